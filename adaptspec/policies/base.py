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
import copy
import json
import operator
import os
from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from ..reward.functions import check_reward
from ..speculator import REWARD_LIMIT, Decision

_F64 = np.dtype(np.float64)

#: The largest norm of a context a policy learns from. Prefill features are hidden-state
#: statistics, log-lengths and the like (norms of tens to thousands); a billion is past any of
#: them, and below it a policy's sums of outer products stay finite (1e18 each).
CONTEXT_LIMIT = 1e9
_CONTEXT_LIMIT_SQ = CONTEXT_LIMIT * CONTEXT_LIMIT


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
    #: True for policies that learn from every arm's outcome after a request
    #: (:meth:`update_full`, graph feedback: the counterfactuals of
    #: :mod:`adaptspec.reward.counterfactual`); they still decide before seeing any reward.
    full_feedback: bool = False

    #: Where the learnt state holds an infinity on purpose (a key of ``_state()`` -> the indices
    #: of its array): the min and max of no reward yet, say. Everywhere else every number of a
    #: learnt state is finite (:meth:`state_fault`), or the state is refused.
    infinite_ok: dict[str, Any] = {}

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
        if 0 in arms_t or len(set(arms_t)) != len(
            arms_t
        ):  # a negative arm is a draft tree (speculator.tree_arm)
            raise AdaptspecError(f"arms must be unique block sizes >= 1 or tree arms, got {list(arms)}")
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
        return self._draw(probs), probs

    @abc.abstractmethod
    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        """Learn from ``reward`` of arm index ``arm``."""

    def _check_update_context(self, context: Sequence[float] | np.ndarray | None) -> np.ndarray | None:
        """``check_context`` for ``update``; subclasses may skip what their decision checked."""
        return self.check_context(context)

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
        # positional: half the cost of keywords, on the hot path (block_size, propensity,
        # probs, arms, policy, version)
        return Decision(self.arms[i], probs.item(i), probs, self.arms, self.label, self.version)

    def update(self, context: Sequence[float] | np.ndarray | None, block_size: int, reward: float) -> None:
        """Feed back the reward of ``block_size``. Bad input raises and changes nothing."""
        arm = self.arm_index(block_size)
        reward = self.check_reward(reward)
        ctx = self._check_update_context(context)
        self._update(ctx, arm, reward)
        self.version += 1

    def update_full(
        self,
        context: Sequence[float] | np.ndarray | None,
        rewards: Sequence[float] | np.ndarray,
        observed: Sequence[bool] | np.ndarray,
    ) -> None:
        """Feed back the reward of every arm whose outcome one request revealed: ``rewards`` (K,)
        in arm order, ``observed`` (K,) true where the reward is known (not censored); the others'
        values are ignored. One request is one update (``version`` + 1), however many arms it
        shows. Only policies with ``full_feedback`` take it; :meth:`update` (the arm that ran
        alone) stays valid for every policy, so its propensities and estimators do too.
        Bad input raises and changes nothing."""
        if not self.full_feedback:
            raise AdaptspecError(
                f"{self.label} learns from the arm that ran only: use update(), not update_full()"
            )
        m = np.asarray(observed)
        k = len(self.arms)
        if m.shape != (k,) or m.dtype != np.bool_:
            raise AdaptspecError(
                f"observed must be {k} booleans (one per arm), got shape {m.shape} of {m.dtype}"
            )
        try:
            r = np.asarray(rewards, dtype=np.float64)
        except (TypeError, ValueError):
            raise AdaptspecError("rewards must be numbers") from None
        if r.shape != (k,):
            raise AdaptspecError(f"rewards must be {k} numbers (one per arm), got shape {r.shape}")
        r = np.where(m, r, 0.0)
        if not np.abs(r).max() <= REWARD_LIMIT:  # NaN compares False
            raise AdaptspecError(
                f"the reward of every observed arm must be finite and within +-{REWARD_LIMIT:g}, "
                f"got {r[m].tolist()}"
            )
        ctx = self._check_update_context(context)
        self._update_full(ctx, r, m)
        self.version += 1

    def _update_full(self, context: np.ndarray | None, rewards: np.ndarray, observed: np.ndarray) -> None:
        """Learn from every observed arm's reward (policies with ``full_feedback``); inputs are
        validated, and the rewards of arms not observed are 0."""
        raise NotImplementedError

    def decide_batch(
        self, contexts: np.ndarray | None, n: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Decide for ``n`` requests without learning in between.

        ``contexts`` is an ``(n, dim)`` array (``None`` for context-free policies, with ``n``).
        Returns arm indices (int64, positions in ``arms``) and their propensities. The whole
        batch is validated before any decision is drawn.
        """
        X, n = self.check_contexts(contexts, n)
        return self._choose_batch(X, n)

    def update_batch(self, contexts: np.ndarray | None, block_sizes: np.ndarray, rewards: np.ndarray) -> None:
        """Feed back many rewards, in order.

        The whole batch is validated first: one unknown arm, non-finite reward or bad context
        raises and nothing is learnt.
        """
        idx = self.arm_indices(block_sizes)
        r = self.check_rewards(rewards, len(idx))
        X, _ = self.check_contexts(contexts, len(idx))
        self._update_batch(X, idx, r)
        self.version += len(idx)

    def update_repeated(
        self,
        context: Sequence[float] | np.ndarray | None,
        block_size: int,
        rewards: Sequence[float] | np.ndarray,
    ) -> None:
        """Feed back several rewards of one block size at one context (the rows of one batched
        round). By default the same as :meth:`update_batch` with the context repeated; linear
        policies learn them in one step (the same posterior, a fraction of the time).
        Bad input raises and changes nothing."""
        arm = self.arm_index(block_size)
        r = self.check_rewards(rewards)
        ctx = self.check_context(context)
        if r.size:
            self._update_repeated(ctx, arm, r)
            self.version += int(r.size)

    def _update_repeated(self, context: np.ndarray | None, arm: int, rewards: np.ndarray) -> None:
        """Vectorise in subclasses; inputs are validated."""
        X = None if context is None else np.repeat(context[None], rewards.size, axis=0)
        self._update_batch(X, np.full(rewards.size, arm, dtype=np.int64), rewards)

    def _choose_batch(self, X: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Vectorise in subclasses; ``X`` is validated (or None)."""
        idx = np.empty(n, dtype=np.int64)
        prop = np.empty(n, dtype=np.float64)
        for t in range(n):
            i, probs = self._choose(None if X is None else X[t])
            idx[t], prop[t] = i, probs[i]
        return idx, prop

    def probs_batch(self, contexts: np.ndarray | None = None, n: int | None = None) -> np.ndarray:
        """``(n, K)`` probabilities the policy would give each request now, without learning.

        For off-policy evaluation of this policy as a target. Thompson-style policies estimate
        them by Monte-Carlo (and so draw from the generator).
        """
        X, n = self.check_contexts(contexts, n)
        return self._probs_batch(X, n)

    def _probs_batch(self, X: np.ndarray | None, n: int) -> np.ndarray:
        """Vectorise in subclasses."""
        out = np.empty((n, len(self.arms)))
        for t in range(n):
            out[t] = self._mix(self._probs(None if X is None else X[t]))
        return out

    def _update_batch(self, X: np.ndarray | None, idx: np.ndarray, rewards: np.ndarray) -> None:
        """Vectorise in subclasses; inputs are validated. Must equal sequential ``_update`` calls."""
        for t in range(len(idx)):
            self._update(None if X is None else X[t], int(idx[t]), float(rewards[t]))

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this policy is.

        A plain dict: ``name``, ``label``, ``arms``, ``version``, ``dim``, ``rng`` (the numpy bit
        generator's state) and ``state`` (the subclass's learnt statistics: numpy arrays and
        plain values, nested dicts allowed). It is a copy: later updates do not change it.
        Hyper-parameters are not in it: load it into a policy built with the same ones.
        """
        return copy.deepcopy(
            {
                "name": self.name,
                "label": self.label,
                "arms": list(self.arms),
                "version": self.version,
                "dim": self.dim,
                "rng": self.rng.bit_generator.state,
                "state": self._state(),
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict``; the arms and the policy type must match.

        A state that does not fit raises and leaves this policy as it was.
        """
        if not isinstance(state, dict) or "state" not in state or "rng" not in state:
            raise AdaptspecError("not a policy state_dict (needs 'name', 'arms', 'rng', 'state')")
        if state.get("name") != self.name:
            raise AdaptspecError(f"state is for policy {state.get('name')!r}, not {self.name!r}")
        if "label" in state and state["label"] != self.label:
            raise AdaptspecError(f"state is for policy {state['label']!r}, not {self.label!r}")
        if tuple(state.get("arms", ())) != self.arms:
            raise AdaptspecError(f"state has arms {state.get('arms')}, this policy has {list(self.arms)}")
        backup = self.state_dict()
        state = copy.deepcopy(state)
        try:
            self.rng.bit_generator.state = state["rng"]
            self.version = int(state["version"])
            dim = state.get("dim")
            self.dim = None if dim is None else int(dim)
            self._load_state(state["state"])
            fault = self.state_fault()
            if fault is not None:
                raise AdaptspecError(f"state refused: {fault}")
        except AdaptspecError:
            self._restore(backup)
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            self._restore(backup)
            raise AdaptspecError(f"state_dict does not fit this {self.name} policy: {e!r}") from None

    def state_fault(self) -> str | None:
        """Where the learnt state holds a number that is not finite (NaN, or an infinity outside
        :attr:`infinite_ok`), in words; None when every number is finite. Checkpoints are written
        and loaded only without one: bounded rewards and contexts (:data:`~adaptspec.speculator.REWARD_LIMIT`,
        :data:`CONTEXT_LIMIT`) keep a learner's sums finite, and a state that is not came from elsewhere."""
        for key, value in self._state().items():
            fault = _non_finite(value, str(key), self.infinite_ok.get(key))
            if fault is not None:
                return fault
        return None

    def _restore(self, backup: dict[str, Any]) -> None:
        self.rng.bit_generator.state = backup["rng"]
        self.version = backup["version"]
        self.dim = backup["dim"]
        self._load_state(backup["state"])

    def save_state(self, path: str | os.PathLike) -> None:
        """Write ``state_dict()`` to ``path`` (a ``.npz`` file: arrays as entries, the rest as JSON)."""
        arrays: dict[str, np.ndarray] = {}

        def pack(obj: Any, key: str) -> Any:
            if isinstance(obj, np.ndarray):
                arrays[key] = obj
                return {"__array__": key}
            if isinstance(obj, dict):
                return {str(k): pack(v, f"{key}/{k}") for k, v in obj.items()}
            if isinstance(obj, (list, tuple)):
                return [pack(v, f"{key}/{i}") for i, v in enumerate(obj)]
            if isinstance(obj, np.generic):
                return obj.item()
            return obj

        meta = pack(self.state_dict(), "s")
        blob = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        with open(path, "wb") as f:
            np.savez(f, __meta__=blob, **arrays)

    def load_state(self, path: str | os.PathLike) -> None:
        """Load a file written by ``save_state`` (same checks as ``load_state_dict``)."""
        from .._util.checks import read_npz
        from .._util.files import parse_json

        arrays = read_npz(path, "policy state file", ("__meta__",))
        meta = parse_json(
            arrays.pop("__meta__").tobytes(), f"{path}: array '__meta__'", "the policy's JSON description"
        )

        def unpack(obj: Any) -> Any:
            if isinstance(obj, dict):
                if set(obj) == {"__array__"}:
                    if obj["__array__"] not in arrays:
                        raise AdaptspecError(f"{path}: policy state file has no array {obj['__array__']!r}")
                    return arrays[obj["__array__"]]
                return {k: unpack(v) for k, v in obj.items()}
            if isinstance(obj, list):
                return [unpack(v) for v in obj]
            return obj

        try:
            self.load_state_dict(unpack(meta))
        except AdaptspecError as e:
            raise AdaptspecError(f"{path}: {e}") from None

    # ------------------------------------------------------------------ shared checks
    def arm_index(self, block_size: int) -> int:
        """Position of ``block_size`` in ``arms``; an unknown arm raises."""
        try:
            if isinstance(block_size, (bool, np.bool_)):
                raise TypeError
            i = self._index.get(block_size)
            return i if i is not None else self._index[operator.index(block_size)]
        except (KeyError, TypeError, ValueError):
            raise AdaptspecError(
                f"unknown arm {block_size!r}: this policy's arms are {list(self.arms)}"
            ) from None

    @staticmethod
    def check_reward(reward: float) -> float:
        """A reward as :func:`adaptspec.reward.functions.check_reward` takes it: a real number,
        finite, of plausible size (so the learnt sums stay finite)."""
        return check_reward(reward)

    def check_context(self, context: Sequence[float] | np.ndarray | None) -> np.ndarray | None:
        """Validate a context: a finite 1-D vector of the policy's dimension (None if context-free).

        The first valid context fixes ``dim`` when it was not given; an invalid one changes nothing.
        """
        if not self.contextual:
            return None
        if context is None:
            raise AdaptspecError(f"{self.name} is contextual: it needs a feature vector, got None")
        if type(context) is np.ndarray and context.dtype is _F64:
            x = context
        else:
            try:
                x = np.asarray(context, dtype=np.float64)
            except (TypeError, ValueError):
                raise AdaptspecError(
                    f"context must be a vector of numbers, got {type(context).__name__}"
                ) from None
        if x.ndim != 1:
            raise AdaptspecError(f"context must be a 1-D vector, got shape {x.shape}")
        if self.dim is not None and x.shape[0] != self.dim:
            raise AdaptspecError(f"context has {x.shape[0]} features, {self.name} expects {self.dim}")
        # one cheap dot: NaN, infinite and implausibly large values all fail it; only then look closer
        if not float(x.dot(x)) <= _CONTEXT_LIMIT_SQ:  # (no errstate: it would double the check's cost)
            raise context_fault(x)
        if self.dim is None:
            self.dim = int(x.shape[0])
        return x

    def check_contexts(
        self, contexts: np.ndarray | None, n: int | None = None
    ) -> tuple[np.ndarray | None, int]:
        """Validate a batch of contexts: an ``(n, dim)`` finite array (None for context-free policies)."""
        if not self.contextual:
            if contexts is not None:
                n_c = len(contexts)
                if n is not None and n_c != n:
                    raise AdaptspecError(f"got {n_c} contexts for {n} requests")
                return None, n_c
            if n is None:
                raise AdaptspecError("decide_batch needs contexts or n")
            return None, int(n)
        if contexts is None:
            raise AdaptspecError(f"{self.name} is contextual: it needs a feature matrix, got None")
        try:
            X = np.asarray(contexts, dtype=np.float64)
        except (TypeError, ValueError):
            raise AdaptspecError("contexts must be a 2-D array of numbers") from None
        if X.ndim != 2:
            raise AdaptspecError(f"contexts must be a 2-D array (requests x features), got shape {X.shape}")
        if n is not None and X.shape[0] != n:
            raise AdaptspecError(f"got {X.shape[0]} contexts for {n} requests")
        if self.dim is not None and X.shape[1] != self.dim:
            raise AdaptspecError(f"contexts have {X.shape[1]} features, {self.name} expects {self.dim}")
        with np.errstate(over="ignore", invalid="ignore"):
            bad = ~(np.einsum("ij,ij->i", X, X) <= _CONTEXT_LIMIT_SQ)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise context_fault(X[i], f"context {i}")
        if self.dim is None and X.shape[0] > 0:
            self.dim = int(X.shape[1])
        return X, int(X.shape[0])

    def arm_indices(self, block_sizes: Sequence[int] | np.ndarray) -> np.ndarray:
        """Positions of many block sizes in ``arms`` (int64); any unknown arm raises."""
        b = np.asarray(block_sizes)
        if b.ndim != 1:
            raise AdaptspecError(f"block sizes must be a 1-D array, got shape {b.shape}")
        if b.size == 0:
            return np.empty(0, dtype=np.int64)
        if not (
            np.issubdtype(b.dtype, np.integer)
            or (np.issubdtype(b.dtype, np.floating) and np.all(np.isfinite(b)) and np.all(b == np.round(b)))
        ):
            raise AdaptspecError(f"block sizes must be integers, got dtype {b.dtype}")
        b = b.astype(np.int64)
        pos = np.searchsorted(self.arm_array, b)
        pos_c = np.minimum(pos, len(self.arms) - 1)
        bad = self.arm_array[pos_c] != b
        if bad.any():
            raise AdaptspecError(
                f"unknown arm {int(b[np.argmax(bad)])}: this policy's arms are {list(self.arms)}"
            )
        return pos_c.astype(np.int64)

    @staticmethod
    def check_rewards(rewards: Sequence[float] | np.ndarray, n: int | None = None) -> np.ndarray:
        """Validate a batch of rewards: finite numbers, ``n`` of them."""
        try:
            r = np.asarray(rewards, dtype=np.float64)
        except (TypeError, ValueError):
            raise AdaptspecError("rewards must be numbers") from None
        if r.ndim != 1:
            raise AdaptspecError(f"rewards must be a 1-D array, got shape {r.shape}")
        if n is not None and r.shape[0] != n:
            raise AdaptspecError(f"got {r.shape[0]} rewards for {n} block sizes")
        bad = ~(np.abs(r) <= REWARD_LIMIT)  # NaN, infinite or implausibly large
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise AdaptspecError(f"reward {i} must be finite and within +-{REWARD_LIMIT:g}, got {r[i]}")
        return r

    def _mix(self, probs: np.ndarray) -> np.ndarray:
        if self.epsilon > 0.0:
            probs = (1.0 - self.epsilon) * probs + self.epsilon / len(self.arms)
        return probs

    def _draw(self, probs: np.ndarray) -> int:
        """One arm index drawn from ``probs`` with the policy's generator (no draw when one arm has all the mass)."""
        k = len(probs)
        if k == 1:
            return 0
        j = int(np.argmax(probs))
        if probs[j] >= 1.0:
            return j
        u = self.rng.random()
        c = np.cumsum(probs)
        return int(min(np.searchsorted(c, u * c[-1], side="right"), k - 1))

    def _draw_many(self, probs: np.ndarray) -> np.ndarray:
        """One arm index per row of ``probs`` (n, K), one uniform draw per row."""
        c = np.cumsum(probs, axis=1)
        u = self.rng.random(probs.shape[0]) * c[:, -1]
        return np.minimum((c <= u[:, None]).sum(axis=1), probs.shape[1] - 1).astype(np.int64)

    @staticmethod
    def _batch_size(contexts: np.ndarray | None, n: int | None) -> int:
        if contexts is not None:
            return len(contexts)
        if n is None:
            raise AdaptspecError("decide_batch needs contexts or n")
        return int(n)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(arms={list(self.arms)})"


def _non_finite(value: Any, path: str, allowed: Any = None) -> str | None:
    """Where ``value`` (a learnt state's entry: arrays, numbers, nested dicts and lists) holds a
    number that is not finite, in words; infinities at ``allowed`` (indices of an array) pass."""
    if isinstance(value, dict):
        return next((f for k, v in value.items() if (f := _non_finite(v, f"{path}/{k}")) is not None), None)
    if isinstance(value, (list, tuple)):
        return next(
            (f for i, v in enumerate(value) if (f := _non_finite(v, f"{path}/{i}")) is not None), None
        )
    if isinstance(value, (float, np.floating)):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "fc":
        return None
    bad = ~np.isfinite(value)
    if allowed is not None and bad.any():
        bad = bad.copy()
        bad[allowed] &= np.isnan(value[allowed])
    if not bad.any():
        return None
    where = np.unravel_index(int(np.flatnonzero(bad)[0]), value.shape) if value.ndim else ()
    return f"{path}{list(map(int, where)) if where else ''} is {value[where].item()!r} (a learnt state holds finite numbers)"


def context_fault(x: np.ndarray, what: str = "context") -> AdaptspecError:
    """The error for a context outside :data:`CONTEXT_LIMIT` (NaN, infinite or implausibly large values)."""
    have = "have" if what.endswith("s") else "has"
    if not np.isfinite(x).all():
        return AdaptspecError(f"{what} {have} NaN or infinite values")
    return AdaptspecError(
        f"{what} {have} values of implausible size (the largest is {float(np.abs(x).max()):.3g}; "
        f"a context's norm is at most {CONTEXT_LIMIT:g})"
    )


def feature_vector(features: Any) -> np.ndarray:
    """A request's prefill features as a float64 vector: 1-D, non-empty, finite and within
    :data:`CONTEXT_LIMIT` (one :class:`AdaptspecError` otherwise); its width is the caller's to check."""
    try:
        x = np.asarray(features, dtype=np.float64)
    except (TypeError, ValueError):
        raise AdaptspecError(f"features must be a vector of numbers, got {type(features).__name__}") from None
    if x.ndim != 1 or x.size == 0:
        raise AdaptspecError(f"features must be a non-empty 1-D vector, got shape {x.shape}")
    if (
        not float(x.dot(x)) <= CONTEXT_LIMIT * CONTEXT_LIMIT
    ):  # NaN, infinite and implausibly large values fail
        raise context_fault(x, "features")
    return x


def one_hot(k: int, i: int) -> np.ndarray:
    """Probability vector that puts all mass on arm ``i``."""
    p = np.zeros(k)
    p[i] = 1.0
    return p


#: default number of Monte-Carlo draws used to estimate Thompson sampling's propensities
MC_SAMPLES = 512


def greedy_probs(scores: np.ndarray) -> np.ndarray:
    """Uniform probability over the arms with the highest score (ties share the mass).

    >>> greedy_probs(np.array([1.0, 3.0, 3.0]))
    array([0. , 0.5, 0.5])
    """
    j = scores.argmax()
    m = scores == scores[j]
    c = np.count_nonzero(m)
    if c == 1:
        p = np.zeros(scores.shape[0])
        p[j] = 1.0
        return p
    return m / c
