"""The fixed rule under load: one block size for every row, every round (1 = plain decoding)."""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import AdaptspecError


class Fixed:
    """The same block size for every row, every round."""

    def __init__(self, block_size: int) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise AdaptspecError(f"block size must be an int >= 1, got {block_size!r}")
        self.block_size = block_size
        self.name = "plain" if block_size == 1 else f"fixed:{block_size}"

    def choose(self, rows: Sequence[Any], load: Any) -> list[int]:
        return [self.block_size] * len(rows)

    def feedback(self, *args: Any) -> None:
        pass
