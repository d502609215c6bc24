"""Baselines: a fixed block size, uniform random, and the per-request oracle (simulator only).

None of them learns (``learning = False``), so the replay simulator decides for a whole
stream at once with ``decide_batch``.

>>> p = Fixed(16, arms=[1, 8, 16], epsilon=0.3, seed=0)
>>> p.decide().probs.round(2).tolist()
[0.1, 0.1, 0.8]
>>> RandomPolicy([1, 8, 16], seed=0).decide_batch(None, n=5)[0].tolist()
[1, 0, 0, 0, 2]
>>> Oracle([1, 8, 16]).decide_batch(None, n=2, rewards=np.array([[1.0, 3.0, 2.0], [5.0, 0.0, 0.0]]))[0].tolist()
[1, 0]
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from ..speculator import Decision
from .base import Policy, one_hot


class _Stateless(Policy):
    """A policy whose probabilities never depend on feedback or on the context."""

    learning = False

    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        """Nothing to learn."""

    def _update_batch(self, X: np.ndarray | None, idx: np.ndarray, rewards: np.ndarray) -> None:
        """Nothing to learn."""

    def _choose_batch(self, X: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        # Same probabilities for every request: one uniform draw per request, as ``decide``
        # makes, so a batch equals the same number of ``decide`` calls.
        probs = self._mix(self._probs(None))
        k = len(probs)
        j = int(np.argmax(probs))
        if k == 1 or probs[j] >= 1.0:
            idx = np.full(n, j, dtype=np.int64)
        else:
            c = np.cumsum(probs)
            idx = np.minimum(np.searchsorted(c, self.rng.random(n) * c[-1], side="right"), k - 1).astype(
                np.int64
            )
        return idx, probs[idx]

    def probs_batch(self, contexts: np.ndarray | None = None, n: int | None = None) -> np.ndarray:
        """``(n, K)`` probabilities of every arm per request (for off-policy evaluation)."""
        _, n = self.check_contexts(contexts, n)
        return np.broadcast_to(self._mix(self._probs(None)), (n, len(self.arms))).copy()


class Fixed(_Stateless):
    """Always the same block size, or the same draft tree (a tree arm ``-N``), with an optional
    ``epsilon`` floor on the others.

    >>> Fixed(8).arms, Fixed(8, arms=[1, 8]).decide().block_size
    ((8,), 8)
    >>> Fixed(3, arms=[1, 8])
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: fixed:3: block size 3 is not one of the arms [1, 8]
    """

    name = "fixed"

    def __init__(
        self,
        block_size: int,
        arms: Sequence[int] | None = None,
        seed: int | None = None,
        epsilon: float = 0.0,
    ) -> None:
        try:
            b = int(block_size)
        except (TypeError, ValueError):
            raise AdaptspecError(f"fixed: block size must be an integer, got {block_size!r}") from None
        if b == 0 or b != block_size:  # a negative one is a tree arm (adaptspec.speculator.tree_arm)
            raise AdaptspecError(
                f"fixed: block size must be a positive integer or a tree arm (-N), got {block_size!r}"
            )
        self.block_size = b
        super().__init__((b,) if arms is None else arms, seed=seed, epsilon=epsilon)
        if b not in self._index:
            raise AdaptspecError(f"fixed:{b}: block size {b} is not one of the arms {list(self.arms)}")

    @property
    def label(self) -> str:
        return f"fixed:{self.block_size}"

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        return one_hot(len(self.arms), self._index[self.block_size])

    def __repr__(self) -> str:
        return f"Fixed({self.block_size}, arms={list(self.arms)})"


class RandomPolicy(_Stateless):
    """Every arm with the same probability."""

    name = "random"

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        return np.full(len(self.arms), 1.0 / len(self.arms))


class Oracle(Policy):
    """The arm with the highest reward for each request: needs every arm's reward.

    A simulator-only policy (``full_information = True``): it is given the reward row of each
    request, which no real policy ever sees, and sets the upper bound in replay reports.
    Ties go to the smaller block size.
    """

    name = "oracle"
    full_information = True
    learning = False

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        raise AdaptspecError("oracle needs the reward of every arm: it runs only in the simulator (replay)")

    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        """Nothing to learn."""

    def decide(self, context: Any = None, rewards: Sequence[float] | np.ndarray | None = None) -> Decision:
        """The best arm of one request given its reward row."""
        if rewards is None:
            self._probs(None)
        idx, _ = self.decide_batch(None, 1, rewards=np.asarray(rewards, dtype=np.float64)[None, :])
        i = int(idx[0])
        return Decision(self.arms[i], 1.0, one_hot(len(self.arms), i), self.arms, self.label, self.version)

    def decide_batch(
        self, contexts: np.ndarray | None, n: int | None = None, rewards: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Best arm per row of ``rewards`` (``(n, K)``), with propensity 1."""
        if rewards is None:
            self._probs(None)
        R = np.asarray(rewards, dtype=np.float64)
        if R.ndim != 2 or R.shape[1] != len(self.arms) or (n is not None and R.shape[0] != n):
            raise AdaptspecError(f"oracle: rewards must have shape (n, {len(self.arms)}), got {R.shape}")
        if not np.isfinite(R).all():
            raise AdaptspecError(
                f"oracle: reward row {int(np.flatnonzero(~np.isfinite(R).all(axis=1))[0])} is not finite"
            )
        return np.argmax(R, axis=1).astype(np.int64), np.ones(R.shape[0])
