"""Block sizes entering a controller, checked here, once.

A block size enters :class:`~adaptspec.control.controller.AdaptiveController` at four places, and
each is checked where it enters:

- the policy's arms, when the controller is built: every one at most the speculator's
  ``max_block_size`` (:func:`check_arms`);
- the fallback block size, when the controller is built: one of the arms (:func:`choose_fallback`);
- each decision a policy returns: a :class:`~adaptspec.speculator.Decision` over the
  controller's arms whose block size is one of them and whose probabilities are valid
  (:func:`valid_decision`); an invalid one is replaced by :func:`fallback_decision`;
- an outcome reported through ``feedback``: it ran no block larger than its decision's
  (:func:`check_outcome`).

From there on the controller trusts a decision's block size: deciding, decoding, logging
and updating do not check it again on the controller's behalf. The components it calls
check what reaches them from their own callers: the decoder the block size it is asked to
decode with, a policy the block size it is fed through ``update``, the decision-log writer
and readers every row.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from ..speculator import Decision, Outcome


def check_arms(learner: Any, arms: Sequence[int] | None, max_block_size: int) -> tuple[int, ...]:
    """The arms of policy ``learner`` as ints; all of them must be at most ``max_block_size``.

    ``arms`` is what the caller gave (for the error message: "given" or "of policy ...")."""
    out = tuple(int(a) for a in learner.arms)
    if max(out) > max_block_size:
        too_big = [a for a in out if a > max_block_size]
        label = getattr(learner, "label", type(learner).__name__)
        whose = "given" if arms is not None and tuple(sorted(arms)) == out else f"of policy {label}"
        raise AdaptspecError(f"block sizes {too_big} {whose} exceed the speculator's max_block_size "
                             f"{max_block_size} (arms {list(out)})")
    return out


def choose_fallback(fallback_block_size: int | None, arms: tuple[int, ...]) -> int:
    """The block size used when the policy fails or is late: the one given (one of ``arms``),
    else the arm closest to 8."""
    if fallback_block_size is None:
        fallback_block_size = min(arms, key=lambda a: (abs(a - 8), a))
    if fallback_block_size not in arms:
        raise AdaptspecError(f"fallback block size {fallback_block_size} is not one of the arms {list(arms)}")
    return int(fallback_block_size)


def valid_decision(d: Any, arms: tuple[int, ...]) -> bool:
    """Whether ``d`` is a :class:`~adaptspec.speculator.Decision` the controller can run and log:
    over ``arms``, an integer block size among them, probabilities that are finite, >= 0 and
    sum to 1, and a propensity in (0, 1] that is the chosen block size's probability."""
    if not isinstance(d, Decision):
        return False
    try:
        b = int(d.block_size)
        if b != d.block_size or b not in arms or tuple(d.arms) != arms:
            return False
        p = np.asarray(d.probs, dtype=np.float64)
        prop = float(d.propensity)
    except (TypeError, ValueError):
        return False
    return (p.shape == (len(arms),) and bool(np.isfinite(p).all()) and bool((p >= -1e-12).all())
            and abs(float(p.sum()) - 1.0) <= 1e-6 and 0.0 < prop <= 1.0 + 1e-9
            and abs(p[arms.index(b)] - prop) <= 1e-6)


def fallback_decision(block_size: int, arms: tuple[int, ...], reason: str) -> Decision:
    """The decision that replaces a failed, late or invalid one: ``block_size`` with probability 1."""
    probs = np.zeros(len(arms))
    probs[arms.index(block_size)] = 1.0
    return Decision(block_size, 1.0, probs, arms, f"fallback:{block_size}", version=-1, extras={"fallback": reason})


def check_outcome(outcome: Outcome, decision: Decision) -> None:
    """Refuse an outcome that ran a block larger than ``decision`` chose (a wrong report)."""
    big = max((r.block_size for r in outcome.rounds), default=0)
    if big > decision.block_size:
        raise AdaptspecError(f"outcome ran block size {big}, but decision {decision.decision_id} chose "
                             f"{decision.block_size}: report the outcome of the decided block size")
