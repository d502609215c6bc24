"""What :meth:`AdaptiveController.generate <adaptspec.control.controller.AdaptiveController.generate>`
returns (:class:`Generation`), what its ``feedback`` returns (:class:`FeedbackResult`), the error of
a refused prompt (:class:`PrefillError`), and how one request's outcome is split among its
re-decisions (:func:`split_outcome`).

>>> r = FeedbackResult("applied", 41.5)
>>> r == "applied", r.status, r.reward
(True, 'applied', 41.5)

>>> from adaptspec.speculator import Round
>>> out = Outcome([7, 1, 2, 3, 4, 5], [Round(2, 2, 0.0, 1.0), Round(4, 3, 0.0, 3.0)], decode_s=4.0)
>>> [(o.tokens, o.decode_s) for o in split_outcome(out, [0, 1])]
[([7, 1, 2], 1.0), ([3, 4, 5], 3.0)]
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import AdaptspecError
from ..speculator import Decision, Outcome


class FeedbackResult(str):
    """What :meth:`AdaptiveController.feedback` computed: its status (this string: ``"applied"``,
    ``"no_reward"``, ``"duplicate"``, ``"late"`` or ``"unknown"``, so it compares as the status
    does) and the reward it logged and queued (None unless ``"applied"``). Immutable."""

    reward: float | None

    def __new__(cls, status: str, reward: float | None = None) -> "FeedbackResult":
        self = super().__new__(cls, status)
        object.__setattr__(self, "reward", reward)
        return self

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a FeedbackResult cannot be changed")

    @property
    def status(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"FeedbackResult({str(self)!r}, {self.reward!r})"


class PrefillError(AdaptspecError):
    """The speculator refused the prompt (empty, token ids out of range, ...): the caller's input is wrong."""


@dataclass
class Generation:
    """What :meth:`AdaptiveController.generate` returns.

    ``decision`` is the decision made after prefill; ``decisions`` holds it and any
    re-decisions (``redecide_every``), ``rewards`` their rewards (None where the reward was
    undefined). ``overhead_s`` is the controller's own time: featurize + decide + reward +
    log + enqueueing the update (the update itself runs on the update thread).
    """

    outcome: Outcome
    decision: Decision
    decisions: list[Decision]
    rewards: list[float | None]
    prefill_s: float
    overhead_s: float

    @property
    def tokens(self) -> list[int]:
        return self.outcome.tokens

    @property
    def reward(self) -> float | None:
        """The reward of the whole request (of the first decision when there were re-decisions)."""
        return self.rewards[0]

    @property
    def fallback(self) -> str | None:
        """Why the first decision fell back to the fallback block size, or None."""
        return self.decision.extras.get("fallback")


def split_outcome(outcome: Outcome, starts: list[int]) -> list[Outcome]:
    """One outcome per re-decision: its rounds, their tokens, its share of the decode time."""
    rounds = outcome.rounds
    bounds = starts + [len(rounds)]
    busy = [r.draft_s + r.verify_s for r in rounds]
    total = sum(busy)
    out = []
    pos = 1
    for j in range(len(starts)):
        rs = rounds[bounds[j] : bounds[j + 1]]
        n = sum(r.tau for r in rs)
        toks = (outcome.tokens[:1] if j == 0 else []) + outcome.tokens[pos : pos + n]
        pos += n
        share = sum(busy[bounds[j] : bounds[j + 1]]) / total if total > 0 else len(rs) / max(1, len(rounds))
        last = j == len(starts) - 1
        out.append(
            Outcome(toks, list(rs), outcome.decode_s * share, outcome.finish_reason if last else "length")
        )
    return out
