"""The table rule under load: a block size per load level, the static "batch size -> B" table
engine users write by hand."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import AdaptspecError


class Table:
    """``{max rows: block size}``: the block size of the smallest level holding the rows in flight
    (the largest level's beyond it)."""

    def __init__(self, table: Mapping[int, int], name: str = "table") -> None:
        if not table:
            raise AdaptspecError("a load table needs at least one level")
        self.levels = sorted((int(k), int(v)) for k, v in table.items())
        self.name = name

    def block_size(self, rows: int) -> int:
        for top, b in self.levels:
            if rows <= top:
                return b
        return self.levels[-1][1]

    def choose(self, rows: Sequence[Any], load: Any) -> list[int]:
        return [self.block_size(load.rows)] * len(rows)

    def feedback(self, *args: Any) -> None:
        pass
