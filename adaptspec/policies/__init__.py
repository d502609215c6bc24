"""Block-size policies: one family per module, one protocol (:class:`Policy`)."""

from .base import Policy
from .baselines import Fixed, Oracle, RandomPolicy
from .epsilon_greedy import EpsilonGreedy
from .exp3 import EXP3
from .fi_linucb import FullInfoLinUCB
from .fi_ucb import FullInfoUCB
from .lints import LinTS
from .linucb import LinUCB
from .neural_linear import NeuralLinear
from .offline_head import HeadModel, OfflineHead, train_head
from .river_adapter import RiverPolicy
from .spec import REGISTRY, make_policy
from .squarecb import SquareCB
from .standardizer import Standardizer
from .thompson import ThompsonSampling
from .ucb import UCB

__all__ = [
    "Policy",
    "Fixed",
    "Oracle",
    "RandomPolicy",
    "REGISTRY",
    "make_policy",
    "EpsilonGreedy",
    "UCB",
    "ThompsonSampling",
    "EXP3",
    "LinUCB",
    "LinTS",
    "Standardizer",
    "OfflineHead",
    "HeadModel",
    "train_head",
    "NeuralLinear",
    "SquareCB",
    "RiverPolicy",
    "FullInfoUCB",
    "FullInfoLinUCB",
]
