"""LinUCB (Li et al. 2010): disjoint per-arm ridge models, an upper confidence bound."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from .base import greedy_probs
from .linear import LinearPolicy
from .ridge import RidgeArms


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
