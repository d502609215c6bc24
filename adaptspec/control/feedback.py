"""Feedback bookkeeping: decisions waiting for feedback, what a feedback does, logging it.

A decision is *pending* from the moment it is made until one of: its feedback arrives
(``applied``, or ``no_reward`` when the reward is undefined), it expires (no feedback for
``feedback_timeout_s``: ``expired``), its decode fails (``decode_error``) or the controller
closes (``dropped``). Each way out logs the decision once (without a reward unless it was
applied). The last 100,000 finished ids are remembered, so a second feedback for one is
``duplicate`` and one after it expired or was dropped is ``late``; an id never decided here
is ``unknown``. A logged row with a reward is queued for the update thread in log order.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import AdaptspecError
from ..speculator import Decision, Outcome

log = logging.getLogger("adaptspec.control.controller")  # one logger for the controller and its parts

_FALLBACK_REASONS = ("error", "timeout", "invalid")
_FEEDBACK = ("applied", "no_reward", "duplicate", "late", "unknown", "expired", "dropped", "decode_error", "log_error")
_DONE_MEMORY = 100_000


class DecisionLogError(AdaptspecError):
    """A decision could not be written to the decision log (a full disk, say): it is not acknowledged,
    and the policy does not learn from it."""


@dataclass
class _Pending:
    decision: Decision
    context: np.ndarray | None
    request_id: str | None
    since: float


@dataclass
class _Update:
    context: np.ndarray | None
    block_size: int
    reward: float
    decision_id: str
    speed_ratio: float | None = None  # measured / speed-reference time; None: learn from ``reward`` as it is


@dataclass
class _Counters:
    decisions: int = 0
    fallbacks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_FALLBACK_REASONS, 0))
    feedback: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_FEEDBACK, 0))
    update_errors: int = 0
    update_s: float = 0.0
    update_max_s: float = 0.0
    checkpoints: int = 0
    checkpoint_errors: int = 0
    log_errors: int = 0
    last_error: tuple[float, str] | None = None  # (time, what) of the newest failure of a checkpoint or log write


class FeedbackMixin:
    """The feedback half of :class:`~adaptspec.control.controller.AdaptiveController`.

    Uses the controller's ``_lock`` (pending decisions, counters), ``_seq_lock`` (log order ==
    update order), ``_cond``/``_enqueued``/``_queue`` (the update queue), ``_pending``,
    ``_done``, ``_counters``, ``_log`` and its settings.
    """

    def _feedback(self, decision_id: str, outcome: Outcome | None, reward: float | None) -> tuple[str, float | None]:
        with self._lock:
            p = self._pending.pop(decision_id, None)
            if p is None:
                prev = self._done.get(decision_id)
                status = "unknown" if prev is None else ("late" if prev in ("expired", "dropped") else "duplicate")
                self._counters.feedback[status] += 1
                return status, None
            self._remember(decision_id, "done")
        r = reward
        ratio = None
        if r is None and outcome is not None:
            try:
                r = float(self.reward_fn(outcome))
            except Exception as e:  # e.g. no round ran: the reward is undefined, the row is still logged
                log.info("%s: no reward for decision %s: %s", self.variant or "controller", decision_id, e)
                r = None
            if r is not None and not math.isfinite(r):
                r = None
            if r is not None and self.machine_speed is not None:  # a computed reward is calibrated, a given one not
                ratio = self.machine_speed.ratio(outcome)
        status = "applied" if r is not None else "no_reward"
        try:
            self._commit(p, outcome, r, ratio)
        except DecisionLogError:  # not logged, so not applied either
            with self._lock:
                self._counters.feedback["log_error"] += 1
            raise
        with self._lock:
            self._counters.feedback[status] += 1
        return status, r

    def _abandon(self, decision_id: str, why: str) -> None:
        """Log a pending decision without a reward (expired, dropped at close, decode error)."""
        with self._lock:
            p = self._pending.pop(decision_id, None)
            if p is None:
                return
            self._remember(decision_id, why)
            self._counters.feedback[why] += 1
        self._commit(p, None, None)

    def _commit(self, p: _Pending, outcome: Outcome | None, reward: float | None, speed_ratio: float | None = None) -> None:
        from ..traces import decision_row

        row = decision_row(p.decision, features=p.context if self.log_features else None, outcome=outcome,
                           reward=reward, request_id=p.request_id, variant=self.variant, speed_ratio=speed_ratio)
        if outcome is not None and not outcome.rounds:
            row["mean_tau"] = None
        learn = reward is not None  # its block size was checked when it was decided (control.block_sizes)
        with self._seq_lock:  # the log's order is the order updates are applied in
            if self._log is not None:
                try:
                    self._log.append(row)
                except AdaptspecError as e:
                    with self._lock:
                        self._counters.log_errors += 1
                        self._counters.last_error = (time.time(), f"decision log: {e}")
                    log.error("%s: decision %s not logged: %s", self.variant or "controller", p.decision.decision_id, e)
                    raise DecisionLogError(f"decision {p.decision.decision_id} could not be logged: {e}") from None
            if learn:
                with self._cond:
                    self._enqueued += 1
                self._queue.put(_Update(p.context, int(p.decision.block_size), float(reward), p.decision.decision_id,
                                        speed_ratio))

    def _remember(self, decision_id: str, status: str) -> None:
        self._done[decision_id] = status
        if len(self._done) > _DONE_MEMORY:
            self._done.popitem(last=False)

    def _expire(self) -> None:
        """Log the decisions pending for longer than ``feedback_timeout_s`` without a reward (update thread)."""
        if self.feedback_timeout_s is not None:
            now = time.monotonic()
            with self._lock:
                old = [k for k, p in self._pending.items() if now - p.since > self.feedback_timeout_s]
            for did in old:
                self._abandon(did, "expired")
