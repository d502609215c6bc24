"""Verify only the drafts the drafter is sure of; stop drafting while it is unsure.

The drafter's top-1 probability of each draft is a cheap, early estimate of whether the
target will accept it (SVIP and DSpark schedule verification on it). This schedule drafts
``block_size`` and verifies the longest prefix whose *cumulative* top-1 probability (the
product over the prefix: the drafter's own estimate that the whole prefix is right) stays at or
above ``threshold``; when even the first draft is below, the round verifies the last token
alone, a plain step. A plain step after drafting still paid for the draft pass, so with
``backoff`` the schedule stops drafting after such a round: 1 plain step, then 2, 4, ... (up to
``max_backoff``) while the drafter's first draft keeps falling below the threshold, and drafts
again after each run of plain steps.

Verifying a prefix chosen from the drafter alone keeps decoding lossless at any temperature:
the target's acceptance test never sees the drafts left out.

>>> import numpy as np
>>> s = ConfidenceThreshold(0.5, block_size=6)
>>> s.draft_size([]), s.verify_size(np.array([0.9, 0.8, 0.6, 0.99, 0.9]), [])  # 0.9, 0.72, 0.43
(6, 3)
>>> unsure = Round(block_size=1, tau=1, draft_s=0.01, verify_s=0.04, drafted=6)
>>> plain = Round(block_size=1, tau=1, draft_s=0.0, verify_s=0.04)
>>> [s.draft_size(h) for h in ([unsure], [unsure, plain], [unsure, plain, unsure], [unsure, plain, unsure, plain])]
[1, 6, 1, 1]
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ..errors import AdaptspecError
from ..speculator import Round
from .fixed import FixedBlock


@dataclass(frozen=True)
class ConfidenceThreshold:
    """Verify the prefix of drafts whose cumulative top-1 probability is >= ``threshold``."""

    threshold: float = 0.4
    block_size: int = 16
    backoff: bool = True
    max_backoff: int = 16
    uses_confidence = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise AdaptspecError(f"confidence threshold must be in [0, 1], got {self.threshold!r}")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 2:
            raise AdaptspecError(
                f"a confidence schedule drafts at least 2 tokens, got block size {self.block_size!r}"
            )
        if self.max_backoff < 1:
            raise AdaptspecError(f"max_backoff must be >= 1, got {self.max_backoff!r}")

    def draft_size(self, rounds: Sequence[Round]) -> int:
        if not self.backoff:
            return self.block_size
        plain = unsure = 0  # the trailing run of plain steps, and the unsure rounds before it
        i = len(rounds) - 1
        while i >= 0 and rounds[i].draft_size == 1:
            plain, i = plain + 1, i - 1
        while i >= 0 and rounds[i].draft_size > 1 and rounds[i].block_size == 1:
            unsure, i = unsure + 1, i - 1
            while i >= 0 and rounds[i].draft_size == 1:  # the plain steps between unsure rounds
                i -= 1
        if unsure and plain < min(2 ** (unsure - 1), self.max_backoff):
            return 1
        return self.block_size

    def verify_size(self, confidence: np.ndarray, rounds: Sequence[Round]) -> int:
        sure = np.cumprod(np.asarray(confidence, dtype=np.float64)) >= self.threshold
        return 1 + int(np.cumprod(sure).sum())

    def with_block_size(self, block_size: int) -> "ConfidenceThreshold | FixedBlock":
        """The same rule drafting ``block_size``; block size 1 is plain decoding."""
        return FixedBlock(1) if block_size == 1 else replace(self, block_size=int(block_size))
