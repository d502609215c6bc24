"""What one batched round did, for attributing time to rows (load-aware control).

>>> r = RoundRecord(requests=(3, 5), block_sizes=(4, 1), taus=(2, 1), draft_s=0.004, verify_s=0.03, round_s=0.036)
>>> r.rows, r.tokens, r.verified, r.width
(2, 3, 5, 4)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoundRecord:
    """One round: the request ids of its rows, each row's verified block and committed
    tokens, and the round's times (drafter phase, the rows' share of the target pass +
    acceptance, whole round with joins and leaves)."""

    requests: tuple[int, ...]
    block_sizes: tuple[int, ...]
    taus: tuple[int, ...]
    draft_s: float
    verify_s: float
    round_s: float
    joined: int = 0  # requests that started rows in this round (their prompts prefilled)
    join_s: float = 0.0  # the joining requests' time inside round_s: prefills alone, or the pass less the rows' share (rows_pass_cost)
    prompt_tokens: int = 0  # joining prompts' tokens that rode in this round's pass

    @property
    def rows(self) -> int:
        return len(self.requests)

    @property
    def tokens(self) -> int:
        """Tokens committed by all rows."""
        return sum(self.taus)

    @property
    def verified(self) -> int:
        """Block positions verified (padding excluded)."""
        return sum(self.block_sizes)

    @property
    def width(self) -> int:
        """The widest block: every row's pass was padded to it."""
        return max(self.block_sizes, default=0)
