"""Counterfactual outcomes: what every other block size would have earned on the rounds that ran.

A round that verified ``v`` positions (the last committed token and ``v - 1`` drafts) and
committed ``tau`` tokens accepted ``a = tau - 1`` drafts, and was rejected at draft ``a + 1``
unless ``tau == v``. Had it verified only the first ``B'`` positions of the same draft, it would
have committed ``min(a, B' - 1) + 1 = min(tau, B')`` tokens: known exactly for every
``B' <= v``, and for every ``B' > v`` too when a draft was rejected (the longer verify stops
at the same rejection). A round that accepted all its ``v`` positions says only that a longer
verify would have committed at least ``v``: the longer block sizes are **censored** from below.
The request's last round is never censored: it committed the request's last token, and no
longer block commits past the end.

**Exact or approximate.** The rule above is exact for *verifying a prefix of one draft*. A
block size ``B'`` run on its own drafts a block of ``B'`` positions, and this drafter attends
both ways inside a block, so its first drafts can differ from the first ``B' - 1`` of a longer
block's: then the outcome is **approximate** (:attr:`Counterfactuals.approximate`). The block
size that ran and block size 1 (a plain step drafts nothing) are always exact; with a speculator
that drafts once and verifies a prefix (``prefix_drafts=True``) every uncensored arm is.
docs/evaluation.md (section 9) measures the error on dense traces.

**From rounds to a request.** Each arm's tokens are summed over the same rounds
(``tokens[B'] = sum_r min(tau_r, B')``); its rate per round is that over the rounds that ran, so
the request's tokens would have taken ``rounds * committed / tokens[B']`` rounds, each costing the
latency profile's draft and verify time of ``B'`` at that round's context. The times are scaled
by the measured over the modelled time of what did run (the machine's speed), so the arm that ran
is paid exactly its measured decode time; rewards follow as
:mod:`~adaptspec.reward.functions` defines them.

>>> from adaptspec.costs.latency import get_profile
>>> cf = counterfactuals([3, 1, 2], [4, 4, 2], arms=[1, 2, 4, 8], decided=4, context_tokens=50,
...                      profile=get_profile("cpu-smollm2-fast"))
>>> cf.tokens.tolist(), cf.censored.tolist(), cf.approximate.tolist()
([3.0, 5.0, 6.0, 6.0], [False, False, False, False], [False, True, False, True])
>>> cf2 = counterfactuals([4, 2], [4, 4], arms=[2, 4, 8], decided=4, context_tokens=50,
...                       profile=get_profile("cpu-smollm2-fast"))
>>> cf2.tokens.tolist(), cf2.censored.tolist()     # the first round accepted all 4: B=8 censored
([4.0, 6.0, 6.0], [False, False, True])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..costs.latency import LatencyProfile
from ..errors import AdaptspecError
from .functions import check_reward_name, modelled_throughput


@dataclass(frozen=True)
class Counterfactuals:
    """Every arm's outcome on one request, from the rounds of the arm that ran.

    ``tokens`` (K,): tokens the rounds that ran would have committed at each arm's verify length
    (a lower bound where ``censored``); ``rounds``: rounds that ran; ``committed``: the tokens
    they committed; ``decode_s`` (K,): each arm's decode seconds for the request (an upper bound
    where censored); ``new_tokens``: the request's new tokens (the prefill's token included).
    """

    arms: tuple[int, ...]
    decided: int
    tokens: np.ndarray
    rounds: int
    committed: int
    decode_s: np.ndarray
    new_tokens: int
    censored: np.ndarray
    approximate: np.ndarray

    @property
    def observed(self) -> np.ndarray:
        """Arms whose outcome is known (exactly or approximately): not censored."""
        return ~self.censored

    @property
    def mean_tau(self) -> np.ndarray:
        """Tokens per round at each arm (a lower bound where censored)."""
        return self.tokens / max(self.rounds, 1)

    def rewards(
        self,
        reward: str,
        profile: LatencyProfile | None = None,
        context_tokens: int | None = None,
        batch_size: int = 1,
    ) -> np.ndarray:
        """Each arm's reward (K,) by the name :mod:`~adaptspec.reward.functions` gives it
        (``token_latency``, ``throughput``, ``tau``, or ``modelled`` with ``profile``); a lower
        bound where censored (every reward grows with the tokens a round commits)."""
        check_reward_name(reward)
        if reward == "token_latency":
            return -1000.0 * self.decode_s / self.new_tokens
        if reward == "throughput":
            return self.new_tokens / self.decode_s
        if reward == "tau":
            return self.mean_tau.copy()
        if profile is None:
            raise AdaptspecError("the modelled reward needs a latency profile")
        return np.asarray(
            modelled_throughput(self.mean_tau, np.asarray(self.arms), profile, context_tokens, batch_size),
            dtype=np.float64,
        )


def round_tokens(taus: np.ndarray, verified: np.ndarray, arms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens (K,), censored (K,))``: the tokens the rounds would have committed at each arm's
    verify length, ``sum_r min(tau_r, B')``, and whether some round that is not the last accepted
    all it verified (``tau_r == v_r``) with ``B' > v_r`` (the arm's count is then a lower bound).

    >>> round_tokens(np.array([2, 4, 1]), np.array([4, 4, 4]), np.array([1, 3, 4, 6]))
    (array([3., 6., 7., 7.]), array([False, False, False,  True]))
    """
    t = np.asarray(taus, dtype=np.int64)
    v = np.asarray(verified, dtype=np.int64)
    a = np.asarray(arms, dtype=np.int64)
    tokens = np.minimum(t[:, None], a[None, :]).sum(axis=0).astype(np.float64)
    full = t == v
    if full.size:
        full[-1] = False  # the last round committed the request's last token
    censored = (full[:, None] & (a[None, :] > v[:, None])).any(axis=0)
    return tokens, censored


