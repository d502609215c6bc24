"""Fleet learning on a real Redis: replica processes on loopback, killed replicas, a restarted Redis.

The expected statistics always come from one plain policy (no fleet code) fed every
acknowledged feedback: the triples (context, block size, reward) the replicas answered with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from _redis import RedisServer
from adaptspec.policies.spec import make_policy

ROOT = Path(__file__).resolve().parents[1]
ARMS = [1, 2, 4, 8]
W = np.array([[0.5, -1.0, 0.2], [1.0, 0.3, -0.5], [-0.4, 0.8, 0.9], [0.1, 0.1, 0.1]])


@pytest.fixture
def redis_server(tmp_path):
    srv = RedisServer(tmp_path / "redis").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
    """A small regression head over 3 features and ARMS (for the neural-linear replicas)."""
    from adaptspec.policies.offline_head import train_head

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    R = X @ W.T + rng.normal(0, 0.3, size=(400, 4))
    head = train_head(X, R, arms=ARMS, hidden=(8, 4), max_epochs=20, seed=0)
    path = tmp_path_factory.mktemp("head")
    head.save(path)
    return path


def stream(n: int, seed: int = 1) -> list[tuple[list[float], dict[str, float]]]:
    """Requests: a context and the reward every block size would earn on it."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)).astype(np.float32)
    R = X.astype(np.float64) @ W.T + rng.normal(0, 0.3, size=(n, 4))
    return [(X[i].tolist(), {str(a): float(R[i, j]) for j, a in enumerate(ARMS)}) for i in range(n)]


