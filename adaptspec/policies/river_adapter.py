"""River adapter: any ``river.bandit`` policy, or any river regressor as a per-arm reward model.

Two modes of :class:`RiverPolicy`:

- ``policy=`` a ``river.bandit`` policy (context-free, or contextual such as
  ``LinUCBDisjoint``). Contexts are passed to contextual ones as dicts ``{"x0": .., "x1": ..}``.
  Propensities: river policies only return an arm, so the adapter pulls the policy ``probe``
  times (its random generators are reseeded from the adapter's own generator before every
  decision, which keeps the whole adapter deterministic under ``seed``), estimates the
  probabilities as the pull frequencies and draws the arm from them: the logged propensity is
  exact given the probe. Policies that are argmax rules (``UCB``, ``BayesUCB``,
  ``LinUCBDisjoint``: randomness only breaks exact ties) are pulled once (propensity 1).
- ``regressor=`` a river regressor (for instance ``preprocessing.StandardScaler() |
  linear_model.LinearRegression()``): one clone per arm learns the reward from the context with
  ``learn_one``; decisions are greedy on ``predict_one`` (``exploration="greedy"``, add an
  ``epsilon`` floor to explore) or optimistic (``"ucb"``: prediction + ``c * sigma_a *
  sqrt(2 ln t / n_a)`` with ``sigma_a`` the arm's prequential residual std). Arms never played
  come first.

Every decision and update goes through python dicts, so this adapter is for experiments with
river's models, not the hot path (LinUCB here is ~20x faster than river's, see BENCHMARKS.md).
State round trips hold data only (:mod:`adaptspec.policies.river_state`): numbers, strings and
arrays, read into a fresh clone of the adapter's own river object, never a pickle, so loading a
``save_state`` file (a checkpoint) cannot run code; a pickled state (written by adaptspec before
this format) is refused with one line.
"""

from __future__ import annotations

import math
import random
from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from .base import Policy, greedy_probs

__all__ = ["RiverPolicy", "river_policy"]


def _argmax_policy_types() -> tuple[type, ...]:
    from river import bandit

    return (bandit.UCB, bandit.BayesUCB, bandit.LinUCBDisjoint)


