"""Per-arm Bayesian ridge statistics of the linear-model policies, stacked numpy arrays.

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
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.linalg.blas import dger

from ..errors import AdaptspecError
from . import ridge_kernels


# ---------------------------------------------------------------------------------- priors
def prior_arrays(k: int, dim: int, mean: Any, precision: Any, lam: float) -> tuple[np.ndarray, np.ndarray]:
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
            f"({k}, {dim}, {dim}); got {p.shape}"
        )
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

    def __init__(
        self, k: int, dim: int, lam: float = 1.0, prior_mean: Any = None, prior_precision: Any = None
    ) -> None:
        ridge_kernels.warm_up()
        self.k, self.dim = int(k), int(dim)
        self.set_prior(prior_mean, prior_precision, lam)

    def set_prior(self, prior_mean: Any = None, prior_precision: Any = None, lam: float = 1.0) -> None:
        """Set the prior and forget all data."""
        self.prior_mean, self.prior_precision = prior_arrays(
            self.k, self.dim, prior_mean, prior_precision, lam
        )
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
        return self._buf[: k * d].reshape(k, d, -1)[:, :, :d]

    @property
    def theta(self) -> np.ndarray:
        """``(K, D)`` view of the posterior means."""
        return self._buf[self.k * self.dim :, : self.dim]

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
            self._u = v[: k * d].reshape(k, d)
            out = np.empty((3, k))
            mu, var, score = out
            mu[:] = v[k * d :]
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
        Ai = self._buf[arm * d : (arm + 1) * d]
        th = self._buf[self.k * d + arm]
        if not fresh:
            u = Ai @ phi
        h = 1.0 + float(phi @ u)
        mean = float(th @ phi)
        # A^-1 <- A^-1 - u u^T / h, in place (A^-1 is symmetric, so its transpose is the
        # Fortran-ordered view BLAS updates without a copy).
        dger(-1.0 / h, u, u, a=Ai.T, overwrite_a=True)
        th += u * ((r - mean) / h)
        return r - mean

    def state(self) -> dict[str, Any]:
        return {
            "A_inv": self.A_inv,
            "theta": self.theta,
            "count": self.count,
            "prior_mean": self.prior_mean,
            "prior_precision": self.prior_precision,
        }

    def load(self, st: dict[str, Any]) -> None:
        k, d = self.k, self.dim
        arrs = checked_arrays(
            st,
            {
                "A_inv": (k, d, d),
                "theta": (k, d),
                "count": (k,),
                "prior_mean": (k, d),
                "prior_precision": (k, d, d),
            },
        )
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

    def __init__(
        self,
        k: int,
        dim: int,
        gamma: float,
        lam: float = 1.0,
        prior_mean: Any = None,
        prior_precision: Any = None,
        every: int = 16,
    ) -> None:
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
        dger(1.0, phi, phi, a=self.Dw[arm].T, overwrite_a=True)
        self.e[arm] += r * phi
        self.since += 1
        return err

    def _decay(self) -> None:
        self._u_for = None
        g = self.discount**self.since
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
        arrs = checked_arrays(st, {"Dw": (k, d, d), "e": (k, d)})
        since = int(st["since"])
        if not 0 <= since <= self.every:
            raise AdaptspecError(f"state 'since' = {since} does not fit every={self.every}")
        super().load(st)
        self.Dw, self.e, self.since = arrs["Dw"], arrs["e"], since


def checked_arrays(st: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    out = {}
    for key, shape in shapes.items():
        a = np.array(st[key], dtype=np.float64)
        if a.shape != shape:
            raise AdaptspecError(f"state array {key!r} has shape {a.shape}, expected {shape}")
        if not np.isfinite(a).all():
            raise AdaptspecError(f"state array {key!r} has non-finite values")
        out[key] = a
    return out
