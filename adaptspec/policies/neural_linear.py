"""Neural-linear (Riquelme et al. 2018) warm-started from the offline head: the product's default policy.

Features: the head's last hidden layer plus a constant, ``phi(x) = [h(x), 1]``. Rewards: in
the head's standardised units. On top, Bayesian linear regression of every arm's reward on
``phi`` (ridge form, as in :mod:`adaptspec.policies.ridge`; below, first written per arm, then
joint over the arms), updated online by Sherman-Morrison (or discounted, for drift).

Warm start (:func:`head_prior`):

- prior mean of arm ``a`` = the head's output-layer row for ``a`` and its bias, so before any
  feedback the posterior mean is exactly the head's prediction;
- prior precision ``P_a = prior_n * (s2 / mse_a) * G``, where ``G`` is the mean of
  ``phi phi^T`` over the head's validation split, ``mse_a`` the head's validation MSE for arm
  ``a`` and ``s2`` the mean of ``mse_a`` over arms (also the noise prior). In words: the head
  counts as ``prior_n`` typical observations of every arm, fewer for arms it predicted worse
  on validation, more for arms it predicted better. The prior predictive variance of the mean
  reward at a typical context is then about ``mse_a * D / prior_n`` (D = hidden width + 1):
  at ``prior_n = D`` the head's own validation error.

The arms are not independent: the head's errors have a large per-request part common to all
arms (its validation errors are correlated across arms), which per-arm regressions would each
re-learn, the arms learnt at different speeds making the argmax noisy. So the prior is one
Gaussian over all arms' weights, covariance ``(C / prior_n) kron (s2 G^-1)`` with ``C``
(:func:`head_arm_cov`) of diagonal the ``mse_a / s2`` above and the correlations of the
systematic part of the head's validation errors (:func:`systematic_corr`: the noise of a reward
is its arm's own and would dilute them), and the posterior is updated jointly
(:class:`JointArms`): a reward of one arm corrects the common part of every arm's prediction.

How much to trust the head is chosen online by default (``prior_n="auto"``, in the spirit of
Zhang et al. 2019's warm start with a weight chosen online): one posterior is kept per weight in
``PRIOR_GRID``, all updated with every reward, each scored by its prequential log predictive
density (the Bayesian evidence for that weight, discounted like the data when ``discount`` is
set), and decisions use the posterior with the highest evidence. A head that keeps predicting
well earns a strong prior (little exploration: the policy stays with the head); one that
turns out wrong (a different machine, batch size or drafter than it was trained for) loses its
weight after a few dozen requests and the policy learns from the feedback instead.

Exploration: UCB (default, ``alpha=0.1``: the warm prior leaves little to explore; chosen on
development seed 100, where 0.5 cost 0.2-0.5 points of the oracle) or Thompson sampling
(randomised, so its logs carry informative propensities without an ``epsilon`` floor; it explored more than UCB on the
development scenario, see BENCHMARKS.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy.linalg.blas import dger

from ..errors import AdaptspecError
from .base import MC_SAMPLES, greedy_probs
from .linear import LinearPolicy, mc_probs
from .offline_head import HeadModel, head_fingerprint

__all__ = [
    "HeadFeatures",
    "NeuralLinear",
    "head_prior",
    "systematic_corr",
    "head_fingerprint",
    "neural_linear_policy",
    "PRIOR_GRID",
]

#: head weights (observations per arm) compared online when ``prior_n="auto"``
PRIOR_GRID = (4.0, 16.0, 64.0, 256.0, 1024.0)
_DEFAULT_PRIOR = 64.0


class HeadFeatures:
    """Feature map ``x -> [h(x), 1]`` of a regression head; rewards in the head's units."""

    intercept = True

    def __init__(self, head: HeadModel) -> None:
        if head.mode != "regression":
            raise AdaptspecError(
                f"a {head.mode} head predicts no rewards: train it with mode='regression' for neural-linear / SquareCB"
            )
        self.head = head
        self.reward_mean = float(head.reward_mean)
        self.reward_scale = float(head.reward_scale)

    @property
    def in_dim(self) -> int:
        return self.head.in_dim

    @property
    def out_dim(self) -> int:
        return self.head.hidden_dim + 1

    def phi(self, x: np.ndarray) -> np.ndarray:
        return np.append(self.head.hidden(x), 1.0)

    def phi_many(self, X: np.ndarray) -> np.ndarray:
        H = self.head.hidden(X)
        return np.concatenate([H, np.ones((H.shape[0], 1))], axis=1)

    def reward(self, r: float | np.ndarray) -> Any:
        return (r - self.reward_mean) / self.reward_scale

    def reward_back(self, r: float | np.ndarray) -> Any:
        return r * self.reward_scale + self.reward_mean


