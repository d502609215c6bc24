"""Phase times of a round without extra host syncs.

On CPU a mark is ``time.perf_counter()``. On CUDA a mark is also a recorded CUDA event, and
the spans between marks are read from the events once the round's own host sync (the
acceptance) has happened, so timing adds no synchronisation of its own.

>>> import torch
>>> clock = RoundClock(torch.device("cpu"))
>>> clock.mark(); clock.mark(); clock.mark()
>>> spans = clock.spans()
>>> len(spans), all(s >= 0 for s in spans)
(3, True)
"""

from __future__ import annotations

import time

import torch


class RoundClock:
    """Marks taken during one round; :meth:`spans` gives the seconds from the start to the first
    mark and between consecutive marks."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.start = time.perf_counter()
        self.walls: list[float] = []
        self.events: list = []

    def mark(self) -> None:
        self.walls.append(time.perf_counter())
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.events.append(e)

    def spans(self) -> list[float]:
        """Call after the round's host sync. On CUDA the first span is wall time (joins sync
        anyway) and the others are the device's event times."""
        first = self.walls[0] - self.start
        if not self.cuda:
            return [first] + [b - a for a, b in zip(self.walls, self.walls[1:])]
        self.events[-1].synchronize()  # already reached: the acceptance synchronised
        return [first] + [a.elapsed_time(b) / 1e3 for a, b in zip(self.events, self.events[1:])]

    def total(self) -> float:
        return time.perf_counter() - self.start
