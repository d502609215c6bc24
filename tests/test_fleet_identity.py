"""Replica identity and joining a fleet, on a real Redis (issue 30, items 3 and 4).

- a replica id is held by one live process: a second one claiming it is refused with one line
  (exit 2), so two processes never overwrite each other's statistics; a clean shutdown frees
  the id at once, a crash after the lease's expiry; a replica that lost its id stops publishing;
- a fresh replica's first decision already uses the fleet's statistics, also when another fresh
  replica (statistics of no dimension yet) is in the fleet.

Expected statistics come from a plain policy (no fleet code) fed the acknowledged feedback, or
from the blob read directly from Redis.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import redis

from _redis import free_port
from adaptspec.errors import AdaptspecError
from adaptspec.fleet import SharedState
from adaptspec.fleet.identity import ReplicaLease
from adaptspec.fleet.redis_backend import RedisBackend
from adaptspec.fleet.wire import decode
from adaptspec.policies.spec import make_policy
from test_fleet_redis import ARMS, ROOT, Replica, redis_server, single_process, stream  # noqa: F401 - fixture

pytestmark = pytest.mark.integration


def start_refused(url: str, rid: str, log_dir, spec: str = "ucb") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_fleet_replica.py"), url, rid, str(log_dir), spec, "8", "2.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )


def published(srv, fleet: str, rid: str, variant: str = "A"):
    """What Redis holds under ``rid``, read directly (no SharedState)."""
    c = redis.Redis(port=srv.port)
    try:
        blob = c.hget(f"adaptspec:fleet:{fleet}:{variant}", rid)
        return None if blob is None else decode(blob)
    finally:
        c.close()


def assert_same_policy_state(fleet, single) -> None:
    assert fleet.version == single.version
    if hasattr(fleet, "core"):  # linucb: the ridge posterior of every arm
        np.testing.assert_allclose(fleet.core.A_inv, single.core.A_inv, rtol=1e-6, atol=1e-10)
        np.testing.assert_allclose(fleet.core.theta, single.core.theta, rtol=1e-6, atol=1e-9)
        np.testing.assert_array_equal(fleet.core.count, single.core.count)
    else:
        for key in ("n", "s", "ss"):
            np.testing.assert_allclose(
                getattr(fleet.stats, key), getattr(single.stats, key), rtol=1e-9, atol=1e-9
            )
        np.testing.assert_allclose(fleet.running, single.running, rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------- item 3: one id, one process
@pytest.mark.slow
def test_a_second_replica_with_a_live_replicas_id_is_refused_and_nothing_is_lost(redis_server, tmp_path):
    url = f"{redis_server.url}/dup"
    data = stream(20)
    a = Replica(url, "a", tmp_path / "a", "ucb")
    try:
        for x, rw in data[:10]:
            a.step(x, rw)
        p = start_refused(url, "a", tmp_path / "b")  # the case: the same --replica-id, another log
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, p.stderr
        assert (
            "replica id 'a' of variant 'A' is held by a live replica" in lines[0]
            and "Traceback" not in p.stderr
        )
        for x, rw in data[10:]:
            a.step(x, rw)
        status = a.call(op="sync")["shared"]
        assert status["fleet_updates"] == 20 and status["other_replicas"] == 0 and status["connected"]
        held = published(redis_server, "dup", "a")
        assert held.updates == 20  # read from Redis: every acknowledged update, nothing overwritten
        assert_same_policy_state(a.state(tmp_path, "ucb"), single_process("ucb", a.acked))
    finally:
        a.close()


@pytest.mark.slow
def test_a_clean_shutdown_frees_the_id_at_once_a_crash_after_the_lease(redis_server, tmp_path):
    url, log, ttl = f"{redis_server.url}/restart", tmp_path / "a", 3.0
    a = Replica(url, "a", log, "ucb", lease_ttl=ttl)
    for x, rw in stream(5):
        a.step(x, rw)
    a.close()
    back = Replica(url, "a", log, "ucb", lease_ttl=ttl)  # clean shutdown: the same id at once
    assert back.hello["rebuilt"]["updates"] == 5
    for x, rw in stream(3, seed=2):
        back.step(x, rw)
    back.call(op="sync")
    back.kill()  # SIGKILL: its lease stays until it expires
    killed = time.monotonic()
    # claims from this process (no start-up time to wait for): refused until the lease expires
    claimant = ReplicaLease(RedisBackend(url).connect(), "A", "a", ttl_s=ttl)
    refusals = 0
    while True:
        try:
            claimant.claim()
            break
        except AdaptspecError as e:
            assert "is held by a live replica" in str(e)
            refusals += 1
            assert time.monotonic() - killed < 10 * ttl, "the lease never expired"
            time.sleep(0.05)
    # not before the lease could have expired (renewed at most a sync interval, 0.2 s, before the kill)
    assert refusals >= 1 and time.monotonic() - killed > ttl - 0.5
    claimant.release()
    again = Replica(url, "a", log, "ucb", lease_ttl=ttl)  # and it rebuilds every acknowledged update
    assert again.hello["rebuilt"] == {"from": "log", "updates": 8, "published_before": 8}
    again.close()


def test_a_replica_that_lost_its_id_stops_publishing_and_takes_it_back_when_free(redis_server):
    url = f"{redis_server.url}/lost"
    first = SharedState(RedisBackend(url).connect(), "r", sync_interval_s=60.0, lease_ttl_s=180.0)
    pol = make_policy("ucb", ARMS, seed=0)
    first.attach(pol, "A")
    for b in (1, 2, 4):
        first.update(pol, None, b, 1.0)
    assert first.sync_now() and published(redis_server, "lost", "r").updates == 3
    # its lease expired while it could not reach Redis (deleted here), and another process took the id
    redis.Redis(port=redis_server.port).delete("adaptspec:fleet:lost:A:lease:r")
    second = SharedState(RedisBackend(url).connect(), "r", sync_interval_s=60.0, lease_ttl_s=180.0)
    pol2 = make_policy("ucb", ARMS, seed=0)
    second.attach(pol2, "A")  # it starts from what "r" published: 3 updates
    second.update(pol2, None, 8, 5.0)
    second.sync_now()
    first.update(pol, None, 8, 0.0)
    assert not first.sync_now()  # does not overwrite the holder's statistics
    s = first.status()
    assert not s["connected"] and not s["lease_held"] and "held by another process" in s["last_error"]
    theirs = published(redis_server, "lost", "r")
    assert theirs.updates == 4 and theirs.sums["s"].tolist() == [1.0, 1.0, 1.0, 5.0]
    second.close()  # frees the id: the first takes it back and publishes its own sums
    assert first.sync_now() and first.status()["lease_held"]
    mine = published(redis_server, "lost", "r")
    assert mine.updates == 4 and mine.sums["s"].tolist() == [1.0, 1.0, 1.0, 0.0]
    first.close()


# ----------------------------------------------------------------------------- item 4: joining a fleet
@pytest.mark.slow
@pytest.mark.parametrize("spec", ["linucb:standardize=false", "ucb"])
def test_a_fresh_replica_decides_with_the_fleets_statistics_from_its_first_decision(
    redis_server, tmp_path, spec
):
    url = f"{redis_server.url}/join-{spec[:3]}"
    data = stream(41, seed=3)
    served = Replica(url, "r1", tmp_path / "r1", spec)
    reps = [served]
    try:
        for x, rw in data[:40]:
            served.step(x, rw)
        served.call(op="sync")
        # r0 joins and serves nothing: its statistics have no dimension yet; r2 reads them first (ids in order)
        reps.append(Replica(url, "r0", tmp_path / "r0", spec))
        fresh = Replica(url, "r2", tmp_path / "r2", spec)
        reps.append(fresh)
        assert fresh.hello["rebuilt"]["updates"] == 0
        single = single_process(spec, served.acked)
        assert_same_policy_state(fresh.state(tmp_path, spec), single)  # before its first decision
        x, rw = data[40]
        expected = single.decide(np.asarray(x, np.float64) if single.contextual else None).block_size
        assert fresh.step(x, rw)["block_size"] == expected
        fresh.call(op="sync")
        s = served.call(op="sync")["shared"]
        assert (
            s["refused"] == 0 and s["other_replicas"] == 2 and s["fleet_updates"] == 41
        )  # empty peers are no error
    finally:
        for r in reps:
            r.close()


# ----------------------------------------------------------------------------- the server
@pytest.mark.slow
def test_serve_refuses_a_live_replicas_id_in_one_line_before_loading_the_model(redis_server, tmp_path):
    from test_serving import Server

    extra = ("--shared", f"{redis_server.url}/serve", "--replica-id", "gpu-0", "--sync-interval", "0.2")

    def server(name: str) -> Server:
        s = Server(tmp_path / name, *extra)
        s.args[s.args.index("A=linucb")] = "A=ucb"  # linucb's warm-up standardiser cannot be shared
        s.root.mkdir()
        return s.start()

    a = server("a")
    try:
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "adaptspec",
                "serve",
                "--tiny",
                "--variant",
                "A=ucb",
                "--variant",
                "B=fixed:4",
                *extra,
                "--port",
                str(free_port()),
                "--log-dir",
                str(tmp_path / "b" / "log"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
        assert "replica id 'gpu-0' of variant 'A' is held by a live replica" in lines[0]
        assert not (tmp_path / "b").exists()  # refused before anything was created
    finally:
        assert a.stop() in (0, -15)
    b = server("b2")  # stopped cleanly: the id is free at once
    assert b.stop() in (0, -15)
