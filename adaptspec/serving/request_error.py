"""The error a refused request gets: an HTTP status and one line naming the field and the value.

>>> e = RequestError("max_tokens must be a positive integer, got -4", param="max_tokens")
>>> e.status, e.body()["error"]["type"]
(400, 'invalid_request_error')
>>> short("x" * 100), len(short("x" * 100))
("'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...", 60)
"""

from __future__ import annotations

from typing import Any

from ..errors import AdaptspecError

__all__ = ["RequestError", "server_fault", "short"]


class RequestError(AdaptspecError):
    """A request the server refuses: ``status`` (4xx) and a message naming what is wrong."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.headers = headers  # extra response headers (a 429's Retry-After)

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.status}}


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


def server_fault(e: BaseException) -> RequestError:
    """The 503 that an unexpected failure while running a request answers with (never a 500): one
    line with the reason; the server keeps serving and the client may retry."""
    return RequestError(f"the server could not complete this request ({type(e).__name__}: {short(str(e), 200)[1:-1]})",
                        503)
