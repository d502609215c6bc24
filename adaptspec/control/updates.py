"""Learning from feedback: the learning policy, the update queue and the update thread.

- An :class:`Update` is one logged reward to learn from. The book of pending decisions
  (:mod:`adaptspec.control.book`) puts it on the :class:`UpdateQueue` right after writing its
  row to the decision log, under one lock: the queue's order is the log's order.
- :class:`Learner` is the learning copy of the policy and how an update is applied to it:
  calibrate a measured reward for the machine's speed (in log order), then ``update`` the
  policy (or the fleet's shared state). An update that carries every arm's counterfactual
  reward (:mod:`adaptspec.control.full_feedback`) goes to a policy with ``full_feedback`` as
  ``update_full`` (each reward calibrated alike; in a fleet, through the shared state, whose
  statistics then hold every arm shown); any other policy learns from the arm that ran,
  as before. Resume replays the log through the same :meth:`Learner.apply`.
- :class:`UpdateWorker` is the update thread: it applies queued updates in batches of up to
  256, publishes a fresh copy of the policy to the decider after each batch, and does the
  housekeeping (expiring pending decisions, checkpoints when due, rolling the decision log).
  At close it drops what is still pending, applies what is left and writes the final checkpoint.

>>> from adaptspec.policies import make_policy
>>> learner = Learner(make_policy("ucb", (1, 4)), contextual=False)
>>> learner.apply(Update(None, 4, 2.0, "d1")); learner.updates, learner.last_decision_id
(1, 'd1')
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Any

import numpy as np

from ..errors import AdaptspecError
from .decider import copy_policy

log = logging.getLogger("adaptspec.control.controller")  # one logger for the controller and its parts

_STOP = object()
_BATCH = 256


@dataclass
class Update:
    """One logged reward to learn from (its block size comes from a checked decision)."""

    context: np.ndarray | None
    block_size: int
    reward: float
    decision_id: str
    speed_ratio: float | None = None  # measured / speed-reference time; None: learn from ``reward`` as it is
    #: every arm's reward on this request (:class:`~adaptspec.control.full_feedback.FullFeedback`,
    #: measured, over ``arms``; ``reward`` at ``block_size``) and which are observed; None: the arm that ran only
    arms: tuple[int, ...] | None = None
    rewards: np.ndarray | None = None
    observed: np.ndarray | None = None


class UpdateQueue:
    """Updates waiting for the update thread, and how many were queued and applied."""

    def __init__(self) -> None:
        self._queue: SimpleQueue = SimpleQueue()
        self.cond = threading.Condition()
        self.enqueued = 0
        self.applied = 0

    def put(self, update: Update) -> None:
        with self.cond:
            self.enqueued += 1
        self._queue.put(update)

    def put_request(self, item: Any) -> None:
        """A request for the update thread (a checkpoint, the stop signal): not counted as an update."""
        self._queue.put(item)

    def get(self, timeout: float | None = None) -> Any:
        """The next item; None when there is none (within ``timeout``, or now when it is None)."""
        try:
            return self._queue.get(timeout=timeout) if timeout is not None else self._queue.get_nowait()
        except Empty:
            return None

    def mark_applied(self, n: int) -> None:
        with self.cond:
            self.applied += n
            self.cond.notify_all()

    @property
    def waiting(self) -> int:
        return self.enqueued - self.applied


class Learner:
    """The learning copy of the policy, and how a logged reward updates it (see the module docstring)."""

    def __init__(
        self,
        policy: Any,
        *,
        contextual: bool,
        machine_speed: Any = None,
        reward_name: str = "",
        name: str = "",
    ) -> None:
        self.policy = policy
        self.name = name or "controller"
        self.contextual = contextual
        self.machine_speed = machine_speed
        self.reward_name = reward_name
        self.shared: Any = None  # the fleet's SharedState once attached
        self.full_feedback = bool(getattr(policy, "full_feedback", False))  # learns every observed arm
        self.updates = 0  # updates seen since the policy was new (incl. before a restart)
        self.last_decision_id: str | None = None
        self.errors = 0
        self.update_s = 0.0
        self.update_max_s = 0.0

    def attach(self, shared: Any, variant: str | None, log_dir: Any) -> None:
        """Learn with the other replicas of a fleet from now on (after resume: replayed feedback is this replica's own)."""
        calibration = None if self.machine_speed is None else self.machine_speed.replay(self.reward_name)
        shared.attach(self.policy, variant, log_dir, self.contextual, calibration)
        self.shared = shared

    def apply(self, u: Update) -> None:
        """Apply one update (in log order); a policy that fails is counted and logged, never raised."""
        t = time.perf_counter()
        try:
            ctx = u.context if self.contextual else None
            reward = u.reward
            if u.speed_ratio is not None and self.machine_speed is not None:  # in log order
                self.machine_speed.observe(u.speed_ratio)
                reward = self.machine_speed.calibrate(self.reward_name, reward)
            full = self.full_feedback and (
                self.shared is None or self.shared.full_feedback
            )  # a fleet that shares them
            if u.rewards is not None and full and u.arms == tuple(self.policy.arms):
                rewards = u.rewards
                if u.speed_ratio is not None and self.machine_speed is not None:
                    rewards = self.machine_speed.calibrate(
                        self.reward_name, rewards
                    )  # one factor for every arm
                if self.shared is None:
                    self.policy.update_full(ctx, rewards, u.observed)
                else:  # the fleet's statistics of every arm the request showed
                    self.shared.update_full(self.policy, ctx, rewards, u.observed)
            elif self.shared is not None:
                self.shared.update(self.policy, ctx, u.block_size, reward)
            else:
                self.policy.update(ctx, u.block_size, reward)
        except Exception as e:
            self.errors += 1
            log.error("%s: policy update failed for decision %s: %r", self.name, u.decision_id, e)
        dt = time.perf_counter() - t
        self.update_s += dt
        self.update_max_s = max(self.update_max_s, dt)
        self.updates += 1
        self.last_decision_id = u.decision_id


class UpdateWorker:
    """The update thread (see the module docstring); it owns ``learner`` once started.

    ``decider`` receives the published copies and gives the decisions' random generator to
    checkpoints; ``book`` expires pending decisions and drops them at close; ``checkpointer``
    (or None) writes checkpoints; ``log_writer`` (a decision-log writer, or None) is rolled.
    Housekeeping runs at least every 0.25 s, and four times per ``book.feedback_timeout_s``.
    """

    def __init__(
        self,
        learner: Learner,
        queue: UpdateQueue,
        *,
        decider: Any,
        book: Any,
        checkpointer: Any = None,
        log_writer: Any = None,
        name: str = "",
    ) -> None:
        self.learner, self.queue, self.decider, self.book = learner, queue, decider, book
        self.checkpointer, self.log_writer = checkpointer, log_writer
        timeout = book.feedback_timeout_s
        self.tick_s = 0.25 if timeout is None else min(0.25, timeout / 4)
        self.name = name or "controller"
        self._thread = threading.Thread(target=self._run, name=f"adaptspec-update-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def sync(self, timeout: float | None) -> None:
        """Wait until every update queued so far is applied and published."""
        with self.queue.cond:
            target = self.queue.enqueued
            if not self.queue.cond.wait_for(
                lambda: self.queue.applied >= target or not self.is_alive(), timeout
            ):
                raise AdaptspecError(f"updates not applied within {timeout} s")

    def checkpoint_now(self, timeout: float = 60.0) -> Any:
        """Write a checkpoint on the update thread (after the updates queued before) and return its path."""
        done: cf.Future = cf.Future()
        self.queue.put_request(("checkpoint", done))
        return done.result(timeout=timeout)

    def stop(self) -> None:
        """Drop pending decisions, apply what is queued, write the final checkpoint, end the thread."""
        self.queue.put_request(_STOP)
        self._thread.join()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        stop = False
        while not stop:
            batch, requests, stop = self._next_batch()
            if batch:
                for u in batch:
                    self.learner.apply(u)
                self.decider.publish(copy_policy(self.learner.policy))
                self.queue.mark_applied(len(batch))
            try:
                self._housekeeping(final=stop)
            except Exception as e:  # never let the update thread die
                log.error("%s: housekeeping failed: %r", self.name, e)
            for kind, fut in requests:
                try:
                    fut.set_result(self.write_checkpoint() if kind == "checkpoint" else None)
                except Exception as e:
                    fut.set_exception(e)
        self._finish()

    def _next_batch(self) -> tuple[list[Update], list[Any], bool]:
        batch: list[Update] = []
        requests: list[Any] = []
        stop = False
        item = self.queue.get(self.tick_s)
        while item is not None:
            if item is _STOP:
                stop = True
            elif isinstance(item, Update):
                batch.append(item)
            else:
                requests.append(item)
            if len(batch) >= _BATCH:
                break
            item = self.queue.get()
        return batch, requests, stop

    def _housekeeping(self, final: bool) -> None:
        self.book.expire()
        if not final and self.checkpointer is not None and self.checkpointer.due(self.learner.updates):
            self._checkpoint_safely()  # at close the final checkpoint comes after the last updates
        if self.log_writer is not None:
            self.log_writer.maybe_roll()
        shared = self.learner.shared
        if shared is not None and shared.apply_pending(self.learner.policy):
            self.decider.publish(copy_policy(self.learner.policy))  # the fleet's statistics, to decisions

    def _finish(self) -> None:
        self.book.drop_pending()
        n = 0
        while (
            u := self.queue.get()
        ) is not None:  # rows just logged: apply them so the final checkpoint has them
            if isinstance(u, Update):
                self.learner.apply(u)
                n += 1
        self.queue.mark_applied(n)
        if self.checkpointer is not None and self.learner.updates > self.checkpointer.updates_written:
            self._checkpoint_safely()
        with self.queue.cond:
            self.queue.cond.notify_all()

    def write_checkpoint(self) -> Any:
        """Write a checkpoint of the learning policy now (update thread); None without a checkpointer."""
        if self.checkpointer is None:
            return None
        try:  # the decisions' generator, so that a resumed policy draws on from there
            rng = self.decider.rng_state()
        except Exception:  # a stuck or generator-less policy: keep the learner's own
            rng = None
        return self.checkpointer.write(
            self.learner.policy, self.learner.updates, self.learner.last_decision_id, rng
        )

    def _checkpoint_safely(self) -> None:
        try:
            self.write_checkpoint()
        except Exception as e:
            self.checkpointer.failed(e)
            log.error("%s: checkpoint failed: %r", self.name, e)
