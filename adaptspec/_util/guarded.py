"""A background thread that is never silently dead: a failure is logged, seen, and either restarted or final.

:class:`GuardedThread` runs ``body()`` on a daemon thread. ``body`` returning is a normal end
(the owner closed it). An exception escaping ``body`` is a failure:

1. it is logged: the first time an error of that type and message is seen, with its traceback;
   again, as one line with its count;
2. ``on_failure(message)`` runs (on the thread itself): the owner fails the work waiting on the
   thread and resets the thread's state, so that a restart starts clean;
3. the thread restarts ``body``, unless this was the ``max_failures``-th failure within
   ``window_s`` seconds: then it stops for good and :attr:`state` is ``"failed"``.

:attr:`state` is ``"ok"``, ``"degraded"`` (a failure within the last ``window_s`` seconds, the
thread restarted) or ``"failed"`` (it gave up, or died from an exception ``on_failure`` raised);
a health report shows it, with :attr:`last_error`.

>>> import logging; logging.getLogger("adaptspec.guarded").disabled = True
>>> runs, failed = [], []
>>> def body():
...     runs.append(1)
...     if len(runs) < 3:
...         raise ZeroDivisionError("division by zero")
>>> g = GuardedThread("demo", body, failed.append, max_failures=3, window_s=60)
>>> g.start(); g.join(10)
>>> len(runs), failed, g.state, g.failures
(3, ['ZeroDivisionError: division by zero', 'ZeroDivisionError: division by zero'], 'degraded', 2)
>>> g = GuardedThread("demo", lambda: 1 / 0, failed.append, max_failures=2, window_s=60)
>>> g.start(); g.join(10); g.state, g.last_error
('failed', 'ZeroDivisionError: division by zero')
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

__all__ = ["GuardedThread"]

log = logging.getLogger("adaptspec.guarded")


class GuardedThread:
    """``body`` on a daemon thread named ``name``, restarted after a failure (see the module docstring)."""

    def __init__(self, name: str, body: Callable[[], None], on_failure: Callable[[str], None],
                 max_failures: int = 3, window_s: float = 60.0, logger: logging.Logger | None = None) -> None:
        if not isinstance(max_failures, int) or max_failures < 1:
            raise ValueError(f"max_failures must be an int >= 1, got {max_failures!r}")
        self.name = name
        self.body = body
        self.on_failure = on_failure
        self.max_failures = max_failures
        self.window_s = float(window_s)
        self.log = logger or log
        self.failures = 0  # in all
        self.last_error: str | None = None
        self.gave_up = False
        self._recent: collections.deque[float] = collections.deque()
        self._seen: collections.Counter[str] = collections.Counter()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def state(self) -> str:
        """``"ok"``, ``"degraded"`` (failed within ``window_s``, restarted) or ``"failed"`` (stopped for good)."""
        if self.gave_up:
            return "failed"
        return "degraded" if self._recent and time.monotonic() - self._recent[-1] < self.window_s else "ok"

    def _main(self) -> None:
        while True:
            try:
                self.body()
                return  # a normal end
            except BaseException as e:  # noqa: BLE001 - the point of the guard
                message = f"{type(e).__name__}: {e}"
                if not self._failed(message, e):
                    return

    def _failed(self, message: str, error: BaseException) -> bool:
        """Log, tell the owner, and say whether to restart."""
        now = time.monotonic()
        self.failures += 1
        self.last_error = message
        self._recent.append(now)
        while self._recent and now - self._recent[0] > self.window_s:
            self._recent.popleft()
        self._seen[message] += 1
        give_up = len(self._recent) >= self.max_failures
        what = "stopping it" if give_up else "restarting it"
        if self._seen[message] == 1:
            self.log.error("thread %s failed (%s); %s", self.name, message, what, exc_info=error)
        else:
            self.log.error("thread %s failed again (%s, %d times); %s", self.name, message, self._seen[message], what)
        self.gave_up = give_up
        try:
            self.on_failure(message)
        except BaseException as e:  # noqa: BLE001 - the owner could not reset: nothing safe to restart
            self.log.error("thread %s: cleaning up after the failure failed too (%s: %s); stopping it",
                           self.name, type(e).__name__, e, exc_info=e)
            self.gave_up = True
        return not self.gave_up
