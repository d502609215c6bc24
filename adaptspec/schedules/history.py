"""Grow the block after a fully accepted round, shrink it after a rejection.

The adaptive schedule serving engines and transformers' assisted generation use (its
``"heuristic"`` schedule: two more drafts after a round whose drafts were all accepted, one
fewer after a round with a rejection), extended down to plain decoding: at block size 1 the
schedule takes ``probe_after`` plain steps and then drafts 2 again.

>>> s = AcceptanceHistory(block_size=4, max_block_size=8)
>>> r = lambda b, tau: Round(block_size=b, tau=tau, draft_s=0.0, verify_s=0.04)
>>> s.draft_size([]), s.draft_size([r(4, 4)]), s.draft_size([r(8, 8)]), s.draft_size([r(4, 2)])
(4, 6, 8, 3)
>>> s.draft_size([r(2, 1)]), s.draft_size([r(2, 1), r(1, 1)]), s.draft_size([r(2, 1)] + [r(1, 1)] * 8)
(1, 1, 2)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ..errors import AdaptspecError
from ..speculator import Round
from .fixed import FixedBlock


@dataclass(frozen=True)
class AcceptanceHistory:
    """Start at ``block_size``; ``+grow`` after a fully accepted round, ``-shrink`` after a rejection."""

    block_size: int = 4
    max_block_size: int = 16
    grow: int = 2
    shrink: int = 1
    probe_after: int = 8
    uses_confidence = False

    def __post_init__(self) -> None:
        for name in ("block_size", "max_block_size", "grow", "shrink", "probe_after"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise AdaptspecError(f"{name} must be a positive int, got {v!r}")
        if self.block_size > self.max_block_size:
            raise AdaptspecError(f"block_size {self.block_size} above max_block_size {self.max_block_size}")

    def draft_size(self, rounds: Sequence[Round]) -> int:
        if not rounds:
            return self.block_size
        last = rounds[-1]
        if last.draft_size == 1:
            plain = 0
            for r in reversed(rounds):
                if r.draft_size != 1:
                    break
                plain += 1
            return 1 if plain < self.probe_after else min(2, self.max_block_size)
        if last.tau == last.block_size:
            return min(last.draft_size + self.grow, self.max_block_size)
        return max(1, last.draft_size - self.shrink)

    def verify_size(self, confidence: np.ndarray, rounds: Sequence[Round]) -> int:
        return len(confidence) + 1

    def with_block_size(self, block_size: int) -> "AcceptanceHistory | FixedBlock":
        """Start at ``block_size``; block size 1 is plain decoding throughout."""
        if block_size == 1:
            return FixedBlock(1)
        return replace(
            self, block_size=int(block_size), max_block_size=max(self.max_block_size, int(block_size))
        )
