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

__all__ = ["RequestError", "short"]


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
