"""LinUCB with full information: every arm a request revealed updates its own ridge model."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .base import one_hot
from .linucb import LinUCB


class FullInfoLinUCB(LinUCB):
    """LinUCB whose per-arm ridge models learn from every arm a request's rounds reveal.

    :meth:`update_full` gives each observed arm (:mod:`adaptspec.reward.counterfactual`) one
    ridge update at the request's context. An arm seen after every request has a posterior that
    narrows with every request, so its bonus ``alpha * sigma * sqrt(phi^T A^-1 phi)`` shrinks as
    the data grow; optimism stays on arms that were censored or never shown.

    While the standardiser warms up (``warmup`` updates, every observed arm counting one) it
    does not decide at random, as LinUCB does: it plays the largest arm without an outcome (one
    request of it shows every smaller arm), then the arm with the best mean outcome so far.
    :meth:`update` (the arm that ran alone) still works, as LinUCB's.

    >>> pol = FullInfoLinUCB([2, 4, 8], warmup=6, seed=0)
    >>> pol.decide([0.5, 1.0]).block_size
    8
    >>> pol.update_full([0.5, 1.0], [1.0, 3.0, 2.0], [True, True, True])
    >>> pol.decide([1.5, 0.0]).block_size, pol.warming_up
    (4, True)
    >>> pol.update_full([1.5, 0.0], [1.0, 3.0, 2.0], [True, True, True])
    >>> pol.warming_up
    False
    """

    name = "fi-linucb"
    full_feedback = True

    def __init__(self, arms: Sequence[int], alpha: float = 0.5, **kwargs: Any) -> None:
        super().__init__(arms, alpha=alpha, **kwargs)

    def warm_arm(self) -> int:
        """The arm played while the standardiser warms up: the largest without an outcome, else
        the one with the best mean outcome in the warm-up buffer."""
        k = len(self.arms)
        a, r = self._buf_a[: self._buf_n], self._buf_r[: self._buf_n]
        n = np.bincount(a, minlength=k)
        if (n == 0).any():
            return int(np.flatnonzero(n == 0)[-1])
        return int(np.argmax(np.bincount(a, weights=r, minlength=k) / n))

    def _choose(self, context: np.ndarray | None) -> tuple[int, np.ndarray]:
        self._ensure_core()
        if self.core is None:
            probs = self._mix(one_hot(len(self.arms), self.warm_arm()))
            return self._draw(probs), probs
        return super()._choose(context)

    def _choose_batch(self, X: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        self._ensure_core()
        if self.core is None:
            j = self.warm_arm()
            return np.full(n, j, dtype=np.int64), np.full(n, self._mix(one_hot(len(self.arms), j))[j])
        return super()._choose_batch(X, n)

    def _probs_batch(self, X: np.ndarray | None, n: int) -> np.ndarray:
        self._ensure_core()
        if self.core is None:
            return np.tile(self._mix(one_hot(len(self.arms), self.warm_arm())), (n, 1))
        return super()._probs_batch(X, n)
