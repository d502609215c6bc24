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
    therefore the reference arm's (the smallest block size, shown by every request; among tree
    arms alone, the smallest tree) mean over
    all requests plus the arm's mean difference from it on the requests that showed both:
    ``mean_k = mean(r_ref) + mean_{S_k}(r_k - r_ref)``. With every arm seen on every request
    this is each arm's sample mean. The bonus is UCB1's, ``c * sd * sqrt(2 ln t / n_k)``, with
    ``sd`` the spread of those differences (the root mean square of each difference's error
    against the arm's mean difference before it), ``n_k`` the requests that showed
    arm ``k`` and ``t`` the most any arm has: an arm seen on every request has a bonus that
    vanishes, so optimism stays on arms that were censored or never shown.

    Decisions before every arm has an outcome play the largest arm without one: one request of
    the largest block shows every smaller one (the largest draft tree first, where the arms hold
    trees: it shows every smaller tree and the chains its rank-0 path holds).

    >>> pol = FullInfoUCB([1, 2, 4, 8], seed=0)
    >>> pol.decide().block_size                 # the largest arm shows all the others
    8
    >>> pol.update_full(None, [1.0, 2.0, 3.0, 1.5], [True, True, True, True])
    >>> pol.decide().block_size, pol.means().tolist()
    (4, [1.0, 2.0, 3.0, 1.5])
    """

    name = "fi-ucb"
    full_feedback = True

    def __init__(
        self,
        arms: Sequence[int],
        c: float = 1.0,
        scale: float | str = "auto",
        epsilon: float = 0.0,
        seed: int | None = None,
        label: str | None = None,
    ) -> None:
        super().__init__(arms, c=c, scale=scale, warmup=1, epsilon=epsilon, seed=seed, label=label)

    def _reset(self) -> None:
        super()._reset()
        k = len(self.arms)
        chains = np.flatnonzero(
            self.arm_array > 0
        )  # tree arms (-N) sort first: a request of a chain censors them
        self.ref_index = int(chains[0]) if chains.size else k - 1
        self.ref = np.zeros(2)  # requests that showed the reference arm, sum of its rewards
        self.diff = np.zeros((2, k))  # per arm: requests that showed it and the reference, sum of differences
        self.err = np.zeros(2)  # prequential errors of the differences: count, sum of squares
        self._ready = False  # every arm has an outcome (no forgetting: stays so)
        self._paired = False  # every arm has a difference from the reference (stays so)
        self._refresh()

    # -------------------------------------------------------------- estimates
    def means(self) -> np.ndarray:
        """Each arm's paired mean (nan for an arm never shown)."""
        return self._means.copy()

    def _refresh(self) -> None:
        """Recompute the means and the bonus' scale after an update (decisions only read them)."""
        n, s = self.diff
        own_n = self.stats.n
        if self._paired or (
            self.ref[0] > 0 and n.min() > 0.5
        ):  # every arm paired (from the first request on)
            self._paired = True
            self._means = self.ref[1] / self.ref[0] + s / n
        else:
            means = self.stats.s / np.maximum(own_n, 1.0)
            means[own_n < 0.5] = np.nan
            if self.ref[0] > 0:
                means = np.where(n > 0.5, self.ref[1] / self.ref[0] + s / np.maximum(n, 1.0), means)
            self._means = means
        self._sd = self._spread()
        if not self._ready:
            self._ready = bool((own_n > 0.5).all())

    def _spread(self) -> float:
        """The bonus' scale: the root mean square of the prequential errors of the differences from
        the reference arm (each against the arm's mean difference before it was learnt); before
        any, the standard deviation of every reward seen."""
        if self.scale != "auto":
            return float(self.scale)
        if self.err[0] < 1.5:
            return RunningStats.std(self.running) or 1.0
        return math.sqrt(self.err[1] / self.err[0]) or RunningStats.std(self.running) or 1.0

    def _scores(self) -> np.ndarray:
        n = self.stats.n
        t = max(float(n.max()), math.e)
        return self._means + (self.c * self._sd) * np.sqrt((2.0 * math.log(t)) / np.maximum(n, 1e-12))

    # -------------------------------------------------------------- deciding
    def _warming(self) -> np.ndarray | None:
        """Arms without an outcome yet."""
        if self._ready:
            return None
        need = self.stats.n < 0.5
        return need if need.any() else None

    def _warmup_arms(self, n: int) -> np.ndarray | None:
        need = self._warming()
        if need is None:
            return None
        idx = np.flatnonzero(need)
        trees = idx[self.arm_array[idx] < 0]  # a tree arm (-N) shows every smaller tree and most chains
        return np.full(n, int(trees[0] if trees.size else idx[-1]), dtype=np.int64)

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
        r = rewards  # 0 where not observed
        of = observed.astype(np.float64)
        if not self._ready:  # only the fallback scale of the first requests reads these
            merge_running(self.running, r[observed])
        st = self.stats  # no forgetting: each observed arm counts once (its pulls are its count)
        st.n += of
        st.s += r
        st.ss += r * r
        ref = self.ref_index
        if observed[ref]:
            n, s = self.diff
            self.ref[0] += 1.0
            self.ref[1] += r[ref]
            d = r - of * r[ref]
            if self._paired:
                e = (d - s / n) * of  # every arm has a mean difference to be wrong about
                self.err[0] += np.count_nonzero(observed)
            else:
                seen = observed & (n > 0.5)
                e = (d - s / np.maximum(n, 1.0)) * seen
                self.err[0] += np.count_nonzero(seen)
            self.err[1] += float(e @ e)
            n += of
            s += d
        self._refresh()

    # -------------------------------------------------------------- state
    def _state(self) -> dict[str, Any]:
        self.stats.pulls = self.stats.n.astype(np.int64)
        return {**super()._state(), "ref": self.ref, "diff": self.diff, "err": self.err}

    def _load_state(self, state: dict[str, Any]) -> None:
        ref = np.array(state["ref"], dtype=np.float64)
        diff = np.array(state["diff"], dtype=np.float64)
        err = np.array(state["err"], dtype=np.float64)
        if ref.shape != (2,) or err.shape != (2,) or diff.shape != (2, len(self.arms)):
            raise AdaptspecError("state 'ref' / 'diff' / 'err' do not fit this policy's arms")
        super()._load_state(state)
        self.ref, self.diff, self.err = ref, diff, err
        self._ready = self._paired = False
        self._refresh()


def merge_running(v: np.ndarray, r: np.ndarray) -> None:
    """Add the values ``r`` to running statistics ``v`` (:class:`RunningStats`) in one step
    (Chan et al.'s pairwise update of count, mean and M2), the same as adding them one by one.

    >>> a, b = RunningStats.new(), RunningStats.new()
    >>> for x in [1.0, 4.0, 2.0]:
    ...     RunningStats.add(a, x)
    >>> merge_running(b, np.array([1.0, 4.0])); merge_running(b, np.array([2.0]))
    >>> np.allclose(a, b)
    True
    """
    m = r.size
    if m == 0:
        return
    n = v[0]
    mean_r = float(r.mean())
    m2_r = float(((r - mean_r) ** 2).sum())
    total = n + m
    delta = mean_r - v[1]
    v[1] += delta * m / total
    v[2] += m2_r + delta * delta * n * m / total
    v[0] = total
    v[3] = min(v[3], float(r.min()))
    v[4] = max(v[4], float(r.max()))
