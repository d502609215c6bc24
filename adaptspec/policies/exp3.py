"""EXP3 for adversarial rewards, with online reward rescaling."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import AdaptspecError
from .context_free import ContextFreePolicy, RunningStats


class EXP3(ContextFreePolicy):
    """EXP3 (Auer et al. 2002) for adversarial rewards, with online reward rescaling.

    Probabilities: ``p = (1 - epsilon) softmax(eta * G) + epsilon / K`` where ``G_a`` is the
    (discounted / windowed) sum of importance-weighted rescaled rewards ``r' / p_a`` of arm
    ``a``; ``eta`` defaults to ``epsilon / K`` as in the original algorithm.

    Rescaling to [0, 1]: with ``reward_range=(lo, hi)`` rewards are clipped to that range and
    mapped linearly. Without it, each reward is mapped with the running minimum and maximum
    of all rewards seen so far, this one included (``r' = (r - min) / (max - min)``, 0.5
    while all rewards are equal). Earlier terms of ``G`` are not re-mapped when the range
    widens: the first few updates use a cruder scale, which only matters until the range
    has been seen.

    The importance weight uses the arm's probability at update time, which equals the
    probability it was chosen with when feedback arrives before the next decision (as in
    replay); with delayed feedback it is an approximation.

    >>> pol = EXP3([4, 8, 16], epsilon=0.2, seed=0)
    >>> for _ in range(500):
    ...     d = pol.decide()
    ...     pol.update(None, d.block_size, {4: 10.0, 8: 30.0, 16: 20.0}[d.block_size])
    >>> int(np.argmax(pol.decide().probs))
    1
    """

    name = "exp3"

    def __init__(
        self,
        arms: Sequence[int],
        epsilon: float = 0.1,
        eta: float | None = None,
        reward_range: tuple[float, float] | None = None,
        discount: float | None = None,
        window: int | None = None,
        seed: int | None = None,
    ) -> None:
        k = len(arms)
        if eta is None:
            eta = max(epsilon, 1e-3) / max(k, 1)
        if not (eta > 0 and math.isfinite(eta)):
            raise AdaptspecError(f"eta must be > 0, got {eta}")
        if reward_range is not None:
            lo, hi = (float(v) for v in reward_range)
            if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
                raise AdaptspecError(f"reward_range must be (lo, hi) with lo < hi, got {reward_range}")
            reward_range = (lo, hi)
        self.eta = float(eta)
        self.reward_range = reward_range
        super().__init__(arms, seed=seed, epsilon=epsilon, discount=discount, window=window)

    def rescale(self, reward: float) -> float:
        """Map a reward to [0, 1] (after it has been added to the running range)."""
        if self.reward_range is not None:
            lo, hi = self.reward_range
        else:
            lo, hi = self.running[3], self.running[4]
            if not hi > lo:
                return 0.5
        return min(1.0, max(0.0, (reward - lo) / (hi - lo)))

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        w = self.eta * self.stats.s
        w = np.exp(w - w.max())
        return w / w.sum()

    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        p = self._mix(self._probs(None))[arm]
        RunningStats.add(self.running, reward)
        self.stats.add(arm, self.rescale(reward) / p)

    def _update_batch(self, X: np.ndarray | None, idx: np.ndarray, rewards: np.ndarray) -> None:
        for a, r in zip(idx.tolist(), rewards.tolist()):
            self._update(None, a, r)
