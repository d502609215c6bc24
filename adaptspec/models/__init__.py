"""Loading the bundled target and drafter, and the library code of the training scripts.

``BUNDLED_TARGET`` and ``load_target`` live in :mod:`adaptspec.decoding.loading` and are imported from
there on first use, so that importing a light module of this package (``adaptspec.models.prompts``:
a command reading a prompt file checks it before any model) does not import torch."""

from typing import Any

from .bundled import BUNDLED_DRAFTER, TEMPLATES_HEAD, load_speculator

__all__ = [
    "BUNDLED_DRAFTER",
    "TEMPLATES_HEAD",
    "BUNDLED_TARGET",
    "load_speculator",
    "load_target",
]


def __getattr__(name: str) -> Any:
    if name in ("BUNDLED_TARGET", "load_target"):
        from ..decoding import loading

        return getattr(loading, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
