"""Continuous batching: many requests decoded together, each with its own block size."""

from .engine import BatchEngine
from .records import RoundRecord
from .rows import RequestHandle

__all__ = ["BatchEngine", "RequestHandle", "RoundRecord"]
