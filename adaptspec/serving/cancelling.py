"""Cancelling a request whose client went away.

The HTTP layer notices the disconnect (on the event loop); the request runs on a worker thread
and decodes as a row of the engine's thread. A :class:`Cancellation` joins them: the HTTP layer
makes one per request and passes it down with the request (``CompletionService.run(...,
cancel=)``), whatever decodes it registers how to stop with :meth:`Cancellation.add` (the batched
runner: its ticket's ``cancel``, which ends the row at the next round boundary), and the HTTP
layer calls :meth:`Cancellation.cancel`. A cancel that comes before the hook is added runs the
hook when it is added.

>>> c = Cancellation(); stopped = []
>>> c.add(lambda: stopped.append("row"))
>>> c.cancel(); c.cancel(); stopped  # once
['row']
>>> late = Cancellation(); late.cancel()
>>> late.add(lambda: stopped.append("late")); stopped
['row', 'late']
"""

from __future__ import annotations

import threading
from typing import Callable

__all__ = ["Cancellation"]


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
