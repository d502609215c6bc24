r"""The engine loop: one thread owns the model and runs batched rounds; requests are submitted from any thread.

One thread owns a :class:`~adaptspec.batching.engine.BatchEngine`: a server (its event loop)
:meth:`~EngineLoop.submit`\ s a request and gets a :class:`Ticket`; the loop drains new
submissions at each round boundary, runs one round for every active row, streams each row's new
tokens to its ticket's callback, and when a request ends runs its ticket's ``on_done`` (a
runner settles the request there: its feedback, and the answer handed back to the event loop)
and wakes whoever waits on the ticket (:meth:`~EngineLoop.wait`, for a caller that blocks). The queue of requests not yet decoding
is bounded: past ``max_queue`` a submission raises :class:`QueueFull`, which a server answers
with 429 and ``Retry-After`` instead of piling up threads. A server :meth:`~EngineLoop.reserve`\ s
a request's place when its checks pass (before a stream's headers go out) and submits with it.

**Failures.** The loop runs on a :class:`~adaptspec._util.guarded.GuardedThread`. An exception
anywhere in it (a round, a load rule, the attribution) is logged once, fails every request in
flight or queued with :class:`EngineFailed` (a server answers 503 with the reason), resets the
engine (:meth:`BatchEngine.reset <adaptspec.batching.engine.BatchEngine.reset>`) and restarts
the loop; ``max_failures`` failures within ``failure_window_s`` seconds stop it for good (every
submission then raises :class:`EngineFailed`). :meth:`~EngineLoop.wait` waits at most
``request_timeout_s``; :attr:`~EngineLoop.health` says ``ok``, ``degraded``, ``stalled`` or ``failed``.
A reason a client gets names what happened, never an exception's text (which may carry a user's
paths): the log has that.

**Stalls.** A round that never returns (a target forward stuck in a kernel, a callback blocked)
raises nothing. The loop beats its guard's watchdog at every round boundary
(:class:`~adaptspec._util.guarded.GuardedThread`, ``stall_s``, default
:data:`~adaptspec._util.guarded.STALL_S`, 60 s): busy with
no round finished for ``stall_s`` seconds, the engine is stalled: every request in flight or
queued gets :class:`EngineFailed` (503) from the watchdog's thread, every new one is refused with
503, /health says ``stalled`` (HTTP 503), and :meth:`~EngineLoop.close` does not wait for it (the
thread is a daemon). If the round returns after all, the loop resets the engine (the rows it held
were answered) and serves again.

**Shutdown.** :meth:`~EngineLoop.drain` answers every request in flight or queued with
:class:`EngineFailed` giving the server's reason (a 503), at once and from the calling thread,
whatever the round in progress is doing, and refuses new ones; the loop drops its rows (engine
reset) at its next round boundary and ends. :meth:`~EngineLoop.close` lets the submitted requests
finish within its ``timeout`` (and only while rounds finish), then drains what is left: so SIGTERM
ends the server within its bound, even with a round that never returns
(:mod:`adaptspec.serving.shutdown`).

Callbacks run on the loop thread between rounds: keep them short (hand the tokens to another
thread or an event loop). A ticket's ``stop_when()`` is asked after its tokens are streamed:
once true, the request ends at the next round boundary as finished (``"stop"``), not failed.

Who pays for a round: each round's decode time (its prefills excluded) is split among its rows
by :func:`~adaptspec.reward.attribution.attribute` (``attribution``: ``"marginal"`` with a
latency ``profile``, else ``"tokens"``) and summed per request in :attr:`Ticket.attributed_s`;
with a ``profile`` each share is also put on the scale of one row
(:mod:`~adaptspec.reward.load_scale`) and summed in :attr:`Ticket.one_row_s`, the time a
request's reward is measured on (without one, the attributed time itself).

**Threads.** With OpenMP (torch's CPU build), every thread that runs torch work keeps its own
team of ``torch.get_num_threads()`` threads. Once two teams hold more threads than the machine
has cores, OpenMP stops spinning between parallel regions and every small matrix product pays to
wake its team: on 2 cores the engine's rounds then run markedly slower on this thread than the
same rounds on the main thread. A team, once made, stays. So a server runs torch work on the engine's
thread only, and no other thread may have made a team of more than one thread before:
``torch.set_num_threads(1)`` first thing in the main thread (model loading then runs on one
thread), then ``threads`` here, set when the loop thread starts (torch's setting is process-wide,
so threads made after that see it too; in the server none of them runs torch work), as
``adaptspec serve`` does. The loop logs a warning if the thread that starts it is
allowed more than one.

>>> from adaptspec.batching import BatchEngine
>>> from adaptspec.serving.tiny import tiny_speculator
>>> spec, codec = tiny_speculator(seed=0, verification="exact")
>>> with EngineLoop(BatchEngine(spec.target, spec.drafter, max_rows=4)) as loop:
...     tickets = [loop.submit(codec.encode(p), block_size=b, max_new_tokens=6) for p, b in (("hi", 1), ("yo", 4))]
...     outs = [t.wait(timeout=60) for t in tickets]
>>> [o.tokens == spec.generate(codec.encode(p), 1, 6).tokens for o, p in zip(outs, ("hi", "yo"))]
[True, True]
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from ..._util.guarded import STALL_S, GuardedThread
from ...errors import AdaptspecError
from ...reward.attribution import ATTRIBUTIONS, attribute
from ...reward.load_scale import OneRowScale
from ...speculator import Outcome
from ..request_error import SHUTTING_DOWN

if TYPE_CHECKING:
    from ...batching import BatchEngine
    from ...batching.records import RoundRecord
    from ...batching.rows import RequestHandle, Row
    from ...costs.latency import LatencyProfile
    from .switchback import Switchback

log = logging.getLogger("adaptspec.serving")


class EngineRule(Protocol):
    """A per-round rule as the loop drives it (:class:`~adaptspec.load_rules.round_rule.RoundRule`, or
    :class:`~adaptspec.serving.engine.switchback.SliceRule` over several): every row's block size before
    a round, the round's outcome after it, and its own time."""

    name: str
    busy_s: float
    busy_wall_s: float

    def choose(self, rows: Sequence["Row"]) -> list[int]: ...

    def feedback(
        self, record: "RoundRecord", shares: Sequence[float], handles: Sequence["RequestHandle"]
    ) -> None: ...


