"""The Redis backend: ``redis://HOST:PORT/NAME`` (``NAME``: the fleet).

Each (fleet, variant) channel is one Redis hash, ``adaptspec:fleet:NAME:VARIANT``, one field
per replica holding its blob (:mod:`adaptspec.fleet.wire`); a publish is one ``HSET`` (atomic
per field), a fetch one ``HGETALL``. Every call has a short socket timeout (1 s by default), so
a Redis that is down costs the sync thread a second, never a request. Needs the ``redis``
client (``pip install 'adaptspec[fleet]'``).

A replica id's lease (:mod:`adaptspec.fleet.identity`) is one string key per (channel, replica),
``adaptspec:fleet:NAME:VARIANT:lease:REPLICA`` (variant names hold no ``:``), holding its owner's
token with an expiry (``SET NX PX``); renewing and releasing compare the token first, in one Lua
script each, so a process never extends or deletes another's lease.

>>> parse_url("redis://10.0.0.5:6380/prod").key("A")
'adaptspec:fleet:prod:A'
>>> parse_url("redis://10.0.0.5:6380/prod").lease_key("A", "gpu-3:8000")
'adaptspec:fleet:prod:A:lease:gpu-3:8000'
>>> parse_url("http://x/y")
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: 'http://x/y': expected redis://HOST:PORT/NAME (NAME: letters, digits, . _ -)

A password in the URL is never shown: messages show the URL through :func:`redact`.

>>> redact("redis://admin:s3cret@10.0.0.5:6380/prod"), redact("redis://:s3cret@h/x"), redact("redis://h:1/x")
('redis://admin:***@10.0.0.5:6380/prod', 'redis://:***@h/x', 'redis://h:1/x')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from .._util.optional import require
from ..errors import AdaptspecError

__all__ = ["RedisURL", "RedisBackend", "parse_url", "redact"]

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")

# KEYS[1]: the lease; ARGV[1]: the token; ARGV[2]: the expiry in ms
_CLAIM = """if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return nil end
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}"""
_RENEW = """local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0"""
_RELEASE = """if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"""


@dataclass(frozen=True)
class RedisURL:
    host: str
    port: int
    name: str
    password: str | None = None

    def key(self, variant: str) -> str:
        return f"adaptspec:fleet:{self.name}:{variant}"

    def lease_key(self, variant: str, replica: str) -> str:
        return f"{self.key(variant)}:lease:{replica}"

    def __str__(self) -> str:
        return f"redis://{self.host}:{self.port}/{self.name}"


def redact(url: str) -> str:
    """``url`` with everything after the user name up to the last ``@`` (the password) shown as ``***``.

    Taken from the raw text, not a parse: a URL too broken to parse still hides its password."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    user, at, host = rest.rpartition("@")
    if not at:
        return url
    name, colon, _ = user.partition(":")
    return f"{scheme}{sep}{name + ':***' if colon else '***'}@{host}"


def parse_url(url: str) -> RedisURL:
    """Check a ``--shared`` URL; anything else raises one line (the password hidden)."""
    bad = AdaptspecError(f"{redact(url)!r}: expected redis://HOST:PORT/NAME (NAME: letters, digits, . _ -)")
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
        redis = require("redis", extra="fleet", needed_by="--shared")
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._redis = redis.Redis(
            host=self.url.host,
            port=self.url.port,
            password=self.url.password,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )  # no retries: the next sync is the retry
        self._claim, self._renew, self._release = (
            self._redis.register_script(x) for x in (_CLAIM, _RENEW, _RELEASE)
        )
        self.describe = str(self.url)

    def connect(self) -> "RedisBackend":
        """Ping Redis now; raises one line when it cannot be reached."""
        try:
            self._redis.ping()
        except Exception as e:  # noqa: BLE001 - redis raises many kinds; one line for all
            raise AdaptspecError(
                f"--shared {self.url}: cannot reach Redis ({type(e).__name__}: {e})"
            ) from None
        return self

    def publish(self, channel: str, replica: str, blob: bytes) -> None:
        self._redis.hset(self.url.key(channel), replica, blob)

    def fetch(self, channel: str) -> dict[str, bytes]:
        # a field that is not UTF-8 (nothing adaptspec writes) keeps a readable name: the replica skips that entry
        return {
            k.decode(errors="backslashreplace"): v
            for k, v in self._redis.hgetall(self.url.key(channel)).items()
        }

    def fetch_one(self, channel: str, replica: str) -> bytes | None:
        return self._redis.hget(self.url.key(channel), replica)

    def claim(self, channel: str, replica: str, token: str, ttl_s: float) -> tuple[str, float] | None:
        for _ in range(3):  # a lease that expires between SET NX and GET is tried again
            held = self._claim(keys=[self.url.lease_key(channel, replica)], args=[token, _ms(ttl_s)])
            if held is None:
                return None
            if held[0] is not None:
                return held[0].decode(errors="replace"), max(int(held[1]), 0) / 1000.0
        return "unknown", ttl_s

    def renew(self, channel: str, replica: str, token: str, ttl_s: float) -> bool:
        return bool(self._renew(keys=[self.url.lease_key(channel, replica)], args=[token, _ms(ttl_s)]))

    def release(self, channel: str, replica: str, token: str) -> None:
        self._release(keys=[self.url.lease_key(channel, replica)], args=[token])

    def close(self) -> None:
        try:
            self._redis.close()
        except Exception:  # noqa: BLE001
            pass


def _ms(seconds: float) -> int:
    return max(1, int(round(seconds * 1000)))
