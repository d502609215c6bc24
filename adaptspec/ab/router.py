"""A/B router: assign each request to a policy variant by a stable hash of a key.

The key is the request's user (or any stable id): the same key always lands in the same
variant, whatever the process, machine or restart (SHA-256, not Python's salted ``hash``),
so a user sees one policy throughout. Requests without a key are assigned at random.

>>> r = ABRouter({"A": 50, "B": 50})
>>> r.assign("user-17") == r.assign("user-17")
True
>>> r = ABRouter.parse(["A=neural-linear:head=runs/head", "B=fixed:16"], "90,10")
>>> r.variants, r.weights.tolist()
(('A', 'B'), [0.9, 0.1])
>>> r.specs["B"]
'fixed:16'
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Mapping, Sequence

import numpy as np

from ..errors import AdaptspecError
from .variants import VARIANT_NAME, check_variant_name, named_specs

__all__ = ["ABRouter", "VARIANT_NAME"]


class ABRouter:
    """Variants with weights; :meth:`assign` maps a key to one of them.

    ``weights`` need not sum to 1 (they are normalised); a zero weight keeps a variant
    reachable only when a request asks for it by name.
    """

    def __init__(
        self, weights: Mapping[str, float], specs: Mapping[str, str] | None = None, salt: str = ""
    ) -> None:
        if not weights:
            raise AdaptspecError("the A/B router needs at least one variant")
        names = tuple(weights)
        for n in names:
            check_variant_name(n)
        w = np.asarray([float(weights[n]) for n in names])
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise AdaptspecError(f"variant weights must be >= 0 with a positive sum, got {list(w)}")
        self.variants: tuple[str, ...] = names
        self.weights = w / w.sum()
        self._cum = np.cumsum(self.weights)
        self._cum[-1] = 1.0
        self.specs = dict(specs or {})
        self.salt = salt

    @classmethod
    def parse(cls, variants: Sequence[str], split: str | None = None, salt: str = "") -> "ABRouter":
        """From CLI values: ``["A=SPEC", "B=SPEC"]`` and ``"50,50"`` (default: equal split)."""
        specs = named_specs(variants, "--variant", "A=fixed:16")
        if split is None:
            weights = [1.0] * len(specs)
        else:
            try:
                weights = [float(x) for x in split.split(",")]
            except ValueError:
                raise AdaptspecError(f"--split: expected weights like 50,50, got {split!r}") from None
            if len(weights) != len(specs):
                raise AdaptspecError(f"--split has {len(weights)} weights for {len(specs)} variants")
        return cls(dict(zip(specs, weights)), specs, salt)

    def position(self, key: str) -> float:
        """Where ``key`` falls in [0, 1): the first 8 bytes of SHA-256(salt + key)."""
        h = hashlib.sha256((self.salt + "\x00" + key).encode()).digest()
        return int.from_bytes(h[:8], "big") / 2.0**64

    def assign(self, key: str | None = None) -> str:
        """The variant for ``key`` (random when None)."""
        u = self.position(key) if key is not None else secrets.randbits(53) / 2.0**53
        i = int(np.searchsorted(self._cum, u, side="right"))
        return self.variants[min(i, len(self.variants) - 1)]

    def check(self, variant: str) -> str:
        """``variant`` if it exists, else a clear error."""
        if variant not in self.variants:
            raise AdaptspecError(f"unknown variant {variant!r}: this server has {', '.join(self.variants)}")
        return variant

    def to_dict(self) -> dict[str, object]:
        return {
            "variants": {
                n: {"weight": round(float(w), 6), "spec": self.specs.get(n)}
                for n, w in zip(self.variants, self.weights)
            }
        }

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={w:.3g}" for n, w in zip(self.variants, self.weights))
        return f"ABRouter({parts})"