#: seconds a reserved place in the queue is held for a request that has not been submitted
RESERVATION_S = 30.0


class QueueFull(AdaptspecError):
    """The engine's queue is full; retry after ``retry_after_s`` seconds."""

    def __init__(self, queued: int, retry_after_s: float) -> None:
        super().__init__(
            f"the server is at capacity ({queued} requests waiting); retry after {retry_after_s:.0f} s"
        )
        self.retry_after_s = retry_after_s


class EngineFailed(AdaptspecError):
    """The engine could not finish this request: its thread failed (the request was dropped with
    every other one in flight), it stopped for good, or the request ran past its time bound.
    A server answers 503: the request may be retried."""


class Reservation:
    """A place in the engine's queue, held from a request's checks until its submission (see
    :meth:`EngineLoop.reserve`); released by :meth:`EngineLoop.submit` or :meth:`release`."""

    def __init__(self, loop: "EngineLoop") -> None:
        self.loop = loop
        self.taken_at = time.monotonic()

    def release(self) -> None:
        """Give the place back (idempotent): the request will not be submitted."""
        self.loop.release(self)


@dataclass
class Ticket:
    """A submitted request as its handler sees it: wait for the outcome, or cancel."""

    on_tokens: Callable[[list[int]], None] | None = None
    stop_when: Callable[[], bool] | None = None  # asked after streaming: true ends the request as "stop"
    handle: "RequestHandle | None" = None  # the engine's, once the loop has taken the request
    error: AdaptspecError | None = None
    sent: int = 0  # tokens already given to on_tokens
    attributed_s: float = 0.0  # this request's shares of its rounds' decode time
    one_row_s: float = 0.0  # the same shares on the scale of one row (reward.load_scale); = attributed_s without a cost model
    row_rounds: int = 0  # the rows of its rounds, summed (over its rounds: the mean rows it shared)
    done: threading.Event = field(default_factory=threading.Event)
    submitted_at: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # cancel() came, maybe before the loop took the request: it is cancelled at take
    #: called once when the request ends (finished or failed), before ``done`` is set, on the thread
    #: that ends it (the loop's, between rounds): a runner settles the request here (its feedback)
    on_done: "Callable[[Ticket], None] | None" = None
    settled: threading.Lock = field(default_factory=threading.Lock)  # held by the one complete() that runs

    def wait(self, timeout: float | None = None) -> Outcome:
        """The request's outcome; raises its own error (a bad prompt, a cancel) or TimeoutError."""
        if not self.done.wait(timeout):
            raise TimeoutError("the request did not finish in time")
        return self.outcome()

    def outcome(self) -> Outcome:
        """The ended request's outcome (from ``on_done`` on, before ``done`` is set); raises its own error."""
        if self.error is not None:
            raise self.error
        if self.handle is None:
            raise EngineFailed("the request ended before the engine took it")
        return self.handle.result()

    def complete(self, error: AdaptspecError | None = None) -> None:
        """The request has ended (its handle is done, or it failed with ``error``): run ``on_done``,
        then wake its waiters; once (a later call, from any thread, does nothing). A failing
        ``on_done`` is logged and fails this request alone."""
        if not self.settled.acquire(blocking=False):
            return  # completed already (a stalled engine's watchdog, a waiter seeing a dead engine, the loop's end)
        if error is not None:
            self.error = error
        if self.on_done is not None:
            try:
                self.on_done(self)
            except Exception:  # noqa: BLE001 - the runner's fault: this request only
                log.exception("settling a finished request failed")
        self.done.set()

    def cancel(self) -> None:
        """Stop at the next round boundary (a client that went away)."""
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()

    @property
    def ttft_s(self) -> float | None:
        h = self.handle
        return None if h is None or h.first_token_at is None else h.first_token_at - self.submitted_at


