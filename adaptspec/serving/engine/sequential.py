"""Serving a speculator that is not adaptspec's own: one request at a time, through its controller.

A speculator given with ``adaptspec serve --speculator MODULE:FACTORY`` (docs/bring-your-own.md)
has no batched engine: :class:`SequentialRunner` runs each request through its variant's
controller's own decide -> decode -> feedback (:meth:`AdaptiveController.generate
<adaptspec.control.controller.AdaptiveController.generate>`), one at a time, on one thread of its
own; requests wait in its queue (an awaiting server holds no thread). It has the batched
runner's interface (:class:`~adaptspec.serving.engine.batched.BatchedRunner`), so the service
does not tell them apart.

**A decode that never returns.** The runner's thread is a
:class:`~adaptspec._util.guarded.GuardedThread` with a watchdog: it beats when a request starts,
at its first token and at every round the speculator reports (``on_round``). Busy with no beat
for ``stall_s`` seconds (default :data:`~adaptspec._util.guarded.STALL_S`, 60; a decode that reports
no rounds has that long for the whole decode), the runner is stalled: the request decoding and
every one waiting get 503 (a reason, no exception text), new requests get 503 at once,
:attr:`~SequentialRunner.health` says ``stalled`` (/health answers 503), and :meth:`close` does not
wait for it: the thread is a daemon (a Python thread stuck in a user's code cannot be killed). A
decode that returns after all is learnt from and logged as any other (its client already had its
503), and the runner serves again.

**Shutdown.** :meth:`~SequentialRunner.drain` answers the request decoding and every one waiting
with a 503 giving the server's reason, at once and from the calling thread, whatever the decode
is doing (stuck, or honest and long), and refuses new ones; the decode goes on on its daemon
thread, and if it returns it is learnt from and logged as above. :meth:`~SequentialRunner.close`
waits for the queue at most its ``timeout``, only while the thread progresses, then drains what
is left: so SIGTERM ends the server within its bound (:mod:`adaptspec.serving.shutdown`).

An exception from the speculator is a 503 with a reason; its text, which may name the user's
files, goes to the log with the request's id (:func:`~adaptspec.serving.responses.unavailable`).
A prefill's :class:`~adaptspec.errors.AdaptspecError` refuses the prompt: a 400 with its message.

A stop sequence halts decoding after the round in which it completes: the controllers decode
through a :class:`~adaptspec.serving.engine.halting.HaltableSpeculator`, and the condition reaches it
with :func:`~adaptspec.serving.engine.halting.halt_when` (the speculator protocol's ``decode`` has no
parameter for it). A request cancelled before its turn is skipped; once decoding it runs to its
end (the protocol has no way to stop it).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..._util.guarded import STALL_S, GuardedThread
from ...control.controller import AdaptiveController
from ...errors import AdaptspecError
from ..cancelling import Cancellation
from ..request_error import SHUTTING_DOWN, RequestError
from ..responses import unavailable
from ..runner import answered, resolve
from .halting import halt_when

if TYPE_CHECKING:
    from ...control.generation import Generation
    from ..request import CompletionRequest

__all__ = ["SequentialRunner"]

log = logging.getLogger("adaptspec.serving")


class Job:
    """One request waiting for, or in, the runner's thread; answered once (:meth:`finish`)."""

    def __init__(
        self,
        req: "CompletionRequest",
        on_tokens: Callable[[list[int]], None] | None,
        stop_when: Callable[[], bool] | None,
        cancel: Cancellation | None,
        deliver: Callable[["Generation | RequestError"], None],
    ) -> None:
        self.req, self.on_tokens, self.stop_when, self.cancel = req, on_tokens, stop_when, cancel
        self.deliver = deliver
        self._settled = threading.Lock()

    def finish(self, result: "Generation | RequestError") -> None:
        """Hand ``result`` to the waiting request, the first time only (from any thread: the
        runner's, or the watchdog's for a stalled one)."""
        if self._settled.acquire(blocking=False):
            self.deliver(result)


