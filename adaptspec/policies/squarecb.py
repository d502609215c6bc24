"""SquareCB (Foster & Rakhlin 2020): contextual bandits reduced to online square-loss regression.

An online regression oracle predicts each arm's reward ``mu_a(x)``; with predicted losses
``y_a = -mu_a`` and ``b = argmin y``, the probabilities are in closed form (inverse gap
weighting):

    p_a = 1 / (K + gamma * (y_a - y_b))   for a != b,      p_b = 1 - sum of the others.

The oracle learns with plain square loss on the chosen arm only. Two oracles:

- linear (default): per-arm ridge regression on standardised features, exact online least
  squares (the ``RidgeArms`` statistics of :mod:`adaptspec.policies.ridge`, same
  warm-up / standardisation options);
- the offline head (``head=``): per-arm ridge regression on the head's last hidden layer,
  starting from the head's output layer (the prior of
  :mod:`adaptspec.policies.neural_linear`), so the oracle starts as the head and its output
  layer is refit online by exact least squares.

``gamma`` grows with time, ``gamma_t = gamma_scale * sqrt(K * t)`` after ``t`` updates (the
anytime form of the paper's ``sqrt(K T / Reg)``), in standardised reward units; or pass a
fixed ``gamma``. Only the mean prediction is used: SquareCB needs no confidence widths.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from .linear import LinearPolicy
from .neural_linear import HeadFeatures, head_fingerprint, head_prior
from .offline_head import HeadModel

__all__ = ["SquareCB", "squarecb_probs"]


def squarecb_probs(mu: np.ndarray, gamma: float) -> np.ndarray:
    """Inverse-gap-weighting probabilities for predicted rewards ``mu`` (K,) or (n, K).

    >>> squarecb_probs(np.array([1.0, 0.0, 0.5]), gamma=4.0).round(4).tolist()
    [0.6, 0.1429, 0.2]
    """
    mu = np.asarray(mu, dtype=np.float64)
    k = mu.shape[-1]
    gap = mu.max(axis=-1, keepdims=True) - mu  # y_a - y_b >= 0
    p = 1.0 / (k + gamma * gap)
    best = np.argmax(mu, axis=-1)
    if mu.ndim == 1:
        p[best] = 0.0
        p[best] = 1.0 - p.sum()
    else:
        rows = np.arange(mu.shape[0])
        p[rows, best] = 0.0
        p[rows, best] = 1.0 - p.sum(axis=1)
    return p


class SquareCB(LinearPolicy):
    """SquareCB with a linear or head-based online regression oracle.

    Parameters
    ----------
    arms
        Block sizes (ignored when ``head`` is given: the head's arms are used; if both are
        given they must match).
    gamma
        Fixed learning rate, or ``None`` for ``gamma_scale * sqrt(K * t)``.
    gamma_scale
        Scale of the time-varying rate (default 4, chosen on a development scenario).
    head
        Optional regression head (object or saved path) used as the oracle's starting point.
    prior_n
        Weight of the head's prior, as in NeuralLinear.
    **kwargs
        Linear oracle options (lam, standardize, warmup, fit_intercept, prior_mean,
        prior_precision, discount), epsilon, seed, dim.

    >>> rng = np.random.default_rng(0)
    >>> pol = SquareCB([4, 8], warmup=20, seed=0)
    >>> for _ in range(400):
    ...     x = rng.normal(size=2)
    ...     d = pol.decide(x)
    ...     pol.update(x, d.block_size, (x[0] if d.block_size == 4 else -x[0]) + rng.normal(0, 0.1))
    >>> d = pol.decide([2.0, 0.0])
    >>> d.block_size, bool(d.propensity > 0.9), bool(abs(d.probs.sum() - 1) < 1e-12)
    (4, True, True)
    """

    name = "squarecb"

    def __init__(
        self,
        arms: Sequence[int] | None = None,
        gamma: float | None = None,
        gamma_scale: float = 4.0,
        head: HeadModel | str | Path | None = None,
        prior_n: float = 64.0,
        **kwargs: Any,
    ) -> None:
        if gamma is not None and not (gamma >= 0 and math.isfinite(gamma)):
            raise AdaptspecError(f"gamma must be >= 0, got {gamma}")
        if not (gamma_scale > 0 and math.isfinite(gamma_scale)):
            raise AdaptspecError(f"gamma_scale must be > 0, got {gamma_scale}")
        self.gamma = None if gamma is None else float(gamma)
        self.gamma_scale = float(gamma_scale)
        self.head: HeadModel | None = None
        self.fingerprint: str | None = None
        if head is not None:
            self.head = head if isinstance(head, HeadModel) else HeadModel.load(head)
            if arms is not None and tuple(sorted(int(a) for a in arms)) != tuple(sorted(self.head.arms)):
                raise AdaptspecError(
                    f"the head was trained for arms {list(self.head.arms)}, not {list(arms)}"
                )
            for key in ("standardize", "prior_mean", "prior_precision", "dim"):
                if key in kwargs:
                    raise AdaptspecError(f"{key} cannot be combined with head= (the head defines them)")
            mean, prec, s2 = head_prior(self.head, prior_n)
            self.fingerprint = head_fingerprint(self.head)
            kwargs.update(
                feature_map=HeadFeatures(self.head),
                prior_mean=mean,
                prior_precision=prec,
                noise_prior=(s2, 100.0),
            )
            arms = self.head.arms
        elif arms is None:
            raise AdaptspecError("SquareCB needs arms (or a head)")
        super().__init__(arms, **kwargs)

    @property
    def label(self) -> str:
        return "squarecb-head" if self.head is not None else self.name

    def current_gamma(self) -> float:
        if self.gamma is not None:
            return self.gamma
        return self.gamma_scale * math.sqrt(len(self.arms) * max(self.version, 1))

    def _probs_from(self, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        return squarecb_probs(mu, self.current_gamma())

    def _probs_from_many(self, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        return squarecb_probs(mu, self.current_gamma())

    def _state(self) -> dict[str, Any]:
        st = super()._state()
        if self.fingerprint is not None:
            st["head"] = self.fingerprint
        return st

    def _load_state(self, state: dict[str, Any]) -> None:
        if state.get("head") != self.fingerprint:
            raise AdaptspecError(
                f"state was saved with head {state.get('head')!r}, this policy uses {self.fingerprint!r}"
            )
        super()._load_state(state)