class EngineLoop:
    """Runs a :class:`~adaptspec.batching.engine.BatchEngine` on its own thread (see the module docstring)."""

    def __init__(
        self,
        engine: "BatchEngine",
        max_queue: int = 64,
        attribution: str = "marginal",
        profile: "LatencyProfile | None" = None,
        rule: EngineRule | None = None,
        switchback: "Switchback | None" = None,
        threads: int | None = None,
        request_timeout_s: float = 600.0,
        max_failures: int = 3,
        failure_window_s: float = 60.0,
        stall_s: float = STALL_S,
    ) -> None:
        _check_loop_settings(max_queue, request_timeout_s, stall_s, threads)
        self.request_timeout_s = float(request_timeout_s)
        self.stall_s = float(stall_s)
        self.threads = threads
        _warn_if_threads_split(threads)
        if attribution not in ATTRIBUTIONS:
            raise AdaptspecError(f"attribution must be one of {', '.join(ATTRIBUTIONS)}, got {attribution!r}")
        self.attribution = attribution if profile is not None else "tokens"  # marginal needs a cost model
        self.profile = profile
        self._one_row = None if profile is None else OneRowScale(profile)
        self.rule = rule  # a load_rules.round_rule.RoundRule: every row's block size, every round
        if rule is not None:
            engine.round_block_sizes = rule.choose
        engine.on_first_token = (
            self._first_token
        )  # a stop in the first token ends the request before any round
        # a serving.engine.switchback.Switchback (switchback A/B): it counts the rounds into slices; the
        # variant of a request joining now is its slice's (switchback.assign), each round is recorded
        self.switchback = switchback
        self.engine = engine
        self.max_queue = max_queue
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._inbox_n = 0  # submitted, not yet handed to the engine
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._tickets: list[Ticket] = []
        self._reserved: dict[int, Reservation] = {}  # places held by requests being checked (see reserve)
        self._closed = False
        self._drained: EngineFailed | None = None  # set by drain(): the loop drops its rows and ends
        self.rounds = 0
        self.decode_s = 0.0  # rounds' decode time (prefills excluded), all rounds
        self.last_round: "RoundRecord | None" = None
        self.rounds_by_width: collections.Counter = collections.Counter()  # (rows, widest block) -> rounds
        self.round_s_ewma: float | None = None
        # one guarded thread: a failure outside a request's own checks fails every request in flight
        # with a 503, resets the engine and restarts the loop; max_failures within failure_window_s
        # stop it for good (submissions then get EngineFailed: the server answers 503); no round
        # finished for stall_s seconds while busy: stalled (see the module docstring)
        self._guard = GuardedThread(
            "adaptspec-engine",
            self._run,
            self._failed,
            max_failures=max_failures,
            window_s=failure_window_s,
            logger=log,
            stall_s=stall_s,
            on_stall=self._stalled,
        )
        self._guard.start()

    # ------------------------------------------------------------------ any thread
    def submit(
        self,
        prompt_ids: Sequence[int],
        block_size: int = 1,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        seed: int | None = None,
        on_tokens: Callable[[list[int]], None] | None = None,
        stop_when: Callable[[], bool] | None = None,
        reservation: Reservation | None = None,
        on_done: Callable[[Ticket], None] | None = None,
    ) -> Ticket:
        """Queue a request (checked by the engine when the loop takes it; a bad one fails alone).

        With a ``reservation`` (:meth:`reserve`) still held, its place is used: no :class:`QueueFull`.
        ``on_done(ticket)`` runs once when the request ends, before its waiters wake (:meth:`Ticket.complete`)."""
        with self._lock:
            self._check_open()
            held = reservation is not None and self._reserved.pop(id(reservation), None) is not None
            if not held:
                self._check_room()
            self._inbox_n += 1
        ticket = Ticket(on_tokens, stop_when, on_done=on_done)
        self._inbox.put((ticket, (list(prompt_ids), block_size, max_new_tokens, temperature, seed)))
        self._wake.set()
        return ticket

    def reserve(self) -> Reservation:
        """Hold a place in the queue for a request about to be submitted, or raise :class:`QueueFull`
        now: a server takes it before a stream's headers go out, so a refused stream is a real 429.
        A place not used within ``RESERVATION_S`` seconds is given back (a request that never ran)."""
        with self._lock:
            self._check_open()
            self._check_room()
            r = Reservation(self)
            self._reserved[id(r)] = r
            return r

    def release(self, reservation: Reservation) -> None:
        """Give back a place :meth:`reserve` held (idempotent)."""
        with self._lock:
            self._reserved.pop(id(reservation), None)

    def _check_room(self) -> None:  # with the lock held
        now = time.monotonic()
        for key, r in list(self._reserved.items()):
            if now - r.taken_at > RESERVATION_S:
                del self._reserved[key]
        queued = self._inbox_n + len(self.engine.waiting) + len(self._reserved)
        if queued >= self.max_queue + self.free_rows:
            raise QueueFull(queued, self.retry_after_s)

    def _check_open(self) -> None:  # with the lock held
        if self._guard.gave_up:
            raise EngineFailed(
                "the engine has stopped after repeated failures (the server's log has them); "
                "this server cannot decode until it is restarted"
            )
        if self._guard.stalled:
            raise self._stall_error()
        if self._closed:
            raise EngineFailed(SHUTTING_DOWN)

    def wait(self, ticket: Ticket, timeout: float | None = None) -> Outcome:
        """``ticket``'s outcome, waiting at most ``timeout`` (default ``request_timeout_s``) seconds: past
        it the request is cancelled and :class:`EngineFailed` raised; so is a dead engine thread's."""
        limit = self.request_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not ticket.done.is_set():
            if (
                not self._guard.alive
            ):  # the loop has ended (closed, or stopped for good): nobody will finish it
                ticket.complete(EngineFailed("the engine stopped before this request finished"))
            elif time.monotonic() >= deadline:
                ticket.cancel()
                raise EngineFailed(f"the request did not finish within {limit:g} s")
            else:
                ticket.done.wait(min(0.5, deadline - time.monotonic()))
        return ticket.wait(0)

    @property
    def health(self) -> dict[str, Any]:
        """The engine thread's state for /health: ``ok``, ``degraded`` (failed and restarted within the
        failure window), ``stalled`` (no round finished for ``stall_s`` while busy) or ``failed``
        (stopped for good), its failures (stalls included) and the last one's kind
        (:meth:`GuardedThread.report <adaptspec._util.guarded.GuardedThread.report>`)."""
        return self._guard.report()

    @property
    def free_rows(self) -> int:
        """Rows neither decoding nor held by a joining request (its prompt being prefilled in chunks)."""
        return max(0, self.engine.max_rows - len(self.engine.rows) - self.engine.joining)

    @property
    def retry_after_s(self) -> float:
        """A guess at when a row frees up: the mean round time times a typical request's rounds."""
        per_round = self.round_s_ewma or 0.05
        return max(1.0, round(per_round * 64))

    def stats(self) -> dict[str, Any]:
        """Rows in flight, requests waiting, the last round's tokens and time (for /metrics)."""
        r = self.last_round
        return {
            "rows_in_flight": len(self.engine.rows),
            "queue_length": self.queue_length,
            "rounds": self.rounds,
            "tokens_per_round": sum(r.taus) if r is not None else 0,
            "batch_time_s": r.round_s if r is not None else 0.0,
            "round_s_ewma": self.round_s_ewma or 0.0,
            "rows_last_round": r.rows if r is not None else 0,
            "decode_s": self.decode_s,
            "rule_s": 0.0 if self.rule is None else self.rule.busy_s,
            "rule_wall_s": 0.0 if self.rule is None else self.rule.busy_wall_s,
            "rounds_by_width": dict(self.rounds_by_width),
            "engine_failures": self._guard.failures,
            "engine_up": int(not (self._guard.gave_up or self._guard.stalled)),
        }

    @property
    def queue_length(self) -> int:
        """Requests submitted and not yet decoding (joining ones included: their prompts being prefilled)."""
        return self._inbox_n + len(self.engine.waiting) + self.engine.joining

    def close(self, timeout: float = 120.0) -> None:
        """Finish what was submitted, then stop the thread (whatever it left unfinished fails); at most
        ``timeout`` seconds, and no longer than the engine progresses. A thread still in a round then
        is left behind, every request answered 503 (:meth:`drain`; the thread is a daemon)."""
        with self._lock:
            self._closed = True
        self._wake.set()
        self._guard.join_unless_stalled(timeout)
        if not self._guard.alive:
            self._fail_everything(EngineFailed("the server shut down before this request finished"))
        else:
            self.drain(SHUTTING_DOWN)
            if self._guard.stalled:
                log.error(
                    "the engine thread is stalled (no round for %g s): shutting down without it", self.stall_s
                )
            else:
                log.error(
                    "the engine thread is still in a round %g s into the shutdown: its requests were "
                    "answered 503; shutting down without it",
                    timeout,
                )
        if self.switchback is not None:  # the slice in progress is written, marked incomplete
            self.switchback.close()

    def drain(self, reason: str) -> None:
        """Answer every request in flight or queued with :class:`EngineFailed` (``reason``), now, and
        refuse new ones. The engine is the loop thread's: it drops the rows at its next round
        boundary and ends (a round that never returns is left to its daemon thread)."""
        error = EngineFailed(reason)
        with self._lock:
            self._closed = True
            self._drained = error
        self._answer_held(error)
        self._wake.set()

    def __enter__(self) -> "EngineLoop":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ the loop thread
    def _take_submissions(self) -> None:
        while True:
            try:
                ticket, (ids, b, n, t, seed) = self._inbox.get_nowait()
            except queue.Empty:
                return
            with self._lock:
                self._inbox_n -= 1
            try:
                ticket.handle = self.engine.submit(
                    ids, block_size=b, max_new_tokens=n, temperature=t, seed=seed
                )
            except AdaptspecError as e:
                ticket.complete(e)
                continue
            if ticket.cancelled:
                ticket.handle.cancel()
            self._tickets.append(ticket)

    def _run(self) -> None:
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)  # this thread's own intra-op team (see the module docstring)
        while True:
            if self._guard.idle():  # stalled while streaming its last tokens: those requests were answered
                self._after_stall()
            self._wake.wait()
            self._wake.clear()
            self._guard.beat()
            self._take_submissions()
            while self.engine.busy and self._drained is None:
                record = self.engine.step()  # a defect raises to the guard: see _failed
                if self._guard.beat():  # a round that outlived stall_s: its requests were answered 503
                    self._after_stall()
                    continue
                if record is not None:
                    self._attribute(record)
                    self.rounds += 1
                    self.rounds_by_width[record.rows, record.width] += 1
                    self.last_round = record
                    a = 0.1
                    self.round_s_ewma = (
                        record.round_s
                        if self.round_s_ewma is None
                        else ((1 - a) * self.round_s_ewma + a * record.round_s)
                    )
                self._stream()
                if self._guard.beat():  # a callback (a stream, a feedback) that outlived stall_s
                    self._after_stall()
                self._take_submissions()
            if self._drained is not None:  # its requests were answered: drop the rows, free their slots
                self._fail_everything(self._drained)
                return
            self._stream()
            with self._lock:
                if self._closed and self._inbox.empty():
                    return

    def _attribute(self, record: "RoundRecord") -> None:
        """Add each row's share of the round's decode time (prefills excluded) to its ticket."""
        by_id = {t.handle.id: t for t in self._tickets}
        rows = [by_id.get(i) for i in record.requests]
        contexts = [0 if t is None else len(t.handle.prompt) + len(t.handle.tokens) for t in rows]
        decode_s = max(0.0, record.round_s - record.join_s)
        self.decode_s += decode_s
        shares = attribute(self.attribution, decode_s, record.block_sizes, contexts, self.profile)
        one_row = (
            1.0 if self._one_row is None else self._one_row.factor(len(rows), sum(contexts) / len(contexts))
        )
        for t, share in zip(rows, shares):
            if t is not None:
                t.attributed_s += float(share)
                t.one_row_s += float(share) * one_row
                t.row_rounds += len(rows)
        if self.rule is not None and None not in rows:
            self.rule.feedback(record, shares, [t.handle for t in rows])
        if self.switchback is not None:
            self.switchback.after_round(record, decode_s)

    def _first_token(self, handle: "RequestHandle") -> None:
        """At join (the engine's hook): a request with a stop condition is streamed its first token
        and asked, so a stop in the first token ends it before it takes a row (one without is
        streamed after its first round, as every round)."""
        for t in self._tickets:
            if t.handle is handle:
                if t.stop_when is not None:
                    self._stream_one(t)
                return

    def _stream_one(self, t: Ticket) -> None:
        """Give ``t`` its new tokens, then ask its stop condition (true: it ends at the next boundary)."""
        h = t.handle
        if t.on_tokens is not None and len(h.tokens) > t.sent:
            new = h.tokens[t.sent :]
            t.sent = len(h.tokens)
            try:
                t.on_tokens(new)
            except Exception:  # a broken stream ends that request only
                log.exception("a stream callback failed; cancelling its request")
                h.cancel()
        if t.stop_when is not None and not h.done and not h.cancelled:
            try:
                if t.stop_when():
                    h.finish("stop")
            except Exception:
                log.exception("a stop condition failed; cancelling its request")
                h.cancel()

    def _stream(self) -> None:
        still = []
        for t in self._tickets:
            h = t.handle
            self._stream_one(t)
            if h.done:
                t.complete()
            else:
                still.append(t)
        self._tickets = still

    def _failed(self, message: str) -> None:
        """After the loop thread failed (on that thread, from the guard): fail every request in
        flight or queued with a 503 saying so (the error's message, logged by the guard, may carry
        a user's paths: not for clients), and reset the engine (rows dropped, KV slots freed)."""
        what = "it has stopped" if self._guard.gave_up else "it was restarted"
        self._fail_everything(
            EngineFailed(
                f"the engine failed (the server's log has the error); {what} and this "
                "request was dropped: retry"
            )
        )

    def _stall_error(self) -> EngineFailed:
        return EngineFailed(
            f"the engine has finished no round for {self.stall_s:g} s (stalled; the server's log "
            "shows where): requests get 503 until it moves again or the server is restarted"
        )

    def _stalled(self, message: str) -> None:
        """On the watchdog's thread, once the engine is stalled: answer every request in flight or
        queued with a 503. The engine itself is the stuck thread's: not touched here (see _after_stall)."""
        self._answer_held(self._stall_error())

    def _answer_held(self, error: EngineFailed) -> None:
        """Answer every request queued (the inbox: submitted, not yet taken by the loop) or in flight
        with ``error``, from any thread: the loop's own may be stuck in a round."""
        for t in self._take_inbox() + list(self._tickets):
            t.complete(error)

    def _after_stall(self) -> None:
        """On the loop thread, back from work that outlived ``stall_s``: its requests were answered
        (:meth:`_stalled`); drop them from the engine (rows failed, KV slots freed) and serve again."""
        error = self._stall_error()
        self.engine.reset(error)
        for t in self._tickets:
            t.complete(error)  # answered already: nothing happens, unless it joined since
        self._tickets = []

    def _take_inbox(self) -> list:
        """The tickets submitted and not yet taken by the loop, taken out of the inbox."""
        taken = []
        while True:
            try:
                ticket, _ = self._inbox.get_nowait()
            except queue.Empty:
                return taken
            with self._lock:
                self._inbox_n -= 1
            taken.append(ticket)

    def _fail_everything(self, error: AdaptspecError) -> None:
        self._tickets.extend(self._take_inbox())
        self.engine.reset(error)
        for t in self._tickets:
            h = t.handle
            finished = h is not None and h.done and h.error is None  # one that finished keeps its outcome
            t.complete(None if finished else error)
        self._tickets = []


