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
- ``POST /v1/chat/completions``: the same for chat messages (:meth:`CompletionService.parse_chat
  <adaptspec.serving.service.CompletionService.parse_chat>`), answered
  as ``chat.completion`` (chunks when streamed).
- ``GET /v1/models``: the served model and, with several A/B variants, one entry ``MODEL:VARIANT``
  per variant (a request for that model runs on that variant), so tools that compare models by
  name compare variants.
- ``GET /metrics``: Prometheus text format (see :mod:`adaptspec.serving.metrics`).
- ``GET /ab``: the live A/B report as JSON (``?ope=0`` skips the off-policy estimates).
- ``GET /health``: status, uptime and per-variant policy state (``?digest=1`` adds a hash of
  each policy's learnt state).

Bad requests get a 4xx with ``{"error": {"message", "type", "param", "code"}}``; they never
reach a controller. A request the server cannot complete gets a 503 with a reason in the
server's words (:mod:`adaptspec.serving.responses`: no exception text, no path; the log has them).
A client that disconnects before its answer cancels its request (on the
batched engine its row leaves at the next round boundary: :mod:`adaptspec.serving.streaming`).
Both POST endpoints go through one handler (:func:`create_app`'s ``answer``): read the body,
check it, then stream it or answer it whole; the bodies are :mod:`adaptspec.serving.responses`.
When the server stops, the app's lifespan closes the service (:meth:`CompletionService.close
<adaptspec.serving.service.CompletionService.close>`: the requests it still holds finished or
answered 503, queued updates applied, final checkpoints, logs rolled). ``adaptspec serve`` bounds
that on SIGINT / SIGTERM (:class:`~adaptspec.serving.shutdown.GracefulServer`): new requests get
503 at once, those in flight have a grace to finish, then every one left is answered 503, whatever
its decode is doing, and the process exits within 30 s.
"""

import asyncio
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from .._util.numbers import finite
from .bodies import ClientGone, read_body
from .request import CompletionRequest, Output
from .responses import (
    ChatChunks,
    ChunkFormat,
    CompletionChunks,
    chat_body,
    completion_body,
    error_body,
    models_body,
    server_fault,
)
from .service import CompletionService, RequestError
from .streaming import complete, events

__all__ = ["create_app"]

#: an endpoint's request check: (body, X-Adaptspec-Variant header) -> a checked request
Parse = Callable[[bytes, "str | None"], CompletionRequest]


def create_app(service: CompletionService) -> Any:
    """A FastAPI application serving ``service``; it closes the service when it shuts down.

    Requests run on the event loop: it checks a request, hands it to the service's runner and
    awaits its answer (the batched engine hands it back; no thread waits for it)."""
    from fastapi import FastAPI

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, service.close)

    app = FastAPI(title="adaptspec", version="1", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    _add_completion_routes(app, service)
    _add_status_routes(app, service)
    return app


def _rejected(service: CompletionService, e: RequestError) -> Any:
    """The error's JSON answer, counted in the service's metrics."""
    from fastapi.responses import JSONResponse

    if service.metrics is not None:
        service.metrics.rejected_request(e.status)
    return JSONResponse(error_body(e), status_code=e.status, headers=e.headers)


def _add_completion_routes(app: Any, service: CompletionService) -> None:
    """POST /v1/completions and /v1/chat/completions: each streams its answer or sends it whole."""
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    model = service.model_name

    async def answer(
        request: Request,
        parse: Parse,
        whole: Callable[[CompletionRequest, Any, Output], dict[str, Any]],
        chunks: Callable[[CompletionRequest], ChunkFormat],
    ) -> Any:
        """One POST endpoint: read and check the body, then stream the answer or send it whole."""
        try:
            body = await read_body(request, service)  # 413, 408, or the client left mid-body
        except RequestError as e:
            return _rejected(service, e)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it
        try:
            req = parse(body, request.headers.get("x-adaptspec-variant"))
        except RequestError as e:
            return _rejected(service, e)
        if req.stream:
            return StreamingResponse(
                events(service, req, chunks(req)),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        try:
            done = await complete(request, service, req)  # None: the client went away (cancelled)
        except RequestError as e:
            return _rejected(service, e)
        except Exception as e:  # noqa: BLE001 - a defect: a 503 with a reason (logged), keep serving
            return _rejected(service, server_fault(e, req.request_id))
        if done is None:
            return Response(status_code=499)  # nobody reads it (nginx's "client closed request")
        return JSONResponse(whole(req, *done))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await answer(
            request,
            service.parse,
            lambda req, gen, out: completion_body(model, req, gen, out),
            lambda req: CompletionChunks(model, req),
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await answer(
            request,
            service.parse_chat,
            lambda req, gen, out: chat_body(model, req, gen, out),
            lambda req: ChatChunks(model, req),
        )


def _add_status_routes(app: Any, service: CompletionService) -> None:
    """GET /v1/models, /metrics, /ab (the A/B report) and /health."""
    from fastapi.responses import JSONResponse, Response

    @app.get("/v1/models")
    async def models() -> Any:
        return JSONResponse(models_body(service.model_ids(), service.started))

    @app.get("/metrics")
    async def metrics() -> Any:
        if service.metrics is None:
            return JSONResponse(error_body(RequestError("metrics are off", 404)), status_code=404)
        data, ctype = service.metrics.render()
        return Response(data, media_type=ctype)

    @app.get("/ab")
    async def ab(ope: int = 1) -> Any:
        try:
            rep = await asyncio.get_running_loop().run_in_executor(None, service.ab_report, bool(ope))
        except RequestError as e:
            return _rejected(service, e)
        except Exception as e:  # noqa: BLE001 - a defect in the report: a 503 with a reason (logged), never a 500
            return _rejected(service, server_fault(e))
        return JSONResponse(finite(rep))

    @app.get("/health")
    async def health(digest: int = 0) -> Any:
        h = await asyncio.get_running_loop().run_in_executor(None, service.health, bool(digest))
        return JSONResponse(h, status_code=503 if h["status"] in ("failed", "stalled") else 200)