def head_prior(head: HeadModel, prior_n: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Prior mean (K, D), prior precision (K, D, D) and noise variance from a regression head."""
    if head.val_mse is None or head.val_gram is None:
        raise AdaptspecError(
            "this head has no validation statistics (val_mse, val_gram): retrain it with train_head"
        )
    if not (prior_n > 0 and math.isfinite(prior_n)):
        raise AdaptspecError(f"prior_n must be > 0, got {prior_n}")
    W, b = head.layers[-1]
    mean = np.concatenate([W, b[:, None]], axis=1)
    mse = np.maximum(np.asarray(head.val_mse, dtype=np.float64), 1e-6)
    s2 = float(mse.mean())
    prec = (prior_n * s2 / mse)[:, None, None] * head_gram(head)[None]
    return mean, prec, s2


def head_gram(head: HeadModel) -> np.ndarray:
    """The head's validation Gram matrix ``G`` of ``phi``, made proper by a small ridge."""
    G = np.asarray(head.val_gram, dtype=np.float64)
    D = head.hidden_dim + 1
    if G.shape != (D, D):
        raise AdaptspecError(f"head val_gram has shape {G.shape}, expected ({D}, {D})")
    # a small ridge keeps directions the validation split never excited (dead units) proper
    return 0.5 * (G + G.T) + (1e-3 * np.trace(G) / D + 1e-8) * np.eye(D)


def head_arm_cov(head: HeadModel) -> np.ndarray:
    """Prior covariance across arms (K, K) of the head's errors, in units of their mean variance.

    Its diagonal is ``val_mse / s2`` (the per-arm weighting of :func:`head_prior`); its
    correlations are those of the *systematic* part of the validation errors
    (:func:`systematic_corr`), the part the regression can learn, common to the arms of a
    request. A head saved without ``val_cov``, or validated on fewer than ``2 K`` requests (too
    few to estimate a K x K covariance), gives the diagonal: independent arms.
    """
    mse = np.maximum(np.asarray(head.val_mse, dtype=np.float64), 1e-6)
    k = len(mse)
    if head.val_cov is None or float(head.info.get("n_val", 0)) < 2 * k:
        return np.diag(mse / mse.mean())
    C = np.asarray(head.val_cov, dtype=np.float64)
    if C.shape != (k, k):
        raise AdaptspecError(f"head val_cov has shape {C.shape}, expected ({k}, {k})")
    C = 0.5 * (C + C.T)
    C[np.diag_indices_from(C)] = mse
    s = np.sqrt(mse / mse.mean())
    return systematic_corr(C) * np.outer(s, s)


def systematic_corr(cov: np.ndarray) -> np.ndarray:
    """Correlation across arms of the systematic part of errors whose covariance is ``cov`` (K, K).

    A validation error is systematic (the head misjudged the request: learnable from ``phi``)
    plus noise. The noise of a reward is its own arm's, so the off-diagonal covariances are the
    systematic part alone, but the diagonal (``val_mse``) also holds the noise, and correlations
    computed from it come out diluted (on synthetic traces about 0.1-0.2 where the head's
    errors on the expected rewards correlate about 0.5, 0.8 between neighbouring block sizes).
    The systematic variance of arm ``a`` is taken as its largest covariance with another arm
    (the arm that errs most like it, usually a neighbouring block size; at most its MSE), and
    the result is made a proper correlation matrix (eigenvalues floored at 1e-3, unit diagonal).

    >>> cov = np.array([[2.0, 0.9, 0.5], [0.9, 2.0, 0.9], [0.5, 0.9, 2.0]])  # raw correlations 0.45, 0.25
    >>> systematic_corr(cov).round(2).tolist()
    [[1.0, 0.89, 0.57], [0.89, 1.0, 0.89], [0.57, 0.89, 1.0]]
    """
    mse = np.diag(cov)
    off = cov - np.diag(mse)
    common = np.clip(np.abs(off).max(axis=1), 1e-3 * mse, mse)
    R = off / np.sqrt(np.outer(common, common)) + np.eye(len(mse))
    w, V = np.linalg.eigh(0.5 * (R + R.T))
    R = (V * np.maximum(w, 1e-3)) @ V.T
    d = np.sqrt(np.diag(R))
    return R / np.outer(d, d)


def _spd_inv(A: np.ndarray) -> np.ndarray:
    """Inverse of a symmetric positive-definite matrix (Cholesky; twice as fast as a general inverse)."""
    from scipy.linalg import lapack

    c, info = lapack.dpotrf(A, lower=True)
    if info == 0:
        S, info = lapack.dpotri(c, lower=True)
        if info == 0:
            S = np.tril(S) + np.tril(S, -1).T
            return np.ascontiguousarray(S)
    S = np.linalg.inv(A)
    return 0.5 * (S + S.T)


class JointArms:
    """Bayesian linear regression of all arms' weights at once: one Gaussian over (K*D) weights.

    ``reward = w_a . phi + noise`` with a prior on ``w = (w_1, ..., w_K)`` whose arms may be
    correlated, so that a reward of one arm also moves the others (by their prior
    correlation). Stored as the posterior mean ``theta`` (K, D) and covariance ``S`` (K*D, K*D)
    in units of the noise variance; an update is a rank-one (Sherman-Morrison) step, O((KD)^2).
    With ``discount`` the data (not the prior) decay by ``gamma`` per update, applied in blocks
    of ``every`` updates as in :class:`~adaptspec.policies.ridge.DiscountedRidgeArms`.

    >>> core = JointArms(np.zeros((2, 1)), np.array([[1.0, 0.5], [0.5, 1.0]]))
    >>> core.update(0, np.array([1.0]), 2.0)   # the prior's prediction: mean 0, variance 1
    (0.0, 1.0)
    >>> # arm 1 learns half as much through the correlation
    >>> mu, var = core.mean_var(np.array([1.0]))
    >>> mu.tolist(), var.tolist()
    ([1.0, 0.5], [0.5, 0.875])
    """

    def __init__(
        self, prior_mean: np.ndarray, prior_cov: np.ndarray, discount: float | None = None, every: int = 16
    ) -> None:
        self.k, self.dim = prior_mean.shape
        n = self.k * self.dim
        if prior_cov.shape != (n, n):
            raise AdaptspecError(f"prior covariance must be ({n}, {n}), got {prior_cov.shape}")
        if discount is not None and not 0.0 < discount < 1.0:
            raise AdaptspecError(f"discount must be in (0, 1), got {discount}")
        self.discount, self.every = discount, int(every)
        self.prior_mean = np.array(prior_mean, dtype=np.float64)
        self.prior_cov = 0.5 * (prior_cov + prior_cov.T)
        self._prior_prec: np.ndarray | None = None
        self.clear()

    def clear(self) -> None:
        """Back to the prior."""
        self.S = self.prior_cov.copy()
        self.theta = self.prior_mean.copy()
        self.count = np.zeros(self.k, dtype=np.int64)
        if self.discount is not None:
            self.Dw = np.zeros((self.k, self.dim, self.dim))
            self.e = np.zeros((self.k, self.dim))
            self.since = 0

    def _block(self, arm: int) -> slice:
        return slice(arm * self.dim, (arm + 1) * self.dim)

    def _diag_blocks(self) -> np.ndarray:
        k, d = self.k, self.dim
        S4 = self.S.reshape(k, d, k, d)
        return S4[np.arange(k), :, np.arange(k), :]

    def mean_var(self, phi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean ``theta_a . phi`` and ``phi^T S_aa phi`` of every arm."""
        return self.theta @ phi, self._diag_blocks() @ phi @ phi

    def mean_var_many(self, Phi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        var = np.einsum("nd,kde,ne->nk", Phi, self._diag_blocks(), Phi, optimize=True)
        return Phi @ self.theta.T, np.maximum(var, 0.0)

    def update(self, arm: int, phi: np.ndarray, r: float) -> tuple[float, float]:
        """Add one observation of ``arm``. Returns the prediction it was scored against: the
        posterior mean ``theta_a . phi`` and ``phi^T S_aa phi`` (noise units) before the update."""
        if self.discount is not None:
            if self.since >= self.every:
                self._decay()
            self.Dw[arm] += np.outer(phi, phi)
            self.e[arm] += r * phi
            self.since += 1
        b = self._block(arm)
        u = self.S[:, b] @ phi  # covariance of every weight with this arm's prediction
        v = float(u[b] @ phi)
        mean = float(self.theta[arm] @ phi)
        h = 1.0 + v
        self.theta += (u * ((r - mean) / h)).reshape(self.k, self.dim)
        dger(-1.0 / h, u, u, a=self.S.T, overwrite_a=True)  # S -= u u^T / h in place (S is symmetric)
        self.count[arm] += 1
        return mean, v

    def _decay(self) -> None:
        g = self.discount**self.since
        self.Dw *= g
        self.e *= g
        if self._prior_prec is None:
            self._prior_prec = np.linalg.inv(self.prior_cov)
        A = self._prior_prec.copy()
        for a in range(self.k):
            A[self._block(a), self._block(a)] += self.Dw[a]
        self.S = _spd_inv(A)
        self.theta = (self.S @ (self._prior_prec @ self.prior_mean.reshape(-1) + self.e.reshape(-1))).reshape(
            self.k, self.dim
        )
        self.since = 0

    def state(self) -> dict[str, Any]:
        st = {"S": self.S, "theta": self.theta, "count": self.count}
        if self.discount is not None:
            st.update(Dw=self.Dw, e=self.e, since=self.since)
        return st

    def load(self, st: dict[str, Any]) -> None:
        n = self.k * self.dim
        S, theta = np.array(st["S"], dtype=np.float64), np.array(st["theta"], dtype=np.float64)
        count = np.array(st["count"], dtype=np.int64)
        if S.shape != (n, n) or theta.shape != (self.k, self.dim) or count.shape != (self.k,):
            raise AdaptspecError("state does not fit this policy's statistics")
        if self.discount is not None:
            Dw, e = np.array(st["Dw"], dtype=np.float64), np.array(st["e"], dtype=np.float64)
            if Dw.shape != (self.k, self.dim, self.dim) or e.shape != (self.k, self.dim):
                raise AdaptspecError("state does not fit this policy's statistics")
            self.Dw, self.e, self.since = Dw, e, int(st["since"])
        self.S, self.theta, self.count = S, theta, count


class NeuralLinear(LinearPolicy):
    """Bayesian linear regression per arm on the head's last hidden layer, warm-started from the head.

    Before any feedback it decides as the head does (its posterior mean is the head's
    prediction); each reward then updates the chosen arm's posterior. See the module docstring
    for the prior.

    Parameters
    ----------
    head
        A :class:`~adaptspec.policies.offline_head.HeadModel` (regression mode) or the path of
        a saved head.
    exploration
        ``"ucb"`` (default; deterministic, add ``epsilon`` for off-policy logs) or ``"ts"``
        (Thompson sampling, Monte-Carlo propensities).
    alpha
        UCB width in posterior standard deviations.
    v
        Thompson posterior inflation.
    prior_n
        Weight of the head, in observations per arm (see the module docstring), or ``"auto"``
        to choose it online from ``PRIOR_GRID`` by evidence.
    noise_weight
        Weight, in observations, of the head's validation MSE as the prior noise variance.
    discount
        Forget feedback (not the head's prior) with this factor per update, for drift.
    noise, mc_samples, epsilon, seed
        As in :class:`~adaptspec.policies.lints.LinTS`.

    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(600, 3))
    >>> R = np.stack([X[:, 0], -X[:, 0], 0 * X[:, 0]], axis=1) + rng.normal(0, 0.3, size=(600, 3))
    >>> from adaptspec.policies.offline_head import train_head
    >>> head = train_head(X, R, arms=[4, 8, 16], hidden=(16, 8), max_epochs=60, seed=0)
    >>> pol = NeuralLinear(head, seed=0)
    >>> d = pol.decide([2.0, 0.0, 0.0])
    >>> d.block_size, d.policy
    (4, 'neural-linear')
    >>> pol.update([2.0, 0.0, 0.0], 4, 2.1)
    >>> pol.version
    1
    """

    name = "neural-linear"

    def __init__(
        self,
        head: HeadModel | str | Path,
        exploration: str = "ucb",
        alpha: float = 0.1,
        v: float = 0.5,
        prior_n: float | str = "auto",
        noise_weight: float = 100.0,
        discount: float | None = None,
        noise: float | str = "auto",
        mc_samples: int = MC_SAMPLES,
        epsilon: float = 0.0,
        seed: int | None = None,
        arms: Sequence[int] | None = None,
    ) -> None:
        self.head = head if isinstance(head, HeadModel) else HeadModel.load(head)
        if arms is not None and tuple(sorted(int(a) for a in arms)) != tuple(sorted(self.head.arms)):
            raise AdaptspecError(f"the head was trained for arms {list(self.head.arms)}, not {list(arms)}")
        if exploration not in ("ts", "ucb"):
            raise AdaptspecError(f"exploration must be 'ts' or 'ucb', got {exploration!r}")
        if not (alpha >= 0 and math.isfinite(alpha)):
            raise AdaptspecError(f"alpha must be >= 0, got {alpha}")
        if not (v > 0 and math.isfinite(v)):
            raise AdaptspecError(f"v must be > 0, got {v}")
        if int(mc_samples) != mc_samples or mc_samples < 1:
            raise AdaptspecError(f"mc_samples must be a positive integer, got {mc_samples}")
        if not (noise_weight > 0 and math.isfinite(noise_weight)):
            raise AdaptspecError(f"noise_weight must be > 0, got {noise_weight}")
        if prior_n == "auto":
            grid = PRIOR_GRID
        elif isinstance(prior_n, (int, float)) and prior_n > 0 and math.isfinite(prior_n):
            grid = (float(prior_n),)
        else:
            raise AdaptspecError(f"prior_n must be 'auto' or a positive number, got {prior_n!r}")
        self.exploration = exploration
        self.alpha, self.v, self.mc_samples = float(alpha), float(v), int(mc_samples)
        self.prior_n = prior_n if prior_n == "auto" else float(prior_n)
        self.prior_grid = np.asarray(grid)
        self._stochastic = exploration == "ts"
        fmap = HeadFeatures(self.head)
        mean, prec1, s2 = head_prior(self.head, 1.0)
        # prior covariance of all arms' weights at head weight 1, in noise units: the head's
        # error covariance across arms (Kronecker) the inverse validation Gram matrix
        self._prior_unit = (mean, np.kron(head_arm_cov(self.head), np.linalg.inv(head_gram(self.head))))
        self.fingerprint = head_fingerprint(self.head)
        # tie-break of the evidence before any feedback: prefer the default weight
        self._tiebreak = -1e-9 * np.abs(np.log(self.prior_grid / _DEFAULT_PRIOR))
        super().__init__(
            self.head.arms,
            feature_map=fmap,
            prior_mean=mean,
            prior_precision=prec1 * grid[0],
            discount=discount,
            noise=noise,
            noise_prior=(s2, float(noise_weight)),
            epsilon=epsilon,
            seed=seed,
        )

    # ------------------------------------------------------------------ one posterior per head weight
    def _make_core(self, dim_out: int) -> JointArms:
        return self._core_for(float(self.prior_grid[0]))

    def _core_for(self, weight: float) -> JointArms:
        mean, cov1 = self._prior_unit
        return JointArms(mean, cov1 / weight, self.discount)

    def _reset(self) -> None:
        super()._reset()
        self.cores = [self._core_for(float(w)) for w in self.prior_grid]
        self.evidence = np.zeros(len(self.cores))
        self._select()

    def _select(self) -> None:
        self.selected = int(np.argmax(self.evidence + self._tiebreak))
        self.core = self.cores[self.selected]

    @property
    def head_weight(self) -> float:
        """The head's current weight, in observations per arm (the selected ``prior_n``)."""
        return float(self.prior_grid[self.selected])

    def set_prior(self, mean: Any = None, precision: Any = None) -> None:
        raise AdaptspecError("NeuralLinear's prior comes from its head (choose its weight with prior_n)")

    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        phi = self._phi_of(context)
        r = float(self.map.reward(reward))
        s2 = self.noise_std() ** 2
        g = self.discount if self.discount is not None else 1.0
        err = 0.0
        for i, core in enumerate(self.cores):
            # each posterior is scored on the prediction it made (prequential evidence), then learns
            mu, v = core.update(arm, phi, r)
            if i == self.selected:
                err = r - mu
            if len(self.cores) > 1:
                var = s2 * (1.0 + max(v, 0.0))
                self.evidence[i] = g * self.evidence[i] - 0.5 * (
                    math.log(2.0 * math.pi * var) + (r - mu) ** 2 / var
                )
        self._add_residual(err)
        self._last = None
        self._select()

    def _probs_from(self, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        if self.exploration == "ucb":
            return greedy_probs(mu + (self.alpha * self.noise_std()) * np.sqrt(np.maximum(var, 0.0)))
        sd = (self.v * self.noise_std()) * np.sqrt(np.maximum(var, 0.0))
        return mc_probs(self.rng, mu, sd, self.mc_samples)

    def _probs_from_many(self, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        if self.exploration == "ucb":
            s = mu + (self.alpha * self.noise_std()) * np.sqrt(np.maximum(var, 0.0))
            m = s == s.max(axis=1, keepdims=True)
            return m / m.sum(axis=1, keepdims=True)
        sd = (self.v * self.noise_std()) * np.sqrt(np.maximum(var, 0.0))
        return mc_probs(self.rng, mu, sd, self.mc_samples)

    def _state(self) -> dict[str, Any]:
        return {
            "head": self.fingerprint,
            "discount": self.discount,
            "noise_stats": self.noise_stats,
            "evidence": self.evidence,
            "prior_grid": self.prior_grid,
            "cores": [c.state() for c in self.cores],
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        if state.get("head") != self.fingerprint:
            raise AdaptspecError(
                f"state was saved with head {state.get('head')!r}, this policy uses head {self.fingerprint!r}"
            )
        if state.get("discount") != self.discount:
            raise AdaptspecError(
                f"state was saved with discount={state.get('discount')}, this policy has {self.discount}"
            )
        grid = np.asarray(state["prior_grid"], dtype=np.float64)
        if grid.shape != self.prior_grid.shape or not np.allclose(grid, self.prior_grid):
            raise AdaptspecError(
                f"state has head weights {grid.tolist()}, this policy uses {self.prior_grid.tolist()}"
            )
        noise_stats = np.array(state["noise_stats"], dtype=np.float64)
        evidence = np.array(state["evidence"], dtype=np.float64)
        if (
            noise_stats.shape != (2,)
            or evidence.shape != self.evidence.shape
            or len(state["cores"]) != len(self.cores)
        ):
            raise AdaptspecError("state does not fit this NeuralLinear policy")
        cores = [self._core_for(float(w)) for w in self.prior_grid]
        for c, st in zip(cores, state["cores"]):
            c.load(st)
        self.cores, self.evidence, self.noise_stats = cores, evidence, noise_stats
        self._sigma, self._last = None, None
        self._select()

    def __repr__(self) -> str:
        return (
            f"NeuralLinear(arms={list(self.arms)}, exploration={self.exploration!r}, "
            f"prior_n={self.prior_n!r}, hidden={list(self.head.hidden_sizes)})"
        )


def neural_linear_policy(
    arms: Sequence[int],
    seed: int | None = None,
    head: Path | None = None,
    exploration: str = "ucb",
    alpha: float = 0.1,
    v: float = 0.5,
    prior_n: float | str = "auto",
    discount: float | None = None,
    epsilon: float = 0.0,
    mc_samples: int = MC_SAMPLES,
) -> NeuralLinear:
    """Factory of the ``neural-linear[:head=PATH,exploration=ucb,...]`` spec (default head: the bundled one)."""
    if head is None:
        from ..paths import BUNDLED_HEAD

        if not (BUNDLED_HEAD / "config.json").is_file():
            raise AdaptspecError(
                "neural-linear needs a trained head: neural-linear:head=PATH (adaptspec train-head)"
            )
        head = BUNDLED_HEAD
    return NeuralLinear(
        head,
        exploration=exploration,
        alpha=alpha,
        v=v,
        prior_n=prior_n,
        discount=discount,
        epsilon=epsilon,
        seed=seed,
        arms=arms,
        mc_samples=mc_samples,
    )