def counterfactuals(
    taus: Sequence[int] | np.ndarray,
    verified: Sequence[int] | np.ndarray,
    *,
    arms: Sequence[int],
    decided: int,
    context_tokens: int,
    profile: LatencyProfile,
    drafted: Sequence[int] | np.ndarray | None = None,
    decode_s: float | None = None,
    new_tokens: int | None = None,
    batch: int = 1,
    prefix_drafts: bool = False,
    tree_outcomes: Sequence[Any] | None = None,
) -> Counterfactuals:
    """Every arm's outcome from the rounds one request ran (see the module docstring).

    ``taus``, ``verified`` (and ``drafted``, default ``verified``): per round, the tokens
    committed, the positions verified and the block drafted; ``decided``: the block size the
    request was given (a round verifying fewer positions than it was cut short by the request's
    ``max_new_tokens``, and every arm's round there is cut the same way); ``context_tokens``: the
    prompt's tokens (a round's context is the prompt plus the tokens committed before it, the
    prefill's included); ``decode_s``: the measured decode time (default: the profile's time of
    the rounds, so the scale is 1); ``new_tokens``: the request's new tokens (default: committed +
    1, the prefill's token); ``prefix_drafts``: the speculator drafts one block and verifies a
    prefix of it, so no uncensored arm is approximate, and every arm's speculating round pays
    for drafting that block; ``tree_outcomes``: per round, what its draft tree showed
    (:class:`~adaptspec.speculator.TreeOutcomes`; None for a round that verified no tree): then
    every arm, tree arms (``-N``) and chains alike, is counted by :func:`tree_round_tokens`, and a
    tree round may verify more positions than it drafted. A request that ran chains tells nothing
    of tree arms: they are censored (at one token a round).
    """
    t, v, d, arm_t, outcomes, is_tree = _checked_rounds(taus, verified, drafted, arms, tree_outcomes)
    A = np.asarray(arm_t, dtype=np.int64)
    committed = int(t.sum())
    n_new = committed + 1 if new_tokens is None else int(new_tokens)
    exact = (A == int(decided)) | (A == 1)
    if t.size == 0:  # nothing ran: no arm is known
        nan = np.full(len(A), np.nan)
        return Counterfactuals(
            arm_t, int(decided), np.zeros(len(A)), 0, 0, nan, n_new, np.ones(len(A), dtype=bool), ~exact
        )
    trees = A < 0
    ctx = context_tokens + 1 + np.concatenate([[0], np.cumsum(t)[:-1]])  # committed before each round
    if is_tree.any():  # the request ran trees: every arm from what they showed
        tokens, censored = tree_round_tokens(t, outcomes, A)
        vv = np.where(v[:, None] > 1, A[None, :], 1)  # a last-token plain step: one position at every arm
        dd = vv
        approx = ~trees & (A != 1) & (not prefix_drafts)  # a chain would draft a block of its own
    elif int(decided) < 0:  # trees ran, and nothing says what they showed: only the arm that ran is known
        tokens = np.full(len(A), float(t.size))  # every arm commits at least a token a round
        tokens[A == int(decided)] = float(committed)
        censored = (A != int(decided)) & (A != 1)  # a plain step commits one token a round: known
        vv = np.where(v[:, None] > 1, A[None, :], 1)
        dd = vv
        approx = np.zeros(len(A), dtype=bool)
    else:
        tokens, censored = round_tokens(t, v, np.where(trees, 1, A))
        tokens[trees] = float(t.size)  # a tree commits at least one token a round; nothing more is known
        censored |= trees
        # each arm's verify length per round: the arm itself, except where the round was cut short by
        # the request's end (fewer positions left than decided): every arm is cut the same way there
        cut = v < int(decided)
        vv = np.where(cut[:, None] & ~trees[None, :], np.minimum(A[None, :], v[:, None]), A[None, :])
        # what each arm drafts a round: its own block; with prefix_drafts the block the speculator drafts
        # every speculating round (the longest drafted here), of which it verifies a prefix (1: a plain step)
        dd = np.where(vv > 1, np.maximum(vv, int(d.max())), vv) if prefix_drafts else vv
        approx = np.zeros(len(A), dtype=bool) if prefix_drafts else ~exact
    cost = profile.draft_s(dd, ctx[:, None], batch) + profile.verify_s(vv, ctx[:, None], batch)
    ran = profile.draft_s(np.where(d > 1, d, 1), ctx, batch) + profile.verify_s(v, ctx, batch)
    scale = 1.0 if decode_s is None else float(decode_s) / float(ran.sum())
    secs = scale * committed / tokens * cost.sum(axis=0)
    return Counterfactuals(arm_t, int(decided), tokens, int(t.size), committed, secs, n_new, censored, approx)


