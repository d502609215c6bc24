"""The real speculator: a block-diffusion drafter, a target adapter and the draft/verify loop."""

from .decoder import SpeculativeDecoder
from .drafter import BlockDiffusionDrafter, DrafterConfig
from .target import TargetModel
from .tree_budget import CostAwareTree, FixedTree, TreeBudget

__all__ = [
    "BlockDiffusionDrafter",
    "CostAwareTree",
    "DrafterConfig",
    "FixedTree",
    "SpeculativeDecoder",
    "TargetModel",
    "TreeBudget",
]
