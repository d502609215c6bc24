"""The controller's threads: the decision thread, the update thread, and the speculator's lock.

- The **decision thread** (one ``ThreadPoolExecutor`` worker) is the only one that touches
  the policy *snapshot* decisions use; before each decision it adopts the newest published
  copy, carrying the random generator over.
- The **update thread** applies queued feedback to the *learning* copy in log order (in
  batches of up to 256), publishes a fresh copy after each batch, and does the housekeeping:
  expiring pending decisions, checkpoints when due, rolling the decision log. At close it
  drops what is still pending, applies what is left and writes the final checkpoint.
- Calls into the speculator are serialised by :func:`speculator_lock`, shared by every
  controller over the same speculator object.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import weakref
from queue import Empty
from typing import Any

import numpy as np

from ..speculator import Decision
from .feedback import _Update

log = logging.getLogger("adaptspec.control.controller")  # one logger for the controller and its parts

_STOP = object()
_LOCKS: "weakref.WeakKeyDictionary[Any, threading.Lock]" = weakref.WeakKeyDictionary()
_LOCKS_BY_ID: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def speculator_lock(speculator: Any) -> threading.Lock:
    """The lock every controller uses around calls into ``speculator`` (one per speculator object)."""
    with _LOCKS_GUARD:
        try:
            lock = _LOCKS.get(speculator)
            if lock is None:
                lock = _LOCKS[speculator] = threading.Lock()
        except TypeError:  # not weak-referenceable
            lock = _LOCKS_BY_ID.setdefault(id(speculator), threading.Lock())
        return lock


class WorkersMixin:
    """The threads of :class:`~adaptspec.control.controller.AdaptiveController`.

    Uses the controller's ``_learner`` (the learning copy, owned by the update thread),
    ``_published`` (the newest copy for decisions), ``_snapshot`` (owned by the decision
    thread), ``_queue``, ``_cond``/``_applied``, ``_counters`` and ``_n_updates``.
    """

    # ================================================================== decision thread
    def _decide_now(self, ctx: np.ndarray | None) -> Decision:
        """Runs on the decision thread, the only one that touches the snapshot."""
        self._adopt()
        return self._snapshot.decide(ctx)

    def _adopt(self) -> None:
        """Switch decisions to the newest published copy, carrying the random generator over."""
        nxt = self._published
        if nxt is not self._snapshot:
            rng = getattr(self._snapshot, "rng", None)
            if rng is not None and getattr(nxt, "rng", None) is not None:
                nxt.rng.bit_generator.state = rng.bit_generator.state
            self._snapshot = nxt

    def _copy_snapshot(self) -> Any:
        self._adopt()
        return self._copy(self._snapshot)

    @staticmethod
    def _copy(policy: Any) -> Any:
        head = getattr(policy, "head", None)  # read-only after training: share it
        memo = {} if head is None else {id(head): head}
        return copy.deepcopy(policy, memo)

    # ================================================================== update thread
    def _work(self) -> None:
        stop = False
        while not stop:
            try:
                item = self._queue.get(timeout=self._tick)
            except Empty:
                item = None
            batch: list[_Update] = []
            requests: list[Any] = []
            while item is not None:
                if item is _STOP:
                    stop = True
                elif isinstance(item, _Update):
                    batch.append(item)
                else:
                    requests.append(item)
                if len(batch) >= 256:
                    break
                try:
                    item = self._queue.get_nowait()
                except Empty:
                    item = None
            if batch:
                for u in batch:
                    self._apply(u)
                self._published = self._copy(self._learner)
                with self._cond:
                    self._applied += len(batch)
                    self._cond.notify_all()
            try:
                self._housekeeping(force_checkpoint=stop)
                if self._shared is not None and self._shared.apply_pending(self._learner):
                    self._published = self._copy(self._learner)  # the fleet's statistics, to decisions
            except Exception as e:  # never let the update thread die
                log.error("%s: housekeeping failed: %r", self.variant or "controller", e)
            for kind, fut in requests:
                try:
                    fut.set_result(self._write_checkpoint() if kind == "checkpoint" else None)
                except Exception as e:
                    fut.set_exception(e)
            if stop:
                with self._lock:
                    left = list(self._pending)
                for did in left:
                    self._abandon(did, "dropped")
                while True:  # rows just logged: apply them so the final checkpoint has them
                    try:
                        u = self._queue.get_nowait()
                    except Empty:
                        break
                    if isinstance(u, _Update):
                        self._apply(u)
                        with self._cond:
                            self._applied += 1
                if self.checkpoint_dir is not None and self._n_updates > self._ckpt_updates:
                    self._safe_checkpoint()
                with self._cond:
                    self._cond.notify_all()

    def _apply(self, u: _Update) -> None:
        t = time.perf_counter()
        try:
            ctx = u.context if self._contextual else None
            reward = u.reward
            if u.speed_ratio is not None and self.machine_speed is not None:  # on this thread: in log order
                self.machine_speed.observe(u.speed_ratio)
                reward = self.machine_speed.calibrate(self.reward_name, reward)
            if self._shared is not None:
                self._shared.update(self._learner, ctx, u.block_size, reward)
            else:
                self._learner.update(ctx, u.block_size, reward)
        except Exception as e:
            self._counters.update_errors += 1
            log.error("%s: policy update failed for decision %s: %r", self.variant or "controller", u.decision_id, e)
        dt = time.perf_counter() - t
        self._counters.update_s += dt
        self._counters.update_max_s = max(self._counters.update_max_s, dt)
        self._n_updates += 1
        self._last_update_id = u.decision_id

    def _housekeeping(self, force_checkpoint: bool = False) -> None:
        self._expire()
        if not force_checkpoint:  # at close the final checkpoint comes after the last updates
            self._checkpoint_if_due()
        if self._log is not None:
            self._log.maybe_roll()
