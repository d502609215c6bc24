"""What a load rule sees when it chooses: the load (:class:`Load`) and each row (:class:`LoadRow`).

The load simulator (:mod:`adaptspec.simulators.load_sim`), the batched server's round hook
(:mod:`adaptspec.load_rules.round_rule`) and the vLLM plug-in hand a rule these. A row the engine
decodes is seen through a :class:`RowView`, the fields the rules read: ``accepted`` (drafts
accepted so far), ``rejected`` (rounds that ended on a rejected draft), ``context`` (prompt +
committed tokens) and ``m`` (committed tokens).

>>> v = RowView(prompt_tokens=5)
>>> v.after_round(block_size=4, tau=2, committed=3); (v.accepted, v.rejected, v.m, v.context)
(1, 1, 3, 8)
>>> v.after_round(block_size=2, tau=2, committed=5); (v.accepted, v.rejected)
(2, 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["Load", "LoadRow", "RowView"]


@dataclass
class Load:
    """What a rule sees of the system when it chooses: rows in the pass and requests waiting."""

    rows: int
    queue: int


class LoadRow(Protocol):
    """What a rule reads of one row: its drafts accepted and rejected rounds so far, its context
    and its committed tokens."""

    @property
    def accepted(self) -> int: ...

    @property
    def rejected(self) -> int: ...

    @property
    def context(self) -> int: ...

    @property
    def m(self) -> int: ...


class RowView:
    """What a load rule sees of one request the engine decodes (a :class:`LoadRow`)."""

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.accepted = 0
        self.rejected = 0
        self.m = 0

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.m

    def after_round(self, block_size: int, tau: int, committed: int) -> None:
        """A round verified ``block_size`` and committed ``tau``; ``committed`` tokens in all now."""
        self.accepted += tau - 1
        self.rejected += int(tau < block_size)
        self.m = committed
