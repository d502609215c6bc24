"""The HTTP server: an OpenAI-style completions API over :class:`~adaptspec.serving.service.CompletionService`.

Endpoints:

- ``POST /v1/completions``: ``{"prompt": "text" | [token ids], "max_tokens": 16,
  "temperature": 0, "seed": null, "stream": false, "user": "...", "variant": "A"}``. ``user``
  is the A/B routing key (same user, same variant); ``variant`` (or the header
  ``X-Adaptspec-Variant``) forces one. The answer is an OpenAI ``text_completion`` plus
  ``choices[0].token_ids`` and an ``adaptspec`` object (variant, decision id, block size,
  propensity, tau, tokens/s, fallback). With ``stream: true`` the same arrives as server-sent
  events: the first token right after prefill, then the rest (per round when the speculator
  streams rounds), a final chunk with ``finish_reason``, ``usage`` and ``adaptspec``, then
  ``data: [DONE]``. The final chunk (and a non-streamed answer) is sent only after the decision
  is in the decision log: a client that got it holds an acknowledged decision.
- ``GET /metrics``: Prometheus text format (see :mod:`adaptspec.serving.metrics`).
- ``GET /ab``: the live A/B report as JSON (``?ope=0`` skips the off-policy estimates).
- ``GET /health``: status, uptime and per-variant policy state (``?digest=1`` adds a hash of
  each policy's learnt state).

Bad requests get a 4xx with ``{"error": {"message", "type", "param", "code"}}``; they never
reach a controller. Shutting the server down (SIGINT / SIGTERM) lets in-flight requests
finish, then closes the controllers: queued updates applied, final checkpoints, logs rolled.
"""

import asyncio
import concurrent.futures as cf
import json
import logging
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from .._util.numbers import finite
from .codec import TextStream
from .service import CompletionService, RequestError

__all__ = ["create_app"]

log = logging.getLogger("adaptspec.serving")


def create_app(service: CompletionService, max_workers: int = 64) -> Any:
    """A FastAPI application serving ``service``; it closes the service when it shuts down."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    pool = cf.ThreadPoolExecutor(max_workers, thread_name_prefix="adaptspec-request")

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, service.close)
            pool.shutdown(wait=False)

    app = FastAPI(title="adaptspec", version="1", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service

    def error(e: RequestError) -> Any:
        if service.metrics is not None:
            service.metrics.rejected_request(e.status)
        return JSONResponse(e.body(), status_code=e.status)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > service.limits.max_body_bytes:
            return error(RequestError(f"request body is {length} bytes; the limit is "
                                      f"{service.limits.max_body_bytes}", 413))
        body = await request.body()
        try:
            req = service.parse(body, request.headers.get("x-adaptspec-variant"))
        except RequestError as e:
            return error(e)
        loop = asyncio.get_running_loop()
        if not req.stream:
            first: list[float] = []
            try:
                gen = await loop.run_in_executor(pool, service.run, req,
                                                 lambda ids: first or first.append(time.perf_counter()))
            except RequestError as e:
                return error(e)
            except Exception as e:  # noqa: BLE001 - answer with a 500, keep serving
                log.exception("request %s failed", req.request_id)
                return JSONResponse(RequestError(f"internal error: {e!r}", 500).body(), status_code=500)
            service.observe(req, gen, first[0] - req.received if first else None)
            return JSONResponse(service.completion_body(req, gen))
        return StreamingResponse(_events(service, req, pool), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/metrics")
    async def metrics() -> Any:
        if service.metrics is None:
            return JSONResponse(RequestError("metrics are off", 404).body(), status_code=404)
        data, ctype = service.metrics.render()
        return Response(data, media_type=ctype)

    @app.get("/ab")
    async def ab(ope: int = 1) -> Any:
        try:
            rep = await asyncio.get_running_loop().run_in_executor(None, service.ab_report, bool(ope))
        except RequestError as e:
            return error(e)
        return JSONResponse(finite(rep))

    @app.get("/health")
    async def health(digest: int = 0) -> Any:
        h = await asyncio.get_running_loop().run_in_executor(None, service.health, bool(digest))
        return JSONResponse(h)

    return app


async def _events(service: CompletionService, req: Any, pool: cf.Executor) -> AsyncIterator[str]:
    """Server-sent events of one streamed completion."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    first: list[float] = []

    def send(item: tuple[str, Any]) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening any more
            pass

    def on_tokens(ids: list[int]) -> None:
        if not first:
            first.append(time.perf_counter())
        send(("tokens", ids))

    def work() -> None:
        try:
            gen = service.run(req, on_tokens)
        except BaseException as e:  # noqa: BLE001 - reported to the client as an error event
            send(("error", e))
        else:
            send(("done", gen))

    pool.submit(work)
    text = TextStream(service.codec)
    while True:
        kind, value = await queue.get()
        if kind == "tokens":
            yield _sse(service.chunk(req, text.push(value), list(value)))
        elif kind == "done":
            gen = value
            out = gen.outcome
            service.observe(req, gen, first[0] - req.received if first else None)
            extra = {"usage": {"prompt_tokens": len(req.prompt_ids), "completion_tokens": out.new_tokens,
                               "total_tokens": len(req.prompt_ids) + out.new_tokens},
                     "adaptspec": service.info(req, gen)}
            yield _sse(service.chunk(req, text.flush(), [], "stop" if out.finish_reason == "eos" else "length", extra))
            yield "data: [DONE]\n\n"
            return
        else:
            e = value if isinstance(value, RequestError) else RequestError(f"internal error: {value!r}", 500)
            yield _sse(e.body())
            yield "data: [DONE]\n\n"
            return


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"

