"""UCB with full information: every arm a request revealed is updated with its counterfactual reward."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from .base import greedy_probs, one_hot
from .context_free import RunningStats
from .ucb import UCB


class FullInfoUCB(UCB):
    """UCB over block sizes that learns from every arm a request's rounds reveal (graph feedback).

    After a request, :meth:`update_full` adds the counterfactual reward of every observed arm
    (:mod:`adaptspec.reward.counterfactual`: every block size up to the one that ran, and the
    longer ones unless a round accepted all it verified). :meth:`update` (the arm that ran
    alone) is the same with one arm observed.

    **Paired means.** Requests differ far more from one another than block sizes do on one
    request, and an arm that is often censored is seen on fewer requests than the others, so
    its plain sample mean would be compared with means over other requests. Each arm's mean is
    therefore the reference arm's (the smallest block size, shown by every request) mean over
    all requests plus the arm's mean difference from it on the requests that showed both:
    ``mean_k = mean(r_ref) + mean_{S_k}(r_k - r_ref)``. With every arm seen on every request
    this is each arm's sample mean. The bonus is UCB1's, ``c * sd * sqrt(2 ln t / n_k)``, with
    ``sd`` the pooled standard deviation of those differences, ``n_k`` the requests that showed
    arm ``k`` and ``t`` the most any arm has: an arm seen on every request has a bonus that
    vanishes, so optimism stays on arms that were censored or never shown.

    Decisions before every arm has an outcome play the largest arm without one: one request of
    the largest block shows every smaller one.

    >>> pol = FullInfoUCB([1, 2, 4, 8], seed=0)
    >>> pol.decide().block_size                 # the largest arm shows all the others
    8
    >>> pol.update_full(None, [1.0, 2.0, 3.0, 1.5], [True, True, True, True])
    >>> pol.decide().block_size, pol.means().tolist()
    (4, [1.0, 2.0, 3.0, 1.5])
    """

    name = "fi-ucb"
    full_feedback = True

    def __init__(self, arms: Sequence[int], c: float = 1.0, scale: float | str = "auto", epsilon: float = 0.0,
                 seed: int | None = None, label: str | None = None) -> None:
        super().__init__(arms, c=c, scale=scale, warmup=1, epsilon=epsilon, seed=seed, label=label)

    def _reset(self) -> None:
        super()._reset()
        k = len(self.arms)
        self.ref = np.zeros(2)  # requests that showed the reference arm, sum of its rewards
        self.diff = np.zeros((3, k))  # per arm: requests that showed it and the reference, sum, sum of squares

    # -------------------------------------------------------------- estimates
    def means(self) -> np.ndarray:
        """Each arm's paired mean (nan for an arm never shown)."""
        n, s = self.diff[0], self.diff[1]
        with np.errstate(invalid="ignore", divide="ignore"):
            paired = self.ref[1] / self.ref[0] + s / n
        return np.where(n > 0, paired, self.stats.mean())

    def _spread(self) -> float:
        """Pooled standard deviation of the differences from the reference arm (the bonus' scale)."""
        if self.scale != "auto":
            return float(self.scale)
        n, s, ss = self.diff
        m = n > 1
        if m.sum() < 2:
            return RunningStats.std(self.running) or 1.0
        within = (ss[m] - s[m] ** 2 / n[m]).sum() / (n[m] - 1).sum()
        return math.sqrt(max(within, 0.0)) or RunningStats.std(self.running) or 1.0

    def _scores(self) -> np.ndarray:
        n = self.stats.n
        t = max(float(n.max()), math.e)
        return self.means() + self.c * self._spread() * np.sqrt(2.0 * math.log(t) / np.maximum(n, 1e-12))

    # -------------------------------------------------------------- deciding
    def _warmup_arms(self, n: int) -> np.ndarray | None:
        need = self._warming()
        if need is None:
            return None
        return np.full(n, int(np.flatnonzero(need)[-1]), dtype=np.int64)

    def _choose(self, context: np.ndarray | None) -> tuple[int, np.ndarray]:
        probs = self._mix(self._probs(context))
        return self._draw(probs), probs

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        warm = self._warmup_arms(1)
        if warm is not None:
            return one_hot(len(self.arms), int(warm[0]))
        return greedy_probs(self._scores())

    # -------------------------------------------------------------- learning
    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        r = np.zeros(len(self.arms))
        r[arm] = reward
        self._update_full(context, r, np.arange(len(self.arms)) == arm)

    def _update_batch(self, X: np.ndarray | None, idx: np.ndarray, rewards: np.ndarray) -> None:
        for a, r in zip(idx.tolist(), rewards.tolist()):
            self._update(None, a, r)

    def _update_full(self, context: np.ndarray | None, rewards: np.ndarray, observed: np.ndarray) -> None:
        idx = np.flatnonzero(observed)
        r = rewards[idx]
        for x in r.tolist():
            RunningStats.add(self.running, x)
        self.stats.add_many(idx, r)
        if observed[0]:
            self.ref += (1.0, rewards[0])
            d = r - rewards[0]
            self.diff[0, idx] += 1.0
            self.diff[1, idx] += d
            self.diff[2, idx] += d * d

    # -------------------------------------------------------------- state
    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "ref": self.ref, "diff": self.diff}

    def _load_state(self, state: dict[str, Any]) -> None:
        ref = np.array(state["ref"], dtype=np.float64)
        diff = np.array(state["diff"], dtype=np.float64)
        if ref.shape != (2,) or diff.shape != (3, len(self.arms)):
            raise AdaptspecError("state 'ref' / 'diff' do not fit this policy's arms")
        super()._load_state(state)
        self.ref, self.diff = ref, diff
