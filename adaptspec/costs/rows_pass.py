"""The rows' part of a target pass that also carried joining prompts' chunks.

A pass with chunks (:mod:`~adaptspec.batching.packed_pass`) computes the decoding rows' blocks and
the joining prompts' tokens together, and its seconds are split between them. The rows are
charged what a pass of their own positions costs on this engine, measured: an exponential
average of the latest passes that carried rows alone with as many positions (rows x the widest
block); the joining prompts get the rest. Where no rows-only pass of that many positions has run
yet, the neighbouring sizes' averages are interpolated (the nearest one past either end); before
any, the pass is split by positions.

Why not by positions always: a pass costs far from proportionally to its positions on these
machines (4 rows at B = 1 beside a 64-token chunk are 6% of its positions, but a pass of their 4
positions alone costs about half of it), and the distortion is larger for narrow blocks than for
wide ones (12 of 76 positions at B = 3). A learner fed those times (the load rule's rewards, a
request's attributed time and so its controller's reward) would see narrow blocks grow fast
whenever requests join, and drift to them.

>>> cost = RowsPassCost(alpha=0.5)
>>> cost.rows_share(0.050, positions=4, prompt_tokens=0)    # rows alone: all of it, and remembered
0.05
>>> cost.rows_share(0.070, positions=4, prompt_tokens=0)
0.07
>>> cost.rows_share(0.120, positions=4, prompt_tokens=64)   # with a chunk: the rows-only average
0.06
>>> cost.rows_share(0.030, positions=4, prompt_tokens=64)   # never more than the pass itself
0.03
"""

from __future__ import annotations

import bisect

#: Weight of the newest rows-only pass in its size's average.
ALPHA = 0.1


class RowsPassCost:
    """Recent seconds of rows-only target passes by positions, and the rows' share of a pass with chunks."""

    def __init__(self, alpha: float = ALPHA) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self._seconds: dict[int, float] = {}  # positions -> exponential average of a rows-only pass
        self._sizes: list[int] = []  # the keys, sorted

    def rows_share(self, pass_s: float, positions: int, prompt_tokens: int) -> float:
        """The rows' seconds of a pass of ``pass_s`` that computed ``positions`` of the rows' and
        ``prompt_tokens`` of joining prompts' (a pass without prompt tokens is learnt from)."""
        if positions <= 0:
            return 0.0
        if prompt_tokens <= 0:
            self._observe(positions, pass_s)
            return pass_s
        estimate = self.estimate(positions)
        if estimate is None:
            return pass_s * positions / (positions + prompt_tokens)
        return min(pass_s, estimate)

    def estimate(self, positions: int) -> float | None:
        """What a rows-only pass of ``positions`` costs here now (None before any was seen)."""
        if not self._sizes:
            return None
        if positions in self._seconds:
            return self._seconds[positions]
        i = bisect.bisect_left(self._sizes, positions)
        if i == 0:
            return self._seconds[self._sizes[0]]
        if i == len(self._sizes):
            return self._seconds[self._sizes[-1]]
        lo, hi = self._sizes[i - 1], self._sizes[i]
        w = (positions - lo) / (hi - lo)
        return (1 - w) * self._seconds[lo] + w * self._seconds[hi]

    def _observe(self, positions: int, seconds: float) -> None:
        old = self._seconds.get(positions)
        if old is None:
            bisect.insort(self._sizes, positions)
            self._seconds[positions] = seconds
        else:
            self._seconds[positions] = old + self.alpha * (seconds - old)
