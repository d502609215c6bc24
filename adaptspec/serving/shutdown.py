"""Shutting the server down within a bound, whatever its requests are doing.

On SIGTERM or SIGINT uvicorn stops listening, waits for the requests in flight (at most its
``timeout_graceful_shutdown``), then runs the application's lifespan shutdown, which closes the
service (:meth:`~adaptspec.serving.service.CompletionService.close`: queued updates applied, final
checkpoints, decision logs rolled). A decode that never returns (a speculator of one's own stuck in
its code, a target forward stuck in a kernel) would hold the first wait until uvicorn gives up, and
the service's close after it. :class:`GracefulServer` bounds the whole:

1. from the signal on (uvicorn's next tick, within 0.1 s) the service admits no request: a new
   one gets 503 ``the server is shutting down``
   (:meth:`~adaptspec.serving.service.CompletionService.stop_admitting`);
2. the requests in flight have ``grace_s`` seconds to finish, and are answered as usual;
3. then every request still waiting or decoding is answered 503 with the reason
   (:meth:`~adaptspec.serving.service.CompletionService.drain`), from a timer thread, whatever its
   decode is doing: on the batched engine its row is dropped at the next round boundary; one
   request at a time, the decode goes on on its daemon thread, its client answered;
4. uvicorn waits at most :data:`ANSWER_S` more for those answers to go out, then its lifespan
   closes the service, which waits for the decoding thread at most
   :data:`~adaptspec.serving.service.DRAINED_WAIT_S` (what it holds was answered) and closes the
   controllers: every acknowledged decision is in the decision log when the process exits.

A second Ctrl-C skips uvicorn's waits and its lifespan: whatever is in flight is answered at once,
and the caller closes the service (``adaptspec serve`` does, in its ``finally``).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import uvicorn

from ..errors import AdaptspecError
from .connections import uvicorn_config
from .service import CompletionService

__all__ = ["ANSWER_S", "GracefulServer"]

#: seconds uvicorn waits, after the grace, for the answers of the requests it cut to go out (a
#: client that does not read its stream holds its connection no longer)
ANSWER_S = 2.0


class GracefulServer(uvicorn.Server):
    """uvicorn's server over ``app`` (the server's HTTP protocol, :func:`~adaptspec.serving.connections.uvicorn_config`
    with ``options``) whose shutdown gives the requests in flight ``grace_s`` seconds, then answers
    every one left with 503 (see the module docstring)."""

    def __init__(self, app: Any, service: CompletionService, grace_s: float, **options: Any) -> None:
        if (
            isinstance(grace_s, bool)
            or not isinstance(grace_s, (int, float))
            or not (math.isfinite(grace_s) and grace_s >= 0)
        ):
            raise AdaptspecError(f"grace_s must be a number of seconds >= 0, got {grace_s!r}")
        self.service = service
        self.grace_s = float(grace_s)
        super().__init__(uvicorn_config(app, timeout_graceful_shutdown=self.grace_s + ANSWER_S, **options))

    @property
    def cut_reason(self) -> str:
        """What a request still waiting or decoding when the grace ends is answered (503)."""
        return f"the server is shutting down and this request did not finish within its {self.grace_s:g} s grace: retry"

    async def shutdown(self, sockets: Any = None) -> None:
        """uvicorn's shutdown, with the service refusing new requests from its start and drained
        when the grace ends."""
        self.service.stop_admitting()
        cut = threading.Timer(self.grace_s, self.service.drain, args=(self.cut_reason,))
        cut.daemon = True
        cut.start()
        try:
            await super().shutdown(sockets)
        finally:
            cut.cancel()  # everything ended within the grace (or the drain has run)
            if self.force_exit:  # a second Ctrl-C: uvicorn skipped its waits, nothing is left to wait for
                self.service.drain()
