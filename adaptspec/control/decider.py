"""The decider: each request's block size, from a snapshot of the policy, or the fallback.

:class:`Decider` makes every decision on one *decision thread* (a daemon thread taking calls
from a queue), the only thread that touches the policy *snapshot* decisions use.
The update thread publishes a fresh copy of the learning policy after each batch of updates
(:meth:`Decider.publish`); before each decision the decision thread adopts the newest copy,
carrying the random generator over, so a slow update never delays a decision.

With ``on_caller`` there is no decision thread: the calling thread decides (an engine whose
own thread decides at join), the snapshot behind a lock; a decision slower than ``timeout_s`` is
then used all the same (nothing can cut it off), counted in :attr:`Decider.late` and logged.

A caller waits at most ``timeout_s`` for a decision. A policy that is late, raises, or returns
a decision :func:`~adaptspec.control.block_sizes.check_decision` refuses gives the fallback
block size instead (:func:`~adaptspec.control.block_sizes.fallback_decision`): the reason is in
``decision.extras["fallback"]`` and counted in :attr:`Decider.fallbacks`. Every decision leaves
here checked and carrying a fresh ``decision_id``.

A late decision's answer is dropped (a call still queued behind it is cancelled). While a late
decision still holds the decision thread (a policy that takes seconds, or never returns), every
later call gets its fallback at once, without waiting: counted as ``timeout``, logged once when the
decision overran and once when it returns. The decision thread is a daemon, so a policy that never
returns does not keep the process from exiting.

>>> from adaptspec.policies import make_policy
>>> from adaptspec.control.context import Contexts
>>> pol = make_policy("fixed:4", (1, 4))
>>> d = Decider(copy_policy(pol), Contexts(None, contextual=False, policy_label="fixed:4"),
...             arms=(1, 4), fallback_block_size=1, timeout_s=1.0)
>>> d.decide(d.context(None)).block_size, d.decisions, d.fallbacks["invalid"]
(4, 1, 0)
>>> d.close()
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import logging
import queue
import threading
import time
import uuid
from typing import Any

import numpy as np

from ..errors import AdaptspecError
from ..speculator import Decision, LoadState
from .block_sizes import check_decision, fallback_decision
from .context import Contexts

log = logging.getLogger("adaptspec.control.controller")  # one logger for the controller and its parts

FALLBACK_REASONS = ("error", "timeout", "invalid")


def copy_policy(policy: Any) -> Any:
    """A private copy of ``policy`` (a head, read-only after training, is shared, not copied)."""
    head = getattr(policy, "head", None)
    memo = {} if head is None else {id(head): head}
    return copy.deepcopy(policy, memo)


class Decider:
    """Decide on a snapshot of the policy (see the module docstring).

    ``snapshot`` is the first copy of the policy decisions use (the decider owns it from now
    on); ``contexts`` makes a request's context; ``arms`` and ``fallback_block_size`` are
    checked already (:mod:`adaptspec.control.block_sizes`); ``timeout_s`` is a decision's budget.
    """

    def __init__(
        self,
        snapshot: Any,
        contexts: Contexts,
        *,
        arms: tuple[int, ...],
        fallback_block_size: int,
        timeout_s: float,
        label: str = "",
        name: str = "",
        on_caller: bool = False,
    ) -> None:
        self.contexts = contexts
        self.arms = arms
        self.fallback_block_size = fallback_block_size
        self.timeout_s = timeout_s
        self.label = label or contexts.policy_label
        self.name = name or "controller"
        self._snapshot = snapshot  # touched on the decision thread only (on_caller: under _own)
        self._published = snapshot  # the newest copy, set by the update thread
        self._calls: queue.SimpleQueue | None = (
            None if on_caller else queue.SimpleQueue()
        )  # to the decision thread
        self._overdue: cf.Future | None = None  # the call past its budget that holds the decision thread
        self._thread: threading.Thread | None = None  # started at the first call (a controller that never
        # decides here, as on the batched engine, has none)
        self._own = threading.Lock()  # on_caller: the snapshot's owner at the moment
        self._lock = threading.Lock()
        self.decisions = 0
        self.late = 0  # on_caller: decisions slower than timeout_s, used all the same
        self.fallbacks = dict.fromkeys(FALLBACK_REASONS, 0)

    def context(self, features: Any, load: LoadState | None = None) -> np.ndarray | None:
        """The context of a request decided under ``load`` (:class:`~adaptspec.control.context.Contexts`):
        the one input of :meth:`decide`."""
        return self.contexts(features, load)

    def decide(self, ctx: np.ndarray | None) -> Decision:
        """A checked decision for context ``ctx``, with a new id; the fallback when the policy fails."""
        did = uuid.uuid4().hex
        reason = None
        try:
            d = self._call(self._decide_now, self.contexts.for_policy(ctx), timeout=self.timeout_s)
        except _StillBusy:
            reason = "timeout"  # an earlier decision is still late: no wait, no line (logged when it overran)
        except cf.TimeoutError:
            reason = "timeout"
            log.warning(
                "%s: policy %s took longer than %.3f s to decide; using block size %d",
                self.name,
                self.label,
                self.timeout_s,
                self.fallback_block_size,
            )
        except Exception as e:  # the policy failed: the request must still succeed
            reason = "error"
            log.warning(
                "%s: policy %s raised %r; using block size %d",
                self.name,
                self.label,
                e,
                self.fallback_block_size,
            )
        else:
            try:
                d = check_decision(d, self.arms, did)
            except AdaptspecError as e:
                reason = "invalid"
                log.warning(
                    "%s: invalid decision (%s); using block size %d", self.name, e, self.fallback_block_size
                )
        if reason is not None:
            d = fallback_decision(self.fallback_block_size, self.arms, reason, did)
        with self._lock:
            self.decisions += 1
            if reason is not None:
                self.fallbacks[reason] += 1
        return d

    def publish(self, policy: Any) -> None:
        """Make ``policy`` (a private copy) the one decisions use from the next decision on."""
        self._published = policy

    def snapshot(self, timeout: float = 5.0) -> Any:
        """A private copy of the policy decisions use now."""
        return self._call(self._copy_snapshot, timeout=timeout)

    def rng_state(self, timeout: float = 1.0) -> dict[str, Any]:
        """The state of the decisions' random generator (checkpoints carry it)."""
        return self._call(self._rng_state, timeout=timeout)

    def close(self) -> None:
        """Stop the decision thread once its current call returns; calls still queued are cancelled."""
        if self._calls is None:
            return
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                break
            if call is not None:
                call[0].cancel()
        self._calls.put(None)

    def _call(self, fn: Any, *args: Any, timeout: float) -> Any:
        """``fn(*args)`` where the snapshot lives: on the decision thread, waiting at most ``timeout``
        (:class:`_StillBusy` at once while a late call holds it); ``on_caller``, on this thread under the
        snapshot's lock (a decision over ``timeout`` counted late)."""
        if self._calls is not None:
            return self._on_thread(fn, args, timeout)
        t0 = time.perf_counter()
        with self._own:
            out = fn(*args)
        took = time.perf_counter() - t0
        if fn == self._decide_now and took > timeout:
            with self._lock:
                self.late += 1
            log.warning(
                "%s: policy %s took %.3f s to decide (budget %.3f s); used on the calling thread",
                self.name,
                self.label,
                took,
                timeout,
            )
        return out

    def _on_thread(self, fn: Any, args: tuple, timeout: float) -> Any:
        """``fn(*args)`` on the decision thread, its answer within ``timeout`` or a TimeoutError; a call
        that is not answered in time is cancelled if it has not started, else its answer is dropped
        and it holds the thread: until it returns, every call raises :class:`_StillBusy` at once."""
        overdue = self._overdue
        if overdue is not None and not overdue.done():
            raise _StillBusy(f"{self.name}: the decision thread is still in a call that overran its budget")
        future: cf.Future = cf.Future()
        started = time.perf_counter()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name=f"adaptspec-decide-{self.name}", daemon=True
                )
                self._thread.start()
        self._calls.put((future, fn, args))  # type: ignore[union-attr]
        try:
            return future.result(timeout)
        except cf.TimeoutError:
            if not future.cancel():  # running: it holds the thread until it returns
                self._overdue = future
                future.add_done_callback(
                    lambda f: log.warning(
                        "%s: policy %s answered %.1f s after it was asked (its answer was dropped); decisions use it "
                        "again",
                        self.name,
                        self.label,
                        time.perf_counter() - started,
                    )
                )
            raise

    def _serve(self) -> None:
        """The decision thread: run the calls in order until :meth:`close`."""
        while (call := self._calls.get()) is not None:  # type: ignore[union-attr]
            future, fn, args = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - the caller sees it, as a ThreadPoolExecutor's would
                future.set_exception(e)

    # ------------------------------------------------------------------ on the decision thread
    def _decide_now(self, ctx: np.ndarray | None) -> Any:
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
        return copy_policy(self._snapshot)

    def _rng_state(self) -> dict[str, Any]:
        self._adopt()
        return self._snapshot.rng.bit_generator.state


class _StillBusy(cf.TimeoutError):
    """A call not made: the decision thread is still held by an earlier call past its budget."""
