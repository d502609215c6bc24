"""Where replicas publish their statistics: the protocol, and the in-process backend.

A backend stores, per *channel* (one fleet and variant), one blob per replica, overwritten by
each publish (cumulative statistics, so the newest blob is all that matters), and returns
all of them. :class:`MemoryBackend` keeps them in a dict: replicas in one process (tests,
the fleet replay simulator); :class:`~adaptspec.fleet.redis_backend.RedisBackend` in Redis,
for replicas in many processes and machines.
"""

from __future__ import annotations

import threading
from typing import Protocol

__all__ = ["Backend", "MemoryBackend"]


class Backend(Protocol):
    """Stores one blob per (channel, replica)."""

    def publish(self, channel: str, replica: str, blob: bytes) -> None: ...

    def fetch(self, channel: str) -> dict[str, bytes]: ...

    def fetch_one(self, channel: str, replica: str) -> bytes | None: ...

    def close(self) -> None: ...


class MemoryBackend:
    """In-process backend: a dict behind a lock (never fails)."""

    def __init__(self) -> None:
        self._data: dict[str, dict[str, bytes]] = {}
        self._lock = threading.Lock()
        self.describe = "memory"

    def publish(self, channel: str, replica: str, blob: bytes) -> None:
        with self._lock:
            self._data.setdefault(channel, {})[replica] = bytes(blob)

    def fetch(self, channel: str) -> dict[str, bytes]:
        with self._lock:
            return dict(self._data.get(channel, {}))

    def fetch_one(self, channel: str, replica: str) -> bytes | None:
        with self._lock:
            return self._data.get(channel, {}).get(replica)

    def close(self) -> None:
        pass
