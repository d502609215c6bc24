"""Linear Thompson sampling (Agrawal & Goyal 2013) on per-arm ridge models."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from .base import MC_SAMPLES
from .linear import LinearPolicy, mc_probs


class LinTS(LinearPolicy):
    """Linear Thompson sampling (Agrawal & Goyal 2013) on per-arm ridge models.

    For a context, each arm's sampled reward ``phi . theta~``, ``theta~ ~ N(theta_a,
    (v sigma)^2 A_a^-1)``, is Gaussian with mean ``mu_a`` and variance ``(v sigma)^2 phi^T
    A_a^-1 phi``, independently across arms, so drawing the scalar is the same as drawing
    ``theta`` and needs no Cholesky factor. Propensities as in
    :class:`~adaptspec.policies.thompson.ThompsonSampling`: ``mc_samples`` vectorised joint draws,
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

    def __init__(
        self, arms: Sequence[int], v: float = 0.5, mc_samples: int = MC_SAMPLES, **kwargs: Any
    ) -> None:
        if not (v > 0 and math.isfinite(v)):
            raise AdaptspecError(f"v must be > 0, got {v}")
        if int(mc_samples) != mc_samples or mc_samples < 1:
            raise AdaptspecError(f"mc_samples must be a positive integer, got {mc_samples}")
        self.v = float(v)
        self.mc_samples = int(mc_samples)
        super().__init__(arms, **kwargs)

    def _probs_from(self, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        sd = (self.v * self.noise_std()) * np.sqrt(np.maximum(var, 0.0))
        return mc_probs(self.rng, mu, sd, self.mc_samples)

    def _probs_from_many(self, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        sd = (self.v * self.noise_std()) * np.sqrt(np.maximum(var, 0.0))
        return mc_probs(self.rng, mu, sd, self.mc_samples)
