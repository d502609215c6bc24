"""Reward functions: the same numbers for one outcome (controller) and for trace matrices (simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from adaptspec.costs.latency import CostCurve, LatencyProfile, get_profile
from adaptspec.errors import AdaptspecError
from adaptspec.reward.functions import (
    REWARDS,
    mean_tau,
    measured_throughput,
    modelled_throughput,
    reward_function,
    throughput,
    trace_costs,
    trace_rewards,
)
from adaptspec.simulators.synthetic import generate
from adaptspec.speculator import Outcome, Round
from adaptspec.traces import TraceSet


def outcome(taus, b=8, d=0.01, v=0.04, extra=0.0):
    rounds = [Round(b, t, d, v) for t in taus]
    return Outcome(tokens=[0] * (1 + sum(taus)), rounds=rounds, decode_s=len(taus) * (d + v) + extra)


def test_outcome_rewards():
    o = outcome([3, 5, 4])
    assert mean_tau(o) == 4.0
    assert measured_throughput(o) == pytest.approx(13 / 0.15)
    p = get_profile("cpu-smollm2-bf16")
    assert reward_function("modelled", p, context_tokens=300)(o) == pytest.approx(
        4.0 / float(p.round_s(8, 300))
    )
    assert reward_function("throughput")(o) == measured_throughput(o)
    assert reward_function("tau")(o) == 4.0


def test_outcome_reward_errors():
    empty = Outcome(tokens=[1], rounds=[], decode_s=0.0)
    with pytest.raises(AdaptspecError, match="no rounds"):
        mean_tau(empty)
    with pytest.raises(AdaptspecError, match="no draft/verify round ran"):
        measured_throughput(empty)
    # a request that ended at its prefill token took (almost) no decode time: no reward, not ~0 ms/token
    with pytest.raises(AdaptspecError, match="no draft/verify round ran"):
        reward_function("token_latency")(Outcome(tokens=[1], rounds=[], decode_s=1e-5))
    with pytest.raises(AdaptspecError, match="throughput is undefined"):
        measured_throughput(Outcome(tokens=[1, 2], rounds=[Round(1, 1, 0.0, 0.0)], decode_s=0.0))
    with pytest.raises(AdaptspecError, match="needs a latency profile"):
        reward_function("modelled")
    with pytest.raises(AdaptspecError, match="unknown reward 'speed'"):
        reward_function("speed")
    assert REWARDS == ("throughput", "token_latency", "modelled", "tau")


#: A profile whose passes cost, in closed form (n = block size x batch, c = context tokens):
#: draft 10 ms + 1 ms per token past the first + 1 us per context token per sequence (0 at B = 1);
#: verify 40 ms + 2 ms per token past the first + 10 ns per query-key pair.
TOY = LatencyProfile(
    "toy",
    draft=CostCurve((1,), (0.010,), tail_slope_s=0.001, per_context_s=1e-6),
    verify=CostCurve((1,), (0.040,), tail_slope_s=0.002, per_pair_s=1e-8),
    context_tokens=300,
)


def _toy_round_s(b: int, c: float, batch: int) -> float:
    n = b * batch
    draft = 0.0 if b == 1 else 0.010 + 0.001 * (n - 1) + 1e-6 * c * batch
    return draft + 0.040 + 0.002 * (n - 1) + 1e-8 * n * c


def test_modelled_throughput_is_tau_over_round_time_elementwise():
    tau = np.array([[1.0, 3.0, 6.5], [1.0, 2.0, 4.0]])
    b = np.array([1, 4, 16])
    ctx = np.array([[100.0], [3000.0]])
    got = modelled_throughput(tau, b, TOY, ctx, 4)
    want = np.array([[tau[i, j] / _toy_round_s(int(b[j]), ctx[i, 0], 4) for j in range(3)] for i in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert float(modelled_throughput(4.0, 8, TOY)) == pytest.approx(4.0 / _toy_round_s(8, 300, 1), rel=1e-12)
    np.testing.assert_allclose(throughput([10, 20], [0.5, 0.5]), [20, 40])


def test_trace_rewards_match_the_outcome_functions():
    """The simulator's reward matrix equals the controller's reward of the same outcome."""
    ts = generate("cpu-small", n_requests=6, seed=3)
    R = trace_rewards(ts, "throughput")
    taus = ts.outcomes.column("tau").to_pylist()
    dec = ts.outcomes.column("decode_ms").to_numpy()
    new = ts.outcomes.column("new_tokens").to_numpy()
    K = len(ts.arms)
    for row in range(0, 6 * K, 7):
        i, j = divmod(row, K)
        o = Outcome(
            tokens=[0] * int(new[row]),
            rounds=[Round(ts.arms[j], t, 0.0, 0.0) for t in taus[row]],
            decode_s=dec[row] / 1000,
        )
        assert R[i, j] == pytest.approx(measured_throughput(o))
        assert ts.tau_matrix()[i, j] == pytest.approx(mean_tau(o))
    M = trace_rewards(ts, "modelled", "cpu-smollm2-bf16")
    ctx = ts.prompt_tokens + ts.new_tokens_matrix()[:, 0] / 2
    p = get_profile("cpu-smollm2-bf16")
    np.testing.assert_allclose(M[:, 3], ts.tau_matrix()[:, 3] / p.round_s(ts.arms[3], ctx))
    np.testing.assert_array_equal(trace_rewards(ts, "tau"), ts.tau_matrix())


def test_trace_costs_and_missing_timings():
    ts = TraceSet.from_arrays(["a", "b"], ["x", "y"], [1, 4], np.array([[1.0, 3.0], [1.0, 2.0]]))
    assert trace_costs(ts) is None
    with pytest.raises(AdaptspecError, match="no measured decode times"):
        trace_rewards(ts, "throughput")
    with pytest.raises(AdaptspecError, match="needs --latency"):
        trace_rewards(ts, "modelled")
    tok, sec = trace_costs(ts, "cpu-smollm2-bf16")
    np.testing.assert_array_equal(tok, 1.0)  # unknown token counts: one per request
    np.testing.assert_allclose(tok / sec, trace_rewards(ts, "modelled", "cpu-smollm2-bf16"))
    syn = generate("cpu-small", n_requests=4, seed=0, per_round=False)
    tok, sec = trace_costs(syn)
    np.testing.assert_allclose(tok / sec, trace_rewards(syn, "throughput"))


def test_token_latency_follows_aggregate_throughput_and_reports_read_as_speed():
    from adaptspec.simulators.replay import replay

    # two requests of 48 tokens; arm 1 is very fast on the first and slow on the second, arm 2 steady
    secs = np.array([[0.5, 1.6], [3.0, 1.6]])
    ts = TraceSet.from_arrays(
        ["a", "b"],
        ["x", "x"],
        [1, 2],
        np.ones((2, 2)),
        new_tokens=np.full((2, 2), 48),
        decode_ms=secs * 1000,
        rounds=np.full((2, 2), 48),
    )
    tps, lat = trace_rewards(ts, "throughput"), trace_rewards(ts, "token_latency")
    assert (
        tps.mean(axis=0).argmax() == 0 and (96 / secs.sum(axis=0)).argmax() == 1
    )  # mean tok/s picks the slower arm
    assert lat.mean(axis=0).argmax() == 1  # minus ms/token picks the arm with the best aggregate throughput
    np.testing.assert_allclose(lat, -1000 * secs / 48)
    out = Outcome(tokens=[1] * 10, rounds=[Round(1, 1, 0.0, 0.01)] * 10, decode_s=0.2)
    assert reward_function("token_latency")(out) == pytest.approx(-20.0)
    rep = replay(ts, ["fixed:1", "fixed:2"], reward="token_latency", progress=False).to_json()
    by = {p["policy"]: p for p in rep["policies"]}
    # percentages of a cost read as speed: the oracle takes 0.5 + 1.6 s, fixed:2 3.2 s, fixed:1 3.5 s
    assert by["fixed:2"]["pct_oracle"] == pytest.approx(100 * 2.1 / 3.2)
    assert by["fixed:1"]["pct_best_fixed"] == pytest.approx(100 * 3.2 / 3.5)
    assert rep["best_fixed"]["block_size"] == 2
