"""The speculator protocol and the records that flow between the parts.

A speculator is anything that can prefill a prompt and then decode with a given block
size. Wrapping another engine means implementing :class:`BlockSpeculator`: two methods
and one attribute.

>>> r = [Round(block_size=8, tau=3, draft_s=0.01, verify_s=0.05),
...      Round(block_size=8, tau=5, draft_s=0.01, verify_s=0.05)]
>>> out = Outcome(tokens=[5] * 9, rounds=r, decode_s=0.12)
>>> out.new_tokens, out.mean_tau
(9, 4.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Round:
    """One draft/verify round: ``tau`` tokens committed (accepted drafts + the bonus token)."""

    block_size: int
    tau: int
    draft_s: float
    verify_s: float

    def __post_init__(self) -> None:
        if not 1 <= self.tau <= self.block_size:
            raise ValueError(f"tau={self.tau} outside 1..block_size={self.block_size}")


@dataclass
class Outcome:
    """What decoding one request produced.

    ``tokens`` are all new token ids (the token chosen at prefill included);
    ``decode_s`` is the wall time of the draft/verify loop, prefill excluded.
    """

    tokens: list[int]
    rounds: list[Round]
    decode_s: float
    finish_reason: str = "length"  # "length" | "eos"

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def mean_tau(self) -> float:
        """Mean tokens committed per round (nan when no round ran)."""
        if not self.rounds:
            return float("nan")
        return float(np.mean([r.tau for r in self.rounds]))

    @property
    def draft_s(self) -> float:
        return float(sum(r.draft_s for r in self.rounds))

    @property
    def verify_s(self) -> float:
        return float(sum(r.verify_s for r in self.rounds))


@dataclass
class Prefill:
    """Result of running the target on the prompt.

    ``features`` is the prefill representation (1-D float32) that policies see;
    ``state`` is the speculator's own opaque state (KV cache, hidden states, ...).
    """

    first_token: int
    prompt_tokens: int
    features: np.ndarray
    state: Any = None


@dataclass
class Decision:
    """A policy's choice of block size, with what off-policy evaluation needs.

    ``probs`` is the probability of every arm (same order as ``arms``); ``propensity`` is the
    probability of the chosen one. Treat it as read-only (``with_id`` returns a copy); it is not
    a frozen dataclass only because one is built per request on the hot path, where a frozen
    one costs four times as much to build (~1 us).
    """

    block_size: int
    propensity: float
    probs: np.ndarray
    arms: tuple[int, ...]
    policy: str
    version: int = 0
    decision_id: str | None = None
    extras: dict = field(default_factory=dict, compare=False)

    def with_id(self, decision_id: str) -> "Decision":
        """A copy of this decision carrying ``decision_id``."""
        return Decision(
            self.block_size, self.propensity, self.probs, self.arms, self.policy,
            self.version, decision_id, self.extras,
        )


@runtime_checkable
class BlockSpeculator(Protocol):
    """What :class:`adaptspec.AdaptiveController` needs from a speculative decoder."""

    max_block_size: int

    def prefill(self, prompt_ids: Sequence[int], **kwargs: Any) -> Prefill: ...

    def decode(
        self,
        prefill: Prefill,
        block_size: int,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> Outcome: ...
