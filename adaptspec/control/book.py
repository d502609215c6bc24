"""The book of pending decisions: what each feedback does, and writing it down.

A decision is *pending* from the moment it is made (:meth:`DecisionBook.open`) until one of:
its feedback arrives (``applied``, or ``no_reward`` when the reward is undefined), it expires
(no feedback for ``feedback_timeout_s``, or ``max_pending`` newer decisions are waiting: the
oldest goes first; ``expired``), its decode or its outcome fails (``decode_error``) or the
controller closes (``dropped``). Each way out writes the decision to the decision log once
(without a reward unless it was applied). The last 100,000 finished ids are remembered, so a
second feedback for one is ``duplicate`` and one after it expired or was dropped is ``late``;
an id never decided here is ``unknown``. A row logged with a reward is queued as an
:class:`~adaptspec.control.updates.Update`; logging and queueing happen under one lock, so the
update thread applies rewards in the log's order.

A reward computed from an outcome with rounds also gets every arm's counterfactual reward here,
once (:mod:`adaptspec.control.full_feedback`, with the book's ``pricer``): the row logs them and
the update carries them, so a policy with ``full_feedback`` learns from every observed arm, and
resume, which replays the row, learns the same. A reward given by the caller is learnt alone.

The book trusts the decisions it is given: they were checked where they entered
(:mod:`adaptspec.control.block_sizes`), so their rows go to the log writer unchecked.

>>> from adaptspec.control.updates import UpdateQueue
>>> from adaptspec.control.block_sizes import fallback_decision
>>> book = DecisionBook(UpdateQueue(), reward_fn=lambda outcome: 1.0)
>>> book.open(fallback_decision(4, (1, 4), "error", "d1"), None, request_id=None)
>>> book.feedback("d1", None, 2.5), book.feedback("d1", None, 2.5), book.feedback("zz", None, 1.0)
(('applied', 2.5), ('duplicate', None), ('unknown', None))
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from itertools import islice
from typing import Any, Callable

import numpy as np

from ..errors import AdaptspecError
from ..reward.functions import check_reward, plausible_rewards
from ..speculator import Decision, LoadState, Outcome, SharedRounds
from .config import ControllerConfig
from .updates import Update, UpdateQueue

log = logging.getLogger("adaptspec.control.controller")  # one logger for the controller and its parts

FEEDBACK = (
    "applied",
    "no_reward",
    "duplicate",
    "late",
    "unknown",
    "expired",
    "dropped",
    "decode_error",
    "log_error",
)
_DONE_MEMORY = 100_000


class DecisionLogError(AdaptspecError):
    """A decision could not be written to the decision log (a full disk, say): it is not acknowledged,
    and the policy does not learn from it."""


@dataclass
class Pending:
    decision: Decision
    context: np.ndarray | None
    request_id: str | None
    since: float
    load: LoadState | None = None
    context_tokens: int | None = None  # the prompt's tokens, when known (prices counterfactual rounds)


class DecisionBook:
    """Pending decisions and their feedback (see the module docstring).

    ``updates`` receives the rewards to learn from; ``log_writer`` (a
    :class:`~adaptspec.traces.log_writer.DecisionLogWriter`, or None) the rows; ``reward_fn``
    turns an outcome into the reward; ``machine_speed`` (or None) gives each computed reward its
    speed ratio; ``variant`` is written in every row; ``log_features`` whether the context is;
    ``pricer`` (a :class:`~adaptspec.control.full_feedback.CounterfactualPricer`, or None: a
    custom reward) gives each computed reward every arm's counterfactual reward.
    """

    def __init__(
        self,
        updates: UpdateQueue,
        *,
        reward_fn: Callable[[Outcome], float],
        log_writer: Any = None,
        machine_speed: Any = None,
        variant: str | None = None,
        log_features: bool = True,
        feedback_timeout_s: float | None = 300.0,
        max_pending: int = 10_000,
        pricer: Any = None,
    ) -> None:
        self.updates = updates
        self.reward_fn = reward_fn
        self.pricer = pricer
        self.log_writer = log_writer
        self.machine_speed = machine_speed
        self.variant = variant
        self.log_features = log_features
        self.feedback_timeout_s = feedback_timeout_s
        self.max_pending = int(max_pending)
        self._lock = threading.Lock()  # pending decisions, counters
        self._seq_lock = threading.Lock()  # log order == update order
        self._pending: dict[str, Pending] = {}
        self._done: OrderedDict[str, str] = OrderedDict()
        self.counts = dict.fromkeys(FEEDBACK, 0)
        self.log_errors = 0
        self.last_error: tuple[float, str] | None = None  # (time, what) of the newest failed log write

    @property
    def pending(self) -> int:
        return len(self._pending)

    def open(
        self,
        decision: Decision,
        context: np.ndarray | None,
        request_id: str | None,
        load: LoadState | None = None,
        context_tokens: int | None = None,
    ) -> None:
        """Record a (checked) decision, made under ``load`` (or None), as waiting for feedback;
        ``context_tokens`` (default: the load's) is the prompt's length."""
        if context_tokens is None and load is not None:
            context_tokens = load.context_tokens
        with self._lock:
            self._pending[decision.decision_id] = Pending(
                decision, context, request_id, time.monotonic(), load, context_tokens
            )
            over = len(self._pending) - self.max_pending
            oldest = list(islice(self._pending, over)) if over > 0 else []
        for did in oldest:  # at the cap the oldest waiting decision expires early (memory stays bounded)
            try:
                self.abandon(did, "expired")
            except DecisionLogError:  # counted and said by _write; the new decision goes on
                pass

    def decision(self, decision_id: str) -> Decision | None:
        """The pending decision ``decision_id`` (None when it is not pending)."""
        with self._lock:
            p = self._pending.get(decision_id)
        return None if p is None else p.decision

    def feedback(
        self,
        decision_id: str,
        outcome: Outcome | None,
        reward: float | None,
        shared: SharedRounds | None = None,
        last: bool = True,
    ) -> tuple[str, float | None]:
        """Settle a decision with its ``outcome`` and/or a (checked) ``reward``: ``(status, reward)``.
        ``shared`` (batched serving) is how its decode time was attributed; it goes to the log;
        ``last``: the outcome's rounds end the request (False for a re-decision followed by another).

        A reward computed from the outcome is measured; an undefined or non-finite one is None
        (``no_reward``). Raises :class:`DecisionLogError` when the row cannot be logged."""
        with self._lock:
            p = self._pending.pop(decision_id, None)
            if p is None:
                status = self._finished(decision_id)
                self.counts[status] += 1
                return status, None
            self._remember(decision_id, "done")
        ratio = full = None
        if reward is None and outcome is not None:
            reward = self._reward(outcome, decision_id)
            if (
                reward is not None and self.machine_speed is not None
            ):  # a computed reward is calibrated, a given one not
                ratio = self.machine_speed.ratio(outcome)
            if reward is not None and self.pricer is not None:  # every arm's, from the same rounds
                full = self.pricer.price(p.decision, outcome, reward, p.context_tokens, last)
                if full is not None and not plausible_rewards(
                    full.rewards
                ):  # learnt as the arm that ran alone
                    log.warning(
                        "%s: decision %s: counterfactual rewards %s are not all of plausible size; "
                        "learning the arm that ran alone",
                        self.variant or "controller",
                        decision_id,
                        full.rewards.tolist(),
                    )
                    full = None
        status = "applied" if reward is not None else "no_reward"
        try:
            self._write(p, outcome, reward, ratio, shared, full)
        except DecisionLogError:  # not logged, so not applied either
            with self._lock:
                self.counts["log_error"] += 1
            raise
        with self._lock:
            self.counts[status] += 1
        return status, reward

    def settled(self, decision_id: str) -> str:
        """The status of feedback for ``decision_id`` once the controller is closed (nothing is
        logged or learnt then), counted: ``late`` for a decision dropped at close (or being
        dropped) or expired, ``duplicate`` for one settled otherwise, ``unknown`` for an id never
        decided here."""
        with self._lock:
            status = "late" if decision_id in self._pending else self._finished(decision_id)
            self.counts[status] += 1
        return status

    def abandon(self, decision_id: str, why: str) -> None:
        """Log a pending decision without a reward (``expired``, ``dropped``, ``decode_error``)."""
        with self._lock:
            p = self._pending.pop(decision_id, None)
            if p is None:
                return
            self._remember(decision_id, why)
            self.counts[why] += 1
        self._write(p, None, None)

    def expire(self) -> None:
        """Abandon the decisions pending for longer than ``feedback_timeout_s`` (update thread)."""
        if self.feedback_timeout_s is not None:
            now = time.monotonic()
            with self._lock:
                old = [k for k, p in self._pending.items() if now - p.since > self.feedback_timeout_s]
            for did in old:
                self.abandon(did, "expired")

    def drop_pending(self) -> None:
        """Abandon every pending decision (at close)."""
        with self._lock:
            left = list(self._pending)
        for did in left:
            self.abandon(did, "dropped")

    # ------------------------------------------------------------------ internals
    def _reward(self, outcome: Outcome, decision_id: str) -> float | None:
        try:
            return check_reward(self.reward_fn(outcome))  # finite and of plausible size, or undefined
        except Exception as e:  # e.g. no round ran: the reward is undefined, the row is still logged
            log.info("%s: no reward for decision %s: %s", self.variant or "controller", decision_id, e)
            return None

    def _write(
        self,
        p: Pending,
        outcome: Outcome | None,
        reward: float | None,
        speed_ratio: float | None = None,
        shared: SharedRounds | None = None,
        full: Any = None,
    ) -> None:
        from ..traces import decision_row

        row = decision_row(
            p.decision,
            features=p.context if self.log_features else None,
            outcome=outcome,
            reward=reward,
            request_id=p.request_id,
            variant=self.variant,
            speed_ratio=speed_ratio,
            load=p.load,
            shared=shared,
            counterfactual=full,
        )
        with self._seq_lock:  # the log's order is the order updates are applied in
            if self.log_writer is not None:
                try:
                    self.log_writer.append(row, checked=True)  # the decision was checked where it entered
                except AdaptspecError as e:
                    with self._lock:
                        self.log_errors += 1
                        self.last_error = (time.time(), f"decision log: {e}")
                    log.error(
                        "%s: decision %s not logged: %s",
                        self.variant or "controller",
                        p.decision.decision_id,
                        e,
                    )
                    raise DecisionLogError(
                        f"decision {p.decision.decision_id} could not be logged: {e}"
                    ) from None
            if reward is not None:
                every = (
                    {}
                    if full is None
                    else {"arms": full.arms, "rewards": full.rewards, "observed": full.observed}
                )
                self.updates.put(
                    Update(
                        p.context, p.decision.block_size, reward, p.decision.decision_id, speed_ratio, **every
                    )
                )

    def _finished(self, decision_id: str) -> str:
        """What feedback for a decision that is not pending is (under the lock): ``late`` after it
        expired or was dropped, ``duplicate`` after it was settled otherwise, else ``unknown``."""
        prev = self._done.get(decision_id)
        return "unknown" if prev is None else ("late" if prev in ("expired", "dropped") else "duplicate")

    def _remember(self, decision_id: str, status: str) -> None:
        self._done[decision_id] = status
        if len(self._done) > _DONE_MEMORY:
            self._done.popitem(last=False)


def open_decision_log(cfg: ControllerConfig) -> Any:
    """The decision-log writer of a controller with settings ``cfg`` (None without ``log_dir``).
    Whether the contexts it holds fit this controller's is
    :func:`~adaptspec.control.context_width.settle_width`'s to say (its ``feature_dim``)."""
    log_dir = cfg.path("log_dir")
    if log_dir is None:
        return None
    from ..traces.log_writer import DecisionLogWriter

    return DecisionLogWriter(
        log_dir,
        name=cfg.variant or "default",
        roll_rows=cfg.roll_rows,
        roll_interval_s=cfg.roll_interval_s,
        fsync=cfg.log_fsync,
    )
