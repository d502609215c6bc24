"""Serving on the batched engine (``adaptspec serve``, the default for adaptspec's own models): every request is a row of one engine.

:class:`BatchedRunner` takes the place of the controller's own decode loop. One
:class:`~adaptspec.serving.engine.loop.EngineLoop` owns the model; a request handler submits
its request and waits while the loop decodes it with the others. The decision is the
variant's controller's, through its split API:

- **decide at join**: the engine prefills the request when a row is free and calls the
  request's chooser with the prefill's features; the chooser asks the variant's controller
  (``controller.decide(features, load=...)``) and returns the decision's block size. The
  :class:`~adaptspec.speculator.LoadState` is read there, on the loop thread (:func:`load_at_join`):
  the rows decoding once the request has joined, the other requests still queued or joining (their
  prompts being prefilled), the prompt's tokens, its temperature and max_tokens. The log keeps it; a controller made with
  ``load_features=True`` decides on it too;
- **feedback at the end**: the request's :class:`~adaptspec.speculator.Outcome` goes back to
  ``controller.feedback`` with ``decode_s`` = the request's *attributed* time, the sum of its
  shares of its rounds (:mod:`adaptspec.reward.attribution`), so its reward counts the cost its
  block size put on the rows it shared rounds with, not the wall time of a batch it did not
  own; each share put on the scale of one row (:mod:`adaptspec.reward.load_scale`, with a cost
  model), so the reward is the request's speed over plain decoding at the load it ran under,
  in the unit of a request decoded alone, and a policy blind to the load does not learn the
  load instead of the block size. The decision log then holds that outcome and reward as for
  any other request, and (``shared=``, a :class:`~adaptspec.speculator.SharedRounds`) the
  attributed time as measured (before the rescaling: ``decode_s / attributed_s`` is the
  request's mean factor) beside the wall decode time and the rows of its rounds.

**Switchback** (``design="switchback"``, :mod:`adaptspec.serving.engine.switchback`): the router's
variant is only provisional. A request's variant is fixed at join, on the engine's thread: the
chooser sets ``req.variant`` to the current slice's variant (overriding the router's choice and
any variant the request named) before that variant's controller decides, so the decision log,
the response's ``adaptspec.variant`` and the metrics all name the variant that ran.

A stop sequence (the ``stop_when`` condition :meth:`BatchedRunner.run` is given) ends the row at
the next round boundary as ``"stop"``; a :class:`~adaptspec.serving.cancelling.Cancellation`
given to it ends the row at the next round boundary as cancelled. A full queue is refused at once:
:class:`RequestError` 429 with a ``Retry-After`` header.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..._util.guarded import STALL_S
from ...batching.engine import DEFAULT_CHUNK_TOKENS
from ...control.controller import AdaptiveController
from ...errors import AdaptspecError
from ...speculator import LoadState, Outcome, SharedRounds
from ..cancelling import Cancellation
from ..request_error import RequestError
from ..responses import unavailable
from ..runner import answered, resolve
from .loop import EngineFailed, EngineLoop, QueueFull, Reservation, Ticket

if TYPE_CHECKING:
    from ...control.generation import Generation
    from ..request import CompletionRequest

__all__ = ["BatchedRunner", "EngineSettings", "batched_runner", "too_busy", "load_at_join"]


@dataclass(frozen=True)
class EngineSettings:
    """How the batched engine runs (``adaptspec serve``'s engine options).

    ``max_rows`` requests decode at once (1: one at a time, through the same path); past
    ``max_queue`` waiting requests a request gets 429. ``profile`` (a latency profile, or its name)
    is the cost model of the ``"marginal"`` attribution; without one, rounds are split by tokens.
    ``rule``: a per-round load rule of :mod:`adaptspec.load_rules` (see
    :mod:`adaptspec.load_rules.round_rule`); without one each row verifies its controller's block size.
    ``design``: ``"requests"`` (each request keeps the router's variant) or ``"switchback"``
    (:mod:`adaptspec.serving.engine.switchback`: slices of ``slice_rounds`` rounds, default 32, each on one
    variant drawn from ``seed``; slice records go next to the decision log). Under switchback
    ``rule`` may map variant -> rule (or None): the slice's variant's rule sets the block sizes of
    the slice's rounds. ``threads``: torch's intra-op threads on the engine's thread (see
    :class:`~adaptspec.serving.engine.loop.EngineLoop`; ``adaptspec serve`` keeps every other
    thread at one). ``chunk_tokens``: the joining prompts' tokens one round's target pass carries
    beside the decoding rows (:class:`~adaptspec.batching.engine.BatchEngine`; None: each prompt is
    prefilled alone while the rows wait).
    """

    max_rows: int = 8
    max_queue: int = 64
    attribution: str = "marginal"
    profile: Any = None
    rule: Any = None
    design: str = "requests"
    slice_rounds: int | None = None
    seed: int = 0
    threads: int | None = None
    chunk_tokens: int | None = DEFAULT_CHUNK_TOKENS


def too_busy(e: QueueFull) -> RequestError:
    """The 429 a full queue answers with: one line and ``Retry-After`` in whole seconds."""
    return RequestError(str(e), 429, headers={"Retry-After": str(max(1, math.ceil(e.retry_after_s)))})


def load_at_join(loop: EngineLoop, req: "CompletionRequest") -> LoadState:
    """The load ``req`` is decided under; called on ``loop``'s thread while the request joins (its
    own row not yet in ``engine.rows``, so it is counted here; the requests joining before it in
    the same round are in; those whose prompts are still being prefilled count in the queue)."""
    return LoadState(
        rows=len(loop.engine.rows) + 1,
        queue=loop.queue_length,
        context_tokens=len(req.prompt_ids),
        temperature=float(req.temperature),
        max_tokens=int(req.max_tokens),
    )


class BatchedRunner:
    """Runs checked requests as rows of ``loop``'s engine, deciding through each variant's controller
    (``controllers``: variant -> :class:`~adaptspec.control.controller.AdaptiveController`)."""

    def __init__(self, loop: EngineLoop, controllers: Mapping[str, AdaptiveController]) -> None:
        self.loop = loop
        self.controllers = dict(controllers)

    @property
    def health(self) -> dict[str, Any]:
        """The engine thread's state (:attr:`EngineLoop.health`)."""
        return self.loop.health

    def describe(self) -> str:
        lp = self.loop
        return (
            f"batched engine: {lp.engine.max_rows} rows, queue {lp.max_queue}, attribution {lp.attribution}, "
            f"load rule {'none' if lp.rule is None else lp.rule.name}"
        )

    def close(self, timeout: float = 120.0) -> None:
        """Finish the requests in the engine within ``timeout`` seconds, then stop its thread
        (:meth:`EngineLoop.close`: what is left is answered 503)."""
        self.loop.close(timeout)

    def drain(self, reason: str) -> None:
        """Answer every request in the engine or its queue with a 503 giving ``reason``, now
        (:meth:`EngineLoop.drain`)."""
        self.loop.drain(reason)

    def reserve(self) -> Reservation:
        """A place in the queue for a request about to run, or the 429 now (taken before a stream's
        headers go out, so a refused stream is a real 429 with ``Retry-After``); a 503 when the
        engine has stopped. :meth:`run` uses the place (or gives it back)."""
        try:
            return self.loop.reserve()
        except QueueFull as e:
            raise too_busy(e) from None
        except EngineFailed as e:
            raise RequestError(str(e), 503) from None

    def start(
        self,
        req: "CompletionRequest",
        on_tokens: Callable[[list[int]], None] | None,
        stop_when: Callable[[], bool] | None,
        cancel: Cancellation | None,
        deliver: Callable[["Generation | RequestError"], None],
    ) -> Ticket:
        """Submit ``req`` to the engine; when it ends, ``deliver`` gets its generation (its feedback
        given, its decision and outcome logged) or the :class:`RequestError` it answers with, on the
        engine's thread (:meth:`settle`). A full queue or a stopped engine raises here."""
        decided: dict[str, Any] = {}
        ctrl = self.controllers[req.variant]

        def choose(features: Any) -> int:  # on the loop thread, at join
            nonlocal ctrl
            if self.loop.switchback is not None:  # switchback: the slice's variant, fixed now (routed late)
                req.variant = self.loop.switchback.assign(req.request_id)
                ctrl = self.controllers[req.variant]
            t0 = time.perf_counter()
            try:
                d = ctrl.decide(features, request_id=req.request_id, load=load_at_join(self.loop, req))
            except Exception as e:  # the controller's fault, not the prompt's: a 503 below
                decided["error"] = e
                raise
            decided["decision"], decided["decide_s"] = d, time.perf_counter() - t0
            return int(d.block_size)

        def done(ticket: Ticket) -> None:  # on the loop thread (or a waiter's, for a dead engine)
            deliver(self.settle(req, ctrl, ticket, decided))

        try:
            ticket = self.loop.submit(
                req.prompt_ids,
                block_size=choose,
                max_new_tokens=req.max_tokens,
                temperature=req.temperature,
                seed=req.seed,
                on_tokens=on_tokens,
                stop_when=stop_when,
                reservation=req.slot,
                on_done=done,
            )
        except QueueFull as e:
            raise too_busy(e) from None
        except EngineFailed as e:
            raise RequestError(str(e), 503) from None
        finally:
            if req.slot is not None:
                req.slot.release()  # used by the submission, or not needed any more
        if cancel is not None:
            cancel.add(ticket.cancel)  # the client went away: the row leaves at the next round boundary
        return ticket

    def settle(
        self, req: "CompletionRequest", ctrl: AdaptiveController, ticket: Ticket, decided: dict[str, Any]
    ) -> "Generation | RequestError":
        """What an ended request answers: its generation, after its feedback (the one decide ->
        decode -> feedback path: the reward is the controller's), or the error it gets."""
        from ...control.controller import DecisionLogError
        from ...control.generation import Generation

        try:
            done = ticket.outcome()
        except AdaptspecError as e:
            if isinstance(e, EngineFailed):
                return RequestError(str(e), 503)
            if "error" in decided:
                return unavailable(
                    f"variant {req.variant}'s controller could not decide this request",
                    decided["error"],
                    req.request_id,
                )
            if "decision" not in decided:  # the prefill refused the prompt
                return RequestError(str(e), param="prompt")
            # after the decision (cancelled: the client went away): it stays pending and is logged
            # without a reward when it expires
            return RequestError(str(e), 503)
        decision = decided["decision"]  # every joined request is decided before its first token
        outcome = Outcome(
            list(done.tokens), list(done.rounds), decode_s=ticket.one_row_s, finish_reason=done.finish_reason
        )
        shared = SharedRounds(
            attributed_s=ticket.attributed_s,
            wall_decode_s=done.decode_s,
            rounds=len(done.rounds),
            row_rounds=ticket.row_rounds,
        )
        t0 = time.perf_counter()
        try:
            fed = ctrl.feedback(decision.decision_id, outcome, shared=shared)
        except DecisionLogError as e:
            return unavailable(
                "the decision log cannot be written, the request was not recorded", e, req.request_id
            )
        except Exception as e:  # noqa: BLE001 - the controller's fault: a 503 with a reason, the server keeps serving
            return unavailable(
                f"variant {req.variant}'s controller could not record this request", e, req.request_id
            )
        overhead = decided["decide_s"] + time.perf_counter() - t0
        queued_prefill = ticket.ttft_s or 0.0  # queueing + prefill: the engine prefills at join
        return Generation(
            outcome, decision, [decision], [fed.reward], prefill_s=queued_prefill, overhead_s=overhead
        )

    def run(
        self,
        req: "CompletionRequest",
        on_tokens: Callable[[list[int]], None] | None = None,
        stop_when: Callable[[], bool] | None = None,
        cancel: Cancellation | None = None,
    ) -> "Generation":
        """Decode ``req`` in the batch, waiting on this thread; returns a
        :class:`~adaptspec.control.generation.Generation` whose decision and outcome are in the
        decision log. ``stop_when()``, asked after each round's tokens are streamed, ends the row as
        ``"stop"``; ``cancel`` ends it as cancelled. (The server awaits :meth:`run_async` instead.)"""
        result: list[Any] = []
        ticket = self.start(req, on_tokens, stop_when, cancel, result.append)
        try:
            self.loop.wait(ticket)  # bounded: the loop's request_timeout_s; settled before it returns
        except EngineFailed as e:
            if not result:
                raise RequestError(str(e), 503) from None
        return answered(
            result[0] if result else RequestError("the engine stopped before this request finished", 503)
        )

    async def run_async(
        self,
        req: "CompletionRequest",
        on_tokens: Callable[[list[int]], None] | None = None,
        stop_when: Callable[[], bool] | None = None,
        cancel: Cancellation | None = None,
    ) -> "Generation":
        """:meth:`run` without a waiting thread: the event loop submits ``req`` and awaits its
        settlement, which the engine's thread hands back (one hand-off each way)."""
        import asyncio

        loop = asyncio.get_running_loop()
        settled: asyncio.Future = loop.create_future()

        def deliver(result: Any) -> None:  # on the engine's thread
            try:
                loop.call_soon_threadsafe(resolve, settled, result)
            except RuntimeError:  # the event loop is gone (shutdown): nobody is waiting any more
                pass

        ticket = self.start(req, on_tokens, stop_when, cancel, deliver)
        try:
            result = await asyncio.wait_for(asyncio.shield(settled), self.loop.request_timeout_s)
        except asyncio.TimeoutError:
            ticket.cancel()
            raise RequestError(
                f"the request did not finish within {self.loop.request_timeout_s:g} s", 503
            ) from None
        return answered(result)


