"""Synthetic scenarios: determinism, calibration, structure a contextual policy can exploit."""

from __future__ import annotations

import numpy as np
import pytest

from adaptspec.costs.latency import get_profile
from adaptspec.errors import AdaptspecError
from adaptspec.reward.functions import trace_rewards
from adaptspec.simulators.synthetic import SCENARIOS, expected_tau, generate
from adaptspec.traces import TraceSet


@pytest.fixture(scope="module")
def cpu():
    return generate("cpu-small", n_requests=1500, seed=0, per_round=False)


@pytest.fixture(scope="module")
def gpu():
    return generate("dflash-gpu", n_requests=600, seed=0, per_round=False)


def per_domain(ts, M):
    dom = ts.domains.astype(str)
    return {d: M[dom == d].mean(axis=0) for d in np.unique(dom)}


def test_deterministic_under_a_seed():
    a = generate("cpu-small", n_requests=30, seed=3)
    b = generate("cpu-small", n_requests=30, seed=3)
    c = generate("cpu-small", n_requests=30, seed=4)
    assert a.outcomes.equals(b.outcomes) and a.requests.equals(b.requests)
    assert not np.array_equal(a.tau_matrix(), c.tau_matrix())


def test_per_round_lists_are_consistent_and_timed_by_the_profile(tmp_path):
    ts = generate("cpu-small", n_requests=20, seed=1)
    back = TraceSet.read(ts.write(tmp_path / "s"))  # passes every validation check
    assert back.outcomes.column("tau").type.value_type.bit_width == 32
    taus = back.outcomes.column("tau").to_pylist()
    bs = back.outcomes.column("block_size").to_numpy()
    new = back.outcomes.column("new_tokens").to_numpy()
    assert all(1 <= min(t) and max(t) <= b and sum(t) == n - 1 for t, b, n in zip(taus, bs, new))
    ver = back.outcomes.column("verify_ms").to_pylist()
    p = get_profile("cpu-smollm2-bf16")
    row = int(np.flatnonzero(bs == 16)[0])
    pt = back.prompt_tokens[row // len(back.arms)]
    ctx = pt + 1 + np.concatenate([[0], np.cumsum(taus[row])[:-1]])
    ratio = np.asarray(ver[row]) / (1000 * p.verify_s(16, ctx))
    assert 0.85 < ratio.mean() < 1.15
    assert np.all(back.tau_matrix()[:, 0] == 1.0)


def test_cpu_small_is_calibrated_to_this_machine(cpu):
    tau = per_domain(cpu, cpu.tau_matrix())
    j16 = cpu.arms.index(16)
    assert 2.9 < tau["math"][j16] < 3.8 and 1.6 < tau["code"][j16] < 2.1
    for d in ("prose", "lists", "chat"):
        assert 1.15 < tau[d][j16] < 1.45
    thr = per_domain(cpu, trace_rewards(cpu, "throughput"))
    best = {d: cpu.arms[int(np.argmax(v))] for d, v in thr.items()}
    assert best["chat"] <= 2 and best["prose"] <= 4 and best["math"] >= 6
    assert len(set(best.values())) >= 3  # different block sizes win in different domains


def test_dflash_gpu_is_calibrated_to_published_figures(gpu):
    tau = per_domain(gpu, gpu.tau_matrix())
    j16 = gpu.arms.index(16)
    assert 7.0 < tau["math"][j16] < 8.5 and 3.8 < tau["chat"][j16] < 4.8
    assert 6.0 < tau["gsm8k"][j16] < 7.0
    assert tau["gsm8k"][gpu.arms.index(32)] < 0.75 * tau["gsm8k"][j16]  # drafter trained at 16
    thr = per_domain(gpu, trace_rewards(gpu, "modelled", "h100-qwen3-8b"))
    assert gpu.arms[int(np.argmax(thr["chat"]))] < gpu.arms[int(np.argmax(thr["math"]))]


def test_features_carry_domain_and_request_skill(cpu):
    X = cpu.features.astype(np.float64)
    skill = cpu.column("skill")
    A = np.column_stack([X, np.ones(len(X))])
    fit = A @ np.linalg.lstsq(A, skill, rcond=None)[0]
    assert np.corrcoef(fit, skill)[0, 1] > 0.8
    # within a domain the best block size moves with the skill: per-domain policies leave gains
    R = trace_rewards(cpu, "throughput")
    math = cpu.domains == "math"
    best = np.asarray(cpu.arms)[np.argmax(R[math], axis=1)]
    assert np.corrcoef(best, skill[math])[0, 1] > 0.3
    per_dom = sum(v.max() * np.sum(cpu.domains == d) for d, v in per_domain(cpu, R).items()) / len(cpu)
    assert R.max(axis=1).mean() > 1.03 * per_dom > 1.03 * R.mean(axis=0).max()


def test_expected_tau_is_the_ground_truth(cpu):
    et = cpu.outcomes.column("expected_tau").to_numpy().reshape(len(cpu), -1)
    np.testing.assert_allclose(cpu.tau_matrix().mean(axis=0), et.mean(axis=0), atol=0.05)
    assert float(expected_tau(np.log(np.full(3, 9.0)))) == pytest.approx(1 + 0.9 + 0.81 + 0.729)
    assert float(expected_tau(np.zeros(0))) == 1.0


def test_drift_moves_the_domain_mix():
    ts = generate("cpu-small", n_requests=1000, seed=0, per_round=False, drift=True)
    d = ts.domains
    early, late = d[:250], d[-250:]
    assert np.mean(early == "math") > 2 * np.mean(late == "math")
    assert np.mean(late == "chat") > 2 * np.mean(early == "chat")


def test_options_and_errors():
    ts = generate("dflash-gpu", n_requests=5, seed=0, arms=[1, 16, 8], dim=6, per_round=False)
    assert ts.arms == (1, 8, 16) and ts.features.shape == (5, 6) and "tau" not in ts.outcomes.column_names
    with pytest.raises(AdaptspecError, match="unknown scenario 'tpu'"):
        generate("tpu")
    with pytest.raises(AdaptspecError, match="n_requests must be >= 1"):
        generate("cpu-small", n_requests=0)
    assert set(SCENARIOS) == {"cpu-small", "dflash-gpu"}


def test_same_seed_same_trace_set():
    a, b = generate("cpu-small", n_requests=40, seed=0), generate("cpu-small", n_requests=40, seed=0)
    assert a.arms == (1, 2, 4, 6, 8, 10, 12, 16, 20, 24)
    np.testing.assert_array_equal(a.tau_matrix(), b.tau_matrix())
    np.testing.assert_allclose(a.decode_s_matrix(), b.decode_s_matrix())
    np.testing.assert_array_equal(a.features, b.features)
