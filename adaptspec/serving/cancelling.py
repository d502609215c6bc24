"""Cancelling a request whose client went away.

The HTTP layer notices the disconnect (on the event loop); the request runs on a worker thread
and, with ``serve --batched``, decodes as a row of the engine's thread. A :class:`Cancellation`
joins them: the worker runs the request inside :func:`cancellable`, whatever decodes it
registers how to stop with :func:`on_cancel` (the batched runner: its ticket's ``cancel``, which
ends the row at the next round boundary), and the HTTP layer calls :meth:`Cancellation.cancel`.
A cancel that comes before the hook is registered runs the hook at registration.

>>> c = Cancellation(); stopped = []
>>> with cancellable(c):
...     on_cancel(lambda: stopped.append("row"))
>>> c.cancel(); c.cancel(); stopped  # once
['row']
>>> late = Cancellation(); late.cancel()
>>> with cancellable(late):
...     on_cancel(lambda: stopped.append("late"))
>>> stopped, on_cancel(lambda: stopped.append("nobody"))  # outside cancellable: nothing registered
(['row', 'late'], None)
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

__all__ = ["Cancellation", "cancellable", "on_cancel"]


class Cancellation:
    """Set once when a request's client has gone; runs the hooks registered to stop its work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []
        self.cancelled = False

    def cancel(self) -> None:
        """Stop the request's work (idempotent; any thread)."""
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def add(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` on :meth:`cancel` (now, if it was already cancelled)."""
        with self._lock:
            if not self.cancelled:
                self._hooks.append(hook)
                return
        hook()


_current: ContextVar[Cancellation | None] = ContextVar("adaptspec_cancellation", default=None)


@contextmanager
def cancellable(cancellation: Cancellation | None) -> Iterator[None]:
    """Within this block, :func:`on_cancel` on this thread registers with ``cancellation`` (None: nowhere)."""
    token = _current.set(cancellation)
    try:
        yield
    finally:
        _current.reset(token)


def on_cancel(hook: Callable[[], None]) -> None:
    """Register ``hook`` with the request running on this thread (see :func:`cancellable`); no-op outside one."""
    c = _current.get()
    if c is not None:
        c.add(hook)
