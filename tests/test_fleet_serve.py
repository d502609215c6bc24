"""``adaptspec serve --shared``: bad URLs and an unreachable Redis are one line; a server that loses
Redis keeps serving and says so in /metrics and /health; two servers learn together."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from _redis import RedisServer, free_port
from test_serving import Server, complete


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "adaptspec", *argv], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "url, needle",
    [
        ("http://127.0.0.1:1/x", "expected redis://HOST:PORT/NAME"),
        ("redis://127.0.0.1:6379/", "expected redis://HOST:PORT/NAME"),
        ("redis://127.0.0.1:99999/x", "expected redis://HOST:PORT/NAME"),
        ("redis://127.0.0.1:{closed}/fleet", "cannot reach Redis"),
    ],
)
def test_bad_or_unreachable_shared_url_is_one_line(url, needle):
    p = cli("serve", "--tiny", "--shared", url.format(closed=free_port()), "--port", str(free_port()))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_a_policy_that_cannot_be_shared_is_one_line(tmp_path):
    srv = RedisServer(tmp_path / "redis").start()
    try:
        p = cli(
            "serve",
            "--tiny",
            "--variant",
            "A=ucb:discount=0.99",
            "--shared",
            f"{srv.url}/f",
            "--port",
            str(free_port()),
        )
    finally:
        srv.stop()
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "cannot be shared" in p.stderr


def metric(text: str, name: str, variant: str = "A") -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{variant="{variant}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_two_servers_learn_together_and_one_without_redis_keeps_serving(tmp_path):
    srv = RedisServer(tmp_path / "redis").start()
    extra = ("--shared", f"{srv.url}/serve", "--sync-interval", "0.2", "--sync-every", "1")
    a = Server(tmp_path / "a", *extra, "--replica-id", "a")
    b = Server(tmp_path / "b", *extra, "--replica-id", "b")
    for s in (a, b):
        s.args[s.args.index("A=linucb")] = "A=ucb"
        s.root.mkdir()
    a.launch(), b.launch()  # side by side: each loads the tiny pair
    a.ready(), b.ready()
    try:
        for i in range(3):
            complete(a.url, {"prompt": [5, 6, 7 + i], "max_tokens": 4, "variant": "A"})
        deadline = time.time() + 10
        while time.time() < deadline:  # b's fleet now holds a's updates
            sb = httpx.get(b.url + "/health").json()["variants"]["A"]["shared"]
            if sb["fleet_updates"] == 3:
                break
            time.sleep(0.1)
        assert sb["fleet_updates"] == 3 and sb["other_replicas"] == 1 and sb["local_updates"] == 0
        m = httpx.get(a.url + "/metrics").text
        assert (
            metric(m, "adaptspec_shared_state_up") == 1.0
            and metric(m, "adaptspec_shared_sync_errors_total") == 0
        )

        srv.kill()  # Redis gone: a keeps serving from its own state, and says so
        for i in range(2):
            out = complete(a.url, {"prompt": [9, 9, i], "max_tokens": 4, "variant": "A"})
            assert out["choices"][0]["token_ids"]
        deadline = time.time() + 10
        while time.time() < deadline:  # a's next sync (every 0.2 s) fails and says so
            m = httpx.get(a.url + "/metrics").text
            if (
                metric(m, "adaptspec_shared_state_up") == 0.0
                and metric(m, "adaptspec_shared_sync_errors_total") >= 1
                and metric(m, "adaptspec_shared_unpublished_updates") == 2
            ):
                break
            time.sleep(0.05)
        assert metric(m, "adaptspec_shared_state_up") == 0.0
        assert metric(m, "adaptspec_shared_sync_errors_total") >= 1
        assert metric(m, "adaptspec_shared_unpublished_updates") == 2
        h = httpx.get(a.url + "/health").json()
        assert h["status"] == "degraded" and h["variants"]["A"]["shared"]["connected"] is False
        assert h["variants"]["A"]["updates"] == 5

        srv.start()  # back: the next sync publishes everything (cumulative statistics)
        deadline = time.time() + 10
        while time.time() < deadline:
            sb = httpx.get(b.url + "/health").json()["variants"]["A"]["shared"]
            if sb["fleet_updates"] == 5:
                break
            time.sleep(0.1)
        assert sb["fleet_updates"] == 5
        # a publishes before it fetches and only then counts itself connected: b can see the
        # updates a moment before a's /health turns ok
        while httpx.get(a.url + "/health").json()["status"] != "ok" and time.time() < deadline + 5:
            time.sleep(0.1)
        assert httpx.get(a.url + "/health").json()["status"] == "ok"
    finally:
        for s in (a, b):
            s.stop()
        srv.stop()
