"""Block-size policies: one family per module, one protocol (:class:`Policy`)."""

from .base import Policy
from .baselines import Fixed, Oracle, RandomPolicy
from .spec import REGISTRY, make_policy

__all__ = ["Policy", "Fixed", "Oracle", "RandomPolicy", "REGISTRY", "make_policy"]
