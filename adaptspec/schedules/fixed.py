"""The same block size every round: what a plain ``int`` block size means.

>>> s = FixedBlock(4)
>>> s.draft_size([]), s.uses_confidence, s.with_block_size(8)
(4, False, FixedBlock(block_size=8))
>>> as_schedule(2)
FixedBlock(block_size=2)
>>> as_schedule(lambda i, rounds: 4 if i % 2 else 1).draft_size([])
1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import AdaptspecError
from ..speculator import Round, RoundSchedule


@dataclass(frozen=True)
class FixedBlock:
    """Draft ``block_size`` and verify all of it, every round (``1``: plain decoding)."""

    block_size: int
    uses_confidence = False

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise AdaptspecError(f"block size must be a positive int, got {self.block_size!r}")

    def draft_size(self, rounds: Sequence[Round]) -> int:
        return self.block_size

    def verify_size(self, confidence: np.ndarray, rounds: Sequence[Round]) -> int:
        return len(confidence) + 1

    def with_block_size(self, block_size: int) -> "FixedBlock":
        return FixedBlock(block_size)


@dataclass(frozen=True)
class BlockFunction:
    """Block size ``fn(round_index, rounds_so_far)`` each round, all of it verified."""

    fn: Callable[[int, Sequence[Round]], int]
    uses_confidence = False

    def draft_size(self, rounds: Sequence[Round]) -> int:
        return self.fn(len(rounds), rounds)

    def verify_size(self, confidence: np.ndarray, rounds: Sequence[Round]) -> int:
        return len(confidence) + 1


def as_schedule(block_size: "int | RoundSchedule | Callable[[int, Sequence[Round]], int]") -> RoundSchedule:
    """A schedule for a block size, a schedule (returned as it is) or a function
    ``(round_index, rounds_so_far) -> block size``."""
    if isinstance(block_size, (int, np.integer)) and not isinstance(block_size, bool):
        return FixedBlock(int(block_size))
    if isinstance(block_size, RoundSchedule):
        return block_size
    if callable(block_size):
        return BlockFunction(block_size)
    raise AdaptspecError(
        f"a block size must be an int, a RoundSchedule or a function of the rounds, got {block_size!r}"
    )
