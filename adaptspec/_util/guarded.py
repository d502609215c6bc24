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

**The watchdog.** An exception is not the only way a thread that runs a user's code can fail:
the code can also never return (a decode stuck in a kernel, a lock never released), and a
Python thread stuck there cannot be killed. With ``stall_s``, the thread is watched for
progress: ``body`` calls :meth:`~GuardedThread.beat` at each unit of progress (a round) and
:meth:`~GuardedThread.idle` before it waits for work; busy with no beat for ``stall_s`` seconds,
the thread is **stalled**: logged (with where it is stuck), counted as a failure, :attr:`state` is
``"stalled"`` and ``on_stall(message)`` runs on the watchdog's own thread, where the owner
answers the work waiting on the stuck thread and refuses new work (it must not touch what the
stuck thread holds). A stalled thread that moves again sees it at its next ``beat()`` or
``idle()``, which return True once: it drops what it held (already answered) and goes on. Its
owner's shutdown waits for it only while it progresses (:meth:`~GuardedThread.join_unless_stalled`):
the thread is a daemon, so a stuck one does not keep the process from exiting.

>>> import threading
>>> stuck, told = threading.Event(), []
>>> def body():
...     g.beat()
...     stuck.wait(30)  # no progress
...     told.append(("resumed", g.idle()))
>>> g = GuardedThread("demo", body, failed.append, stall_s=0.2, on_stall=told.append)
>>> g.start(); g.join_unless_stalled(30); (g.state, told)
('stalled', ['no progress for 0.2 s'])
>>> stuck.set(); g.join(10); (g.state, told[-1])
('degraded', ('resumed', True))
>>> logging.getLogger("adaptspec.guarded").disabled = False
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
import traceback
from typing import Callable

__all__ = ["GuardedThread", "STALL_S"]

#: the usual bound of a watched thread: seconds busy without progress before it is stalled. A
#: round of a served model takes milliseconds to seconds, even on a busy CPU; a decode that
#: reports no rounds must finish its whole output within it (``adaptspec serve --stall-timeout``)
STALL_S = 60.0

log = logging.getLogger("adaptspec.guarded")


class GuardedThread:
    """``body`` on a daemon thread named ``name``, restarted after a failure (see the module docstring)."""

    def __init__(
        self,
        name: str,
        body: Callable[[], None],
        on_failure: Callable[[str], None],
        max_failures: int = 3,
        window_s: float = 60.0,
        logger: logging.Logger | None = None,
        stall_s: float | None = None,
        on_stall: Callable[[str], None] | None = None,
    ) -> None:
        if not isinstance(max_failures, int) or max_failures < 1:
            raise ValueError(f"max_failures must be an int >= 1, got {max_failures!r}")
        if stall_s is not None and (
            isinstance(stall_s, bool)
            or not isinstance(stall_s, (int, float))
            or not 0 < stall_s < float("inf")
        ):
            raise ValueError(f"stall_s must be a number of seconds > 0, got {stall_s!r}")
        self.stall_s = None if stall_s is None else float(stall_s)
        self.on_stall = on_stall
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
        # the watchdog's view: when the thread last made progress (None: idle, waiting for work)
        self._progress_lock = threading.Lock()
        self._last_beat: float | None = None
        self.stalled = False  # busy with no progress for stall_s; cleared by its next beat() or idle()
        self._stall_told = (
            threading.Event()
        )  # set once a stall is logged, counted and told; cleared by progress
        self._watchdog = (
            None
            if self.stall_s is None
            else threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True)
        )

    def start(self) -> None:
        self._thread.start()
        if self._watchdog is not None:
            self._watchdog.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def join_unless_stalled(self, timeout: float) -> None:
        """Wait for the thread to end, at most ``timeout`` seconds, and only while it makes progress:
        return once it is stalled and its stall has been logged, counted and told to ``on_stall`` (a
        thread stuck in user code never ends; it is a daemon)."""
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and not self._stall_told.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._thread.join(min(left, 0.1))

    # ------------------------------------------------------------------ the watchdog (stall_s)
    def beat(self) -> bool:
        """On the thread: it made progress now and is busy. True once after it was stalled (its
        owner already answered what it held: drop it)."""
        return self._progress(time.monotonic())

    def idle(self) -> bool:
        """On the thread: it is about to wait for work (no progress expected). True once after it
        was stalled, as :meth:`beat`."""
        return self._progress(None)

    def _progress(self, now: float | None) -> bool:
        with self._progress_lock:
            self._last_beat = now
            was = self.stalled
            self.stalled = False
            self._stall_told.clear()
        if was:
            self.log.warning(
                "thread %s made progress again after it was stalled; what it held had been answered",
                self.name,
            )
        return was

    def _watch(self) -> None:
        assert self.stall_s is not None
        every = min(1.0, self.stall_s / 4)
        while self._thread.is_alive():
            time.sleep(every)
            with self._progress_lock:
                last = self._last_beat
                if self.stalled or last is None or time.monotonic() - last < self.stall_s:
                    continue
                self.stalled = True
            self._stalled()
            with self._progress_lock:
                if self.stalled:  # not moved again meanwhile
                    self._stall_told.set()

    def _stalled(self) -> None:
        """Log where the thread is stuck, count it, tell the owner (on the watchdog's thread)."""
        message = f"no progress for {self.stall_s:g} s"
        now = time.monotonic()
        self.failures += 1
        self.last_error = message
        self._recent.append(now)
        frame = sys._current_frames().get(self._thread.ident or -1)
        where = (
            "".join(traceback.format_stack(frame)) if frame is not None else "(its stack is not available)\n"
        )
        self.log.error("thread %s stalled: %s; stuck in:\n%s", self.name, message, where.rstrip())
        if self.on_stall is not None:
            try:
                self.on_stall(message)
            except Exception as e:  # noqa: BLE001 - logged; the thread stays stalled
                self.log.error(
                    "thread %s: answering the work of a stalled thread failed (%s: %s)",
                    self.name,
                    type(e).__name__,
                    e,
                    exc_info=e,
                )

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def report(self) -> dict[str, object]:
        """What a health report shows of the thread: its :attr:`state`, its failures (stalls
        included) and what the last one was: the error's type, or the stall; never the error's
        message, which may carry a user's paths (the log has it)."""
        last = self.last_error
        return {
            "state": self.state,
            "failures": self.failures,
            "last_error": None if last is None else last.split(":")[0],
        }

    @property
    def state(self) -> str:
        """``"ok"``, ``"degraded"`` (failed within ``window_s``, restarted), ``"stalled"`` (busy with no
        progress for ``stall_s``: see the module docstring) or ``"failed"`` (stopped for good)."""
        if self.gave_up:
            return "failed"
        if self.stalled:
            return "stalled"
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
            self.log.error(
                "thread %s failed again (%s, %d times); %s", self.name, message, self._seen[message], what
            )
        self.gave_up = give_up
        try:
            self.on_failure(message)
        except BaseException as e:  # noqa: BLE001 - the owner could not reset: nothing safe to restart
            self.log.error(
                "thread %s: cleaning up after the failure failed too (%s: %s); stopping it",
                self.name,
                type(e).__name__,
                e,
                exc_info=e,
            )
            self.gave_up = True
        return not self.gave_up