def _checked_rounds(
    taus: Sequence[int] | np.ndarray,
    verified: Sequence[int] | np.ndarray,
    drafted: Sequence[int] | np.ndarray | None,
    arms: Sequence[int],
    tree_outcomes: Sequence[Any] | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...], list[Any], np.ndarray]:
    """counterfactuals' rounds checked: the taus, verified and drafted positions, the arms sorted,
    each round's tree outcomes (None: a chain round) and which rounds verified a tree."""
    t = np.asarray(taus, dtype=np.int64)
    v = np.asarray(verified, dtype=np.int64)
    d = v if drafted is None else np.asarray(drafted, dtype=np.int64)
    arm_t = tuple(sorted(int(a) for a in arms))
    if t.shape != v.shape or d.shape != t.shape or t.ndim != 1:
        raise AdaptspecError("taus, verified and drafted must be 1-D sequences of the same length")
    outcomes = list(tree_outcomes) if tree_outcomes is not None else [None] * t.size
    if len(outcomes) != t.size:
        raise AdaptspecError("tree_outcomes must have one entry per round")
    is_tree = np.array([o is not None for o in outcomes], dtype=bool)
    if t.size and (np.any(t < 1) or np.any(t > v) or np.any((d < v) & ~is_tree) or np.any((d < t) & is_tree)):
        raise AdaptspecError("every round needs 1 <= tau <= verified <= drafted (a tree's: tau <= drafted)")
    if not arm_t or 0 in arm_t:
        raise AdaptspecError(f"arms must be block sizes >= 1 or tree arms, got {list(arms)}")
    return t, v, d, arm_t, outcomes, is_tree


def tree_round_tokens(
    taus: np.ndarray, outcomes: Sequence[Any], arms: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens (K,), censored (K,))`` over rounds that verified draft trees (``outcomes[r]``, a
    :class:`~adaptspec.speculator.TreeOutcomes`; None: a plain step, one token at every arm): a tree
    arm ``-M`` commits what the tree's first ``M`` nodes would have (exact up to the nodes the
    round verified; a larger tree at least the whole tree's, censored unless nothing more could be
    accepted); a chain ``B`` what the tree shows of its rank-0 path (at least the depth it holds,
    censored where it held it too shallow to tell). The last round is never censored (it committed
    the request's last token).

    >>> from adaptspec.speculator import TreeOutcomes
    >>> o = TreeOutcomes(tree_tau=(1, 2, 2, 3), chain_tau=(1, 2, None), chain_floor=(1, 2, 2))
    >>> tree_round_tokens(np.array([3, 1]), [o, None], np.array([-8, -3, -1, 1, 2, 3]))
    (array([4., 4., 3., 2., 3., 3.]), array([ True, False, False, False, False,  True]))
    """
    tokens = np.zeros(len(arms))
    censored = np.zeros(len(arms), dtype=bool)
    for r, o in enumerate(outcomes):
        last = r == len(outcomes) - 1
        if o is None:
            tokens += 1.0
            continue
        nodes = len(o.tree_tau) - 1
        for k, a in enumerate(int(x) for x in arms):
            if a < 0:
                tokens[k] += o.tree(-a)
                censored[k] |= -a > nodes and not last
            else:
                known = o.chain(a)
                tokens[k] += known if known is not None else o.chain_at_least(a)
                censored[k] |= known is None and not last
    return tokens, censored


def from_outcome(
    outcome: Any,
    decided: int,
    arms: Sequence[int],
    context_tokens: int,
    profile: LatencyProfile,
    *,
    batch: int = 1,
    prefix_drafts: bool = False,
) -> Counterfactuals:
    """:func:`counterfactuals` of an :class:`~adaptspec.speculator.Outcome`: its rounds' taus, verified
    and drafted sizes, its measured decode time and new tokens."""
    rounds = outcome.rounds
    outcomes = [r.tree_outcomes for r in rounds]
    return counterfactuals(
        [r.tau for r in rounds],
        [r.block_size for r in rounds],
        arms=arms,
        decided=decided,
        context_tokens=context_tokens,
        profile=profile,
        drafted=[r.draft_size for r in rounds],
        decode_s=float(outcome.decode_s),
        new_tokens=outcome.new_tokens,
        batch=batch,
        prefix_drafts=prefix_drafts,
        tree_outcomes=outcomes if any(o is not None for o in outcomes) else None,
    )
