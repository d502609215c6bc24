"""The goodput rule under load (SmartSpec-style) and its model: each row's expected tokens at a
block size from its acceptance so far (independent per-draft acceptance), over the cost model's
round time."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..costs.pass_costs import PassCosts
from ..reward.attribution import batch_round_s


def acceptance(row: Any, prior: float, weight: float) -> float:
    """A row's per-draft acceptance so far: accepted over tried (accepted + rejections),
    smoothed towards ``prior`` with the weight of ``weight`` trials."""
    return (row.accepted + prior * weight) / (row.accepted + row.rejected + weight)


def expected_tau(acceptance: np.ndarray, block_size: int) -> np.ndarray:
    """Expected tokens a round of ``block_size`` commits when each draft is accepted with
    probability ``acceptance`` independently, until the first rejection, plus the bonus token.

    >>> expected_tau(np.array([0.0, 0.5, 1.0]), 4).round(3)
    array([1.   , 1.875, 4.   ])
    """
    a = np.clip(np.asarray(acceptance, dtype=np.float64), 0.0, 1.0 - 1e-9)
    return (1.0 - a**block_size) / (1.0 - a) if block_size > 1 else np.ones_like(a)


def predicted_speedup(
    profile: PassCosts, arms: Sequence[int], acceptance: float, rows: int, context: float
) -> np.ndarray:
    """The goodput model's reward of each block size in ``arms`` at ``rows`` rows in flight, in the
    learned rule's unit (1.0 = plain decoding): a batch all at ``B`` commits :func:`expected_tau`
    tokens a row in one round of ``batch_round_s``, plain decoding one token a row in a plain
    round, so ``E[tau_B] x t(plain) / t(B)``.

    >>> from adaptspec.costs.latency import CostCurve, LatencyProfile
    >>> flat = LatencyProfile("flat", draft=CostCurve((2,), (0.010,)), verify=CostCurve((1,), (0.040,)))
    >>> predicted_speedup(flat, [1, 2, 4], 0.5, rows=8, context=100).round(3)   # 1, 1.5 and 1.875 tokens in 40/50 ms
    array([1. , 1.2, 1.5])
    """
    plain = batch_round_s(profile, [1] * rows, [context] * rows)
    return np.array(
        [
            float(expected_tau(np.array([acceptance]), b)[0])
            * plain
            / batch_round_s(profile, [b] * rows, [context] * rows)
            for b in arms
        ]
    )


class Goodput:
    """Each round, the one block size (of ``arms``) with the most expected tokens per second for
    the batch (SmartSpec's goodput), from each row's acceptance so far and the cost model.

    A row's acceptance is its accepted drafts over accepted drafts and rejections (each round
    tries drafts until the first rejection), smoothed towards ``prior`` with the weight of
    ``prior_drafts`` trials (a new row starts at the prior).
    """

    def __init__(
        self,
        arms: Sequence[int],
        profile: PassCosts,
        prior: float = 0.5,
        prior_drafts: float = 8.0,
        max_new_tokens: int = 128,
    ) -> None:
        self.arms = sorted(int(a) for a in arms)
        self.profile, self.prior, self.weight = profile, float(prior), float(prior_drafts)
        self.max_new_tokens = max_new_tokens
        self.name = "goodput"

    def acceptance(self, rows: Sequence[Any]) -> np.ndarray:
        return np.array([acceptance(r, self.prior, self.weight) for r in rows])

    def choose(self, rows: Sequence[Any], load: Any) -> list[int]:
        a = np.clip(self.acceptance(rows), 0.0, 1.0 - 1e-9)
        room = np.array([self.max_new_tokens - r.m for r in rows])
        ctx = [r.context for r in rows]
        best, best_rate = self.arms[0], -1.0
        for b in self.arms:
            blocks = np.clip(np.minimum(b, room), 1, None)
            gain = float(((1.0 - a**blocks) / (1.0 - a)).sum())  # expected_tau, row by row
            rate = gain / batch_round_s(self.profile, blocks, ctx)
            if rate > best_rate:
                best, best_rate = b, rate
        return [best] * len(rows)

    def feedback(self, *args: Any) -> None:
        pass  # acceptance is read from the rows themselves