def batched_runner(
    speculator: Any,
    controllers: Mapping[str, AdaptiveController],
    variants: list[str],
    log_dir: Any,
    settings: EngineSettings,
    stall_s: float = STALL_S,
) -> BatchedRunner:
    """One batched engine over ``speculator``'s target and drafter, deciding through ``controllers``
    (``variants``: the router's, in order, for a switchback schedule; ``log_dir``: where slice
    records go, or None); ``stall_s``: its watchdog's bound (:class:`EngineLoop`)."""
    from ...batching import BatchEngine
    from ...costs.latency import get_profile
    from ...load_rules.round_rule import RoundRule

    s = settings
    target, drafter = getattr(speculator, "target", None), getattr(speculator, "drafter", None)
    if target is None:
        raise AdaptspecError(
            f"the batched engine needs adaptspec's own target and drafter, not a {type(speculator).__name__}"
        )
    switchback = _switchback(variants, log_dir, s.design, s.slice_rounds, s.seed, s.rule)
    engine = BatchEngine(target, drafter, max_rows=s.max_rows, chunk_tokens=s.chunk_tokens)
    rule = s.rule
    if isinstance(rule, Mapping):  # per variant (switchback): the slice's variant's rule, each round
        from .switchback import SliceRule

        adapter: Any = SliceRule(
            switchback,
            {v: None if r is None else RoundRule(r, lambda: loop.queue_length) for v, r in rule.items()},
        )
    else:
        adapter = None if rule is None else RoundRule(rule, lambda: loop.queue_length)
    loop = EngineLoop(
        engine,
        max_queue=s.max_queue,
        attribution=s.attribution,
        profile=None if s.profile is None else get_profile(s.profile),
        rule=adapter,
        switchback=switchback,
        threads=s.threads,
        stall_s=stall_s,
    )
    return BatchedRunner(loop, controllers)


def _switchback(
    variants: list[str], log_dir: Any, design: str, slice_rounds: int | None, seed: int, rule: Any
) -> Any:
    """The :class:`~adaptspec.serving.engine.switchback.Switchback` of ``design`` (None for ``"requests"``),
    writing its slice records next to the decision log in ``log_dir`` (when there is one)."""
    from .switchback import AB_DESIGNS, DEFAULT_SLICE_ROUNDS, Switchback

    if design not in AB_DESIGNS:
        raise AdaptspecError(f"A/B design must be one of {', '.join(AB_DESIGNS)}, got {design!r}")
    if design == "requests":
        if slice_rounds is not None or isinstance(rule, Mapping):
            raise AdaptspecError("slice rounds and per-variant load rules need the switchback design")
        return None
    sb = Switchback(variants, DEFAULT_SLICE_ROUNDS if slice_rounds is None else slice_rounds, seed)
    if log_dir is not None:
        from ...traces.slice_log import SliceLogWriter

        sb.writer = SliceLogWriter(log_dir)
    return sb
