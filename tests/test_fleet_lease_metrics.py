"""The replica id's lease in ``/metrics`` of a server in a fleet (a real Redis, tests/_redis.py).

``adaptspec_fleet_lease_seconds_left`` is checked against Redis's own PTTL of the lease key;
``adaptspec_fleet_lease_held`` against who holds the key after another process took the id.
"""

from __future__ import annotations

import re

import pytest
import redis

from _redis import RedisServer
from adaptspec.fleet import SharedState
from adaptspec.fleet.identity import ReplicaLease
from adaptspec.fleet.redis_backend import RedisBackend
from adaptspec.serving import CompletionService, ServerLimits, create_app
from adaptspec.serving.tiny import tiny_speculator

TTL = 30.0


@pytest.fixture
def redis_server(tmp_path):
    srv = RedisServer(tmp_path / "redis").start()
    yield srv
    srv.stop()


def gauge(text: str, name: str) -> float | None:
    for line in text.splitlines():
        m = re.match(rf'^{name}\{{variant="A"\}} (\S+)$', line)
        if m:
            return float(m.group(1))
    return None


def test_the_lease_is_in_metrics_and_agrees_with_redis(redis_server):
    from fastapi.testclient import TestClient

    url = f"{redis_server.url}/lease"
    key = "adaptspec:fleet:lease:A:lease:r0"  # docs/serving.md: adaptspec:fleet:NAME:VARIANT:lease:ID
    state = SharedState(RedisBackend(url).connect(), "r0", sync_interval_s=10.0, lease_ttl_s=TTL)
    spec, codec = tiny_speculator(0)
    svc = CompletionService.build(
        spec,
        {"A": "ucb"},
        codec=codec,
        limits=ServerLimits(max_context=512, vocab_size=128),
        arms=[1, 2, 4],
        shared=lambda name: state,
    )
    r = redis.Redis(port=redis_server.port)
    with TestClient(create_app(svc)) as client:
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        assert state.sync_now()  # renews the lease
        m = client.get("/metrics").text
        pttl_s = r.pttl(key) / 1000.0
        assert gauge(m, "adaptspec_fleet_lease_held") == 1.0
        left = gauge(m, "adaptspec_fleet_lease_seconds_left")
        assert 0 < pttl_s <= TTL and left is not None
        assert pttl_s - 1.0 < left <= pttl_s + 0.5  # never later than Redis lets it expire
        assert left > TTL - 5  # just renewed

        # the lease lapsed (deleted here, as if Redis had been unreachable for the ttl) and another process took the id
        r.delete(key)
        other = ReplicaLease(RedisBackend(url).connect(), "A", "r0", ttl_s=TTL)
        other.claim()
        assert not state.sync_now()
        m = client.get("/metrics").text
        assert r.get(key).decode() == other.token  # Redis: the other process holds it
        assert gauge(m, "adaptspec_fleet_lease_held") == 0.0
        assert gauge(m, "adaptspec_fleet_lease_seconds_left") == 0.0
        other.release()
        assert state.sync_now()  # free again: taken back
        assert gauge(client.get("/metrics").text, "adaptspec_fleet_lease_held") == 1.0


def test_a_server_outside_a_fleet_has_no_lease_gauges(tmp_path):
    from fastapi.testclient import TestClient

    spec, codec = tiny_speculator(0)
    svc = CompletionService.build(
        spec, {"A": "ucb"}, codec=codec, limits=ServerLimits(max_context=512, vocab_size=128), arms=[1, 2, 4]
    )
    with TestClient(create_app(svc)) as client:
        m = client.get("/metrics").text
    assert "adaptspec_requests_total" in m or "adaptspec_decisions_total" in m
    assert "adaptspec_fleet_lease" not in m
