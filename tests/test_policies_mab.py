"""Context-free bandits: statistics with forgetting against brute force, warm-up, rescaling, learning."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.errors import AdaptspecError
from adaptspec.policies import EXP3, UCB, EpsilonGreedy, ThompsonSampling
from adaptspec.policies.base import greedy_probs
from adaptspec.policies.context_free import ArmStats

pairs = st.lists(st.tuples(st.integers(0, 3), st.floats(-100, 100, allow_nan=False)), min_size=1, max_size=80)


@settings(max_examples=40, deadline=None)
@given(data=pairs, window=st.integers(1, 25))
def test_window_stats_equal_brute_force(data, window):
    s = ArmStats(4, window=window)
    for a, r in data:
        s.add(a, r)
    last = data[-window:]
    for k in range(4):
        rs = [r for a, r in last if a == k]
        assert s.n[k] == pytest.approx(len(rs))
        assert s.s[k] == pytest.approx(sum(rs), abs=1e-6)
        assert s.ss[k] == pytest.approx(sum(r * r for r in rs), rel=1e-9, abs=1e-6)
    assert s.pulls.sum() == len(data)


@settings(max_examples=40, deadline=None)
@given(data=pairs, g=st.floats(0.5, 0.999))
def test_discounted_stats_equal_brute_force(data, g):
    s = ArmStats(4, discount=g)
    for a, r in data:
        s.add(a, r)
    T = len(data)
    for k in range(4):
        w = [g ** (T - 1 - t) for t, (a, _) in enumerate(data) if a == k]
        rs = [r for a, r in data if a == k]
        assert s.n[k] == pytest.approx(sum(w), rel=1e-9, abs=1e-12)
        assert s.s[k] == pytest.approx(sum(wi * r for wi, r in zip(w, rs)), rel=1e-9, abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(data=pairs)
def test_add_many_equals_add(data):
    a, b = ArmStats(4), ArmStats(4)
    for k, r in data:
        a.add(k, r)
    b.add_many(np.array([k for k, _ in data]), np.array([r for _, r in data]))
    assert np.allclose(a.s, b.s) and np.allclose(a.n, b.n) and np.array_equal(a.pulls, b.pulls)


def test_greedy_probs_split_ties():
    assert greedy_probs(np.array([1.0, 2.0, 2.0, 0.0])).tolist() == [0.0, 0.5, 0.5, 0.0]
    assert greedy_probs(np.array([3.0, 1.0])).tolist() == [1.0, 0.0]


def test_forgetting_arguments_are_checked():
    with pytest.raises(AdaptspecError, match="either discount or window"):
        UCB([1, 2], discount=0.9, window=10)
    with pytest.raises(AdaptspecError, match="discount"):
        ThompsonSampling([1, 2], discount=1.5)
    with pytest.raises(AdaptspecError, match="window"):
        EpsilonGreedy([1, 2], window=0)
    with pytest.raises(AdaptspecError, match="epsilon"):
        EpsilonGreedy([1, 2], epsilon=2.0)
    with pytest.raises(AdaptspecError, match="reward_range"):
        EXP3([1, 2], reward_range=(3.0, 1.0))


def test_ucb_warmup_is_round_robin_and_deterministic():
    pol = UCB([1, 2, 4, 8], warmup=2)
    seen = []
    for t in range(8):
        d = pol.decide()
        assert d.propensity == 1.0
        seen.append(d.block_size)
        pol.update(None, d.block_size, 1.0)
    assert seen == [1, 2, 4, 8] * 2
    assert UCB.throughput([1, 2, 4, 8]).warmup == 2  # BanditSpec: 8 round-robin rounds for 4 arms
    assert UCB.throughput([1, 2, 4, 8]).label == "ucb-throughput"


def test_ucb_bonus_is_scale_free():
    """Multiplying every reward by 1000 (tokens/s vs ms) does not change UCB's choices."""
    rng = np.random.default_rng(0)
    means = np.array([1.0, 1.3, 1.1])
    a, b = UCB([1, 2, 3], seed=0), UCB([1, 2, 3], seed=0)
    for t in range(300):
        da, db = a.decide(), b.decide()
        assert da.block_size == db.block_size
        r = means[da.block_size - 1] + rng.normal(0, 0.2)
        a.update(None, da.block_size, r)
        b.update(None, db.block_size, 1000 * r)


