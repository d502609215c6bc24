"""Replay: metrics against hand computations, vectorised == looped, orders, seeds, logs."""

from __future__ import annotations

import time

import numpy as np
import pytest

from adaptspec.errors import AdaptspecError
from adaptspec.policies import Fixed, RandomPolicy
from adaptspec.policies.base import Policy
from adaptspec.reward.functions import trace_rewards
from adaptspec.simulators.replay import METRICS, replay, replay_log, run_policy, stream_order
from adaptspec.simulators.synthetic import generate
from adaptspec.traces import DecisionLog, TraceSet

R = np.array([[1.0, 2.0, 3.0], [1.0, 1.5, 1.2], [1.0, 1.0, 1.0], [1.0, 2.0, 4.0]])


def toy(features=True) -> TraceSet:
    X = np.arange(8, dtype=float).reshape(4, 2) if features else None
    return TraceSet.from_arrays(list("abcd"), ["x", "x", "y", "y"], [1, 2, 4], R, features=X)


class Greedy(Policy):
    """A small learning policy for the tests: epsilon-greedy on running means."""

    name = "greedy"

    def _reset(self):
        self.n = np.zeros(len(self.arms))
        self.s = np.zeros(len(self.arms))

    def _probs(self, context):
        mean = np.where(self.n > 0, self.s / np.maximum(self.n, 1), np.inf)
        p = np.zeros(len(self.arms))
        p[int(np.argmax(mean))] = 1.0
        return 0.9 * p + 0.1 / len(self.arms)

    def _update(self, context, arm, reward):
        self.n[arm] += 1
        self.s[arm] += reward


class GreedyPublic(Greedy):
    """Same policy, but overriding the public methods: replay must use them."""

    def decide(self, context=None):
        return super().decide(context)

    def update(self, context, block_size, reward):
        return super().update(context, block_size, reward)


class LoopRandom(RandomPolicy):
    learning = True


def test_fixed_policies_metrics_by_hand():
    rep = replay(toy(), ["fixed:1", "fixed:4"], reward="tau")
    f1, f4 = rep.policies
    oracle = R.max(axis=1)
    assert f4.mean("mean_reward") == pytest.approx(R[:, 2].mean())
    assert f4.mean("pct_oracle") == pytest.approx(100 * R[:, 2].sum() / oracle.sum())
    assert f1.mean("cumulative_regret") == pytest.approx((oracle - 1).sum())
    assert rep.best_fixed_block_size == 4 and rep.best_fixed.mean("pct_best_fixed") == pytest.approx(100)
    assert f1.mean("pct_best_fixed") == pytest.approx(100 * 4 / R[:, 2].sum())
    assert rep.oracle.mean("mean_reward") == pytest.approx(oracle.mean())
    assert np.all(rep.oracle.curve == 0) and np.all(np.diff(f1.curve[0]) >= 0)
    assert f1.curve[0, -1] == pytest.approx(f1.mean("cumulative_regret"))
    assert rep.oracle.chosen.tolist() == [2, 1, 0, 2]


def test_json_has_the_design_shape():
    rep = replay(toy(), ["random", "fixed:2"], reward="tau", seeds=[0, 1, 2], order="shuffled")
    d = rep.to_json()
    keys = {
        "policy",
        "mean_reward",
        "mean_tau",
        "throughput",
        "pct_oracle",
        "pct_best_fixed",
        "cumulative_regret",
    }
    for p in [*d["policies"], d["oracle"], d["best_fixed"]]:
        assert keys <= set(p)
    assert d["best_fixed"]["block_size"] == 4 and d["policies"][0]["policy"] == "random"
    assert d["policies"][0]["throughput"] is None  # no timings, no latency profile
    lo, hi = d["policies"][0]["ci95"]["mean_reward"]
    assert lo <= d["policies"][0]["mean_reward"] <= hi
    assert len(d["policies"][0]["cumulative_regret_curve"]) == len(d["curve_steps"])
    assert set(METRICS) <= set(d["policies"][0]["ci95"])


def test_one_seed_has_no_interval_and_table_renders():
    rep = replay(toy(), ["fixed:2"], reward="tau")
    assert rep.policies[0].ci("mean_reward") is None
    t = rep.table()
    assert "fixed:2" in t and "fixed:4 (best fixed)" in t and "oracle" in t


def test_vectorised_and_looped_paths_agree():
    ts = generate("cpu-small", n_requests=50, seed=2, per_round=False)
    Rm = trace_rewards(ts, "throughput")
    idx = stream_order(ts, "shuffled", 3, 500)
    a = run_policy(RandomPolicy(ts.arms, seed=7), Rm, idx)
    b = run_policy(LoopRandom(ts.arms, seed=7), Rm, idx)
    assert np.array_equal(a, b)
    g1 = run_policy(Greedy(ts.arms, seed=1), Rm, idx)
    g2 = run_policy(GreedyPublic(ts.arms, seed=1), Rm, idx)
    assert np.array_equal(g1, g2)


