"""Running one checked request with its stop sequences, whole or as server-sent events.

:func:`answer` runs a request for the server, awaited on its event loop (:func:`generate`: the
same on the calling thread, for in-process use): the tokens of each round go
through a :class:`~adaptspec.serving.stops.StopStream`, decoding halts after the round in which
a stop sequence completes (the runner is given the condition), and the answer is the
:class:`~adaptspec.serving.service.Output` up to it. :func:`events` streams the same as
server-sent events in a format given by a :class:`~adaptspec.serving.responses.ChunkFormat`
(completions or chat chunks):
a piece of text is sent as soon as no stop sequence can begin in it, and the final chunk only
once the decision is in the decision log.

A client that goes away cancels its request (:mod:`adaptspec.serving.cancelling`): a stream
when its response is abandoned (the server cancels the streaming task, or the generator is
closed), a plain request (:func:`complete`) when the server reports ``http.disconnect`` before
the answer is ready. On the batched engine the row then leaves the batch at the next round
boundary, ends as cancelled and its decision stays without feedback, as any failed request's
(logged without a reward when it expires, or at shutdown).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from .cancelling import Cancellation
from .request_error import RequestError
from .responses import ChunkFormat, error_body, server_fault
from .service import CompletionRequest, CompletionService, Output
from .stops import StopStream

if TYPE_CHECKING:
    from ..control.generation import Generation

__all__ = ["answer", "complete", "events", "generate"]

log = logging.getLogger("adaptspec.serving")


class _Answer:
    """One request's answer as its tokens arrive: stop sequences watched, pieces handed on, the
    output cut at the first stop, metrics recorded at the end."""

    def __init__(
        self,
        service: CompletionService,
        req: CompletionRequest,
        on_piece: Callable[[str, list[int]], None] | None,
    ) -> None:
        self.service, self.req, self.on_piece = service, req, on_piece
        self.stream = StopStream(service.codec, req.stop)
        self.watch = bool(req.stop) or on_piece is not None  # else the text is decoded once, at the end
        self.first: float | None = None

    def on_tokens(self, ids: list[int]) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        if not self.watch:
            return
        text, kept = self.stream.push(
            ids
        )  # on the decoding thread, so a stop halts decoding right after this round
        if self.on_piece is not None and (text or kept):
            self.on_piece(text, kept)

    def stopped(self) -> bool:
        return self.stream.stopped

    def output(self, gen: "Generation") -> tuple["Generation", Output]:
        if self.watch:
            self.stream.finish()
            output = Output(
                self.stream.ids,
                self.stream.text,
                "stop" if self.stream.stopped else self.service.output(gen).finish_reason,
            )
        else:
            output = self.service.output(gen)
        # the client gets output.ids (usage.completion_tokens), not what was decoded past a stop sequence
        ttft = None if self.first is None else self.first - self.req.received
        self.service.observe(self.req, gen, ttft, len(output.ids))
        return gen, output


def generate(
    service: CompletionService,
    req: CompletionRequest,
    on_piece: Callable[[str, list[int]], None] | None = None,
    cancel: Cancellation | None = None,
) -> tuple["Generation", Output]:
    """Run ``req`` on this thread; ``on_piece(text, ids)`` gets each piece that may be sent. Returns
    ``(generation, output)``.

    ``cancel``: cancelling it stops the request's decoding where the runner can (the batched
    engine); the request then raises.

    The text still held back when generation ends is in neither ``on_piece`` call; a streamed
    answer sends it with its final chunk (:attr:`Output.text` has it).
    """
    a = _Answer(service, req, on_piece)
    return a.output(service.run(req, a.on_tokens, stop_when=a.stopped, cancel=cancel))


async def answer(
    service: CompletionService,
    req: CompletionRequest,
    on_piece: Callable[[str, list[int]], None] | None = None,
    cancel: Cancellation | None = None,
) -> tuple["Generation", Output]:
    """:func:`generate`, awaited on the event loop: no thread waits for the engine."""
    a = _Answer(service, req, on_piece)
    return a.output(await service.run_async(req, a.on_tokens, stop_when=a.stopped, cancel=cancel))


_working: set = set()  # the requests' tasks, held until they end (the event loop keeps weak references)


def _spawn(coro: Any) -> "asyncio.Future":
    task = asyncio.ensure_future(coro)
    _working.add(task)
    task.add_done_callback(_working.discard)
    return task


async def events(service: CompletionService, req: CompletionRequest, fmt: ChunkFormat) -> AsyncIterator[str]:
    """Server-sent events of one streamed request, ending with ``data: [DONE]``."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    cancel = Cancellation()

    def send(item: tuple[str, Any]) -> None:  # from the decoding thread
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening any more
            pass

    async def work() -> None:
        try:
            done = await answer(service, req, lambda text, ids: send(("piece", (text, ids))), cancel)
        except Exception as e:  # noqa: BLE001 - reported to the client as an error event
            queue.put_nowait(("error", e))
        else:
            queue.put_nowait(("done", done))

    _spawn(work())
    sent = ""
    ended = False  # the request has finished (answered or failed): nothing to cancel
    try:
        while True:
            kind, value = await queue.get()
            if kind == "piece":
                sent += value[0]
                chunk = fmt.piece(*value)
                if chunk is not None:
                    yield sse(chunk)
            elif kind == "done":
                ended = True
                gen, output = value
                for chunk in fmt.final(gen, output, output.text[len(sent) :]):
                    yield sse(chunk)
                yield "data: [DONE]\n\n"
                return
            else:
                ended = True
                # a defect: a 503 with a reason in the stream (server_fault logs the error)
                e = value if isinstance(value, RequestError) else server_fault(value, req.request_id)
                yield sse(error_body(e))
                yield "data: [DONE]\n\n"
                return
    finally:  # the response was abandoned (client gone: the task cancelled, or the generator closed)
        if not ended:
            gone(req, cancel)


def gone(req: CompletionRequest, cancel: Cancellation) -> None:
    """The client of ``req`` went away before its answer: cancel the request, say so in the log."""
    log.info("request %s: the client went away; cancelling it", req.request_id)
    cancel.cancel()


async def complete(
    request: Any, service: CompletionService, req: CompletionRequest
) -> tuple["Generation", Output] | None:
    """Run a plain (not streamed) request; ``None`` if its client went away first (the request is
    then cancelled, and whatever it raises is dropped: nobody is listening).

    The disconnect is what the server's ``receive`` reports once the body has been read
    (``http.disconnect``), so the check costs one waiting task, no polling."""
    cancel = Cancellation()
    work = _spawn(answer(service, req, None, cancel))
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not work.done() and watch.done() and not watch.cancelled() and watch.exception() is None:
        gone(req, cancel)
        try:
            await work
        except Exception:  # noqa: BLE001 - the cancel itself, or any failure: nobody to tell
            pass
        return None
    return await work


async def _disconnected(request: Any) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
