"""The error a refused request gets: an HTTP status and one line naming the field and the value
(its body: :func:`adaptspec.serving.responses.error_body`).

>>> e = RequestError("max_tokens must be a positive integer, got -4", param="max_tokens")
>>> e.status, e.param
(400, 'max_tokens')
>>> short("x" * 100), len(short("x" * 100))
("'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...", 60)
"""

from __future__ import annotations

from typing import Any

from ..errors import AdaptspecError

__all__ = ["RequestError", "body_too_large", "short"]


class RequestError(AdaptspecError):
    """A request the server refuses: ``status`` (4xx) and a message naming what is wrong."""

    def __init__(
        self, message: str, status: int = 400, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.headers = headers  # extra response headers (a 429's Retry-After)


#: what a request gets (503) once the server has begun shutting down
SHUTTING_DOWN = "the server is shutting down"


def short(v: Any, n: int = 60) -> str:
    """A value for an error message, cut to ``n`` characters."""
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def body_too_large(service: Any, content_length: str | None) -> "RequestError | None":
    """The 413 for a request whose declared body exceeds the server's limit (checked before it is read)."""
    limit = service.limits.max_body_bytes
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        return RequestError(f"request body is {content_length} bytes; the limit is {limit}", 413)
    return None
