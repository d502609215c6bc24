"""The endpoints OpenAI clients call besides ``/v1/completions``: ``GET /v1/models`` and ``POST /v1/chat/completions``.

:func:`add_openai_routes` adds them to the FastAPI app of :func:`~adaptspec.serving.app.create_app`.
``/v1/models`` lists the served model and, when there are several A/B variants, one entry
``MODEL:VARIANT`` per variant (a request for that model runs on that variant), so tools that
compare models by name can compare variants.
"""


import concurrent.futures as cf
import logging
from typing import Any, Callable

from .chat import ChatChunks, chat_body, parse_chat
from .bodies import ClientGone, read_body
from .request_error import RequestError, server_fault
from .service import CompletionService
from .streaming import complete, events

__all__ = ["add_openai_routes", "models_body"]

log = logging.getLogger("adaptspec.serving")


def models_body(service: CompletionService) -> dict[str, Any]:
    created = int(service.started)
    return {"object": "list", "data": [{"id": m, "object": "model", "created": created, "owned_by": "adaptspec"}
                                       for m in service.model_ids()]}


def add_openai_routes(app: Any, service: CompletionService, pool: cf.Executor, error: Callable[[RequestError], Any]) -> None:
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    @app.get("/v1/models")
    async def models() -> Any:
        return JSONResponse(models_body(service))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        try:
            body = await read_body(request, service)  # 413, 408, or the client left mid-body
        except RequestError as e:
            return error(e)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it
        try:
            req = parse_chat(service, body, request.headers.get("x-adaptspec-variant"))
        except RequestError as e:
            return error(e)
        if req.stream:
            return StreamingResponse(events(service, req, pool, ChatChunks(service, req)), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            done = await complete(request, service, req, pool)  # None: the client went away (cancelled)
        except RequestError as e:
            return error(e)
        except Exception as e:  # noqa: BLE001 - a defect: a 503 with the reason, keep serving
            log.exception("request %s failed", req.request_id)
            return error(server_fault(e))
        if done is None:
            return Response(status_code=499)  # nobody reads it
        return JSONResponse(chat_body(service, req, *done))