class RiverPolicy(Policy):
    """Any ``river.bandit`` policy or river regressor behind the adaptspec policy protocol.

    Parameters
    ----------
    arms
        Block sizes.
    policy
        A ``river.bandit`` policy (``bandit.base.Policy`` or ``bandit.base.ContextualPolicy``).
    regressor
        A river regressor used as the per-arm reward model (exclusive with ``policy``).
    exploration
        Regressor mode: ``"greedy"`` or ``"ucb"``.
    c
        Regressor mode, UCB bonus weight.
    probe
        Bandit mode: pulls per decision to estimate the propensity (1 for argmax policies).
    epsilon, seed, dim
        As in :class:`~adaptspec.policies.base.Policy`.

    >>> from river import bandit, proba
    >>> pol = RiverPolicy([4, 8], policy=bandit.ThompsonSampling(reward_obj=proba.Beta()), seed=0)
    >>> for _ in range(100):
    ...     d = pol.decide()
    ...     pol.update(None, d.block_size, 1.0 if d.block_size == 8 else 0.0)
    >>> d = pol.decide()
    >>> d.block_size, d.policy
    (8, 'river:ThompsonSampling')

    >>> from river import linear_model, preprocessing
    >>> rng = np.random.default_rng(0)
    >>> reg = preprocessing.StandardScaler() | linear_model.LinearRegression()
    >>> pol = RiverPolicy([4, 8], regressor=reg, epsilon=0.1, seed=0)
    >>> for _ in range(300):
    ...     x = rng.normal(size=2)
    ...     d = pol.decide(x)
    ...     pol.update(x, d.block_size, x[0] if d.block_size == 4 else -x[0])
    >>> pol.decide([2.0, 0.0]).block_size, pol.decide([-2.0, 0.0]).block_size
    (4, 8)
    """

    name = "river"

    def __init__(
        self,
        arms: Sequence[int],
        policy: Any = None,
        regressor: Any = None,
        exploration: str = "greedy",
        c: float = 1.0,
        probe: int = 32,
        epsilon: float = 0.0,
        seed: int | None = None,
        dim: int | None = None,
        label: str | None = None,
    ) -> None:
        from river import bandit

        if (policy is None) == (regressor is None):
            raise AdaptspecError(
                "RiverPolicy needs exactly one of policy= (a river.bandit policy) or regressor="
            )
        if policy is not None and not isinstance(policy, bandit.base.Policy):
            raise AdaptspecError(f"policy must be a river.bandit policy, got {type(policy).__name__}")
        if regressor is not None and not (
            hasattr(regressor, "learn_one") and hasattr(regressor, "predict_one")
        ):
            raise AdaptspecError(
                f"regressor must be a river regressor (learn_one/predict_one), got {type(regressor).__name__}"
            )
        if exploration not in ("greedy", "ucb"):
            raise AdaptspecError(f"exploration must be 'greedy' or 'ucb', got {exploration!r}")
        if not (c >= 0 and math.isfinite(c)):
            raise AdaptspecError(f"c must be >= 0, got {c}")
        if int(probe) != probe or probe < 1:
            raise AdaptspecError(f"probe must be a positive integer, got {probe}")
        self.template = policy if policy is not None else regressor
        self.mode = "bandit" if policy is not None else "regressor"
        self.contextual = self.mode == "regressor" or isinstance(policy, bandit.base.ContextualPolicy)
        self.exploration, self.c = exploration, float(c)
        self.probe = 1 if (policy is not None and isinstance(policy, _argmax_policy_types())) else int(probe)
        self._keys: list[str] = []
        self._label = label
        super().__init__(arms, seed=seed, epsilon=epsilon, dim=dim)

    @property
    def label(self) -> str:
        return self._label or f"river:{type(self.template).__name__}"

    # ------------------------------------------------------------------ helpers
    def _dict(self, x: np.ndarray | None) -> dict[str, float] | None:
        if x is None:
            return None
        if len(self._keys) != x.shape[0]:
            self._keys = [f"x{i}" for i in range(x.shape[0])]
        return dict(zip(self._keys, x.tolist()))

    def _reset(self) -> None:
        if self.mode == "bandit":
            self.model = self.template.clone()
        else:
            self.models = [self.template.clone() for _ in self.arms]
            k = len(self.arms)
            self.n = np.zeros(k)
            self.rss = np.zeros(k)

    def _reseed(self) -> None:
        """Reseed every ``random.Random`` of the river policy (and of its per-arm reward objects)."""
        objs = [self.model]
        rewards = getattr(self.model, "_rewards", None)
        if isinstance(rewards, dict):
            objs += list(rewards.values())
        for o in objs:
            for v in vars(o).values():
                if isinstance(v, random.Random):
                    v.seed(int(self.rng.integers(2**62)))

    # ------------------------------------------------------------------ protocol
    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        k = len(self.arms)
        if self.mode == "bandit":
            ids = list(self.arms)
            xd = self._dict(context)
            self._reseed()
            counts = np.zeros(k)
            for _ in range(self.probe):
                a = self.model.pull(ids, context=xd) if self.contextual else self.model.pull(ids)
                counts[self.arm_index(a)] += 1.0
            return counts / self.probe
        unplayed = self.n == 0
        if unplayed.any():
            return unplayed / unplayed.sum()
        xd = self._dict(context)
        pred = np.array([float(m.predict_one(xd)) for m in self.models])
        if self.exploration == "ucb":
            sigma = np.sqrt(self.rss / self.n)
            pred = pred + self.c * sigma * np.sqrt(2.0 * math.log(max(self.n.sum(), math.e)) / self.n)
        return greedy_probs(pred)

    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        xd = self._dict(context)
        if self.mode == "bandit":
            if self.contextual:
                self.model.update(self.arms[arm], xd, reward)
            else:
                self.model.update(self.arms[arm], reward)
            return
        m = self.models[arm]
        err = reward - float(m.predict_one(xd))
        m.learn_one(xd, reward)
        self.n[arm] += 1.0
        self.rss[arm] += err * err

    # ------------------------------------------------------------------ state
    def _state(self) -> dict[str, Any]:
        from .river_state import dump

        if self.mode == "bandit":
            return {"mode": self.mode, "model": dump(self.model)}
        return {"mode": self.mode, "models": [dump(m) for m in self.models], "n": self.n, "rss": self.rss}

    def _load_state(self, state: dict[str, Any]) -> None:
        from .river_state import fill

        if not isinstance(state, dict):
            raise AdaptspecError("not a river policy's state")
        if "pickle" in state:
            raise AdaptspecError(
                "holds a pickled river state (written by an older adaptspec): refused, unpickling "
                "a file can run code; remove this checkpoint to resume from the decision log"
            )
        if state.get("mode") != self.mode:
            raise AdaptspecError(
                f"state is for a river {state.get('mode')} policy, this one is a {self.mode} policy"
            )
        if self.mode == "bandit":
            self.model = fill(self.template.clone(), state["model"])
            return
        k = len(self.arms)
        nodes = state["models"]
        n, rss = np.array(state["n"], dtype=np.float64), np.array(state["rss"], dtype=np.float64)
        if not isinstance(nodes, list) or len(nodes) != k or n.shape != (k,) or rss.shape != (k,):
            raise AdaptspecError(f"state has models for a different number of arms (expected {k})")
        self.models, self.n, self.rss = [fill(self.template.clone(), m) for m in nodes], n, rss

    def __repr__(self) -> str:
        return f"RiverPolicy(arms={list(self.arms)}, {self.mode}={type(self.template).__name__})"


