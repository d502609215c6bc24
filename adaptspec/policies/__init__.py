"""Block-size policies: one family per module, one protocol (:class:`Policy`)."""

from .base import Policy
from .baselines import Fixed, Oracle, RandomPolicy
from .linear import LinTS, LinUCB, Standardizer
from .mab import EXP3, UCB, EpsilonGreedy, ThompsonSampling
from .neural_linear import NeuralLinear
from .offline_head import HeadModel, OfflineHead, train_head
from .river_adapter import RiverPolicy
from .spec import REGISTRY, make_policy
from .squarecb import SquareCB

__all__ = ["Policy", "Fixed", "Oracle", "RandomPolicy", "REGISTRY", "make_policy",
           "EpsilonGreedy", "UCB", "ThompsonSampling", "EXP3", "LinUCB", "LinTS", "Standardizer",
           "OfflineHead", "HeadModel", "train_head", "NeuralLinear", "SquareCB", "RiverPolicy"]
