"""Shared machinery of the linear-model policies (LinUCB, LinTS, NeuralLinear, SquareCB): the
feature map, the ridge statistics (:mod:`adaptspec.policies.ridge`) and the warm-up that
freezes the standardiser (:mod:`adaptspec.policies.standardizer`).

Feature standardisation
-----------------------
The statistics live in the standardised space, so the standardiser must not move once
statistics depend on it. Three ways, chosen with ``standardize``:

- ``True`` (default): a warm-up. The first ``warmup`` updates are buffered while decisions are
  uniformly random (propensity 1/K). When the buffer is full, the feature means and scales and
  the reward mean and scale are computed from it and frozen, and the buffered updates are
  replayed into the statistics in the standardised space. From then on every statistic and
  every new context use the same frozen map, so the statistics are exactly those of a ridge
  regression on standardised data. Rewards are standardised too, so ``alpha``, ``lam`` and
  the noise prior are scale-free.
- a :class:`Standardizer` (for example ``Standardizer.fit(X, rewards)`` on offline data, or the
  one an offline head was trained with): used from the first request, no warm-up. Priors
  (``prior_mean``, ``prior_precision``) are expressed in this space, so a prior requires this
  form (or ``False``).
- ``False``: raw features and raw rewards.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from . import ridge_kernels
from .base import _F64, Policy
from .ridge import DiscountedRidgeArms, RidgeArms, prior_arrays
from .standardizer import Standardizer


class LinearPolicy(Policy):
    """Shared machinery of the linear-model policies (LinUCB, LinTS, NeuralLinear, SquareCB).

    Subclasses turn the per-arm posterior mean ``mu`` and ``var = phi^T A^-1 phi`` (model
    units) into probabilities with :meth:`_probs_from`.
    """

    contextual = True
    #: whether ``_probs_from`` draws random numbers (Thompson-style)
    _stochastic = False

    def __init__(
        self,
        arms: Sequence[int],
        *,
        lam: float = 1.0,
        standardize: bool | Standardizer = True,
        warmup: int | None = None,
        fit_intercept: bool = True,
        prior_mean: Any = None,
        prior_precision: Any = None,
        discount: float | None = None,
        noise: float | str = "auto",
        noise_prior: tuple[float, float] = (1.0, 10.0),
        epsilon: float = 0.0,
        seed: int | None = None,
        dim: int | None = None,
        feature_map: Any = None,
    ) -> None:
        k = len(arms)
        if not (lam > 0 and math.isfinite(lam)):
            raise AdaptspecError(f"lam must be > 0, got {lam}")
        if discount is not None and not 0.0 < discount <= 1.0:
            raise AdaptspecError(f"discount must be in (0, 1], got {discount}")
        if not (noise == "auto" or (isinstance(noise, (int, float)) and noise > 0 and math.isfinite(noise))):
            raise AdaptspecError(f"noise must be 'auto' or a positive number, got {noise!r}")
        if not (noise_prior[0] > 0 and noise_prior[1] > 0):
            raise AdaptspecError(f"noise_prior must be (variance > 0, weight > 0), got {noise_prior}")
        self.lam = float(lam)
        self.fit_intercept = bool(fit_intercept)
        self.discount = None if discount in (None, 1.0) else float(discount)
        self.noise = noise
        self.noise_prior = (float(noise_prior[0]), float(noise_prior[1]))
        self._fixed_map = None
        if feature_map is not None:
            self._fixed_map = feature_map
            dim = feature_map.in_dim
        elif isinstance(standardize, Standardizer):
            if dim is not None and dim != standardize.in_dim:
                raise AdaptspecError(f"dim={dim} but the standardizer has {standardize.in_dim} features")
            self._fixed_map = standardize
            dim = standardize.in_dim
        elif standardize is False:
            if dim is not None:
                self._fixed_map = Standardizer.identity(dim, self.fit_intercept)
        elif standardize is not True:
            raise AdaptspecError(f"standardize must be True, False or a Standardizer, got {standardize!r}")
        self.standardize = standardize if feature_map is None else False
        if self.standardize is True:
            if prior_mean is not None or prior_precision is not None:
                raise AdaptspecError(
                    "a prior is expressed in the standardised feature space: pass standardize="
                    "Standardizer(...) (or False) together with prior_mean / prior_precision"
                )
            warmup = 10 * k if warmup is None else int(warmup)
            if warmup < 2:
                raise AdaptspecError(f"warmup must be >= 2 to estimate scales, got {warmup}")
        self.warmup = warmup if self.standardize is True else 0
        if prior_mean is not None or prior_precision is not None:
            if self._fixed_map is None:
                raise AdaptspecError("a prior needs the context dimension: pass dim= (or a Standardizer)")
            prior_arrays(k, self._fixed_map.out_dim, prior_mean, prior_precision, self.lam)  # validate now
        self._prior = (prior_mean, prior_precision)
        ridge_kernels.warm_up()  # compile now, not in the first decision
        super().__init__(arms, seed=seed, epsilon=epsilon, dim=dim)

    # -------------------------------------------------------------- structure
    def _make_core(self, dim_out: int) -> RidgeArms | DiscountedRidgeArms:
        pm, pp = self._prior
        if self.discount is not None:
            return DiscountedRidgeArms(len(self.arms), dim_out, self.discount, self.lam, pm, pp)
        return RidgeArms(len(self.arms), dim_out, self.lam, pm, pp)

    def _reset(self) -> None:
        self.map: Standardizer | Any = self._fixed_map
        if self.map is None and self.standardize is False and self.dim is not None:
            self.map = self._fixed_map = Standardizer.identity(self.dim, self.fit_intercept)
        self.core = self._make_core(self.map.out_dim) if self.map is not None else None
        self.noise_stats = np.zeros(2)
        self._sigma: float | None = None
        self._last: tuple | None = None
        self._buf_X: np.ndarray | None = None
        self._buf_a = np.zeros(self.warmup, dtype=np.int64)
        self._buf_r = np.zeros(self.warmup)
        self._buf_n = 0

    def set_prior(self, mean: Any = None, precision: Any = None) -> None:
        """Set the per-arm prior (in the feature map's space) and forget all feedback.

        ``mean``: (D,) or (K, D); ``precision``: a number, (K,), (D,), (K, D) (diagonals) or
        (K, D, D). Needs a fixed feature map (``standardize`` a Standardizer or False).
        """
        if self.standardize is True:
            raise AdaptspecError(
                "set_prior needs a fixed standardizer (standardize=Standardizer(...) or False)"
            )
        if self.map is None:
            raise AdaptspecError("set_prior needs the context dimension: pass dim= when building the policy")
        prior_arrays(len(self.arms), self.map.out_dim, mean, precision, self.lam)  # validate first
        self._prior = (mean, precision)
        self.core = self._make_core(self.map.out_dim)
        self.noise_stats = np.zeros(2)
        self._sigma, self._last = None, None

    @property
    def warming_up(self) -> bool:
        """True while the standardiser is still being estimated (decisions are uniform)."""
        return self.core is None

    @property
    def noise_stats(self) -> np.ndarray:
        """Weighted count and weighted sum of squares of the prequential residuals (model units)."""
        return np.array([self._noise_n, self._noise_ss])

    @noise_stats.setter
    def noise_stats(self, value: np.ndarray) -> None:
        self._noise_n, self._noise_ss = (float(v) for v in value)
        self._sigma = None

    def _add_residual(self, err: float) -> None:
        """Count one prediction error in the noise estimate (decayed like the data)."""
        if self.discount is not None:
            self._noise_n *= self.discount
            self._noise_ss *= self.discount
        self._noise_n += 1.0
        self._noise_ss += err * err
        self._sigma = None

    def noise_std(self) -> float:
        """Current noise standard deviation in model (standardised) units."""
        if self._sigma is None:
            self._sigma = self._noise_std()
        return self._sigma

    def _noise_std(self) -> float:
        if self.noise != "auto":
            v = float(self.noise)
            return v / self.map.reward_scale if self.map is not None else v
        s0, n0 = self.noise_prior
        return math.sqrt((n0 * s0 + self._noise_ss) / (n0 + self._noise_n))

    # -------------------------------------------------------------- deciding
    def _probs_from(self, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _probs_from_many(self, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        return np.stack([self._probs_from(mu[i], var[i]) for i in range(mu.shape[0])])

    def _ensure_core(self) -> None:
        """Build the identity map and the statistics once the dimension is known (standardize=False)."""
        if self.core is None and self.standardize is False and self.dim is not None:
            if self._fixed_map is None:
                self._fixed_map = Standardizer.identity(self.dim, self.fit_intercept)
            self.map = self._fixed_map
            self.core = self._make_core(self.map.out_dim)

    def _choose(self, context: np.ndarray | None) -> tuple[int, np.ndarray]:
        self._ensure_core()
        core = self.core
        if core is None:
            probs = np.full(len(self.arms), 1.0 / len(self.arms))
            return self._draw(probs), probs
        phi = self._phi_of(context)
        mu, var = core.mean_var(phi)
        probs = self._mix(self._probs_from(mu, var))
        return self._draw(probs), probs

    def _check_update_context(self, context: Any) -> np.ndarray | None:
        """A context equal to the one of the last decision (the update of the request just
        decided) was validated then, so it is not checked twice."""
        last = self._last
        if (
            last is not None
            and type(context) is np.ndarray
            and context.ndim == 1
            and context.dtype is _F64
            and context.tobytes() == last[0]
        ):
            return context
        return self.check_context(context)

    def _phi_of(self, context: np.ndarray) -> np.ndarray:
        """Features of ``context``; the decision's are kept for the update of the same request
        (a request is decided, then updated, usually with nothing learnt in between)."""
        last = self._last
        if last is not None and last[2] == self.version and last[0] == context.tobytes():
            return last[1]
        phi = self.map.phi(context)
        self._last = (context.tobytes(), phi, self.version)
        return phi

    def _choose_batch(self, X: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        k = len(self.arms)
        self._ensure_core()
        if self.core is None:
            probs = np.full((n, k), 1.0 / k)
        else:
            mu, var = self.core.mean_var_many(self.map.phi_many(X))
            probs = self._mix(self._probs_from_many(mu, var))
        idx = self._draw_many(probs)
        return idx, probs[np.arange(n), idx]

    def _probs_batch(self, X: np.ndarray | None, n: int) -> np.ndarray:
        self._ensure_core()
        if self.core is None:
            return np.full((n, len(self.arms)), 1.0 / len(self.arms))
        mu, var = self.core.mean_var_many(self.map.phi_many(X))
        return self._mix(self._probs_from_many(mu, var))

    def predict(self, contexts: np.ndarray) -> np.ndarray:
        """Posterior mean reward of every arm, in reward units: (n, d) -> (n, K)."""
        X, _ = self.check_contexts(np.atleast_2d(contexts))
        if self.core is None:
            raise AdaptspecError(f"{self.name} is still warming up ({self._buf_n}/{self.warmup} updates)")
        mu, _ = self.core.mean_var_many(self.map.phi_many(X))
        return self.map.reward_back(mu)

    # -------------------------------------------------------------- learning
    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        self._ensure_core()
        core = self.core
        if core is None:
            self._buffer(context, arm, reward)
            return
        r = self.map.reward(reward)
        phi = self._phi_of(context)
        self._last = None
        err = core.update(arm, phi, r)  # the prequential residual: before this reward is learnt
        self._add_residual(err)

    def _update_full(self, context: np.ndarray | None, rewards: np.ndarray, observed: np.ndarray) -> None:
        """Every observed arm learns its reward at this context: one ridge update per arm, as
        if each had run (used by the full-information subclasses, ``full_feedback``)."""
        for a in np.flatnonzero(observed).tolist():
            self._update(context, a, float(rewards[a]))

    def _update_repeated(self, context: np.ndarray | None, arm: int, rewards: np.ndarray) -> None:
        """``n`` rewards at one context, one step: adding ``sqrt(n) phi`` with reward
        ``sqrt(n) mean(r)`` adds ``n phi phi^T`` to the precision and ``phi sum(r)`` to the
        moment vector, exactly what ``n`` rank-one updates add. The noise estimate counts ``n``
        residuals, each against the prediction before the round (sequential updates would
        measure the later ones against a model that had already moved)."""
        self._ensure_core()
        core = self.core
        if (
            core is None
            or rewards.size == 1
            or self.discount is not None
            or type(self)._update is not LinearPolicy._update
        ):
            # warming up (the buffer takes them one by one), decaying data (its clock counts
            # updates), or a subclass that learns more than the ridge statistics from each one
            super()._update_repeated(context, arm, rewards)
            return
        n = rewards.size
        r = np.asarray(self.map.reward(rewards), dtype=np.float64)
        mean = float(r.mean())
        phi = self._phi_of(context)
        self._last = None
        root = math.sqrt(n)
        err = core.update(arm, root * phi, root * mean) / root  # mean(r) - prediction before the round
        self._add_residuals(float(((r - mean) ** 2).sum()) + n * err * err, n)

    def _add_residuals(self, sum_sq: float, n: int) -> None:
        """Count ``n`` prediction errors whose squares sum to ``sum_sq`` (no discount)."""
        self._noise_n += n
        self._noise_ss += sum_sq
        self._sigma = None

    def _buffer(self, x: np.ndarray, arm: int, reward: float) -> None:
        if self._buf_X is None:
            self._buf_X = np.zeros((self.warmup, x.shape[0]))
        i = self._buf_n
        self._buf_X[i], self._buf_a[i], self._buf_r[i] = x, arm, reward
        self._buf_n += 1
        if self._buf_n == self.warmup:
            self.map = Standardizer.fit(self._buf_X, self._buf_r, self.fit_intercept)
            self.core = self._make_core(self.map.out_dim)
            X, a, r = self._buf_X, self._buf_a, self._buf_r
            self._buf_X, self._buf_n = None, 0
            for t in range(self.warmup):
                self._update(X[t], int(a[t]), float(r[t]))

    # -------------------------------------------------------------- state
    def _state(self) -> dict[str, Any]:
        st: dict[str, Any] = {
            "noise_stats": self.noise_stats,
            "buf_n": self._buf_n,
            "discount": self.discount,
        }
        if self._buf_X is not None:
            st.update(
                buf_X=self._buf_X[: self._buf_n],
                buf_a=self._buf_a[: self._buf_n],
                buf_r=self._buf_r[: self._buf_n],
            )
        if self.map is not None and self.standardize is True:
            st["map"] = self.map.to_dict()
        if self.core is not None:
            st["core"] = self.core.state()
        return st

    def _load_state(self, state: dict[str, Any]) -> None:
        if state.get("discount") != self.discount:
            raise AdaptspecError(
                f"state was saved with discount={state.get('discount')}, this policy has {self.discount}"
            )
        noise_stats = np.array(state["noise_stats"], dtype=np.float64)
        if noise_stats.shape != (2,):
            raise AdaptspecError("state 'noise_stats' must have 2 values")
        buf_n = int(state["buf_n"])
        if self.standardize is True:
            fmap = Standardizer.from_dict(state["map"]) if "map" in state else None
        else:
            fmap = self._fixed_map
            if fmap is None and self.dim is not None:
                fmap = Standardizer.identity(self.dim, self.fit_intercept)
        core = None
        if "core" in state:
            if fmap is None:
                raise AdaptspecError("state has statistics but no feature map")
            core = self._make_core(fmap.out_dim)
            core.load(state["core"])
        buf = None
        if buf_n:
            if core is not None or buf_n >= max(self.warmup, 1):
                raise AdaptspecError("state has a warm-up buffer that does not fit this policy")
            buf = (
                np.array(state["buf_X"], dtype=np.float64),
                np.array(state["buf_a"], dtype=np.int64),
                np.array(state["buf_r"], dtype=np.float64),
            )
            if buf[0].shape[0] != buf_n or buf[1].shape != (buf_n,) or buf[2].shape != (buf_n,):
                raise AdaptspecError("state warm-up buffer has inconsistent lengths")
        self.map, self.core, self.noise_stats = fmap, core, noise_stats
        self._sigma, self._last = None, None
        if self.standardize is False and fmap is not None:
            self._fixed_map = fmap
        self._buf_n = buf_n
        self._buf_X = None
        self._buf_a = np.zeros(self.warmup, dtype=np.int64)
        self._buf_r = np.zeros(self.warmup)
        if buf is not None:
            self._buf_X = np.zeros((self.warmup, buf[0].shape[1]))
            self._buf_X[:buf_n], self._buf_a[:buf_n], self._buf_r[:buf_n] = buf

    def __repr__(self) -> str:
        return f"{type(self).__name__}(arms={list(self.arms)}, dim={self.dim})"


def mc_probs(rng: np.random.Generator, mu: np.ndarray, sd: np.ndarray, m: int) -> np.ndarray:
    """Share of ``m`` joint draws ``N(mu, sd^2)`` in which each arm is the best (rows: requests)."""
    k = mu.shape[-1]
    if mu.ndim == 1:
        best = np.argmax(mu + sd * rng.standard_normal((m, k)), axis=1)
        return np.bincount(best, minlength=k) / m
    n = mu.shape[0]
    out = np.empty((n, k))
    step = max(1, 262_144 // (m * k))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        z = rng.standard_normal((hi - lo, m, k))
        best = np.argmax(mu[lo:hi, None, :] + sd[lo:hi, None, :] * z, axis=2)
        out[lo:hi] = (best[:, :, None] == np.arange(k)).sum(axis=1) / m
    return out
