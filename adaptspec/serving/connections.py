"""The HTTP connections of the server: uvicorn's h11 protocol, answering clients that half-close.

A client may send its whole request and then close its sending side (``shutdown(SHUT_WR)``:
"that is all I send"), still reading the answer. uvicorn's protocol takes the end of the input
for a client gone: the connection closes and the request is cancelled unanswered. A client
that closed its connection entirely sends the same end of input, so the two are told apart
the way TCP allows: :class:`HalfCloseProtocol` keeps the connection open and writes an
interim ``100 Continue`` (every HTTP/1.1 client skips interim responses) twice,
:data:`PROBE_S` apart; a closed peer answers the first with a reset, the second write fails,
and the request is cancelled as before (:mod:`adaptspec.serving.cancelling`). A half-closed
client reads the two interim responses and then its answer, and the connection closes after it.

:func:`uvicorn_config` is the server's uvicorn configuration with this protocol.
"""

from __future__ import annotations

from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["PROBE_S", "HalfCloseProtocol", "uvicorn_config"]

#: seconds between the two interim responses written after a client's end of input
PROBE_S = 0.1


class HalfCloseProtocol(H11Protocol):
    """uvicorn's h11 protocol; the end of a client's input during a request is probed, not taken
    for a disconnect (see the module docstring)."""

    input_ended = False  # the client sent its end of input during a request

    def eof_received(self) -> bool | None:
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return None  # between requests: the connection closes, as before
        self.input_ended = True
        self._probe()
        self.loop.call_later(PROBE_S, self._probe)
        return True  # keep the connection open for writing the answer

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.input_ended:  # the client sends nothing more: close once the answer is out
            self.transport.close()

    def _probe(self) -> None:
        cycle = self.cycle
        if (
            cycle is None
            or cycle.response_started
            or cycle.response_complete
            or cycle.disconnected
            or self.transport.is_closing()
        ):
            return
        try:
            data = self.conn.send(h11.InformationalResponse(status_code=100, headers=[]))
        except h11.LocalProtocolError:  # the response has begun meanwhile
            return
        self.transport.write(data)  # on a closed peer: a reset, then connection_lost (a disconnect)


def uvicorn_config(app: Any, **options: Any) -> uvicorn.Config:
    """``uvicorn.Config(app, **options)`` with the server's HTTP protocol (:class:`HalfCloseProtocol`)."""
    return uvicorn.Config(app, http=HalfCloseProtocol, **options)
