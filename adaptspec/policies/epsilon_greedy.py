"""Epsilon-greedy over the arms' mean rewards."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import AdaptspecError
from .base import greedy_probs
from .context_free import ContextFreePolicy


class EpsilonGreedy(ContextFreePolicy):
    """Play the arm with the best mean reward, explore uniformly with probability epsilon.

    Arms without data are played first (uniformly among them). ``epsilon`` decays as
    ``epsilon / (1 + decay * t)`` after ``t`` updates.

    Parameters
    ----------
    arms
        Block sizes.
    epsilon
        Exploration probability (the probabilities are ``(1 - eps) greedy + eps / K``).
    decay
        Decay rate of epsilon (0: constant).
    discount, window
        Forgetting for drift (see the module docstring).
    seed
        Seed of the generator.

    >>> pol = EpsilonGreedy([4, 8, 16], epsilon=0.1, seed=0)
    >>> for _ in range(300):
    ...     d = pol.decide()
    ...     pol.update(None, d.block_size, {4: 1.0, 8: 2.0, 16: 1.5}[d.block_size])
    >>> d = pol.decide()
    >>> d.probs.round(3).tolist()
    [0.033, 0.933, 0.033]
    """

    name = "eps-greedy"

    def __init__(
        self,
        arms: Sequence[int],
        epsilon: float = 0.1,
        decay: float = 0.0,
        discount: float | None = None,
        window: int | None = None,
        seed: int | None = None,
    ) -> None:
        if decay < 0 or not math.isfinite(decay):
            raise AdaptspecError(f"decay must be >= 0, got {decay}")
        self.decay = float(decay)
        super().__init__(arms, seed=seed, epsilon=epsilon, discount=discount, window=window)

    @property
    def current_epsilon(self) -> float:
        return self.epsilon / (1.0 + self.decay * self.version)

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        un = self._unplayed()
        return un / un.sum() if un.any() else greedy_probs(self.stats.mean())

    def _mix(self, probs: np.ndarray) -> np.ndarray:
        e = self.current_epsilon
        return (1.0 - e) * probs + e / len(self.arms) if e > 0 else probs
