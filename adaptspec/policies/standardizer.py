"""The frozen feature and reward map of the linear-model policies; how a policy gets one (a
warm-up, a fitted map, or none) is described in :mod:`adaptspec.policies.linear`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import AdaptspecError
from . import ridge_kernels


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
        if not (
            math.isfinite(self.reward_mean) and math.isfinite(self.reward_scale) and self.reward_scale > 0
        ):
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
        return {
            "mean": self.mean,
            "scale": self.scale,
            "reward_mean": self.reward_mean,
            "reward_scale": self.reward_scale,
            "intercept": self.intercept,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Standardizer":
        return cls(d["mean"], d["scale"], d["reward_mean"], d["reward_scale"], bool(d["intercept"]))
