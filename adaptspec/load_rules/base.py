"""What every block-size rule under load has (:mod:`adaptspec.load_rules`): a name, a choice of
every active row's block size each round, and the round's outcome back after it."""

from __future__ import annotations

from typing import Protocol, Sequence

from .load import Load, LoadRow


class LoadRule(Protocol):
    """A block-size rule under load, as the load simulator and the engine's round hook call it."""

    name: str

    def choose(self, rows: Sequence[LoadRow], load: Load) -> list[int]:
        """Every row's block size this round (one per row), given the rows (their ``accepted``,
        ``rejected``, ``context`` and ``m``) and the load (its ``rows`` and ``queue``)."""
        ...

    def feedback(
        self,
        rows: Sequence[LoadRow],
        block_sizes: Sequence[int],
        taus: Sequence[int],
        attributed_s: Sequence[float],
        load: Load,
    ) -> None:
        """After the round: each row's asked block size, committed tokens and share of the round's time."""
        ...
