"""Where replicas publish their statistics: the protocol, and the in-process backend.

A backend stores, per *channel* (one fleet and variant), one blob per replica, overwritten by
each publish (cumulative statistics, so the newest blob is all that matters), and returns
all of them. :class:`MemoryBackend` keeps them in a dict: replicas in one process (tests,
the fleet replay simulator); :class:`~adaptspec.fleet.redis_backend.RedisBackend` in Redis,
for replicas in many processes and machines.

It also keeps one *lease* per (channel, replica): the replica id's owner, a token that expires
unless renewed (:mod:`adaptspec.fleet.identity`), so that two live processes never publish
under one id.

>>> be = MemoryBackend()
>>> be.claim("A", "r0", "tok-1", 10.0) is None          # free: now held by tok-1
True
>>> be.claim("A", "r0", "tok-2", 10.0)[0]               # held: the holder's token
'tok-1'
>>> be.renew("A", "r0", "tok-2", 10.0), be.renew("A", "r0", "tok-1", 10.0)
(False, True)
>>> be.release("A", "r0", "tok-1"); be.claim("A", "r0", "tok-2", 10.0) is None
True
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Backend", "MemoryBackend"]


class Backend(Protocol):
    """Stores one blob per (channel, replica)."""

    def publish(self, channel: str, replica: str, blob: bytes) -> None: ...

    def fetch(self, channel: str) -> dict[str, bytes]: ...

    def fetch_one(self, channel: str, replica: str) -> bytes | None: ...

    def claim(self, channel: str, replica: str, token: str, ttl_s: float) -> tuple[str, float] | None:
        """Take the lease of ``replica`` for ``ttl_s`` seconds if it is free: None; else (holder's token, seconds left)."""
        ...

    def renew(self, channel: str, replica: str, token: str, ttl_s: float) -> bool:
        """Extend the lease if ``token`` holds it, or take it again if it expired free; False if another holds it."""
        ...

    def release(self, channel: str, replica: str, token: str) -> None:
        """Free the lease if ``token`` holds it."""
        ...

    def close(self) -> None: ...


class MemoryBackend:
    """In-process backend: a dict behind a lock (never fails)."""

    def __init__(self) -> None:
        self._data: dict[str, dict[str, bytes]] = {}
        self._leases: dict[tuple[str, str], tuple[str, float]] = {}  # (channel, replica) -> (token, deadline)
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

    def _holder(self, key: tuple[str, str]) -> tuple[str, float] | None:
        held = self._leases.get(key)
        if held is not None and held[1] <= time.monotonic():
            del self._leases[key]
            return None
        return held

    def claim(self, channel: str, replica: str, token: str, ttl_s: float) -> tuple[str, float] | None:
        with self._lock:
            held = self._holder((channel, replica))
            if held is not None:
                return held[0], held[1] - time.monotonic()
            self._leases[(channel, replica)] = (token, time.monotonic() + ttl_s)
            return None

    def renew(self, channel: str, replica: str, token: str, ttl_s: float) -> bool:
        with self._lock:
            held = self._holder((channel, replica))
            if held is not None and held[0] != token:
                return False
            self._leases[(channel, replica)] = (token, time.monotonic() + ttl_s)
            return True

    def release(self, channel: str, replica: str, token: str) -> None:
        with self._lock:
            held = self._leases.get((channel, replica))
            if held is not None and held[0] == token:
                del self._leases[(channel, replica)]

    def close(self) -> None:
        pass
