"""Issue 38, item 1: a malformed entry in the fleet's Redis never stops a replica.

- the wire decoder turns every malformed blob into one AdaptspecError naming the entry (any bytes:
  a property test mutates valid blobs);
- a replica skips a malformed entry (one log line, counted once), keeps syncing, merges the
  valid replicas, renews its lease, and reports the sync as degraded while the entry is there;
- one that starts while the entry is there starts;
- the sync loop outlives an iteration that raises; a lapsed lease is reported, never ``ok``.

Expected statistics come from a plain policy (no fleet code) fed the same rewards.
"""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import redis
from hypothesis import given, settings, strategies as st

from _redis import RedisServer, free_port
from adaptspec.errors import AdaptspecError
from adaptspec.fleet import MemoryBackend, SharedState
from adaptspec.fleet.redis_backend import RedisBackend
from adaptspec.fleet.stats import family_for
from adaptspec.fleet.wire import Published, decode, encode
from adaptspec.policies.spec import make_policy

ARMS = [1, 2, 4, 8]
ENTRY = "replica 'x' of variant 'A'"


def npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def head(obj) -> np.ndarray:
    return np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)


GOOD_HEAD = {"format": 1, "replica": "x", "fingerprint": "f", "updates": 1, "time": 0.0}
VALID = encode(Published("x", "f", 1, {"count": np.array([1, 0])}, time=0.0))


def compressed() -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, __head__=head(GOOD_HEAD), count=np.zeros(1000))
    return buf.getvalue()


