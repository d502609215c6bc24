"""A/B: the report of a served log (per-variant figures, tests, cross-variant OPE), the offline replay, the CLIs.

The sequential test and the intervals themselves are tested in test_statistics.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from _controller_helpers import FakeSpeculator
from adaptspec import AdaptiveController, AdaptspecError
from adaptspec.ab.variants import parse_ab_specs
from adaptspec.analysis.ab import analyze, rows_to_arrays
from adaptspec.analysis.statistics import sequential_test
from adaptspec.cli import main
from adaptspec.simulators.ab import simulate_ab
from adaptspec.simulators.synthetic import generate


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
        rows.append(
            {
                "decision_id": f"d{i}",
                "time": 1.7e9 + i,
                "variant": v,
                "policy": "random" if v == "A" else "fixed:8",
                "block_size": b,
                "propensity": probs[arms.index(b)],
                "probs": probs,
                "arms": arms,
                "reward": r,
                "new_tokens": tok,
                "decode_ms": 1000 * tok / r,
                "mean_tau": 1.0 + b / 8,
                "features": [float(rng.normal()), 1.0],
            }
        )
    return rows, mu


def test_report_figures_match_direct_computation():
    rows, _ = synthetic_rows()
    rows.append({**rows[0], "decision_id": "x", "reward": None, "time": 1.8e9})  # feedback never came
    data = rows_to_arrays(rows)
    rep = analyze(data).to_json()
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


def test_report_tests_are_the_sequential_test_of_the_arrival_stream():
    rows, _ = synthetic_rows(n=800, seed=3)
    rows = rows[::-1]  # the report orders rows by time itself
    rep = analyze(rows_to_arrays(rows), alpha=0.01, tau_sd=0.3, min_n=20)
    by_time = sorted(rows, key=lambda r: r["time"])
    g = np.array([r["variant"] == "B" for r in by_time], dtype=np.int64)
    want = sequential_test(g, np.array([r["reward"] for r in by_time]), alpha=0.01, tau_sd=0.3, min_n=20)
    (t,) = rep.tests
    assert t["n"] == {"A": want.n[0], "B": want.n[1]} and t["stopped_at"] == want.stopped_at
    assert t["p_value"] == pytest.approx(want.p_value, rel=1e-5, abs=1e-6) and t["alpha"] == 0.01
    assert rep.to_json()["sequential"]["tau_sd"] == 0.3 and rep.to_json()["sequential"]["min_n"] == 20


def test_report_as_json_and_text():
    rows, _ = synthetic_rows(n=60)
    rows += [
        {**rows[0], "decision_id": "c", "variant": "C", "reward": None, "mean_tau": None, "decode_ms": None}
    ]
    rep = analyze(rows_to_arrays(rows))
    doc = rep.to_json()
    json.dumps(doc, allow_nan=False)  # a variant with no reward and no latency: nulls, not NaN
    assert doc["variants"]["C"]["reward"] == {"mean": None, "ci": None} and "off_policy" not in doc
    assert [(t["n"] and list(t["n"])) for t in doc["sequential"]["tests"]] == [
        ["A", "B"],
        ["A", "C"],
        ["B", "C"],
    ]
    text = rep.to_text()
    assert "| variant | decisions | reward |" in text and "| C | 1 |" in text
    assert text.count("sequential test ") == 3
    rep.logs = ["/x/r0", "/x/r1"]
    assert rep.to_json()["log"] == "/x" and rep.to_json()["logs"] == ["/x/r0", "/x/r1"]


def test_off_policy_estimates_across_variants():
    from adaptspec.policies import Fixed

    rows, mu = synthetic_rows(n=3000)
    data = rows_to_arrays(rows)
    arms = (2, 4, 8)
    rep = analyze(data, policies={"A": Fixed(4, arms=arms), "B": Fixed(8, arms=arms)}, n_boot=100).to_json()
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
        "ctl": "linucb:alpha=0.5,lam=2",
        "new": "neural-linear:head=h,prior_n=64",
    }
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
    sim = simulate_ab(
        traces, {"A": "fixed:16", "B": "linucb"}, reward="throughput", seeds=[0, 1, 2], n_steps=2000
    ).to_json()
    assert sim["better"] == "B" and sim["true_difference"] < 0
    assert sim["stopped"] == 3 and sim["correct"] == 3 and sim["wrong"] == 0
    assert all(d["stopped_at"] < 2000 and d["winner"] == "B" for d in sim["seeds"])
    # A/A: the same policy twice rarely "wins" (type I error)
    aa = simulate_ab(
        traces, {"A": "fixed:8", "B": "fixed:8"}, reward="throughput", seeds=range(10), n_steps=1500
    )
    assert aa.stopped <= 2
    with pytest.raises(AdaptspecError, match="every arm"):
        simulate_ab(traces, {"A": "oracle", "B": "fixed:8"}, n_steps=100)


def test_simulate_ab_truth_of_fixed_policies_is_the_column_mean():
    from adaptspec.traces import TraceSet

    rng = np.random.default_rng(7)
    tau = np.column_stack([rng.uniform(1.0, 2.0, 300), rng.uniform(1.0, 4.0, 300)])
    ts = TraceSet.from_arrays([f"r{i}" for i in range(300)], ["chat"] * 300, [2, 4], tau)
    sim = simulate_ab(ts, {"A": "fixed:2", "B": "fixed:4"}, order="logged", seeds=[0, 1])
    assert sim.true_value["A"] == pytest.approx(tau[:, 0].mean()) and sim.true_value["B"] == pytest.approx(
        tau[:, 1].mean()
    )
    assert sim.better == "B"
    for (
        run
    ) in sim.runs:  # each variant is paid from its own column on the requests routed to it (seeded split)
        to_b = np.random.default_rng([run["seed"], 99]).random(300) >= 0.5
        assert run["mean"]["A"] == pytest.approx(tau[~to_b, 0].mean(), rel=1e-6)
        assert run["mean"]["B"] == pytest.approx(tau[to_b, 1].mean(), rel=1e-6)
    text = sim.to_text()
    assert "| seed | requests | stopped at |" in text and f"stopped in {sim.stopped}/2 runs" in text


def test_simulate_cli_ab(cpu_small, tmp_path, capsys):
    ts = str(cpu_small.write(tmp_path / "cpu-small"))
    assert (
        main(
            [
                "simulate",
                ts,
                "--ab",
                "A=fixed:16,B=ucb",
                "--seeds",
                "2",
                "--order",
                "shuffled",
                "--steps",
                "1500",
                "--json",
            ]
        )
        == 0
    )
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
    a = AdaptiveController(
        spec, "random:epsilon=0", variant="A", log_dir=log, checkpoint_dir=ck / "A", roll_rows=25
    )
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
