"""A replica id belongs to one live process: a lease in the backend, renewed while the replica syncs.

Two processes publishing under one replica id would overwrite each other's statistics (each
field of a channel holds one replica's cumulative sums): the fleet would silently lose one of
them. So a replica *claims* its id (per variant) before it publishes anything: the backend
stores its token with an expiry (``ttl_s``); the sync thread renews it at every sync; a clean
shutdown releases it. A second process claiming a live replica's id is refused with one line.
A crashed replica stops renewing: its id is free once the lease expires (``ttl_s`` at most),
and a replica restarted after a clean shutdown claims it at once.
:meth:`ReplicaLease.seconds_left` is how long the lease lasts without another renewal (from when
the last claim or renewal that worked was sent: never longer than the backend keeps it).

If a replica cannot renew for longer than ``ttl_s`` (Redis unreachable) and meanwhile another
process claims its id, the replica has lost its identity: :meth:`ReplicaLease.renew` says so,
and the replica stops publishing (it keeps serving from its own state, reports it in
``/health``, and claims the id again if it becomes free).

>>> from adaptspec.fleet import MemoryBackend
>>> be = MemoryBackend()
>>> first = ReplicaLease(be, "A", "r0", ttl_s=10.0); first.claim()
>>> ReplicaLease(be, "A", "r0", ttl_s=10.0).claim()  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: replica id 'r0' of variant 'A' is held by a live replica (...): give this replica another id (--replica-id), ...
>>> 9.0 < first.seconds_left() <= 10.0
True
>>> first.release(); first.seconds_left(), ReplicaLease(be, "A", "r0", ttl_s=10.0).claim()  # free after a clean shutdown
(0.0, None)
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from typing import Any

from ..errors import AdaptspecError

__all__ = ["ReplicaLease"]


class ReplicaLease:
    """This process's claim on replica id ``replica`` of ``channel`` in ``backend``."""

    def __init__(self, backend: Any, channel: str, replica: str, ttl_s: float) -> None:
        if not ttl_s > 0:
            raise AdaptspecError(f"lease ttl_s must be > 0, got {ttl_s!r}")
        self.backend, self.channel, self.replica, self.ttl_s = backend, channel, replica, float(ttl_s)
        self.token = f"{socket.gethostname()} pid {os.getpid()} {secrets.token_hex(4)}"
        self.held = False
        self.renewed_at: float | None = (
            None  # time.monotonic() when the last claim/renewal that worked was sent
        )

    def seconds_left(self) -> float:
        """Seconds until the lease expires unless renewed (0 when it is not held)."""
        if not self.held or self.renewed_at is None:
            return 0.0
        return max(0.0, self.ttl_s - (time.monotonic() - self.renewed_at))

    def claim(self) -> None:
        """Take the id now; one line when a live replica holds it or the backend cannot be reached."""
        where = getattr(self.backend, "describe", self.backend)
        sent = time.monotonic()
        try:
            holder = self.backend.claim(self.channel, self.replica, self.token, self.ttl_s)
        except Exception as e:  # noqa: BLE001 - any backend failure is one line
            raise AdaptspecError(
                f"shared state {where}: cannot be reached ({type(e).__name__}: {e})"
            ) from None
        if holder is not None:
            token, left = holder
            raise AdaptspecError(
                f"replica id {self.replica!r} of variant {self.channel!r} is held by a live replica ({token}; its "
                f"lease ends {left:.1f} s after its last renewal): give this replica another id (--replica-id), or stop that "
                "one (a crashed replica's id is free once its lease has expired)"
            )
        self.held, self.renewed_at = True, sent

    def renew(self) -> bool:
        """Extend the lease (or take the id again if it expired free); False when another process holds it.

        Backend errors propagate: the caller counts them like any failed sync."""
        sent = time.monotonic()
        self.held = bool(self.backend.renew(self.channel, self.replica, self.token, self.ttl_s))
        if self.held:
            self.renewed_at = sent
        return self.held

    def release(self) -> None:
        """Free the id (best effort: an unreachable backend lets the lease expire instead)."""
        try:
            self.backend.release(self.channel, self.replica, self.token)
        except Exception:  # noqa: BLE001
            pass
        self.held = False
