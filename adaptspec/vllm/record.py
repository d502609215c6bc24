"""One vLLM request as the plug-in follows it: its variant, its decision, its rounds and its time.

A request is admitted with its prompt; when its prefill ends it is decided (its block size B:
1 + the drafts verified, B = 1 no speculation); every engine step that decodes it adds one round
(the drafts vLLM verified for it, the tokens it committed, its share of the step's time); when it
ends, :meth:`RequestRecord.outcome` is what the controller's ``feedback`` gets.

vLLM keeps only the tokens of a request's last step up to its stop (``max_tokens``, a stop
token): the round that step added counted what the step sampled, so the outcome gives that
round the tokens the request kept (its tokens less the prefill's and the earlier rounds').

>>> r = RequestRecord("r1", "A", prompt_tokens=12, admitted_s=0.0)
>>> r.add_round(drafted=3, proposed=7, committed=2, share_s=0.010, rows=2)
>>> r.add_round(drafted=0, proposed=0, committed=1, share_s=0.004, rows=1)
>>> o = r.outcome([5, 6, 7, 8], finish_reason="length")
>>> [(x.block_size, x.tau, x.drafted) for x in o.rounds], round(o.decode_s, 3), r.view.accepted
([(4, 2, 8), (1, 1, 0)], 0.014, 1)
>>> r.add_round(drafted=3, proposed=3, committed=4, share_s=0.010, rows=1)   # 4 sampled, 2 kept
>>> [x.tau for x in r.outcome([5, 6, 7, 8, 9, 10], finish_reason="length").rounds]
[2, 1, 2]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ..load_rules.load import RowView
from ..speculator import Outcome, Round, SharedRounds

__all__ = ["RequestRecord", "kept_last_tau"]


@dataclass
class RequestRecord:
    """What the plug-in knows of one request (see the module docstring)."""

    request_id: str
    variant: str
    prompt_tokens: int
    admitted_s: float
    features: Any = None
    decision: Any = None  # the controller's Decision, once the prefill ended
    decided_s: float = 0.0
    fallback: str | None = None  # why the request runs at vLLM's own length (None: it does not)
    rounds: list[Round] = field(default_factory=list)
    attributed_s: float = 0.0
    row_rounds: int = 0
    view: RowView = None  # type: ignore[assignment]  # what a load rule sees of it

    def __post_init__(self) -> None:
        self.view = RowView(self.prompt_tokens)

    @property
    def block_size(self) -> int | None:
        """The decided block size (None: not decided, or fallen back to vLLM's own length)."""
        return None if self.decision is None or self.fallback is not None else int(self.decision.block_size)

    def add_round(self, drafted: int, proposed: int, committed: int, share_s: float, rows: int) -> None:
        """One engine step decoded it: ``drafted`` drafts verified (of ``proposed`` the drafter
        proposed before the cut), ``committed`` tokens (accepted drafts + the target's own),
        ``share_s`` its share of the step's time, in a pass of ``rows`` requests."""
        block = 1 + drafted
        whole = 1 + proposed if drafted else 0
        self.rounds.append(
            Round(block, committed, 0.0, share_s, drafted=whole if whole > block else 0, rows=rows)
        )
        self.view.after_round(block, committed, self.view.m + committed)
        self.attributed_s += share_s
        self.row_rounds += rows

    def outcome(self, tokens: Sequence[int], finish_reason: str) -> Outcome:
        """The request's :class:`~adaptspec.speculator.Outcome`: its tokens, its rounds since the
        decision (the last one's tokens those vLLM kept: see the module docstring), its attributed
        decode time."""
        rounds = list(self.rounds)
        if rounds:
            rounds[-1] = replace(rounds[-1], tau=kept_last_tau([r.tau for r in rounds], len(tokens)))
        return Outcome(list(tokens), rounds, decode_s=self.attributed_s, finish_reason=finish_reason)

    def shared(self, now_s: float) -> SharedRounds:
        """How its decode time was counted (the log keeps it)."""
        return SharedRounds(
            attributed_s=self.attributed_s,
            wall_decode_s=max(now_s - self.decided_s, 0.0),
            rounds=len(self.rounds),
            row_rounds=self.row_rounds,
        )


def kept_last_tau(taus: Sequence[int], tokens_out: int) -> int:
    """The last round's tokens as vLLM kept them: ``taus`` the rounds' committed tokens as its steps
    sampled them, ``tokens_out`` the tokens the request kept (the prefill's one included); the last
    round gives up what lies past them (see the module docstring).

    >>> kept_last_tau([2, 1, 4], 6), kept_last_tau([2, 1, 4], 8)
    (2, 4)
    """
    excess = 1 + sum(taus) - tokens_out  # 1: the prefill's token
    return taus[-1] - excess if 0 < excess < taus[-1] else taus[-1]
