"""The real speculator: a block-diffusion drafter, a target adapter and the draft/verify loop."""

from .decoder import SpeculativeDecoder
from .drafter import BlockDiffusionDrafter, DrafterConfig
from .target import TargetModel

__all__ = ["BlockDiffusionDrafter", "DrafterConfig", "SpeculativeDecoder", "TargetModel"]
