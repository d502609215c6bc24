"""UCB1 on rewards of any scale, and its BanditSpec-style throughput variant."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from .base import Policy, greedy_probs, one_hot
from .context_free import ContextFreePolicy, RunningStats


class UCB(ContextFreePolicy):
    """UCB1 on rewards of any scale, with a round-robin warm-up.

    Score of arm ``a``: ``mean_a + c * scale * sqrt(2 ln N / n_a)`` where ``n_a`` is the
    arm's (discounted / windowed) count, ``N`` their sum, and ``scale`` the running standard
    deviation of all rewards seen (or a fixed number), so that ``c`` needs no re-tuning when
    rewards are tokens/s rather than values in [0, 1]. Ties share the probability.

    Before any arm has ``warmup`` observations, arms are played round-robin (arm order,
    skipping arms that already have enough). This choice is deterministic, so the
    propensity is 1 unless ``epsilon`` > 0 mixes in uniform exploration.

    :meth:`UCB.throughput` builds the BanditSpec-style variant (UCB over block sizes on the
    measured throughput of each request, ``tokens / decode seconds``, with 8 round-robin
    warm-up rounds), spec string ``ucb-throughput``.

    Parameters
    ----------
    arms
        Block sizes.
    c
        Exploration weight (default 0.25: the std-scaled UCB1 bonus with ``c = 1`` over-explored
        ten block sizes on the development scenario, see BENCHMARKS.md).
    scale
        ``"auto"`` (running std of rewards; 1 until two different rewards were seen) or a
        fixed reward scale.
    warmup
        Observations per arm collected round-robin before UCB scores are used.
    discount, window
        Forgetting for drift (discounted UCB / sliding-window UCB).
    epsilon
        Optional floor for off-policy evaluation.

    >>> pol = UCB([4, 8, 16], seed=0)
    >>> [pol.decide().block_size for _ in range(3)]  # warm-up is round-robin
    [4, 8, 16]
    >>> for b, r in [(4, 1.0), (8, 3.0), (16, 2.0)]:
    ...     pol.update(None, b, r)
    >>> d = pol.decide()
    >>> d.block_size, d.propensity
    (8, 1.0)
    """

    name = "ucb"

    def __init__(
        self,
        arms: Sequence[int],
        c: float = 0.25,
        scale: float | str = "auto",
        warmup: int = 1,
        discount: float | None = None,
        window: int | None = None,
        epsilon: float = 0.0,
        seed: int | None = None,
        label: str | None = None,
    ) -> None:
        if not c >= 0 or not math.isfinite(c):
            raise AdaptspecError(f"c must be >= 0, got {c}")
        if not (scale == "auto" or (isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale))):
            raise AdaptspecError(f"scale must be 'auto' or a positive number, got {scale!r}")
        if int(warmup) != warmup or warmup < 0:
            raise AdaptspecError(f"warmup must be a non-negative integer, got {warmup}")
        self.c = float(c)
        self.scale = scale
        self.warmup = int(warmup)
        self._label = label
        super().__init__(arms, seed=seed, epsilon=epsilon, discount=discount, window=window)

    @classmethod
    def throughput(cls, arms: Sequence[int], warmup_rounds: int = 8, **kwargs: Any) -> "UCB":
        """BanditSpec-style UCB: feed it measured throughput (tokens per decode second).

        ``warmup_rounds`` round-robin rounds in all (at least one per arm) come first, as in
        BanditSpec; the bonus is scaled by the running std of throughput.

        >>> UCB.throughput([2, 4, 8, 16]).warmup
        2
        """
        k = len(set(int(a) for a in arms))
        kwargs.setdefault("label", "ucb-throughput")
        return cls(arms, warmup=max(1, math.ceil(warmup_rounds / max(k, 1))), **kwargs)

    @property
    def label(self) -> str:
        return self._label or self.name

    def _reset(self) -> None:
        super()._reset()
        self._rr = 0

    def _warming(self) -> np.ndarray | None:
        """Arms still in warm-up (raw pulls below ``warmup``, or forgotten by the window)."""
        need = (self.stats.pulls < self.warmup) | self._unplayed()
        return need if need.any() else None

    def _scores(self) -> np.ndarray:
        n = self.stats.n
        scale = self.scale if self.scale != "auto" else (RunningStats.std(self.running) or 1.0)
        total = max(n.sum(), 1.0)
        bonus = self.c * scale * np.sqrt(2.0 * math.log(max(total, math.e)) / np.maximum(n, 1e-12))
        return self.stats.mean() + bonus

    def _warmup_arms(self, n: int) -> np.ndarray | None:
        """Arm indices the next ``n`` decisions play round-robin, without learning in between
        (the arms still in warm-up, in arm order from the round-robin position); None after warm-up."""
        need = self._warming()
        if need is None:
            return None
        k = len(self.arms)
        order = (self._rr + np.arange(k)) % k
        cycle = order[need[order]]
        return cycle[np.arange(n) % len(cycle)]

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        # during warm-up the next decision is the round-robin arm: an arm without data has no
        # mean (nan), so its score is no probability
        warm = self._warmup_arms(1)
        if warm is not None:
            return one_hot(len(self.arms), int(warm[0]))
        return greedy_probs(self._scores())

    def _choose(self, context: np.ndarray | None) -> tuple[int, np.ndarray]:
        probs = self._mix(self._probs(context))
        warm = self._warmup_arms(1)
        if warm is not None:  # the round-robin moves on
            self._rr = (int(warm[0]) + 1) % len(self.arms)
        return self._draw(probs), probs

    def _choose_batch(self, X: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self._warming() is not None:
            return Policy._choose_batch(self, X, n)
        return super()._choose_batch(X, n)

    def _probs_batch(self, X: np.ndarray | None, n: int) -> np.ndarray:
        warm = self._warmup_arms(n)
        if warm is None:
            return np.broadcast_to(self._mix(greedy_probs(self._scores())), (n, len(self.arms))).copy()
        return self._mix(np.eye(len(self.arms))[warm])

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "rr": self._rr}

    def _load_state(self, state: dict[str, Any]) -> None:
        rr = int(state["rr"])
        super()._load_state(state)
        self._rr = rr


def ucb_throughput(
    arms: Sequence[int],
    seed: int | None = None,
    warmup_rounds: int = 8,
    c: float = 0.25,
    discount: float | None = None,
    window: int | None = None,
    epsilon: float = 0.0,
) -> UCB:
    """Factory of the ``ucb-throughput`` spec: :meth:`UCB.throughput`."""
    return UCB.throughput(
        arms, warmup_rounds=warmup_rounds, c=c, discount=discount, window=window, epsilon=epsilon, seed=seed
    )