#: ``river:NAME`` spec presets: name -> (kind, builder(seed, **params))
def _presets() -> dict[str, tuple[str, Any]]:
    from river import bandit, linear_model, preprocessing, proba

    return {
        "ucb": ("policy", lambda seed, delta=1.0, **kw: bandit.UCB(delta=delta, seed=seed, **kw)),
        "eps-greedy": (
            "policy",
            lambda seed, epsilon=0.1, **kw: bandit.EpsilonGreedy(epsilon=epsilon, seed=seed, **kw),
        ),
        "ts": (
            "policy",
            lambda seed, burn_in=2, **kw: bandit.ThompsonSampling(
                reward_obj=proba.Gaussian(), burn_in=burn_in, seed=seed, **kw
            ),
        ),
        "exp3": ("policy", lambda seed, gamma=0.1, **kw: bandit.Exp3(gamma=gamma, seed=seed, **kw)),
        "linucb": ("policy", lambda seed, **kw: bandit.LinUCBDisjoint(seed=seed, **kw)),
        "random": ("policy", lambda seed, **kw: bandit.RandomPolicy(seed=seed, **kw)),
        "linear": (
            "regressor",
            lambda seed, **kw: preprocessing.StandardScaler() | linear_model.LinearRegression(**kw),
        ),
    }


def river_policy(
    arms: Sequence[int],
    seed: int | None = None,
    model: str = "linear",
    exploration: str = "greedy",
    c: float = 1.0,
    probe: int = 32,
    epsilon: float = 0.0,
    **params: Any,
) -> RiverPolicy:
    """Build a :class:`RiverPolicy` from a preset name (the ``river:NAME,key=value`` spec).

    Presets: ``ucb``, ``eps-greedy``, ``ts`` (Gaussian reward distributions, two burn-in pulls
    per arm: river's Gaussian samples 0 for an arm it has not seen), ``exp3``,
    ``linucb`` (``LinUCBDisjoint``), ``random`` (river.bandit policies) and ``linear``
    (``StandardScaler | LinearRegression`` per arm, with ``exploration`` greedy or ucb).
    Other ``key=value`` options go to the river constructor.

    >>> river_policy([4, 8], model="ucb", seed=0).label
    'river:ucb'
    """
    presets = _presets()
    if model not in presets:
        raise AdaptspecError(f"unknown river model {model!r}: choose one of {', '.join(presets)}")
    kind, build = presets[model]
    try:
        obj = build(seed, **params)
    except TypeError as e:
        raise AdaptspecError(f"river:{model}: {e}") from None
    label = f"river:{model}"
    if kind == "policy":
        return RiverPolicy(arms, policy=obj, probe=probe, epsilon=epsilon, seed=seed, label=label)
    return RiverPolicy(
        arms, regressor=obj, exploration=exploration, c=c, epsilon=epsilon, seed=seed, label=label
    )
