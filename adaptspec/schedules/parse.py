"""Schedules from short text specs, as the CLI and configuration files give them.

>>> parse_schedule("confidence:0.3")
ConfidenceThreshold(threshold=0.3, block_size=16, backoff=True, max_backoff=16)
>>> parse_schedule("confidence:0.5,nobackoff", max_block_size=8).block_size
8
>>> parse_schedule("history")
AcceptanceHistory(block_size=4, max_block_size=16, grow=2, shrink=1, probe_after=8)
>>> parse_schedule("fixed:4")
FixedBlock(block_size=4)
>>> parse_schedule("sometimes")
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: unknown round schedule 'sometimes': expected fixed:B, confidence[:THRESHOLD[,nobackoff]] or history
"""

from __future__ import annotations

from ..errors import AdaptspecError
from .confidence import ConfidenceThreshold
from .fixed import FixedBlock
from .history import AcceptanceHistory

_USAGE = "expected fixed:B, confidence[:THRESHOLD[,nobackoff]] or history"


def parse_schedule(spec: str, max_block_size: int = 16):
    """``fixed:B``, ``confidence[:T[,nobackoff]]`` or ``history``. ``max_block_size`` (the
    drafter's) is the confidence rule's drafted block and the history rule's ceiling; the history
    rule starts at 4 (or lower)."""
    name, _, arg = str(spec).strip().partition(":")
    try:
        if name == "fixed":
            return FixedBlock(int(arg))
        if name == "confidence":
            parts = [p.strip() for p in arg.split(",") if p.strip()]
            flags = {p for p in parts if not _is_number(p)}
            if flags - {"nobackoff"}:
                raise AdaptspecError(f"unknown round schedule {spec!r}: {_USAGE}")
            nums = [float(p) for p in parts if _is_number(p)]
            return ConfidenceThreshold(
                *(nums[:1] or [0.4]), block_size=max_block_size, backoff="nobackoff" not in flags
            )
        if name == "history" and not arg:
            return AcceptanceHistory(block_size=min(max_block_size, 4), max_block_size=max_block_size)
    except ValueError:
        pass
    raise AdaptspecError(f"unknown round schedule {spec!r}: {_USAGE}")


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False
