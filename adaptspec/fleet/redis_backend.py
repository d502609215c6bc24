"""The Redis backend: ``redis://HOST:PORT/NAME`` (``NAME``: the fleet).

Each (fleet, variant) channel is one Redis hash, ``adaptspec:fleet:NAME:VARIANT``, one field
per replica holding its blob (:mod:`adaptspec.fleet.wire`); a publish is one ``HSET`` (atomic
per field), a fetch one ``HGETALL``. Every call has a short socket timeout (1 s by default), so
a Redis that is down costs the sync thread a second, never a request. Needs the ``redis``
client (``pip install 'adaptspec[fleet]'``).

>>> parse_url("redis://10.0.0.5:6380/prod").key("A")
'adaptspec:fleet:prod:A'
>>> parse_url("http://x/y")
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: 'http://x/y': expected redis://HOST:PORT/NAME (NAME: letters, digits, . _ -)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import AdaptspecError

__all__ = ["RedisURL", "RedisBackend", "parse_url"]

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


@dataclass(frozen=True)
class RedisURL:
    host: str
    port: int
    name: str
    password: str | None = None

    def key(self, variant: str) -> str:
        return f"adaptspec:fleet:{self.name}:{variant}"

    def __str__(self) -> str:
        return f"redis://{self.host}:{self.port}/{self.name}"


def parse_url(url: str) -> RedisURL:
    """Check a ``--shared`` URL; anything else raises one line."""
    bad = AdaptspecError(f"{url!r}: expected redis://HOST:PORT/NAME (NAME: letters, digits, . _ -)")
    try:
        u = urlsplit(url)
        port = u.port if u.port is not None else 6379
    except ValueError:
        raise bad from None
    name = u.path[1:] if u.path.startswith("/") else ""
    if u.scheme != "redis" or not u.hostname or not _NAME.match(name) or u.query or u.fragment:
        raise bad
    if not 1 <= port <= 65535:
        raise bad
    return RedisURL(u.hostname, port, name, u.password)


class RedisBackend:
    """Blobs in Redis hashes (see the module docstring); ``connect()`` checks that Redis answers."""

    def __init__(self, url: str | RedisURL, timeout_s: float = 1.0) -> None:
        self.url = url if isinstance(url, RedisURL) else parse_url(url)
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise AdaptspecError("--shared needs the redis client: pip install 'adaptspec[fleet]'") from None
        self._redis = redis.Redis(host=self.url.host, port=self.url.port, password=self.url.password,
                                  socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                  retry=Retry(NoBackoff(), 0))  # no retries: the next sync is the retry
        self.describe = str(self.url)

    def connect(self) -> "RedisBackend":
        """Ping Redis now; raises one line when it cannot be reached."""
        try:
            self._redis.ping()
        except Exception as e:  # noqa: BLE001 - redis raises many kinds; one line for all
            raise AdaptspecError(f"--shared {self.url}: cannot reach Redis ({type(e).__name__}: {e})") from None
        return self

    def publish(self, channel: str, replica: str, blob: bytes) -> None:
        self._redis.hset(self.url.key(channel), replica, blob)

    def fetch(self, channel: str) -> dict[str, bytes]:
        return {k.decode(): v for k, v in self._redis.hgetall(self.url.key(channel)).items()}

    def fetch_one(self, channel: str, replica: str) -> bytes | None:
        return self._redis.hget(self.url.key(channel), replica)

    def close(self) -> None:
        try:
            self._redis.close()
        except Exception:  # noqa: BLE001
            pass
