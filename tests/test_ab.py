"""A/B analysis: the always-valid sequential test, per-variant figures, cross-variant OPE, replay, CLIs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from _controller_helpers import FakeSpeculator
from adaptspec import AdaptiveController, AdaptspecError
from adaptspec.cli import main
from adaptspec.simulators.ab import analyze, parse_ab_specs, rows_to_arrays, sequential_test, simulate_ab
from adaptspec.simulators.synthetic import generate


# ============================================================================ the sequential test
def test_type_one_error_holds_under_continuous_monitoring():
    # 300 A/A streams of 1,500 skewed rewards, looked at after every single request
    rng = np.random.default_rng(0)
    stopped_msprt = stopped_naive = 0
    for _ in range(300):
        g = rng.integers(0, 2, 1500)
        y = rng.gamma(2.0, 15.0, 1500)
        stopped_msprt += sequential_test(g, y).stopped_at is not None
        # what peeking with a plain t-test every 50 requests would do
        stopped_naive += any(stats.ttest_ind(y[:n][g[:n] == 0], y[:n][g[:n] == 1]).pvalue < 0.05
                             for n in range(100, 1501, 50))
    assert stopped_msprt / 300 <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 300)
    assert stopped_naive / 300 > 0.12  # the reason for an always-valid test


def test_detects_a_real_difference_and_names_the_winner():
    rng = np.random.default_rng(1)
    wins, stops = 0, []
    for _ in range(40):
        g = rng.integers(0, 2, 3000)
        y = rng.normal(30.0 + 1.5 * g, 5.0)  # 0.3 standard deviations
        t = sequential_test(g, y)
        if t.stopped_at is not None:
            stops.append(t.stopped_at)
            wins += t.winner == 1
    assert len(stops) >= 36 and wins == len(stops) and np.median(stops) < 1500


def test_always_valid_interval_covers_the_truth_and_is_wider_than_a_fixed_one():
    rng = np.random.default_rng(2)
    cover = 0
    for _ in range(100):
        g = rng.integers(0, 2, 800)
        y = rng.normal(10.0 - 0.5 * g, 3.0)
        t = sequential_test(g, y)
        cover += t.ci[0] <= 0.5 <= t.ci[1]
        fixed = stats.norm.ppf(0.975) * math.sqrt(np.var(y[g == 0], ddof=1) / t.n[0] + np.var(y[g == 1], ddof=1) / t.n[1])
        assert (t.ci[1] - t.ci[0]) / 2 > fixed
    assert cover >= 95


def test_sequential_test_edge_cases():
    t = sequential_test(np.array([0, 1] * 4), np.arange(8.0))  # fewer than min_n: nothing tested
    assert t.stopped_at is None and t.p_value == 1.0 and t.ci == (-math.inf, math.inf)
    assert sequential_test(np.array([], int), np.array([])).n == (0, 0)
    p = sequential_test(np.tile([0, 1], 200), np.tile([5.0, 5.0], 200) + np.arange(400) * 1e-9).p_path
    assert np.all(np.diff(p) <= 0)  # the always-valid p never goes back up
    with pytest.raises(AdaptspecError, match="0 or 1"):
        sequential_test(np.array([0, 2]), np.array([1.0, 2.0]))
    with pytest.raises(AdaptspecError, match="not finite"):
        sequential_test(np.array([0, 1]), np.array([1.0, np.nan]))
    with pytest.raises(AdaptspecError, match="alpha"):
        sequential_test(np.array([0, 1]), np.array([1.0, 2.0]), alpha=1.5)


# ============================================================================ the report
def synthetic_rows(n=600, seed=0):
    """A log of two variants: A random over 3 arms, B fixed at arm 8; reward depends on the arm."""
    rng = np.random.default_rng(seed)
    arms = [2, 4, 8]
    mu = {2: 20.0, 4: 30.0, 8: 25.0}
    rows = []
    for i in range(n):
        v = "A" if rng.random() < 0.5 else "B"
        b = int(rng.choice(arms)) if v == "A" else 8
        probs = [1 / 3] * 3 if v == "A" else [0.0, 0.0, 1.0]
        tok = 32
        r = mu[b] + rng.normal(0, 4)
        rows.append({"decision_id": f"d{i}", "time": 1.7e9 + i, "variant": v, "policy": "random" if v == "A" else "fixed:8",
                     "block_size": b, "propensity": probs[arms.index(b)], "probs": probs, "arms": arms,
                     "reward": r, "new_tokens": tok, "decode_ms": 1000 * tok / r, "mean_tau": 1.0 + b / 8,
                     "features": [float(rng.normal()), 1.0]})
    return rows, mu


def test_report_figures_match_direct_computation():
    rows, _ = synthetic_rows()
    rows.append({**rows[0], "decision_id": "x", "reward": None, "time": 1.8e9})  # feedback never came
    data = rows_to_arrays(rows)
    rep = analyze(data)
    for v in ("A", "B"):
        mine = [r for r in rows if r["variant"] == v and r["reward"] is not None]
        s = rep["variants"][v]
        assert s["reward"]["mean"] == pytest.approx(np.mean([r["reward"] for r in mine]), rel=1e-6)
        lo, hi = s["reward"]["ci"]
        assert lo < s["reward"]["mean"] < hi
        timed = [r for r in rows if r["variant"] == v]  # every row has tokens and a latency
        tput = sum(r["new_tokens"] for r in timed) / sum(r["decode_ms"] / 1000 for r in timed)
        assert s["throughput"]["tokens_per_s"] == pytest.approx(tput, rel=1e-5)
        lat = [r["decode_ms"] for r in timed]
        assert s["latency_ms"]["p50"] == pytest.approx(np.median(lat), rel=1e-6)
        assert s["latency_ms"]["p50_ci"][0] <= s["latency_ms"]["p50"] <= s["latency_ms"]["p50_ci"][1]
    assert rep["variants"]["A"]["decisions"] == sum(r["variant"] == "A" for r in rows)
    assert rep["variants"]["B"]["block_sizes"] == {"8": sum(r["variant"] == "B" for r in rows)}
    (t,) = rep["sequential"]["tests"]
    assert t["n"]["A"] + t["n"]["B"] == 600 and t["diff_of"] == "A - B"


def test_off_policy_estimates_across_variants():
    from adaptspec.policies import Fixed

    rows, mu = synthetic_rows(n=3000)
    data = rows_to_arrays(rows)
    arms = (2, 4, 8)
    rep = analyze(data, policies={"A": Fixed(4, arms=arms), "B": Fixed(8, arms=arms)}, n_boot=100)
    est = {(e["target"], e["logged_by"]): e for e in rep["off_policy"]}
    # "always 8" evaluated on A's uniformly random log: full support, close to the truth (25)
    e = est[("B", "A")]
    assert e["support"] == pytest.approx(1.0)
    assert e["estimates"]["snips"]["value"] == pytest.approx(mu[8], abs=1.0)
    lo, hi = e["estimates"]["snips"]["ci"]
    assert lo < mu[8] < hi
    # "always 4" on B's log (always 8): no support, and the report says so
    e = est[("A", "B")]
    assert e["support"] == 0.0 and "never plays" in e["note"]


def test_rows_from_parts_and_journals_are_ordered_by_time():
    from datetime import datetime, timezone

    rows, _ = synthetic_rows(n=4)
    rows[2]["time"] = datetime.fromtimestamp(1.6e9, tz=timezone.utc)  # parquet rows carry datetimes
    data = rows_to_arrays(rows)
    assert data["time"][0] == 1.6e9 and list(data["variant"]) == [rows[i]["variant"] for i in (2, 0, 1, 3)]


# ============================================================================ offline A/B replay
def test_parse_ab_specs():
    assert parse_ab_specs("A=fixed:16,B=ucb") == {"A": "fixed:16", "B": "ucb"}
    assert parse_ab_specs("ctl=linucb:alpha=0.5,lam=2,new=neural-linear:head=h,prior_n=64") == {
        "ctl": "linucb:alpha=0.5,lam=2", "new": "neural-linear:head=h,prior_n=64"}
    assert parse_ab_specs("A=fixed:4;B=fixed:8") == {"A": "fixed:4", "B": "fixed:8"}
    for bad, msg in (("A=fixed:16", "exactly two"), ("fixed:16,ucb", "NAME=SPEC"), ("A=ucb,A=ts", "twice")):
        with pytest.raises(AdaptspecError, match=msg):
            parse_ab_specs(bad)


@pytest.fixture(scope="module")
def cpu_small():
    """The synthetic cpu-small scenario, where LinUCB is known to beat fixed:16."""
    return generate("cpu-small", n_requests=300, seed=0, per_round=False, progress=False)


def test_simulate_ab_stops_and_picks_the_better_policy(cpu_small):
    traces = cpu_small
    sim = simulate_ab(traces, {"A": "fixed:16", "B": "linucb"}, reward="throughput", seeds=[0, 1, 2], n_steps=2000)
    assert sim["better"] == "B" and sim["true_difference"] < 0
    assert sim["stopped"] == 3 and sim["correct"] == 3 and sim["wrong"] == 0
    assert all(d["stopped_at"] < 2000 and d["winner"] == "B" for d in sim["seeds"])
    # A/A: the same policy twice rarely "wins" (type I error)
    aa = simulate_ab(traces, {"A": "fixed:8", "B": "fixed:8"}, reward="throughput", seeds=range(10), n_steps=1500)
    assert aa["stopped"] <= 2
    with pytest.raises(AdaptspecError, match="every arm"):
        simulate_ab(traces, {"A": "oracle", "B": "fixed:8"}, n_steps=100)


def test_simulate_cli_ab(cpu_small, tmp_path, capsys):
    ts = str(cpu_small.write(tmp_path / "cpu-small"))
    assert main(["simulate", ts, "--ab", "A=fixed:16,B=ucb", "--seeds", "2", "--order", "shuffled", "--steps", "1500",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"ab"} and out["ab"]["better"] == "B" and len(out["ab"]["seeds"]) == 2
    assert main(["simulate", ts, "--ab", "A=fixed:16,B=ucb", "--steps", "300"]) == 0
    text = capsys.readouterr().out
    assert "stopped in" in text and "true value on the whole stream" in text
    assert main(["simulate", "--ab", "A=fixed:16,B=ucb", "--policy", "ucb"]) == 2
    assert "--policy does not apply" in capsys.readouterr().err
    assert main(["simulate", "--ab", "A=fixed:16,B=ucb", "--ab-split", "1.5"]) == 2
    assert "--ab-split" in capsys.readouterr().err


# ============================================================================ ab-report on a controller's log
def test_ab_report_cli_on_a_served_log(tmp_path, capsys):
    spec = FakeSpeculator()
    log, ck = tmp_path / "log", tmp_path / "ck"
    a = AdaptiveController(spec, "random:epsilon=0", variant="A", log_dir=log, checkpoint_dir=ck / "A", roll_rows=25)
    b = AdaptiveController(spec, "fixed:2", variant="B", log_dir=log, checkpoint_dir=ck / "B", roll_rows=25)
    for i in range(120):
        (a if i % 2 else b).generate([i % 13 + 1, i % 7 + 20, i], max_new_tokens=24)
    a.close()
    b.checkpoint()  # B still running: its last rows are in the journal only
    assert main(["ab-report", str(log), "--checkpoint-dir", str(ck), "--json", "--bootstrap", "50"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["decisions"] == 120 and set(rep["variants"]) == {"A", "B"}
    assert rep["variants"]["B"]["block_sizes"] == {"2": 60}
    (t,) = rep["sequential"]["tests"]
    assert t["n"] == {"A": 60, "B": 60}
    est = {(e["target"], e["logged_by"]): e for e in rep["off_policy"]}
    assert est[("B", "A")]["support"] == pytest.approx(1.0) and "estimates" in est[("B", "A")]
    assert main(["ab-report", str(log), "--policy", "B=fixed:4"]) == 0
    assert "sequential test A vs B" in capsys.readouterr().out
    b.close()
    assert main(["ab-report", str(tmp_path / "nope")]) == 2
    assert main(["ab-report", str(log), "--alpha", "2"]) == 2
    assert "--alpha" in capsys.readouterr().err