def _check_loop_settings(max_queue: Any, request_timeout_s: Any, stall_s: Any, threads: Any) -> None:
    """EngineLoop's queue length (an int >= 0), request time bound and stall time (seconds > 0) and
    torch threads (None or an int >= 1)."""
    if not isinstance(max_queue, int) or max_queue < 0:
        raise AdaptspecError(f"max_queue must be an int >= 0, got {max_queue!r}")
    if not (isinstance(request_timeout_s, (int, float)) and request_timeout_s > 0):
        raise AdaptspecError(f"request_timeout_s must be a number > 0, got {request_timeout_s!r}")
    if isinstance(stall_s, bool) or not isinstance(stall_s, (int, float)) or not 0 < stall_s < float("inf"):
        raise AdaptspecError(f"stall_s must be a number of seconds > 0, got {stall_s!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise AdaptspecError(f"threads must be an int >= 1, got {threads!r}")


def _warn_if_threads_split(threads: int | None) -> None:
    """Warns when the loop gets several torch threads and the starting thread has several too."""
    if threads is not None and threads > 1:
        import torch

        if torch.get_num_threads() > 1:
            log.warning(
                "the engine loop gets %d torch threads while the thread starting it has %d: if that "
                "thread has run torch work, the engine runs ~1.6x slower (call "
                "torch.set_num_threads(1) before any torch work; see adaptspec.serving.engine.loop)",
                threads,
                torch.get_num_threads(),
            )