MALFORMED = {
    "header {format: 1}": npz(__head__=head({"format": 1})),
    "truncated": VALID[: len(VALID) // 2],
    "garbage": b"garbage" * 10,
    "empty": b"",
    "no header": npz(count=np.zeros(2)),
    "header not UTF-8": npz(__head__=np.frombuffer(b"\xff\xfe{", dtype=np.uint8)),
    "header not JSON": npz(__head__=np.frombuffer(b"{nope", dtype=np.uint8)),
    "header a list": npz(__head__=head([1, 2])),
    "format 2": npz(__head__=head({**GOOD_HEAD, "format": 2})),
    "replica an int": npz(__head__=head({**GOOD_HEAD, "replica": 7})),
    "replica empty": npz(__head__=head({**GOOD_HEAD, "replica": ""})),
    "updates a string": npz(__head__=head({**GOOD_HEAD, "updates": "3"})),
    "updates a bool": npz(__head__=head({**GOOD_HEAD, "updates": True})),
    "updates negative": npz(__head__=head({**GOOD_HEAD, "updates": -1})),
    "time NaN": npz(
        __head__=np.frombuffer(json.dumps({**GOOD_HEAD, "time": float("nan")}).encode(), np.uint8)
    ),
    "strings array": npz(__head__=head(GOOD_HEAD), count=np.array(["a", "b"])),
    "complex array": npz(__head__=head(GOOD_HEAD), count=np.array([1j, 2])),
    "NaN in sums": npz(__head__=head(GOOD_HEAD), n=np.array([np.nan, 1.0])),
    "compressed": compressed(),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_every_malformed_blob_is_one_error_naming_the_entry(name):
    with pytest.raises(AdaptspecError) as e:
        decode(MALFORMED[name], ENTRY)
    msg = str(e.value)
    assert msg.startswith(f"shared statistics of {ENTRY}: ") and "\n" not in msg and len(msg) < 400, msg


def test_a_pickled_array_is_refused_not_loaded():
    buf = io.BytesIO()
    np.savez(buf, __head__=head(GOOD_HEAD), count=np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(AdaptspecError, match="not readable"):
        decode(buf.getvalue(), ENTRY)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(1, len(VALID)),
)
def test_any_mutation_of_a_blob_decodes_or_is_one_adaptspec_error(flips, cut):
    blob = bytearray(VALID[:cut])
    for i, v in flips:
        if i < len(blob):
            blob[i] = v
    try:
        p = decode(bytes(blob), ENTRY)
    except AdaptspecError:
        return
    assert isinstance(p.updates, int) and all(a.dtype.kind in "iuf" for a in p.sums.values())


@pytest.mark.parametrize("spec", ["ucb", "fi-ucb", "linucb:standardize=false"])
def test_the_family_refuses_sums_no_replica_makes(spec):
    pol = make_policy(spec, ARMS, seed=0)
    if pol.contextual:
        pol.update(np.ones(3), 4, 1.0)
    fam = family_for(pol)
    zero = fam.zero_like(fam.zero())
    fam.check(zero)  # nothing learnt: passes (the context-free running min/max are +-inf)
    key = "n" if "n" in zero else "xr"
    for bad, needle in ((np.full_like(zero[key], np.inf), "infinity"),):
        with pytest.raises(AdaptspecError, match=needle):
            fam.check({**zero, key: bad})
    with pytest.raises(AdaptspecError, match="negative count"):
        fam.check({**zero, "count": -np.ones_like(zero["count"])})
    with pytest.raises(AdaptspecError, match="does not keep"):
        fam.check({**zero, "extra": np.zeros(1)})


# ----------------------------------------------------------------------------- a real Redis
@pytest.fixture
def redis_server(tmp_path):
    srv = RedisServer(tmp_path / "redis").start()
    yield srv
    srv.stop()


def plain_ucb(rewards: list[tuple[int, float]]):
    pol = make_policy("ucb", ARMS, seed=0)
    for b, r in rewards:
        pol.update(None, b, r)
    return pol


def replica(url: str, rid: str, ttl: float = 1.5) -> tuple[SharedState, object]:
    s = SharedState(RedisBackend(url).connect(), rid, sync_interval_s=0.1, lease_ttl_s=ttl)
    pol = make_policy("ucb", ARMS, seed=0)
    s.attach(pol, "A")
    return s, pol


def wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.integration
def test_a_malformed_entry_is_skipped_and_the_replica_keeps_syncing(redis_server, caplog):
    url, key = f"{redis_server.url}/fb", "adaptspec:fleet:fb:A"
    r = redis.Redis(port=redis_server.port)
    bad = {
        b"bad-head": MALFORMED["header {format: 1}"],
        b"bad-cut": MALFORMED["truncated"],
        b"bad-junk": MALFORMED["garbage"],
        b"\xff\xfe": VALID,
    }  # the last: a field name that is not UTF-8
    names = {"bad-head", "bad-cut", "bad-junk", "\\xff\\xfe"}  # as the replica names them
    for field, blob in bad.items():
        r.hset(key, field, blob)
    caplog.set_level(logging.WARNING, logger="adaptspec.fleet")
    a, pol_a = replica(url, "r1")  # starts while the entries are there
    b, pol_b = replica(url, "r2")
    try:
        assert a.status()["state"] == "degraded" and set(a.status()["refused_entries"]) == names
        fed = [(4, 1.0), (8, 2.0), (4, 0.5), (1, -1.0), (2, 0.25)]
        for blk, rw in fed:
            b.update(pol_b, None, blk, rw)
        b.sync_now()
        wait_for(lambda: a.status()["fleet_updates"] == len(fed))  # b's updates reach a through the loop
        a.apply_pending(pol_a)
        want = plain_ucb(fed)
        np.testing.assert_allclose(pol_a.stats.s, want.stats.s)
        np.testing.assert_array_equal(pol_a.stats.pulls, want.stats.pulls)
        # the lease keeps being renewed: past two lease lives, still held; the same id is refused meanwhile
        time.sleep(2 * a.lease_ttl_s)
        s = a.status()
        assert s["lease_held"] and s["lease_seconds_left"] > 0 and s["state"] == "degraded"
        assert r.pttl("adaptspec:fleet:fb:A:lease:r1") > 0
        with pytest.raises(AdaptspecError, match="held by a live replica"):
            SharedState(RedisBackend(url).connect(), "r1", sync_interval_s=0.1, lease_ttl_s=1.5).claim("A")
        # each bad entry was logged once and counted once, however many syncs saw it
        assert s["syncs"] > 10 and s["refused"] == len(bad)
        assert len([m for m in caplog.messages if "skipping" in m]) == 2 * len(bad)  # a's and b's
        assert all("\n" not in m for m in caplog.messages)
        r.hdel(key, *bad)  # removed: ok again
        wait_for(lambda: a.status()["state"] == "ok")
        assert a.status()["refused_entries"] == {}
    finally:
        a.close(), b.close()
        r.close()


@pytest.mark.integration
def test_an_unreadable_own_entry_is_replaced_at_start(redis_server):
    url = f"{redis_server.url}/own"
    r = redis.Redis(port=redis_server.port)
    r.hset("adaptspec:fleet:own:A", "r1", MALFORMED["header {format: 1}"])
    a, pol = replica(url, "r1")
    try:
        a.update(pol, None, 4, 1.0)
        a.sync_now()
        assert decode(r.hget("adaptspec:fleet:own:A", "r1")).updates == 1 and a.status()["state"] == "ok"
    finally:
        a.close()
        r.close()


@pytest.mark.integration
def test_an_entry_under_another_replicas_field_or_of_another_policy_is_skipped(redis_server):
    url = f"{redis_server.url}/other"
    r = redis.Redis(port=redis_server.port)
    a, pol = replica(url, "r1")
    try:
        fp = a.fingerprint
        r.hset("adaptspec:fleet:other:A", "r9", encode(Published("r1", fp, 0, family_for(pol).zero())))
        r.hset("adaptspec:fleet:other:A", "r8", encode(Published("r8", "another", 0, family_for(pol).zero())))
        inf = family_for(pol).zero() | {"s": np.array([np.inf, 0, 0, 0])}
        r.hset("adaptspec:fleet:other:A", "r7", encode(Published("r7", fp, 0, inf)))
        a.sync_now()
        why = a.status()["refused_entries"]
        assert (
            "published as replica 'r1'" in why["r9"]
            and "another policy" in why["r8"]
            and "infinity" in why["r7"]
        )
        assert a.status()["other_replicas"] == 0 and a.status()["state"] == "degraded"
    finally:
        a.close()
        r.close()


@pytest.mark.integration
def test_sums_that_are_no_posterior_are_not_merged(redis_server):
    """Finite sums of the right shapes that no replica can make (a precision that is not positive
    definite): the merge is refused, the policy keeps what it learnt, /health degraded."""
    url = f"{redis_server.url}/psd"
    s = SharedState(RedisBackend(url).connect(), "r1", sync_interval_s=0.1, lease_ttl_s=1.5)
    pol = make_policy("linucb:standardize=false", ARMS, seed=0)
    s.attach(pol, "A")
    r = redis.Redis(port=redis_server.port)
    try:
        for x, blk, rw in ((np.array([1.0, 0.0, 2.0]), 4, 1.0), (np.array([0.0, 1.0, 1.0]), 8, 0.5)):
            s.update(pol, x, blk, rw)
        s.sync_now()
        before = pol.core.theta.copy()
        sums = decode(r.hget("adaptspec:fleet:psd:A", "r1")).sums  # what r1 published, made no posterior
        sums["xx"] = -10.0 * np.repeat(np.eye(sums["xx"].shape[1])[None], len(ARMS), axis=0)
        r.hset("adaptspec:fleet:psd:A", "r2", encode(Published("r2", s.fingerprint, 0, sums)))
        s.sync_now()
        assert not s.apply_pending(pol)
        np.testing.assert_array_equal(pol.core.theta, before)
        st_ = s.status()
        assert st_["state"] == "degraded" and "not a posterior" in st_["last_error"]
        r.hdel("adaptspec:fleet:psd:A", "r2")
        s.sync_now()
        assert s.apply_pending(pol) and s.status()["state"] == "ok"
    finally:
        s.close()
        r.close()


class BrokenBackend(MemoryBackend):
    """A backend whose fetch answers something that is not a mapping while ``broken`` (a faulty third-party
    backend): the sync iteration raises past the backend's own error handling."""

    broken = False

    def fetch(self, channel):
        return 42 if self.broken else super().fetch(channel)


def test_the_sync_loop_outlives_an_iteration_that_raises(caplog):
    be = BrokenBackend()
    s = SharedState(be, "r1", sync_interval_s=0.05, lease_ttl_s=0.5)
    pol = make_policy("ucb", ARMS, seed=0)
    s.attach(pol, "A")
    caplog.set_level(logging.WARNING, logger="adaptspec.fleet")
    try:
        be.broken = True
        wait_for(lambda: s.sync_errors >= 5)
        st_ = s.status()
        assert st_["state"] == "failing" and "AttributeError" in st_["last_error"]
        assert st_["lease_seconds_left"] > 0  # renewed at every iteration, failing or not
        assert len([m for m in caplog.messages if "sync failed" in m]) == 1  # logged once, one line
        be.broken = False
        wait_for(lambda: s.status()["state"] == "ok")  # the same thread, still running
        syncs = s.syncs
        wait_for(lambda: s.syncs > syncs + 2)
    finally:
        s.close()


@pytest.mark.integration
def test_a_lease_that_lapsed_is_never_ok(redis_server):
    """Redis frozen past the lease's life: the replica cannot renew, publishes nothing, says failing;
    back once Redis answers and the id is free."""
    url = f"{redis_server.url}/lapse"
    a, pol = replica(url, "r1", ttl=1.0)
    try:
        redis_server.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: a.status()["lease_seconds_left"] == 0.0, timeout=15)
            assert a.status()["state"] == "failing"  # lapsed, whether or not the renewal has timed out yet
            wait_for(lambda: not a.status()["connected"])
            assert a.status()["state"] == "failing"
        finally:
            redis_server.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: a.status()["state"] == "ok", timeout=15)
        assert a.status()["lease_seconds_left"] > 0
    finally:
        a.close()


