"""Fleet statistics in one process (MemoryBackend): what cannot be shared, restarts with checkpoints,
and a replica restarted on the wrong log. Expected values come from plain policies fed every feedback."""

from __future__ import annotations

import numpy as np
import pytest

from _controller_helpers import SplitFormOnly as _Toy
from adaptspec import AdaptiveController, AdaptspecError
from adaptspec.fleet import MemoryBackend, SharedState, family_for
from adaptspec.policies.spec import make_policy

ARMS = [1, 2, 4, 8]


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("ucb:discount=0.99", "global order of updates"),
        ("ts:window=50", "global order of updates"),
        ("linucb:discount=0.999", "global order of updates"),
        ("exp3", "EXP3"),
        ("linucb", "warm-up standardiser"),
        ("squarecb", "cannot be shared"),
    ],
)
def test_policies_that_cannot_be_shared_say_why_in_one_line(spec, needle):
    with pytest.raises(AdaptspecError, match=needle) as e:
        family_for(make_policy(spec, ARMS, seed=0))
    assert "\n" not in str(e.value)


def feed(ctl, rng, n, triples):
    for _ in range(n):
        x = rng.normal(size=3).astype(np.float32)
        d = ctl.decide(x)
        r = float(x[0] * np.log2(d.block_size) + rng.normal(0, 0.1))
        assert ctl.feedback(d.decision_id, reward=r) == "applied"
        triples.append((x.astype(np.float64), d.block_size, r))


def settle(ctls):
    for c in ctls:
        c.sync()
        c._shared.sync_now()
    for c in ctls:
        c._shared.sync_now()
    for c in ctls:  # the update thread applies the fetch at its next tick
        deadline = 50
        while c._shared._applied_seq != c._shared._fetch_seq and deadline:
            import time

            time.sleep(0.05)
            deadline -= 1


def test_restart_from_checkpoint_and_log_equals_one_process(tmp_path):
    spec, be = "linucb:standardize=false", MemoryBackend()
    rng, triples = np.random.default_rng(0), []

    def replica(i):
        return AdaptiveController(
            _Toy(),
            spec,
            arms=ARMS,
            variant="A",
            log_dir=tmp_path / f"log{i}",
            checkpoint_dir=tmp_path / f"ck{i}",
            checkpoint_every=7,
            log_fsync=False,
            shared=SharedState(be, f"r{i}", sync_every=4, sync_interval_s=0.05),
        )

    a, b = replica(0), replica(1)
    feed(a, rng, 30, triples)
    feed(b, rng, 25, triples)
    a.close()  # checkpoint + final publish
    a = replica(0)  # resumes from its checkpoint and log, then takes the fleet's statistics
    assert a.stats()["shared"]["rebuilt"] == {"from": "log", "updates": 30, "published_before": 30}
    feed(a, rng, 10, triples)
    settle([a, b])
    single = make_policy(spec, ARMS, seed=0)
    for x, blk, r in triples:
        single.update(x, blk, r)
    for c in (a, b):
        pol = c.policy_snapshot()
        assert pol.version == 65
        np.testing.assert_allclose(pol.core.A_inv, single.core.A_inv, rtol=1e-6, atol=1e-10)
        np.testing.assert_allclose(pol.core.theta, single.core.theta, rtol=1e-6, atol=1e-9)
        np.testing.assert_array_equal(pol.core.count, single.core.count)
    a.close(), b.close()


def test_a_replica_restarted_on_an_empty_log_is_refused(tmp_path):
    be = MemoryBackend()
    c = AdaptiveController(
        _Toy(), "ucb", arms=ARMS, log_dir=tmp_path / "log", log_fsync=False, shared=SharedState(be, "r0")
    )
    for _ in range(5):
        d = c.decide(None)
        c.feedback(d.decision_id, reward=1.0)
    c.close()
    with pytest.raises(AdaptspecError, match="published 5 updates .* holds 0"):
        AdaptiveController(_Toy(), "ucb", arms=ARMS, log_dir=tmp_path / "other", shared=SharedState(be, "r0"))


def test_a_replica_of_another_policy_is_refused_not_merged(tmp_path):
    be = MemoryBackend()
    a = AdaptiveController(_Toy(), "ucb", arms=ARMS, shared=SharedState(be, "a", sync_interval_s=0.05))
    b = AdaptiveController(_Toy(), "ts", arms=ARMS, shared=SharedState(be, "b", sync_interval_s=0.05))
    for c in (a, b):
        d = c.decide(None)
        c.feedback(d.decision_id, reward=1.0)
    settle([a, b])
    s = a.stats()["shared"]
    assert s["refused"] >= 1 and s["other_replicas"] == 0 and s["fleet_updates"] == 1
    a.close(), b.close()
