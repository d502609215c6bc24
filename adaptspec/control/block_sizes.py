"""Block sizes entering a controller, checked here, once.

A block size enters :class:`~adaptspec.control.controller.AdaptiveController` at four places, and
each is checked where it enters:

- the policy's arms, when the controller is built: every one at most the speculator's
  ``max_block_size`` (:func:`check_arms`);
- the fallback block size, when the controller is built: one of the arms (:func:`choose_fallback`);
- each decision a policy returns (:func:`check_decision`, called by the decider,
  :mod:`adaptspec.control.decider`, once per decision): a
  :class:`~adaptspec.speculator.Decision` over the controller's arms whose block size is an
  integer among them and whose probabilities and propensity are valid
  (:func:`adaptspec.traces.decision_check.decision_fault`, the one statement of that rule). The
  checked decision carries plain values (an ``int`` block size); an invalid one is replaced by
  :func:`fallback_decision`, and counted;
- an outcome reported through ``feedback`` or returned by ``decode``: it ran no block larger
  than its decision's, its rounds add up to its tokens (the last round may be cut, wholly or in
  part) and its times are seconds (:func:`check_outcome`, by
  :func:`adaptspec.speculator.outcome_fault`, the one statement of that rule).

From there on the controller's parts trust a decision: the book of pending decisions logs it
(the log writer is told the row comes from a checked decision and does not check it again),
the update worker feeds its block size to the policy, nothing casts or checks it again. The
components the controller calls keep the checks of their own entry points, for their other
callers: the decoder checks the block size it is asked to decode with, a policy the block
size fed to ``update``, the decision-log writer the rows of other callers and every row it
reads back from disk.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from ..speculator import Decision, Outcome, check_block_sizes, outcome_fault, verified_positions
from ..traces.decision_check import decision_fault


def check_arms(
    learner: Any, arms: Sequence[int] | None, max_block_size: int, trees: bool = False
) -> tuple[int, ...]:
    """The arms of policy ``learner`` as ints, in the policy's order, checked by
    :func:`~adaptspec.speculator.check_block_sizes` (the one block-size check; tree arms only
    where the speculator declares ``draft_trees``: ``trees``).

    ``arms`` is what the caller gave (for the error message: "given" or "of policy ...")."""
    out = tuple(int(a) for a in learner.arms)
    label = getattr(learner, "label", type(learner).__name__)
    whose = (
        "given" if arms is not None and tuple(sorted(arms)) == tuple(sorted(out)) else f"of policy {label}"
    )
    check_block_sizes(out, max_block_size, name=f"arms {list(out)} {whose}", trees=trees)
    return out


def choose_fallback(fallback_block_size: int | None, arms: tuple[int, ...]) -> int:
    """The block size used when the policy fails or is late: the one given (one of ``arms``),
    else the chain closest to 8 (a tree arm only where the arms hold no chain)."""
    if fallback_block_size is None:
        fallback_block_size = min(arms, key=lambda a: (a < 0, abs(a - 8), a))
    if fallback_block_size not in arms:
        raise AdaptspecError(f"fallback block size {fallback_block_size} is not one of the arms {list(arms)}")
    return int(fallback_block_size)


def check_decision(d: Any, arms: tuple[int, ...], decision_id: str) -> Decision:
    """The decision a policy returned, checked, as the controller keeps it: a
    :class:`~adaptspec.speculator.Decision` over ``arms`` whose fields pass
    :func:`~adaptspec.traces.decision_check.decision_fault` (an integer block size among the
    arms, probabilities finite, >= 0, summing to 1, the propensity the chosen arm's), carrying
    ``decision_id``, with plain values (an ``int`` block size, a ``float`` propensity, float64
    probabilities). Anything else raises :class:`~adaptspec.errors.AdaptspecError`; the
    decider then uses the fallback. The one check of a decision on the request path.

    >>> d = Decision(4, 1.0, np.array([0.0, 1.0]), (1, 4), "fixed:4")
    >>> check_decision(d, (1, 4), "id1").decision_id
    'id1'
    >>> check_decision(Decision(3.5, 1.0, np.array([0.0, 1.0]), (1, 4), "p"), (1, 4), "id2")
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: policy p: block_size 3.5 is not an integer
    """
    if not isinstance(d, Decision):
        raise AdaptspecError(f"a policy returned {type(d).__name__}, not a Decision")
    if tuple(d.arms) != arms:
        raise AdaptspecError(
            f"policy {d.policy}: decision over arms {list(d.arms)}, the controller's are {list(arms)}"
        )
    fault = decision_fault(d.block_size, d.propensity, d.probs, arms)
    if fault is not None:
        raise AdaptspecError(f"policy {d.policy}: {fault}")
    return Decision(
        int(d.block_size),
        float(d.propensity),
        np.asarray(d.probs, dtype=np.float64),
        arms,
        d.policy,
        d.version,
        decision_id,
        d.extras,
    )


def fallback_decision(block_size: int, arms: tuple[int, ...], reason: str, decision_id: str) -> Decision:
    """The decision that replaces a failed, late or invalid one: ``block_size`` (an arm, checked
    by :func:`choose_fallback`) with probability 1."""
    probs = np.zeros(len(arms))
    probs[arms.index(block_size)] = 1.0
    return Decision(
        block_size, 1.0, probs, arms, f"fallback:{block_size}", -1, decision_id, {"fallback": reason}
    )


def check_outcome(
    outcome: Outcome, decision: Decision, largest: int | None = None, max_new_tokens: int | None = None
) -> None:
    """Refuse, in one line, an outcome that is not a report of ``decision``: a block larger than
    it chose (than ``largest``, when a per-round rule may go beyond the decision), rounds that
    no honest loop ends with for its tokens, or times that are not seconds
    (:func:`adaptspec.speculator.outcome_fault`)."""
    fault = outcome_fault(
        outcome, verified_positions(decision.block_size) if largest is None else largest, max_new_tokens
    )
    if fault is not None:
        raise AdaptspecError(f"outcome of decision {decision.decision_id} refused: {fault}")
