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
    "prefill_features",
]


def __getattr__(name: str):
    if name == "AdaptiveController":
        from .control.controller import AdaptiveController

        return AdaptiveController
    if name == "prefill_features":  # the standard feature vector of a Hugging Face prefill (loads torch)
        from .decoding.features import prefill_features

        return prefill_features
    raise AttributeError(f"module 'adaptspec' has no attribute {name!r}")
