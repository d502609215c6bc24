"""The policy protocol every block-size policy follows, and the checks they share.

A policy picks one arm (a block size) per request. ``decide`` returns a
:class:`~adaptspec.speculator.Decision` with the probability of every arm, so that logs
stay usable for off-policy evaluation; ``update`` feeds back the reward of the arm that ran.
Subclasses implement ``_probs`` (or ``_choose`` for policies whose probabilities are not
closed-form) and ``_update``; this class does validation, seeding, versioning and the
epsilon floor.
"""

from __future__ import annotations

import abc
from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from ..speculator import Decision


class Policy(abc.ABC):
    """Base class: arms, seed, validation, epsilon floor, state round trips.

    Parameters
    ----------
    arms
        Candidate block sizes (positive ints, unique); stored sorted.
    seed
        Seed of the policy's own random generator.
    epsilon
        Floor mixed into the probabilities: ``p = (1 - epsilon) p + epsilon / K``. Keeps
        deterministic policies' logs usable for off-policy evaluation.
    dim
        Context dimension for contextual policies; ``None`` learns it from the first context.
    """

    name: str = "policy"
    contextual: bool = False
    #: True only for simulator policies that must see every arm's reward (``Oracle``).
    full_information: bool = False

    def __init__(
        self,
        arms: Sequence[int],
        seed: int | None = None,
        epsilon: float = 0.0,
        dim: int | None = None,
    ) -> None:
        arms_t = tuple(int(a) for a in arms)
        if not arms_t:
            raise AdaptspecError("a policy needs at least one arm")
        if any(a < 1 for a in arms_t) or len(set(arms_t)) != len(arms_t):
            raise AdaptspecError(f"arms must be unique positive block sizes, got {list(arms)}")
        if not 0.0 <= epsilon <= 1.0:
            raise AdaptspecError(f"epsilon must be in [0, 1], got {epsilon}")
        self.arms: tuple[int, ...] = tuple(sorted(arms_t))
        self.arm_array = np.asarray(self.arms, dtype=np.int64)
        self._index = {a: i for i, a in enumerate(self.arms)}
        self.seed = seed
        self.epsilon = float(epsilon)
        self.dim = dim
        self.reset()

    # ------------------------------------------------------------------ to implement
    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        """Probability of each arm for this context (length K, sums to 1)."""
        raise NotImplementedError

    def _choose(self, context: np.ndarray | None) -> tuple[int, np.ndarray]:
        """Index of the chosen arm and the probabilities it was drawn from."""
        probs = self._mix(self._probs(context))
        return int(self.rng.choice(len(self.arms), p=probs)), probs

    @abc.abstractmethod
    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        """Learn from ``reward`` of arm index ``arm``."""

    def _reset(self) -> None:
        """Forget everything learnt (called by ``reset`` after the generator is re-seeded)."""

    def _state(self) -> dict[str, Any]:
        """Learnt state as numpy arrays and plain values."""
        return {}

    def _load_state(self, state: dict[str, Any]) -> None:
        """Inverse of ``_state``."""

    # ------------------------------------------------------------------ public protocol
    @property
    def label(self) -> str:
        """Name shown in reports and logs."""
        return self.name

    def reset(self) -> None:
        """Forget all feedback and re-seed the generator."""
        self.rng = np.random.default_rng(self.seed)
        self.version = 0
        self._reset()

    def decide(self, context: Sequence[float] | np.ndarray | None = None) -> Decision:
        """Choose a block size for one request."""
        ctx = self.check_context(context)
        i, probs = self._choose(ctx)
        return Decision(
            block_size=self.arms[i],
            propensity=float(probs[i]),
            probs=probs,
            arms=self.arms,
            policy=self.label,
            version=self.version,
        )

    def update(self, context: Sequence[float] | np.ndarray | None, block_size: int, reward: float) -> None:
        """Feed back the reward of ``block_size``. Bad input raises and changes nothing."""
        ctx = self.check_context(context)
        arm = self.arm_index(block_size)
        reward = self.check_reward(reward)
        self._update(ctx, arm, reward)
        self.version += 1

    def decide_batch(self, contexts: np.ndarray | None, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Decide for ``n`` requests without learning in between.

        Returns arm indices (int64) and their propensities. Subclasses vectorise this.
        """
        n = self._batch_size(contexts, n)
        idx = np.empty(n, dtype=np.int64)
        prop = np.empty(n, dtype=np.float64)
        for t in range(n):
            ctx = None if contexts is None else self.check_context(contexts[t])
            i, probs = self._choose(ctx)
            idx[t], prop[t] = i, probs[i]
        return idx, prop

    def update_batch(self, contexts: np.ndarray | None, block_sizes: np.ndarray, rewards: np.ndarray) -> None:
        """Feed back many rewards, in order."""
        block_sizes = np.asarray(block_sizes)
        for t in range(len(block_sizes)):
            self.update(None if contexts is None else contexts[t], int(block_sizes[t]), float(rewards[t]))

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this policy is."""
        return {
            "name": self.name,
            "arms": list(self.arms),
            "version": self.version,
            "dim": self.dim,
            "rng": self.rng.bit_generator.state,
            "state": self._state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict``; the arms and the policy type must match."""
        if state.get("name") != self.name:
            raise AdaptspecError(f"state is for policy {state.get('name')!r}, not {self.name!r}")
        if tuple(state.get("arms", ())) != self.arms:
            raise AdaptspecError(f"state has arms {state.get('arms')}, this policy has {list(self.arms)}")
        self.rng.bit_generator.state = state["rng"]
        self.version = int(state["version"])
        self.dim = state.get("dim")
        self._load_state(state["state"])

    # ------------------------------------------------------------------ shared checks
    def arm_index(self, block_size: int) -> int:
        """Position of ``block_size`` in ``arms``; an unknown arm raises."""
        try:
            return self._index[int(block_size)]
        except (KeyError, TypeError, ValueError):
            raise AdaptspecError(f"unknown arm {block_size!r}: this policy's arms are {list(self.arms)}") from None

    @staticmethod
    def check_reward(reward: float) -> float:
        try:
            r = float(reward)
        except (TypeError, ValueError):
            raise AdaptspecError(f"reward must be a number, got {reward!r}") from None
        if not np.isfinite(r):
            raise AdaptspecError(f"reward must be finite, got {reward!r}")
        return r

    def check_context(self, context: Sequence[float] | np.ndarray | None) -> np.ndarray | None:
        """Validate a context: a finite 1-D vector of the policy's dimension (None if context-free)."""
        if not self.contextual:
            return None
        if context is None:
            raise AdaptspecError(f"{self.name} is contextual: it needs a feature vector, got None")
        x = np.asarray(context, dtype=np.float64)
        if x.ndim != 1:
            raise AdaptspecError(f"context must be a 1-D vector, got shape {x.shape}")
        if self.dim is None:
            self.dim = x.shape[0]
        elif x.shape[0] != self.dim:
            raise AdaptspecError(f"context has {x.shape[0]} features, {self.name} expects {self.dim}")
        if not np.all(np.isfinite(x)):
            raise AdaptspecError("context has NaN or infinite values")
        return x

    def _mix(self, probs: np.ndarray) -> np.ndarray:
        if self.epsilon > 0.0:
            probs = (1.0 - self.epsilon) * probs + self.epsilon / len(self.arms)
        return probs

    @staticmethod
    def _batch_size(contexts: np.ndarray | None, n: int | None) -> int:
        if contexts is not None:
            return len(contexts)
        if n is None:
            raise AdaptspecError("decide_batch needs contexts or n")
        return int(n)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(arms={list(self.arms)})"


def one_hot(k: int, i: int) -> np.ndarray:
    """Probability vector that puts all mass on arm ``i``."""
    p = np.zeros(k)
    p[i] = 1.0
    return p