class SequentialRunner:
    """Runs checked requests through ``controllers`` (variant -> controller), one at a time, on a
    watched thread of its own (see the module docstring)."""

    def __init__(self, controllers: Mapping[str, AdaptiveController], stall_s: float = STALL_S) -> None:
        self.controllers = dict(controllers)
        self.stall_s = float(stall_s)
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._drained: RequestError | None = None  # set by drain(): what a request still held gets
        self._current: Job | None = None  # the request being decoded
        self._guard = GuardedThread(
            "adaptspec-speculator",
            self._serve,
            self._failed,
            logger=log,
            stall_s=stall_s,
            on_stall=self._stalled,
        )
        self._guard.start()

    @property
    def health(self) -> dict[str, Any]:
        """The decoding thread's state for /health (:meth:`GuardedThread.report
        <adaptspec._util.guarded.GuardedThread.report>`)."""
        return self._guard.report()

    def describe(self) -> str:
        return f"one request at a time (a speculator of your own; stalled after {self.stall_s:g} s without progress)"

    def reserve(self) -> None:
        """Nothing to reserve: a request waits in the runner's queue."""
        return None

    def close(self, timeout: float = 120.0) -> None:
        """Finish the requests queued, then stop the thread; at most ``timeout`` seconds, and no
        longer than it progresses. A thread still decoding then is left behind, its requests
        answered 503 (:meth:`drain`; the thread is a daemon)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._jobs.put(None)
        self._guard.join_unless_stalled(timeout)
        if not self._guard.alive:
            return
        self.drain(SHUTTING_DOWN)
        if self._guard.stalled:
            log.error(
                "the speculator's thread is stalled (no progress for %g s): shutting down without it",
                self.stall_s,
            )
        else:
            log.error(
                "the speculator's thread is still decoding %g s into the shutdown: its requests were "
                "answered 503; shutting down without it",
                timeout,
            )

    def drain(self, reason: str) -> None:
        """Answer the request decoding and every one waiting with a 503 giving ``reason``, now, and
        refuse new ones; the decode goes on on the runner's daemon thread (it cannot be stopped)."""
        error = RequestError(reason, 503)
        with self._lock:  # with _serve's: a job it has just taken is either seen here or sees this
            self._drained = error
        self._answer_all(error)

    # ------------------------------------------------------------------ requests
    def submit(
        self,
        req: "CompletionRequest",
        on_tokens: Callable[[list[int]], None] | None,
        stop_when: Callable[[], bool] | None,
        cancel: Cancellation | None,
        deliver: Callable[["Generation | RequestError"], None],
    ) -> None:
        """Queue ``req``; ``deliver`` gets its generation (decision and outcome logged) or the
        :class:`RequestError` it answers with. A stalled, failed or closing runner refuses it now (503)."""
        with self._lock:
            if self._closed or self._drained is not None:
                raise RequestError(SHUTTING_DOWN, 503)
            if self._guard.gave_up:
                raise RequestError(
                    "the speculator's thread has stopped after repeated failures (the server's log "
                    "has them); this server cannot decode until it is restarted",
                    503,
                )
            if self._guard.stalled:
                raise self._stall_error()
            self._jobs.put(Job(req, on_tokens, stop_when, cancel, deliver))

    def run(
        self,
        req: "CompletionRequest",
        on_tokens: Callable[[list[int]], None] | None = None,
        stop_when: Callable[[], bool] | None = None,
        cancel: Cancellation | None = None,
    ) -> "Generation":
        """Decode ``req`` through its variant's controller, waiting on this thread; returns the
        :class:`~adaptspec.control.generation.Generation`, its decision and outcome logged."""
        done = threading.Event()
        result: list[Any] = []

        def deliver(r: Any) -> None:
            result.append(r)
            done.set()

        self.submit(req, on_tokens, stop_when, cancel, deliver)
        done.wait()  # bounded: the watchdog answers a request whose decode stalls
        return answered(result[0])

    async def run_async(
        self,
        req: "CompletionRequest",
        on_tokens: Callable[[list[int]], None] | None = None,
        stop_when: Callable[[], bool] | None = None,
        cancel: Cancellation | None = None,
    ) -> "Generation":
        """:meth:`run` without a waiting thread: the event loop queues ``req`` and awaits its answer,
        which the runner's thread (or its watchdog) hands back."""
        import asyncio

        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def deliver(r: Any) -> None:  # on the runner's thread, or the watchdog's
            try:
                loop.call_soon_threadsafe(resolve, future, r)
            except RuntimeError:  # the event loop is gone (shutdown): nobody is waiting any more
                pass

        self.submit(req, on_tokens, stop_when, cancel, deliver)
        return answered(await asyncio.shield(future))

    # ------------------------------------------------------------------ the runner's thread
    def _serve(self) -> None:
        while True:
            self._guard.idle()  # True after a stall: that request was answered by the watchdog
            job = self._jobs.get()
            if job is None:
                return  # closed, and everything queued before was decoded
            self._guard.beat()
            if job.cancel is not None and job.cancel.cancelled:
                job.finish(RequestError("the client went away before this request started", 499))
                continue
            with self._lock:
                self._current = job
                drained = self._drained
            if drained is not None:  # taken just as the runner was drained: answered, not decoded
                self._current = None
                job.finish(drained)
                continue
            try:
                result = self._decode(job)
            finally:
                self._current = None
            job.finish(result)

    def _decode(self, job: Job) -> "Generation | RequestError":
        """``job``'s request through its variant's controller; every failure is its answer."""
        from ...control.controller import DecisionLogError, PrefillError

        req = job.req

        def tokens(ids: list[int]) -> None:  # the first token, then every round the speculator reports
            self._guard.beat()
            if job.on_tokens is not None:
                job.on_tokens(ids)

        try:
            with halt_when(job.stop_when):
                return self.controllers[req.variant].generate(
                    req.prompt_ids,
                    max_new_tokens=req.max_tokens,
                    temperature=req.temperature,
                    seed=req.seed,
                    request_id=req.request_id,
                    on_tokens=tokens,
                )
        except PrefillError as e:  # the speculator refused this prompt: its own words, for the client
            return RequestError(str(e), param="prompt")
        except DecisionLogError as e:  # not acknowledged: the client may retry
            return unavailable(
                "the decision log cannot be written, the request was not recorded", e, req.request_id
            )
        except AdaptspecError as e:  # the controller's refusal (closed, an outcome that breaks the protocol)
            return unavailable(
                f"variant {req.variant}'s controller could not complete this request", e, req.request_id
            )
        except Exception as e:  # noqa: BLE001 - the speculator's own failure: a 503, its text logged
            return unavailable("the speculator could not decode this request", e, req.request_id)

    def _stall_error(self) -> RequestError:
        return RequestError(
            f"the speculator's decode has made no progress for {self.stall_s:g} s (stalled; the "
            "server's log shows where): requests get 503 until it moves again or the server is "
            "restarted",
            503,
        )

    def _stalled(self, message: str) -> None:
        """On the watchdog's thread: answer the request decoding and every one waiting with a 503."""
        self._answer_all(self._stall_error())

    def _failed(self, message: str) -> None:
        """After the runner's own loop failed (the guard logged it): answer what it held, then it restarts."""
        self._answer_all(
            unavailable(
                "the speculator's thread failed (the server's log has the error); this "
                "request was dropped: retry"
            )
        )

    def _answer_all(self, error: RequestError) -> None:
        current = self._current
        if current is not None:
            current.finish(error)
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is None:  # closing: the thread ends when it comes back
                self._jobs.put(None)
                return
            job.finish(error)
