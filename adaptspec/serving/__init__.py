"""Serving: an OpenAI-compatible HTTP server (completions, chat completions, the model list,
stop sequences) that runs requests through :class:`~adaptspec.AdaptiveController`, an A/B
router between policy variants, decision logs and Prometheus metrics.

``adaptspec serve`` starts it; :func:`create_app` builds the FastAPI application from a
:class:`CompletionService` (``CompletionService.build(speculator, {"A": spec, "B": spec})``).
FastAPI, uvicorn and prometheus-client come with the ``serve`` extra and are imported only
when an app is built.
"""

from .service import CompletionRequest, CompletionService, RequestError, ServerLimits, runs_on_engine

__all__ = [
    "CompletionRequest",
    "CompletionService",
    "RequestError",
    "ServerLimits",
    "create_app",
    "runs_on_engine",
]


def __getattr__(name: str):
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module 'adaptspec.serving' has no attribute {name!r}")
