"""Block-size policies: one family per module, one protocol (:class:`Policy`)."""

from .base import Policy

__all__ = ["Policy"]
