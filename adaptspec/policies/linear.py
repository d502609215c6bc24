"""Contextual linear bandits: LinUCB (Li et al. 2010) and linear Thompson sampling (Agrawal &
Goyal 2013), with per-arm Bayesian ridge statistics kept as stacked numpy arrays.

Model and statistics
--------------------
Each arm ``a`` has a linear model ``r = theta_a . phi(x) + noise`` on a feature map ``phi``
(standardised context plus an intercept). Its ridge / Gaussian posterior is, in "ridge form",

    A_a = P_a + sum phi phi^T,     b_a = P_a m_a + sum r phi,     theta_a = A_a^-1 b_a,

with prior mean ``m_a`` and prior precision ``P_a`` (``lam * I`` unless set: that is how an
offline model warm-starts the policy). The posterior covariance is ``sigma^2 A_a^-1``, with the
noise ``sigma`` estimated online from the prequential residuals (or fixed).

:class:`RidgeArms` keeps ``A^-1`` as a ``(K, D, D)`` array and ``theta`` as ``(K, D)``; an
update is one Sherman-Morrison step, O(D^2), and a decision for all K arms is one batched
matrix-vector product; no matrix is ever inverted after the prior is set.

Drift: with ``discount=gamma`` the data part of the statistics decays,
``A_a = P_a + sum_s w_s phi_s phi_s^T`` with ``w_s`` about ``gamma^(age of s in updates)``
(the prior does not decay, as in D-LinUCB, Russac et al. 2019), over all arms, so an arm that
is not played sees its confidence widen back towards the prior's. Decaying every arm at every
update is not a rank-one change, so :class:`DiscountedRidgeArms` applies the decay in blocks of
``every`` updates (weights ``gamma^(every * blocks since s)``), recomputing the inverses once
per block; between blocks it is the same Sherman-Morrison core.

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
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy.linalg.blas import dger as _dger

from ..errors import AdaptspecError
from . import ridge_kernels
from .base import _F64, Policy
from .mab import MC_SAMPLES, greedy_probs

__all__ = ["Standardizer", "RidgeArms", "DiscountedRidgeArms", "LinearPolicy", "LinUCB", "LinTS"]


# ---------------------------------------------------------------------------------- maps
@dataclass
class Standardizer:
    """Frozen affine maps: ``x -> (x - mean) / scale`` (plus an intercept 1) and
    ``r -> (r - reward_mean) / reward_scale``.

    >>> st = Standardizer.fit(np.array([[0.0, 10.0], [2.0, 30.0]]), np.array([1.0, 3.0]))
    >>> st.phi(np.array([1.0, 20.0])).tolist(), st.reward(3.0)
    ([0.0, 0.0, 1.0], 1.0)
    """

    mean: np.ndarray
    scale: np.ndarray
    reward_mean: float = 0.0
    reward_scale: float = 1.0
    intercept: bool = True

    def __post_init__(self) -> None:
        self.mean = np.asarray(self.mean, dtype=np.float64).ravel()
        self.scale = np.asarray(self.scale, dtype=np.float64).ravel()
        if self.mean.shape != self.scale.shape:
            raise AdaptspecError(f"standardizer mean {self.mean.shape} and scale {self.scale.shape} differ")
        if not (np.isfinite(self.mean).all() and np.isfinite(self.scale).all() and (self.scale > 0).all()):
            raise AdaptspecError("standardizer needs finite means and positive finite scales")
        self.reward_mean, self.reward_scale = float(self.reward_mean), float(self.reward_scale)
        if not (math.isfinite(self.reward_mean) and math.isfinite(self.reward_scale) and self.reward_scale > 0):
            raise AdaptspecError("standardizer needs a finite reward mean and a positive reward scale")
        self._inv = 1.0 / self.scale

    @classmethod
    def fit(cls, X: np.ndarray, rewards: np.ndarray | None = None, intercept: bool = True) -> "Standardizer":
        """Means and scales of ``X`` (n, d); constant columns get scale 1."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[0] < 1 or not np.isfinite(X).all():
            raise AdaptspecError("Standardizer.fit needs a finite (n, d) array with n >= 1")
        sd = X.std(axis=0)
        sd = np.where(sd > 1e-8 * np.maximum(1.0, np.abs(X).max(axis=0)), sd, 1.0)
        rm, rs = 0.0, 1.0
        if rewards is not None:
            r = np.asarray(rewards, dtype=np.float64).ravel()
            if r.size and np.isfinite(r).all():
                rm = float(r.mean())
                rsd = float(r.std())
                rs = rsd if rsd > 1e-8 * max(1.0, abs(rm)) else max(abs(rm), 1.0)
        return cls(X.mean(axis=0), sd, rm, rs, intercept)

    @classmethod
    def identity(cls, d: int, intercept: bool = True) -> "Standardizer":
        return cls(np.zeros(d), np.ones(d), 0.0, 1.0, intercept)

    @property
    def in_dim(self) -> int:
        return int(self.mean.shape[0])

    @property
    def out_dim(self) -> int:
        return self.in_dim + int(self.intercept)

    def phi(self, x: np.ndarray) -> np.ndarray:
        """Features of one context (1-D)."""
        d = self.mean.shape[0]
        z = np.empty(d + 1) if self.intercept else np.empty(d)
        if ridge_kernels.AVAILABLE:
            ridge_kernels.standardize(x, self.mean, self._inv, z)
            return z
        w = z[:d]
        np.subtract(x, self.mean, out=w)
        w *= self._inv
        if self.intercept:
            z[d] = 1.0
        return z

    def phi_many(self, X: np.ndarray) -> np.ndarray:
        """Features of many contexts (n, d) -> (n, D)."""
        Z = (X - self.mean) * self._inv
        if self.intercept:
            Z = np.concatenate([Z, np.ones((Z.shape[0], 1))], axis=1)
        return Z

    def reward(self, r: float | np.ndarray) -> Any:
        return (r - self.reward_mean) / self.reward_scale

    def reward_back(self, r: float | np.ndarray) -> Any:
        """Inverse of :meth:`reward` (model units -> reward units)."""
        return r * self.reward_scale + self.reward_mean

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "scale": self.scale, "reward_mean": self.reward_mean,
                "reward_scale": self.reward_scale, "intercept": self.intercept}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Standardizer":
        return cls(d["mean"], d["scale"], d["reward_mean"], d["reward_scale"], bool(d["intercept"]))