def test_learning_policy_learns_and_instances_are_copied():
    ts = generate("cpu-small", n_requests=300, seed=4, per_round=False)
    g = Greedy(ts.arms, seed=0)
    rep = replay(ts, [g, "random"], reward="throughput", n_steps=3000, seeds=[0, 1])
    greedy, rnd = rep.policies
    assert greedy.name == "greedy" and g.version == 0 and g.n.sum() == 0  # the original is untouched
    assert greedy.mean("mean_reward") > rnd.mean("mean_reward") * 1.1
    assert (
        greedy.curve[0, -1] - greedy.curve[0, len(greedy.curve[0]) // 2]
        < greedy.curve[0, len(greedy.curve[0]) // 2]
    )
    rep2 = replay(
        ts, [lambda arms, seed: Greedy(arms, seed=seed)], reward="throughput", n_steps=3000, seeds=[0, 1]
    )
    np.testing.assert_array_equal(rep2.policies[0].values["mean_reward"], greedy.values["mean_reward"])


def test_orders():
    ts = generate("cpu-small", n_requests=400, seed=0, per_round=False)
    n = len(ts)
    for order in ("logged", "shuffled", "drift"):
        idx = stream_order(ts, order, 1)
        assert sorted(idx.tolist()) == list(range(n))
        assert np.array_equal(idx, stream_order(ts, order, 1))
    assert not np.array_equal(stream_order(ts, "shuffled", 1), stream_order(ts, "shuffled", 2))
    long = stream_order(ts, "shuffled", 1, 2 * n + 5)
    assert len(long) == 2 * n + 5 and np.all(np.bincount(long, minlength=n) >= 2)
    d = ts.domains[stream_order(ts, "drift", 3)]
    first, last = d[: n // 5], d[-n // 5 :]
    top_first = max(set(first), key=list(first).count)
    assert list(first).count(top_first) > 0.5 * len(first) > list(last).count(top_first)
    with pytest.raises(AdaptspecError, match="unknown order 'random'"):
        stream_order(ts, "random")
    with pytest.raises(AdaptspecError, match="steps must be >= 1"):
        stream_order(ts, "logged", n_steps=0)


def test_measured_and_modelled_throughput_columns():
    ts = generate("cpu-small", n_requests=40, seed=1)
    rep = replay(ts, ["fixed:4"], reward="throughput")
    tok, sec = ts.new_tokens_matrix(), ts.decode_s_matrix()
    assert rep.policies[0].mean("throughput") == pytest.approx(tok[:, 2].sum() / sec[:, 2].sum())
    rep2 = replay(ts, ["fixed:4"], reward="tau", latency="h100-qwen3-8b", batch_size=2)
    assert rep2.latency == "h100-qwen3-8b" and rep2.policies[0].mean("throughput") > 100


def test_errors():
    class Ctx(Greedy):
        contextual = True

    with pytest.raises(AdaptspecError, match="needs features, and this trace set has none"):
        replay(toy(features=False), [Ctx((1, 2, 4))], reward="tau")
    with pytest.raises(AdaptspecError, match=r"has arms \[1, 2\], the trace set has \[1, 2, 4\]"):
        replay(toy(), [Fixed(2, arms=[1, 2])], reward="tau")
    with pytest.raises(AdaptspecError, match="at least one seed"):
        replay(toy(), ["random"], seeds=[])
    with pytest.raises(AdaptspecError, match="not a policy"):
        replay(toy(), [3.5])


def test_a_million_vectorised_decisions_take_seconds():
    ts = generate("cpu-small", n_requests=100, seed=0, per_round=False)
    t = time.perf_counter()
    rep = replay(ts, ["fixed:4", "random"], reward="tau", n_steps=1_000_000)
    assert time.perf_counter() - t < 15  # ~1 s on 2 busy cores; BENCHMARKS.md has the figure
    assert rep.n_steps == 1_000_000


def test_replay_log_matches_replay_and_validates(tmp_path):
    ts = generate("cpu-small", n_requests=60, seed=5, per_round=False)
    tab = replay_log(ts, Greedy(ts.arms), reward="throughput", seed=0, n_steps=200, order="shuffled")
    rep = replay(ts, [Greedy(ts.arms)], reward="throughput", seeds=[0], n_steps=200, order="shuffled")
    np.testing.assert_array_equal(
        np.searchsorted(ts.arms, tab.column("block_size").to_numpy()), rep.policies[0].chosen
    )
    log = DecisionLog(tmp_path / "log")
    log.append(tab)
    back = DecisionLog.read(tmp_path / "log")
    assert len(back) == 200 and back.arms == ts.arms and back.contexts.shape == (200, 32)
    assert np.allclose(back.probs[np.arange(200), back.actions], back.propensities)
    with pytest.raises(AdaptspecError, match="cannot produce a decision log"):
        replay_log(ts, "oracle")