def test_exp3_rescaling():
    pol = EXP3([1, 2], seed=0)
    pol.update(None, 1, 10.0)
    assert pol.rescale(10.0) == 0.5  # one value seen: the middle
    pol.update(None, 2, 30.0)
    assert pol.rescale(20.0) == pytest.approx(0.5) and pol.rescale(40.0) == 1.0
    fixed = EXP3([1, 2], reward_range=(0.0, 100.0))
    assert fixed.rescale(25.0) == 0.25 and fixed.rescale(-5.0) == 0.0
    # probabilities always keep the epsilon floor
    for _ in range(200):
        pol.update(None, 2, 30.0)
    assert pol.decide().probs.min() >= 0.1 / 2 - 1e-12


STREAM_MEANS = np.array([1.0, 1.6, 1.3, 0.5])


def _play(pol, T, means, rng, switch=None, after=None):
    chosen = []
    for t in range(T):
        m = after if (switch is not None and t >= switch) else means
        d = pol.decide()
        a = pol.arm_index(d.block_size)
        pol.update(None, d.block_size, m[a] + rng.normal(0, 0.3))
        chosen.append(a)
    return np.array(chosen)


@pytest.mark.parametrize(
    "make",
    [
        lambda: EpsilonGreedy([1, 2, 4, 8], epsilon=0.05, seed=1),
        lambda: UCB([1, 2, 4, 8], seed=1),
        lambda: UCB.throughput([1, 2, 4, 8], seed=1),
        lambda: ThompsonSampling([1, 2, 4, 8], mc_samples=128, seed=1),
        lambda: EXP3([1, 2, 4, 8], epsilon=0.05, eta=0.05, seed=1),
    ],
    ids=["eps-greedy", "ucb", "ucb-throughput", "ts", "exp3"],
)
def test_learns_the_best_arm(make):
    chosen = _play(make(), 1500, STREAM_MEANS, np.random.default_rng(2))
    assert np.mean(chosen[-300:] == 1) > 0.8


@pytest.mark.parametrize(
    "make, forget",
    [
        (lambda **kw: UCB([1, 2, 4, 8], seed=1, **kw), {"discount": 0.98}),
        (lambda **kw: UCB([1, 2, 4, 8], seed=1, **kw), {"window": 150}),
        (lambda **kw: ThompsonSampling([1, 2, 4, 8], mc_samples=128, seed=1, **kw), {"discount": 0.98}),
        (lambda **kw: EpsilonGreedy([1, 2, 4, 8], epsilon=0.1, seed=1, **kw), {"window": 150}),
    ],
    ids=["ucb-discount", "ucb-window", "ts-discount", "eps-window"],
)
def test_forgetting_recovers_after_a_change(make, forget):
    """At t=1000 the worst arm becomes the best (the old best stays as it was, so nothing tells a
    policy that never forgets to look again): with forgetting the policy has moved within 300
    requests; without it (same seed, same stream) it mostly has not."""
    after = np.array([1.0, 1.6, 1.3, 2.1])  # arm 3 (block 8) is now best
    fast = _play(make(**forget), 1300, STREAM_MEANS, np.random.default_rng(3), switch=1000, after=after)
    slow = _play(make(), 1300, STREAM_MEANS, np.random.default_rng(3), switch=1000, after=after)
    assert np.mean(fast[-100:] == 3) > 0.6
    assert np.mean(fast[-300:] == 3) > np.mean(slow[-300:] == 3) + 0.2


def test_thompson_propensity_matches_its_choices():
    """Monte-Carlo propensities are unbiased: the empirical choice frequencies match them."""
    pol = ThompsonSampling([1, 2, 3], mc_samples=256, seed=0)
    for a, r in [(1, 1.0), (2, 1.1), (3, 0.9), (1, 1.05), (2, 1.0), (3, 0.95)]:
        pol.update(None, a, r)
    counts = np.zeros(3)
    probs = np.zeros(3)
    for _ in range(2000):
        d = pol.decide()
        counts[d.block_size - 1] += 1
        probs += d.probs
    assert np.allclose(counts / 2000, probs / 2000, atol=0.04)
    idx, prop = pol.decide_batch(None, n=2000)
    assert np.allclose(np.bincount(idx, minlength=3) / 2000, probs / 2000, atol=0.04)