# ---------------------------------------------------------------------------------- priors
def _prior_arrays(k: int, dim: int, mean: Any, precision: Any, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Normalise a prior to mean (K, D) and precision (K, D, D)."""
    if mean is None:
        m = np.zeros((k, dim))
    else:
        m = np.asarray(mean, dtype=np.float64)
        if m.shape == (dim,):
            m = np.broadcast_to(m, (k, dim)).copy()
        if m.shape != (k, dim):
            raise AdaptspecError(f"prior_mean must have shape ({dim},) or ({k}, {dim}), got {m.shape}")
    if precision is None:
        precision = lam
    p = np.asarray(precision, dtype=np.float64)
    eye = np.eye(dim)
    if p.ndim == 0:
        P = np.broadcast_to(eye * float(p), (k, dim, dim)).copy()
    elif p.shape == (k,) and k != dim:
        P = eye[None] * p[:, None, None]
    elif p.shape == (dim,):
        P = np.broadcast_to(np.diag(p), (k, dim, dim)).copy()
    elif p.shape == (k, dim):
        P = eye[None] * p[:, None, :]
    elif p.shape == (k, dim, dim):
        P = p.copy()
    else:
        raise AdaptspecError(
            f"prior_precision must be a number or have shape ({k},), ({dim},), ({k}, {dim}) or "
            f"({k}, {dim}, {dim}); got {p.shape}")
    if not (np.isfinite(m).all() and np.isfinite(P).all()):
        raise AdaptspecError("prior mean and precision must be finite")
    P = 0.5 * (P + P.transpose(0, 2, 1))
    try:
        np.linalg.cholesky(P)
    except np.linalg.LinAlgError:
        raise AdaptspecError("prior_precision must be symmetric positive definite for every arm") from None
    return m, P


# ---------------------------------------------------------------------------------- cores
class RidgeArms:
    """Per-arm ridge statistics, exact, with Sherman-Morrison updates of the inverse.

    ``A_inv`` (K, D, D) and ``theta`` (K, D) are the only learnt arrays; ``count`` (K,) counts
    updates per arm.

    >>> core = RidgeArms(2, 2, lam=1.0)
    >>> core.update(0, np.array([1.0, 0.0]), 2.0)  # returns the error of the prior mean
    2.0
    >>> mu, var = core.mean_var(np.array([1.0, 0.0]))
    >>> mu.tolist(), var.tolist()
    ([1.0, 0.0], [0.5, 1.0])
    """

    discount = None

    def __init__(self, k: int, dim: int, lam: float = 1.0, prior_mean: Any = None, prior_precision: Any = None) -> None:
        ridge_kernels.warm_up()
        self.k, self.dim = int(k), int(dim)
        self.set_prior(prior_mean, prior_precision, lam)

    def set_prior(self, prior_mean: Any = None, prior_precision: Any = None, lam: float = 1.0) -> None:
        """Set the prior and forget all data."""
        self.prior_mean, self.prior_precision = _prior_arrays(self.k, self.dim, prior_mean, prior_precision, lam)
        self.clear()

    def clear(self) -> None:
        """Back to the prior."""
        A_inv = np.linalg.inv(self.prior_precision)
        self._alloc()
        self.A_inv[...] = 0.5 * (A_inv + A_inv.transpose(0, 2, 1))
        self.theta[...] = self.prior_mean
        self.count = np.zeros(self.k, dtype=np.int64)

    def _alloc(self) -> None:
        # A^-1 of every arm and theta live in one (K*D + K, D) buffer, so that one matrix-vector
        # product gives A_a^-1 phi for every arm and every mean theta_a . phi at once. The
        # compiled path keeps its rows on cache lines (padded: use the first D columns); the
        # numpy path needs them contiguous (BLAS updates A^-1 in place). A core keeps its path.
        k, d = self.k, self.dim
        self._compiled = ridge_kernels.AVAILABLE
        if self._compiled:
            self._buf = ridge_kernels.cache_aligned_rows(k * d + k, d)
        else:
            self._buf = np.zeros((k * d + k, d))
        # A_a^-1 phi of the last decision (compiled: a last row for an aligned copy of phi),
        # and that phi's bytes (None: nothing kept)
        self._u = ridge_kernels.cache_aligned_rows(k + 1, d) if self._compiled else np.zeros((k, d))
        self._u_for: bytes | None = None

    @property
    def A_inv(self) -> np.ndarray:
        """``(K, D, D)`` view of the inverses."""
        k, d = self.k, self.dim
        return self._buf[:k * d].reshape(k, d, -1)[:, :, :d]

    @property
    def theta(self) -> np.ndarray:
        """``(K, D)`` view of the posterior means."""
        return self._buf[self.k * self.dim:, :self.dim]

    def mean_var_score(self, phi: np.ndarray, width: float = 0.0) -> tuple[np.ndarray, int, int]:
        """Rows ``(mu, var, score)`` (3, K) for one feature vector: the posterior mean
        ``theta_a . phi``, ``var = phi^T A_a^-1 phi`` and the UCB score ``mu + width * sqrt(var)``;
        then the best arm by score and how many arms tie with it. One compiled call when numba
        is installed (:mod:`~adaptspec.policies.ridge_kernels`), else one matrix-vector product.
        The products ``A_a^-1 phi`` are kept: an update with the same ``phi`` reuses them."""
        k, d = self.k, self.dim
        if self._compiled:
            out = np.empty((3, k))
            best, ties = ridge_kernels.mean_var_score(self._buf, k, d, phi, float(width), out, self._u)
        else:
            v = self._buf @ phi
            self._u = v[:k * d].reshape(k, d)
            out = np.empty((3, k))
            mu, var, score = out
            mu[:] = v[k * d:]
            np.maximum(np.matmul(self._u, phi, out=var), 0.0, out=var)
            np.sqrt(var, out=score)
            score *= width
            score += mu
            best = int(score.argmax())
            ties = int(np.count_nonzero(score == score[best]))
        self._u_for = phi.tobytes()
        return out, best, ties

    def mean_var(self, phi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean ``theta_a . phi`` and ``phi^T A_a^-1 phi`` for every arm."""
        out = self.mean_var_score(phi)[0]
        return out[0], out[1]

    def mean_var_many(self, Phi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Same for many feature vectors (n, D) -> (n, K), (n, K)."""
        mu = Phi @ self.theta.T
        var = np.einsum("nd,kde,ne->nk", Phi, self.A_inv, Phi, optimize=True)
        return mu, np.maximum(var, 0.0)

    def update(self, arm: int, phi: np.ndarray, r: float) -> float:
        """Add one observation to ``arm``: one Sherman-Morrison step, O(D^2). Returns the
        prediction error ``r - theta_a . phi`` of the statistics before the step."""
        fresh = self._u_for is not None and self._u_for == phi.tobytes()
        self._u_for = None
        self.count[arm] += 1
        u = self._u[arm]
        if self._compiled:
            return ridge_kernels.sherman_morrison(self._buf, self.k, self.dim, arm, phi, float(r), u, fresh)
        d = self.dim
        Ai = self._buf[arm * d:(arm + 1) * d]
        th = self._buf[self.k * d + arm]
        if not fresh:
            u = Ai @ phi
        h = 1.0 + float(phi @ u)
        mean = float(th @ phi)
        # A^-1 <- A^-1 - u u^T / h, in place (A^-1 is symmetric, so its transpose is the
        # Fortran-ordered view BLAS updates without a copy).
        _dger(-1.0 / h, u, u, a=Ai.T, overwrite_a=True)
        th += u * ((r - mean) / h)
        return r - mean

    def state(self) -> dict[str, Any]:
        return {"A_inv": self.A_inv, "theta": self.theta, "count": self.count,
                "prior_mean": self.prior_mean, "prior_precision": self.prior_precision}

    def load(self, st: dict[str, Any]) -> None:
        k, d = self.k, self.dim
        arrs = _checked(st, {"A_inv": (k, d, d), "theta": (k, d), "count": (k,),
                             "prior_mean": (k, d), "prior_precision": (k, d, d)})
        self.prior_mean, self.prior_precision = arrs["prior_mean"], arrs["prior_precision"]
        self._alloc()
        self.A_inv[...] = arrs["A_inv"]
        self.theta[...] = arrs["theta"]
        self.count = arrs["count"].astype(np.int64)


class DiscountedRidgeArms(RidgeArms):
    """Per-arm ridge statistics whose data decay by ``gamma`` per update; the prior does not decay.

    The decay is applied in blocks: at the start of every block of ``every`` updates (over all
    arms) the data part of every arm's statistics is multiplied by ``gamma ** every`` and the
    inverses are recomputed from ``A = P + data`` (one batched inverse, which also clears any
    rounding drift); within a block updates are exact Sherman-Morrison steps. An observation
    weighs ``gamma ** (every * blocks started after it)`` -- the per-update discount, in steps
    of ``every`` -- and the statistics are exactly those of a ridge regression with those
    weights. Decisions cost the same as without discount; updates one batched inverse per block.

    >>> core = DiscountedRidgeArms(1, 1, gamma=0.5, lam=1.0, every=1)
    >>> core.update(0, np.array([1.0]), 3.0)   # mean (0 + 3) / (1 + 1); returns the error 3 - 0
    3.0
    >>> core.mean_var(np.array([1.0]))[0].round(3).tolist()
    [1.5]
    >>> core.update(0, np.array([1.0]), 0.0)   # decayed first: mean 1.5 / (1 + 0.5) = 1, error -1
    -1.0
    >>> core.mean_var(np.array([1.0]))[0].round(3).tolist()  # 1.5 / (1 + 0.5 + 1)
    [0.6]
    """

    def __init__(self, k: int, dim: int, gamma: float, lam: float = 1.0, prior_mean: Any = None,
                 prior_precision: Any = None, every: int = 16) -> None:
        if not 0.0 < gamma < 1.0:
            raise AdaptspecError(f"discount must be in (0, 1), got {gamma}")
        if int(every) != every or every < 1:
            raise AdaptspecError(f"every must be a positive integer, got {every}")
        self.discount, self.every = float(gamma), int(every)
        super().__init__(k, dim, lam, prior_mean, prior_precision)

    def clear(self) -> None:
        super().clear()
        self.Dw = np.zeros((self.k, self.dim, self.dim))
        self.e = np.zeros((self.k, self.dim))
        self.since = 0

    def update(self, arm: int, phi: np.ndarray, r: float) -> float:
        if self.since >= self.every:
            self._decay()
        err = super().update(arm, phi, r)
        _dger(1.0, phi, phi, a=self.Dw[arm].T, overwrite_a=True)
        self.e[arm] += r * phi
        self.since += 1
        return err

    def _decay(self) -> None:
        self._u_for = None
        g = self.discount ** self.since
        self.Dw *= g
        self.e *= g
        P = self.prior_precision
        A_inv = np.linalg.inv(P + self.Dw)
        A_inv = 0.5 * (A_inv + A_inv.transpose(0, 2, 1))
        self.A_inv[...] = A_inv
        self.theta[...] = np.einsum("kij,kj->ki", A_inv, np.einsum("kij,kj->ki", P, self.prior_mean) + self.e)
        self.since = 0

    def state(self) -> dict[str, Any]:
        return {**super().state(), "Dw": self.Dw, "e": self.e, "since": self.since}

    def load(self, st: dict[str, Any]) -> None:
        k, d = self.k, self.dim
        arrs = _checked(st, {"Dw": (k, d, d), "e": (k, d)})
        since = int(st["since"])
        if not 0 <= since <= self.every:
            raise AdaptspecError(f"state 'since' = {since} does not fit every={self.every}")
        super().load(st)
        self.Dw, self.e, self.since = arrs["Dw"], arrs["e"], since


def _checked(st: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    out = {}
    for key, shape in shapes.items():
        a = np.array(st[key], dtype=np.float64)
        if a.shape != shape:
            raise AdaptspecError(f"state array {key!r} has shape {a.shape}, expected {shape}")
        if not np.isfinite(a).all():
            raise AdaptspecError(f"state array {key!r} has non-finite values")
        out[key] = a
    return out


# ---------------------------------------------------------------------------------- policies
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
                    "Standardizer(...) (or False) together with prior_mean / prior_precision")
            warmup = 10 * k if warmup is None else int(warmup)
            if warmup < 2:
                raise AdaptspecError(f"warmup must be >= 2 to estimate scales, got {warmup}")
        self.warmup = warmup if self.standardize is True else 0
        if prior_mean is not None or prior_precision is not None:
            if self._fixed_map is None:
                raise AdaptspecError("a prior needs the context dimension: pass dim= (or a Standardizer)")
            _prior_arrays(k, self._fixed_map.out_dim, prior_mean, prior_precision, self.lam)  # validate now
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
            raise AdaptspecError("set_prior needs a fixed standardizer (standardize=Standardizer(...) or False)")
        if self.map is None:
            raise AdaptspecError("set_prior needs the context dimension: pass dim= when building the policy")
        _prior_arrays(len(self.arms), self.map.out_dim, mean, precision, self.lam)  # validate first
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
        if (last is not None and type(context) is np.ndarray and context.ndim == 1
                and context.dtype is _F64 and context.tobytes() == last[0]):
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
        st: dict[str, Any] = {"noise_stats": self.noise_stats, "buf_n": self._buf_n, "discount": self.discount}
        if self._buf_X is not None:
            st.update(buf_X=self._buf_X[: self._buf_n], buf_a=self._buf_a[: self._buf_n],
                      buf_r=self._buf_r[: self._buf_n])
        if self.map is not None and self.standardize is True:
            st["map"] = self.map.to_dict()
        if self.core is not None:
            st["core"] = self.core.state()
        return st

    def _load_state(self, state: dict[str, Any]) -> None:
        if state.get("discount") != self.discount:
            raise AdaptspecError(f"state was saved with discount={state.get('discount')}, this policy has {self.discount}")
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
            buf = (np.array(state["buf_X"], dtype=np.float64), np.array(state["buf_a"], dtype=np.int64),
                   np.array(state["buf_r"], dtype=np.float64))
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


def _mc_probs(rng: np.random.Generator, mu: np.ndarray, sd: np.ndarray, m: int) -> np.ndarray:
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


class LinUCB(LinearPolicy):
    """LinUCB, disjoint per-arm ridge models (Li et al. 2010).

    Chooses ``argmax mu_a(x) + alpha * sigma * sqrt(phi^T A_a^-1 phi)`` (ties share the
    probability), where ``sigma`` is the noise estimate, so ``alpha`` is a number of standard
    deviations. Deterministic: set ``epsilon`` for a floor usable by off-policy evaluation.
    See the module docstring for standardisation, priors and ``discount``.

    Parameters
    ----------
    arms
        Block sizes.
    alpha
        Width of the confidence bonus, in posterior standard deviations (default 0.5, chosen on a
        development scenario, see BENCHMARKS.md).
    lam
        Default prior precision (ridge penalty) ``lam * I``.
    standardize, warmup
        ``True`` (warm-up of ``warmup`` updates, default 10 K), a :class:`Standardizer`, or False.
    fit_intercept
        Append a constant feature.
    prior_mean, prior_precision
        Per-arm prior (needs a fixed standardizer): warm start.
    discount
        Forget data with this factor per update, for drift.
    noise
        ``"auto"`` (prequential residuals, prior variance / weight ``noise_prior``) or a fixed std
        in reward units.
    epsilon, seed, dim
        As in :class:`~adaptspec.policies.base.Policy`.

    >>> rng = np.random.default_rng(0)
    >>> pol = LinUCB([4, 8], warmup=20, seed=0)
    >>> for _ in range(300):
    ...     x = rng.normal(size=2)
    ...     d = pol.decide(x)
    ...     pol.update(x, d.block_size, (x[0] if d.block_size == 4 else -x[0]) + rng.normal(0, 0.1))
    >>> pol.decide([2.0, 0.0]).block_size, pol.decide([-2.0, 0.0]).block_size
    (4, 8)
    """

    name = "linucb"

    def __init__(self, arms: Sequence[int], alpha: float = 0.5, **kwargs: Any) -> None:
        if not (alpha >= 0 and math.isfinite(alpha)):
            raise AdaptspecError(f"alpha must be >= 0, got {alpha}")
        self.alpha = float(alpha)
        super().__init__(arms, **kwargs)
        self._one_hot = np.eye(len(self.arms))  # read-only rows: the probabilities of a sure choice
        self._one_hot.flags.writeable = False

    def _probs_from(self, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        return greedy_probs(mu + (self.alpha * self.noise_std()) * np.sqrt(np.abs(var)))

    def _choose(self, context: np.ndarray | None) -> tuple[int, np.ndarray]:
        core = self.core
        if not isinstance(core, RidgeArms) or self.epsilon > 0.0:
            return super()._choose(context)
        # the hot path (decide + update in tens of microseconds): one product for all arms,
        # the chosen index straight from the scores
        out, j, ties = core.mean_var_score(self._phi_of(context), self.alpha * self.noise_std())
        if ties > 1:
            probs = greedy_probs(out[2])
            return self._draw(probs), probs
        return j, self._one_hot[j]

    def _probs_from_many(self, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        s = mu + (self.alpha * self.noise_std()) * np.sqrt(var)
        m = s == s.max(axis=1, keepdims=True)
        return m / m.sum(axis=1, keepdims=True)


class LinTS(LinearPolicy):
    """Linear Thompson sampling (Agrawal & Goyal 2013) on per-arm ridge models.

    For a context, each arm's sampled reward ``phi . theta~``, ``theta~ ~ N(theta_a,
    (v sigma)^2 A_a^-1)``, is Gaussian with mean ``mu_a`` and variance ``(v sigma)^2 phi^T
    A_a^-1 phi``, independently across arms, so drawing the scalar is the same as drawing
    ``theta`` and needs no Cholesky factor. Propensities as in
    :class:`~adaptspec.policies.mab.ThompsonSampling`: ``mc_samples`` vectorised joint draws,
    the arm drawn from their empirical argmax distribution (exact propensity given the draws).

    Parameters
    ----------
    arms
        Block sizes.
    v
        Posterior scale (1: the plain Bayesian posterior; default 0.5, chosen on a development
        scenario, see BENCHMARKS.md).
    mc_samples
        Draws per decision for the propensity (default 512).
    **kwargs
        As :class:`LinUCB` (lam, standardize, warmup, prior, discount, noise, epsilon, seed, dim).

    >>> rng = np.random.default_rng(0)
    >>> pol = LinTS([4, 8], warmup=20, seed=0)
    >>> for _ in range(300):
    ...     x = rng.normal(size=2)
    ...     d = pol.decide(x)
    ...     pol.update(x, d.block_size, (x[0] if d.block_size == 4 else -x[0]) + rng.normal(0, 0.1))
    >>> d = pol.decide([2.0, 0.0])
    >>> d.block_size, round(d.propensity, 2)
    (4, 1.0)
    """

    name = "lints"
    _stochastic = True

    def __init__(self, arms: Sequence[int], v: float = 0.5, mc_samples: int = MC_SAMPLES, **kwargs: Any) -> None:
        if not (v > 0 and math.isfinite(v)):
            raise AdaptspecError(f"v must be > 0, got {v}")
        if int(mc_samples) != mc_samples or mc_samples < 1:
            raise AdaptspecError(f"mc_samples must be a positive integer, got {mc_samples}")
        self.v = float(v)
        self.mc_samples = int(mc_samples)
        super().__init__(arms, **kwargs)

    def _probs_from(self, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        sd = (self.v * self.noise_std()) * np.sqrt(np.maximum(var, 0.0))
        return _mc_probs(self.rng, mu, sd, self.mc_samples)

    def _probs_from_many(self, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        sd = (self.v * self.noise_std()) * np.sqrt(np.maximum(var, 0.0))
        return _mc_probs(self.rng, mu, sd, self.mc_samples)