class Replica:
    """One replica process (tests/_fleet_replica.py); ``wait=False`` returns once it is started,
    before it is ready (then :meth:`ready`), so that several start side by side."""

    def __init__(
        self,
        url: str,
        rid: str,
        log_dir: Path,
        spec: str,
        sync_every: int = 8,
        lease_ttl: float = 15.0,
        wait: bool = True,
    ) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "_fleet_replica.py"),
                url,
                rid,
                str(log_dir),
                spec,
                str(sync_every),
                str(lease_ttl),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.rid = rid
        self.acked: list[tuple[np.ndarray, int, float, float]] = []  # context, block size, reward, ack time
        if wait:
            self.ready()

    def ready(self) -> "Replica":
        """Wait for the replica's first line (``hello``)."""
        self.hello = self._read()
        return self

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"replica {self.rid} exited ({self.proc.wait()})")
        return json.loads(line)

    def call(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def step(self, x: list[float], rewards: dict[str, float]) -> dict:
        out = self.call(op="step", x=x, rewards=rewards)
        assert out["status"] == "applied"
        self.acked.append(
            (np.asarray(x, np.float32).astype(np.float64), out["block_size"], out["reward"], time.monotonic())
        )
        return out

    def state(self, tmp: Path, spec: str):
        path = tmp / f"state-{self.rid}-{time.monotonic_ns()}.npz"
        self.call(op="state", path=str(path))
        pol = make_policy(spec, ARMS, seed=0)
        pol.load_state(path)
        return pol

    def close(self) -> None:
        if self.proc.poll() is None:
            self.call(op="close")
            self.proc.wait(30)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def start_replicas(url: str, log_dirs: list[Path], spec: str, **kw) -> list[Replica]:
    """Replicas r0, r1, ... on ``log_dirs``, started side by side (each imports torch: about 2 s of CPU)."""
    reps = [Replica(url, f"r{i}", d, spec, wait=False, **kw) for i, d in enumerate(log_dirs)]
    return [r.ready() for r in reps]


def wait_for_lease_expiry(srv, fleet: str, rid: str, variant: str = "A", timeout: float = 30.0) -> None:
    import redis

    c = redis.Redis(port=srv.port)
    deadline = time.monotonic() + timeout
    while c.exists(f"adaptspec:fleet:{fleet}:{variant}:lease:{rid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    c.close()


def single_process(spec: str, triples) -> object:
    pol = make_policy(spec, ARMS, seed=0)
    for x, b, r, _ in triples:
        pol.update(x if pol.contextual else None, b, r)
    return pol


def assert_same_statistics(fleet, single) -> None:
    """The order-free statistics of the fleet's policy equal the single process's (float tolerance)."""
    assert fleet.version == single.version
    if hasattr(fleet, "cores"):  # neural-linear: every head weight's posterior
        for cf, cs in zip(fleet.cores, single.cores):
            np.testing.assert_allclose(cf.S, cs.S, rtol=1e-6, atol=1e-10)
            np.testing.assert_allclose(cf.theta, cs.theta, rtol=1e-6, atol=1e-9)
            np.testing.assert_array_equal(cf.count, cs.count)
        assert fleet.noise_stats[0] == single.noise_stats[0]  # one residual per update, wherever scored
    else:
        for key in ("n", "s", "ss"):
            np.testing.assert_allclose(
                getattr(fleet.stats, key), getattr(single.stats, key), rtol=1e-9, atol=1e-9
            )
        np.testing.assert_array_equal(fleet.stats.pulls, single.stats.pulls)
        np.testing.assert_allclose(fleet.running, single.running, rtol=1e-9, atol=1e-9)


def sync_all(replicas) -> list[dict]:
    for r in replicas:  # everyone publishes, ...
        r.call(op="sync")
    return [r.call(op="sync")["shared"] for r in replicas]  # ... then everyone has everyone's


def test_four_replicas_equal_one_process_that_saw_every_feedback(redis_server, tmp_path, head_dir):
    for spec in ("ucb", f"neural-linear:head={head_dir}"):
        url = f"{redis_server.url}/t-{spec[:3]}"
        reps = start_replicas(url, [tmp_path / spec[:3] / f"r{i}" for i in range(4)], spec)
        try:
            for i, (x, rw) in enumerate(stream(160)):
                reps[i % 4].step(x, rw)
            statuses = sync_all(reps)
            triples = [t for r in reps for t in r.acked]
            single = single_process(spec, triples)
            for r, st in zip(reps, statuses):
                assert st["fleet_updates"] == 160 and st["other_replicas"] == 3 and st["connected"]
                assert_same_statistics(r.state(tmp_path, spec), single)
        finally:
            for r in reps:
                r.close()


def test_sigkill_loses_nothing_acknowledged_and_its_key_keeps_counting(redis_server, tmp_path):
    spec, url, k = "ucb", f"{redis_server.url}/kill", 8
    logs = [tmp_path / f"r{i}" for i in range(4)]
    reps = start_replicas(url, logs, spec, sync_every=k, lease_ttl=2.0)
    data = stream(240)
    try:
        for i, (x, rw) in enumerate(data[:120]):
            reps[i % 4].step(x, rw)
        dead = reps[1]
        killed_at = time.monotonic()
        dead.kill()  # mid-stream: some of its acknowledged updates may not be published yet
        status = sync_all([reps[0]])[0]
        published = status["fleet_updates"] - sum(len(r.acked) for r in (reps[0], reps[2], reps[3]))
        # what it published keeps counting; what it had not published is at most the window:
        # sync_every updates, or what it acknowledged in the last sync interval (0.2 s, + scheduling slack)
        recent = sum(1 for t in dead.acked if t[3] > killed_at - 1.0)
        assert 0 < published <= len(dead.acked)
        assert len(dead.acked) - published <= max(k, recent)
        # restarted on its own log once its id is free (the lease expired), it rebuilds every acknowledged
        # update (and republishes them once)
        wait_for_lease_expiry(redis_server, "kill", "r1")
        back = Replica(url, "r1", logs[1], spec, sync_every=k, lease_ttl=2.0)
        assert back.hello["rebuilt"] == {
            "from": "log",
            "updates": len(dead.acked),
            "published_before": published,
        }
        back.acked = dead.acked
        reps[1] = back
        for i, (x, rw) in enumerate(data[120:]):
            reps[i % 4].step(x, rw)
        statuses = sync_all(reps)
        single = single_process(spec, [t for r in reps for t in r.acked])
        assert all(s["fleet_updates"] == 240 for s in statuses)
        for r in reps:
            assert_same_statistics(r.state(tmp_path, spec), single)
    finally:
        for r in reps:
            if r.proc.poll() is None:
                r.close()


def test_redis_restarted_mid_stream_loses_nothing(redis_server, tmp_path):
    spec, url = "ucb", f"{redis_server.url}/restart"
    reps = start_replicas(url, [tmp_path / f"r{i}" for i in range(4)], spec)
    data = stream(200)
    try:
        for i, (x, rw) in enumerate(data[:80]):
            reps[i % 4].step(x, rw)
        gone = reps.pop(3)
        gone.close()  # its final publish now lives only in Redis
        redis_server.kill()  # SIGKILL: only what Redis persisted (AOF) survives
        for i, (x, rw) in enumerate(data[80:120]):  # the replicas keep serving while Redis is down
            reps[i % 3].step(x, rw)
        down = [r.call(op="sync")["shared"] for r in reps]
        assert all(not s["connected"] and s["sync_errors"] >= 1 for s in down)
        redis_server.start()
        for i, (x, rw) in enumerate(data[120:]):
            reps[i % 3].step(x, rw)
        statuses = sync_all(reps)
        single = single_process(spec, [t for r in reps + [gone] for t in r.acked])
        assert all(s["connected"] and s["fleet_updates"] == 200 for s in statuses)
        for r in reps:
            assert_same_statistics(r.state(tmp_path, spec), single)
    finally:
        for r in reps:
            r.close()
