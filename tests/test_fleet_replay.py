"""Fleet replay on the bundled benchmark trace set: 4 replicas sharing one LinUCB reach the
single-replica learning curve about 4x sooner in requests per replica.

The reference is the same policy learning alone on the same kind of stream (one replica,
4x the requests); both curves are regret against the best fixed block size, binned over the
same number of rewards learnt from.
"""

from __future__ import annotations

import numpy as np
import pytest

from adaptspec.fleet.replay import fleet_replay, learning_curve, speedup
from adaptspec.paths import BUNDLED_HEAD
from adaptspec.policies.featurizer import Featurizer
from adaptspec.policies.spec import make_policy
from adaptspec.reward.functions import trace_rewards
from adaptspec.simulators.replay import finite_rewards
from adaptspec.traces import load_traces

SPEC, STEPS, SEEDS, WIDTH = "linucb:standardize=false", 300, 8, 40


@pytest.fixture(scope="module")
def bench():
    t = load_traces("adaptspec/data/traces/benchmarks")
    X = Featurizer.load(BUNDLED_HEAD).transform(t.features).astype(np.float64)
    R = finite_rewards(t, "token_latency")
    make = lambda i: make_policy(SPEC, t.arms, seed=0)  # noqa: E731
    single = np.stack(
        [fleet_replay(make, R, X, replicas=1, steps_per_replica=4 * STEPS, seed=s) for s in range(SEEDS)]
    )
    return make, R, X, learning_curve(single, WIDTH)


def levels(curve: np.ndarray) -> np.ndarray:
    """Regret levels from 20% to 70% of the way the single replica's curve falls."""
    hi, lo = curve[0], curve[-1]
    return hi - np.linspace(0.2, 0.7, 6) * (hi - lo)


@pytest.mark.parametrize("sync_every, at_least", [(1, 3.5), (8, 2.8)])
def test_four_replicas_learn_about_four_times_sooner(bench, sync_every, at_least):
    make, R, X, single = bench
    fleet = np.stack(
        [
            fleet_replay(make, R, X, replicas=4, steps_per_replica=STEPS, sync_every=sync_every, seed=s)
            for s in range(SEEDS)
        ]
    )
    curve = learning_curve(fleet, WIDTH // 4)
    s = speedup(single, WIDTH, curve, WIDTH // 4, levels(single))
    assert np.isfinite(s).all() and single[0] - single[-1] > 2.0  # the single replica does learn
    assert at_least <= np.median(s) <= 4.6, s


def test_without_sharing_a_replica_learns_as_one_alone(bench):
    make, R, X, single = bench
    alone = np.stack(
        [
            fleet_replay(make, R, X, replicas=4, steps_per_replica=STEPS, sync_every=10**9, seed=s)
            for s in range(SEEDS // 2)
        ]
    )
    s = speedup(single, WIDTH, learning_curve(alone, WIDTH), WIDTH, levels(single))
    assert np.all(np.isnan(s) | (s < 1.6)), s  # NaN: not reached within its requests (a sharing fleet was)


def test_a_full_information_fleet_learns_every_arm_its_requests_show():
    """fi-ucb fed the trace set's counterfactuals: the replay of one replica is one fi-ucb learning
    every arm each request shows (replayed here by hand), and differs from learning the arm alone."""
    from adaptspec.simulators.counterfactuals import trace_feedback

    t = load_traces("adaptspec/data/traces/benchmarks")
    R = trace_rewards(t, "token_latency")
    fb = trace_feedback(t, R, "token_latency")
    make = lambda i: make_policy("fi-ucb", t.arms, seed=0)  # noqa: E731
    got = fleet_replay(make, R, None, replicas=1, steps_per_replica=200, seed=3, feedback=fb)[0]
    pol = make(0)
    idx = np.random.default_rng(3).integers(0, R.shape[0], size=200)
    best = int(np.argmax(R.mean(axis=0)))
    want, shown = [], 0
    for i in idx.tolist():
        a = pol.arm_index(pol.decide(None).block_size)
        want.append(R[i, best] - R[i, a])
        pol.update_full(None, fb.rewards[i, a], fb.observed[i, a])
        shown += int(fb.observed[i, a].sum())
    np.testing.assert_allclose(got, want)
    assert shown > 3 * 200  # most requests showed several arms, not just the one that ran
    bandit = fleet_replay(make, R, None, replicas=1, steps_per_replica=200, seed=3)[0]
    assert not np.allclose(bandit, got)  # learning the arm alone chooses differently
