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
  ``stop`` (a string or up to 4) ends the output before the first stop sequence.
- ``GET /v1/models``, ``POST /v1/chat/completions``: see :mod:`adaptspec.serving.routes`.
- ``GET /metrics``: Prometheus text format (see :mod:`adaptspec.serving.metrics`).
- ``GET /ab``: the live A/B report as JSON (``?ope=0`` skips the off-policy estimates).
- ``GET /health``: status, uptime and per-variant policy state (``?digest=1`` adds a hash of
  each policy's learnt state).

Bad requests get a 4xx with ``{"error": {"message", "type", "param", "code"}}``; they never
reach a controller. A client that disconnects before its answer cancels its request (with
``--batched`` its row leaves at the next round boundary: :mod:`adaptspec.serving.streaming`).
Shutting the server down (SIGINT / SIGTERM) lets in-flight requests finish, then closes the
controllers: queued updates applied, final checkpoints, logs rolled.
"""

import asyncio
import concurrent.futures as cf
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from .._util.numbers import finite
from .routes import add_openai_routes
from .service import CompletionService, RequestError
from .bodies import ClientGone, read_body
from .request_error import server_fault
from .streaming import CompletionChunks, complete, events

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
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        try:
            body = await read_body(request, service)  # 413, 408, or the client left mid-body
        except RequestError as e:
            return error(e)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it
        try:
            req = service.parse(body, request.headers.get("x-adaptspec-variant"))
        except RequestError as e:
            return error(e)
        if not req.stream:
            try:
                done = await complete(request, service, req, pool)  # None: the client went away (cancelled)
            except RequestError as e:
                return error(e)
            except Exception as e:  # noqa: BLE001 - a defect: a 503 with the reason, keep serving
                log.exception("request %s failed", req.request_id)
                return error(server_fault(e))
            if done is None:
                return Response(status_code=499)  # nobody reads it (nginx's "client closed request")
            return JSONResponse(service.completion_body(req, *done))
        return StreamingResponse(events(service, req, pool, CompletionChunks(service, req)), media_type="text/event-stream",
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
        return JSONResponse(h, status_code=503 if h["status"] == "failed" else 200)

    add_openai_routes(app, service, pool, error)  # GET /v1/models, POST /v1/chat/completions
    return app