# ----------------------------------------------------------------------------- adaptspec serve
@pytest.mark.integration
@pytest.mark.slow
def test_serve_starts_with_a_malformed_entry_and_health_says_degraded(redis_server, tmp_path):
    """The issue's case: the entry is there before the server starts; it starts (one log line, no
    traceback), /health is degraded while the entry is there, the lease is renewed, ok once removed."""
    r = redis.Redis(port=redis_server.port)
    r.hset("adaptspec:fleet:fb:A", "x", MALFORMED["header {format: 1}"])
    port = free_port()
    out = tmp_path / "server.out"

    def args(port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "adaptspec",
            "serve",
            "--tiny",
            "--threads",
            "1",
            "--variant",
            "A=ucb",
            "--shared",
            f"{redis_server.url}/fb",
            "--replica-id",
            "r1",
            "--lease-ttl",
            "1.5",
            "--sync-interval",
            "0.2",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]

    with open(out, "wb") as f:
        proc = subprocess.Popen(args(port), stdout=f, stderr=f)
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert proc.poll() is None, out.read_text()[-2000:]
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=120)
        time.sleep(3.0)  # two lease lives
        h = httpx.get(url + "/health").json()
        shared = h["variants"]["A"]["shared"]
        assert (
            h["status"] == "degraded" and shared["state"] == "degraded" and "x" in shared["refused_entries"]
        )
        assert shared["lease_seconds_left"] > 0 and shared["syncs"] > 5
        metrics = httpx.get(url + "/metrics").text
        assert 'adaptspec_shared_refused_entries{variant="A"} 1.0' in metrics
        assert 'adaptspec_shared_refused_total{variant="A"} 1.0' in metrics
        again = subprocess.run(args(free_port()), capture_output=True, text=True, timeout=120)
        assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1, again.stderr
        assert "held by a live replica" in again.stderr
        r.hdel("adaptspec:fleet:fb:A", "x")
        wait_for(lambda: httpx.get(url + "/health").json()["status"] == "ok")
        log = out.read_text()
        assert "Traceback" not in log and log.count("skipping") == 1, log
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        r.close()
