"""adaptspec: per-request block sizes for block-diffusion speculative decoding.

Public names are imported lazily so that ``import adaptspec`` stays cheap (no torch).
"""

from .errors import AdaptspecError
from .speculator import BlockSpeculator, Decision, Outcome, Prefill, Round

__version__ = "0.1.0"

__all__ = [
    "AdaptiveController",
    "AdaptspecError",
    "BlockSpeculator",
    "Decision",
    "Outcome",
    "Prefill",
    "Round",
]


def __getattr__(name: str):
    if name == "AdaptiveController":
        from .control.controller import AdaptiveController

        return AdaptiveController
    raise AttributeError(f"module 'adaptspec' has no attribute {name!r}")
