"""Reading a request's body: within a size limit, within a time limit, and quietly when the client leaves.

:func:`read_body` is how the POST endpoints read their body. A declared body over the limit is
refused before it is read (413); a body that does not arrive whole within
``ServerLimits.body_timeout_s`` seconds is answered 408 and its connection closed, so a client
that stalls mid-body holds nothing for long; a client that disconnects mid-body gets one line in
the log (no traceback: nobody is there to answer).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .request_error import RequestError, body_too_large

__all__ = ["ClientGone", "read_body"]

log = logging.getLogger("adaptspec.serving")


class ClientGone(Exception):
    """The client disconnected before its request body was read whole: there is no one to answer."""


async def read_body(request: Any, service: Any) -> bytes:
    """The whole body of ``request``; raises :class:`RequestError` (413, 408) or :class:`ClientGone`."""
    from starlette.requests import ClientDisconnect

    too_big = body_too_large(service, request.headers.get("content-length"))
    if too_big is not None:
        raise too_big
    timeout = service.limits.body_timeout_s
    try:
        return await asyncio.wait_for(request.body(), timeout)
    except ClientDisconnect:
        client = request.client
        log.info(
            "a client%s disconnected before sending its whole request body",
            "" if client is None else f" ({client.host}:{client.port})",
        )
        raise ClientGone() from None
    except asyncio.TimeoutError:
        raise RequestError(
            f"the request body did not arrive within {timeout:g} s", 408, headers={"Connection": "close"}
        ) from None
