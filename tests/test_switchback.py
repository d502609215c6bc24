"""Switchback A/B in the batched server: the slice schedule, the slice records, their analysis,
and a served test over the tiny model (adaptspec/serving/engine/switchback.py, traces/slice_log.py,
analysis/switchback.py)."""

from __future__ import annotations

import json
import math
import threading
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from adaptspec.analysis.switchback import analyze_slices
from adaptspec.batching.records import RoundRecord
from adaptspec.cli import main
from adaptspec.errors import AdaptspecError
from adaptspec.serving.engine.switchback import SliceRule, Switchback, slice_variant
from adaptspec.traces.slice_log import SliceLogWriter, slice_rows


# ============================================================================ the schedule
@pytest.mark.parametrize("variants", [("A", "B"), ("x", "y", "z")])
def test_every_block_of_k_slices_holds_each_variant_once(variants):
    k = len(variants)
    for seed in range(20):
        seq = [slice_variant(variants, seed, i) for i in range(40 * k)]
        for b in range(40):
            assert sorted(seq[b * k : (b + 1) * k]) == sorted(variants)


def test_the_schedule_is_reproducible_from_its_seed_and_random_across_seeds():
    seq = lambda seed: [slice_variant(("A", "B"), seed, i) for i in range(64)]  # noqa: E731
    assert seq(7) == seq(7)
    assert len({tuple(seq(s)) for s in range(10)}) == 10
    # the order within a block is a fair coin: over 2,000 (seed, block) pairs, A first about half the time
    firsts = [slice_variant(("A", "B"), s, 2 * b) for s in range(100) for b in range(20)]
    share = firsts.count("A") / len(firsts)
    assert abs(share - 0.5) < 4 * math.sqrt(0.25 / len(firsts))
    # and every order of 3 variants is about equally likely (chi-square, 5 df)
    orders = Counter(
        tuple(slice_variant(("x", "y", "z"), s, 3 * b + j) for j in range(3))
        for s in range(100)
        for b in range(12)
    )
    assert len(orders) == 6 and stats.chisquare(list(orders.values())).pvalue > 0.001


def test_a_switchback_needs_two_variants_and_a_positive_slice_length():
    with pytest.raises(AdaptspecError, match="at least 2 distinct variants"):
        Switchback(("A",))
    with pytest.raises(AdaptspecError, match="slice_rounds must be an int >= 1"):
        Switchback(("A", "B"), slice_rounds=0)


# ============================================================================ the slice records
def _round(requests, taus, round_s=0.1, join_s=0.0):
    return RoundRecord(
        requests=tuple(requests),
        block_sizes=tuple(taus),
        taus=tuple(taus),
        draft_s=0.0,
        verify_s=round_s,
        round_s=round_s,
        join_s=join_s,
    )


def test_slices_cut_rounds_at_multiples_of_n_and_count_carried_rows(tmp_path):
    sb = Switchback(("A", "B"), slice_rounds=3, seed=4, writer=SliceLogWriter(tmp_path, run="t"))
    # request 1 joins in slice 0 and decodes 5 rounds (2 of them in slice 1); request 2 joins in round 3
    plan = [
        ((1,), (2,)),
        ((1,), (3,)),
        ((1,), (1,)),
        ((1, 2), (2, 4)),
        ((1, 2), (1, 1)),
        ((2,), (2,)),
        ((2,), (3,)),
    ]
    assigned = []
    for r, (reqs, taus) in enumerate(plan):
        if r in (0, 3):
            assigned.append(sb.assign(f"req{len(assigned) + 1}"))
        sb.after_round(_round(reqs, taus, round_s=0.1 * (r + 1)), 0.1 * (r + 1))
    sb.close()
    recs = slice_rows(tmp_path)
    assert [r["slice"] for r in recs] == [0, 1, 2] and [r["complete"] for r in recs] == [True, True, False]
    assert [r["variant"] for r in recs] == [slice_variant(("A", "B"), 4, i) for i in range(3)]
    assert assigned == [recs[0]["variant"], recs[1]["variant"]]
    assert [r["requests"] for r in recs] == [["req1"], ["req2"], []]
    assert [(r["first_round"], r["last_round"], r["rounds"]) for r in recs] == [
        (0, 2, 3),
        (3, 5, 3),
        (6, 6, 1),
    ]
    assert [r["tokens"] for r in recs] == [6, 10, 3]
    assert [r["row_rounds"] for r in recs] == [3, 5, 1]
    assert [r["carried_row_rounds"] for r in recs] == [
        0,
        2,
        1,
    ]  # request 1 in rounds 3-4, request 2 in round 6
    assert recs[1]["decode_s"] == pytest.approx(0.4 + 0.5 + 0.6)
    assert recs[1]["round_carried"] == [1, 1, 0]


def test_the_slice_log_survives_a_torn_last_line_and_refuses_a_bad_one_inside(tmp_path):
    w = SliceLogWriter(tmp_path, run="a")
    w.append({"slice": 0, "variant": "A"})
    w.close()
    with open(w.file, "a") as f:
        f.write('{"slice": 1, "variant": "B", "rou')  # the crash case: the write never finished
    assert [r["slice"] for r in slice_rows(tmp_path)] == [0]
    with open(w.file, "a") as f:
        f.write('\n{"slice": 2, "variant": "A"}\n')  # the torn line is no longer the last one
    with pytest.raises(AdaptspecError, match="line 2 is not valid JSON"):
        slice_rows(tmp_path)
    with pytest.raises(AdaptspecError, match="already exists"):
        SliceLogWriter(tmp_path, run="a")


def test_a_decision_log_with_slice_records_is_still_one_a_server_may_log_into(tmp_path):
    from adaptspec.cli._types import log_dir

    (tmp_path / ".writer-A.lock").write_text("")
    SliceLogWriter(tmp_path).close()
    assert log_dir(str(tmp_path)) == tmp_path


class _Rule:
    def __init__(self, b):
        self.b, self.name, self.busy_s, self.fed = b, f"fixed:{b}", 0.0, 0

    def choose(self, rows):
        return [self.b] * len(rows)

    def feedback(self, record, shares, handles):
        self.fed += 1


def test_the_slices_variant_rule_sets_the_rounds_block_sizes():
    class Row:
        class handle:
            block_size = 8

    sb = Switchback(("A", "B"), slice_rounds=2, seed=0)
    rules = {"A": _Rule(2), "B": None}
    sr = SliceRule(sb, rules)
    got = []
    for r in range(8):
        got.append((sb.variant, sr.choose([Row, Row])[0]))
        sr.feedback(None, [], [])
        sb.after_round(_round((1,), (1,)), 0.1)
    assert got == [(v, 2 if v == "A" else 8) for v, _ in got]
    assert [v for v, _ in got] == [slice_variant(("A", "B"), 0, r // 2) for r in range(8)]
    assert rules["A"].fed == sum(v == "A" for v, _ in got)
    with pytest.raises(AdaptspecError, match="unknown variant 'C'"):
        SliceRule(sb, {"C": _Rule(1)})


# ============================================================================ the analysis
def _records(rng, variant, n, mean, d=None, rounds=4):
    """``n`` complete slices of ``variant``: per round, tokens ~ Poisson(mean * seconds)."""
    out = []
    for _ in range(n):
        sec = np.full(rounds, 0.05) if d is None else rng.uniform(0.02, d, rounds)
        tok = rng.poisson(mean * sec)
        out.append(
            {
                "variant": variant,
                "complete": True,
                "round_tokens": tok.tolist(),
                "round_decode_s": sec.tolist(),
                "round_rows": [3] * rounds,
                "round_carried": [0] * rounds,
            }
        )
    return out


def test_with_equal_slice_times_the_interval_is_welchs_on_per_slice_throughput():
    rng = np.random.default_rng(1)
    recs = _records(rng, "A", 9, 400.0) + _records(rng, "B", 13, 300.0)
    rep = analyze_slices(recs)
    y = {
        v: np.asarray([sum(r["round_tokens"]) / sum(r["round_decode_s"]) for r in recs if r["variant"] == v])
        for v in "AB"
    }
    t = stats.ttest_ind(y["A"], y["B"], equal_var=False)
    lo, hi = t.confidence_interval(0.95)
    c = rep["comparisons"][0]
    assert (c["a"], c["b"]) == ("A", "B")
    assert c["diff"] == pytest.approx(y["A"].mean() - y["B"].mean(), abs=1e-5)
    assert c["diff_ci"] == pytest.approx([lo, hi], abs=1e-5)
    assert c["p_value"] == pytest.approx(t.pvalue, abs=1e-6)
    for v in "AB":
        m, sem = y[v].mean(), stats.sem(y[v])
        assert rep["variants"][v]["ci"] == pytest.approx(
            list(stats.t.interval(0.95, len(y[v]) - 1, m, sem)), abs=1e-5
        )


def test_with_unequal_slice_times_the_intervals_are_welchs_on_the_linearised_slices():
    rng = np.random.default_rng(2)
    recs = _records(rng, "A", 11, 400.0, d=0.2) + _records(rng, "B", 8, 330.0, d=0.2)
    rep = analyze_slices(recs)
    lin, loglin = {}, {}
    for v in "AB":
        T = np.asarray([sum(r["round_tokens"]) for r in recs if r["variant"] == v], dtype=float)
        D = np.asarray([sum(r["round_decode_s"]) for r in recs if r["variant"] == v])
        R = T.sum() / D.sum()
        assert rep["variants"][v]["tokens_per_s"] == pytest.approx(R, abs=1e-5)
        lin[v] = R + (T - R * D) / D.mean()  # values whose mean is R and whose spread is the delta method's
        loglin[v] = math.log(R) + (T - R * D) / (D.mean() * R)
    c = rep["comparisons"][0]
    assert c["diff_ci"] == pytest.approx(
        list(stats.ttest_ind(lin["A"], lin["B"], equal_var=False).confidence_interval(0.95)), abs=1e-5
    )
    lo, hi = stats.ttest_ind(loglin["A"], loglin["B"], equal_var=False).confidence_interval(0.95)
    assert c["ratio_ci"] == pytest.approx([math.exp(lo), math.exp(hi)], abs=1e-5)
    assert c["ratio"] == pytest.approx(
        rep["variants"]["A"]["tokens_per_s"] / rep["variants"]["B"]["tokens_per_s"], abs=1e-5
    )


def test_the_difference_interval_covers_the_truth_about_95_percent_of_the_time():
    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(400):
        recs = _records(rng, "A", 10, 400.0, d=0.1) + _records(rng, "B", 10, 300.0, d=0.1)
        lo, hi = analyze_slices(recs)["comparisons"][0]["diff_ci"]
        hits += lo <= 100.0 <= hi
    assert 0.92 <= hits / 400 <= 0.98  # binomial sd at 0.95 and 400 draws: 0.011


def test_burn_in_drops_each_slices_first_rounds_and_incomplete_slices_are_left_out():
    recs = [
        {
            "variant": v,
            "complete": True,
            "round_tokens": [99, 99, t, t],
            "round_decode_s": [1.0, 1.0, 0.5, 0.5],
            "round_rows": [4, 4, 2, 2],
            "round_carried": [4, 2, 0, 0],
        }
        for v, t in [("A", 10), ("B", 5), ("A", 12), ("B", 6), ("A", 11), ("B", 4)]
    ]
    recs.append({"variant": "A", "complete": False, "round_tokens": [1000], "round_decode_s": [0.1]})
    rep = analyze_slices(recs, burn_in=2)
    assert rep["variants"]["A"]["tokens_per_s"] == pytest.approx((20 + 24 + 22) / 3.0)
    assert rep["variants"]["B"]["tokens_per_s"] == pytest.approx((10 + 12 + 8) / 3.0)
    assert rep["variants"]["A"]["carried_share"] == 0.0
    assert rep["slices"] == {"used": 6, "incomplete": 1, "too_short": 0}
    whole = analyze_slices(recs)
    assert whole["variants"]["A"]["carried_share"] == pytest.approx(6 / 12)
    assert analyze_slices(recs, burn_in=4)["slices"]["too_short"] == 6


# ============================================================================ served, in process
def test_cli_refuses_a_switchback_it_cannot_run_in_one_line(capsys, tmp_path):
    base = ["serve", "--tiny", "--port", "0", "--variant", "A=fixed:1", "--variant", "B=fixed:4"]
    for argv, needle in [
        (["--ab-design", "switchback"], "needs --log-dir"),
        (
            ["--slice-rounds", "8", "--log-dir", str(tmp_path / "l")],
            "--slice-rounds needs --ab-design switchback",
        ),
        (
            ["--ab-design", "switchback", "--log-dir", str(tmp_path / "l"), "--split", "60,40"],
            "--split does not apply",
        ),
    ]:
        assert main([*base, *argv]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1
    assert (
        main(
            ["serve", "--tiny", "--port", "0", "--ab-design", "switchback", "--log-dir", str(tmp_path / "l")]
        )
        == 2
    )
    assert "needs at least 2 --variant" in capsys.readouterr().err


def test_a_served_switchback_gives_each_request_its_slices_variant_and_ab_report_reads_the_slices(
    tmp_path, capsys
):
    import torch
    from fastapi.testclient import TestClient

    from adaptspec.load_rules import Fixed
    from adaptspec.serving import CompletionService, ServerLimits
    from adaptspec.serving.app import create_app
    from adaptspec.serving.engine.batched import EngineSettings
    from adaptspec.serving.tiny import tiny_speculator
    from adaptspec.traces.log_writer import log_rows

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        spec, codec = tiny_speculator(0, verification="exact")
        log = tmp_path / "log"
        svc = CompletionService.build(
            spec,
            {"A": "fixed:1", "B": "fixed:4"},
            codec=codec,
            log_dir=log,
            limits=ServerLimits(max_context=512, vocab_size=128, max_tokens=64),
            arms=[1, 2, 4],
            # B's slices run under a per-round rule (at most 2), A's under none
            engine=EngineSettings(
                max_rows=3, design="switchback", slice_rounds=3, seed=5, rule={"B": Fixed(2), "A": None}
            ),
        )
        loop = svc.runner.loop
        prompts = [
            "Hello there",
            "def f(x):",
            "1 + 1 =",
            "Once upon",
            "The quick",
            "Q: why?",
            "abc",
            "xyz",
            "ok",
            "no",
        ]
        got = {}
        with TestClient(create_app(svc)) as client:

            def one(i, p):
                body = {"prompt": p, "max_tokens": 6 + (i % 3) * 4}
                if i == 0:
                    body["variant"] = "A"  # named, but the slice decides
                r = client.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                got[i] = r.json()["adaptspec"]

            ths = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts)]
            for t in ths:
                t.start()
            for t in ths:
                t.join(120)
            history = list(loop.engine.history)
        # closed: the slice in progress is written too
        recs = slice_rows(log)
        rows = {r["request_id"]: r for r in log_rows(log)}
    finally:
        torch.set_num_threads(threads)
    assert len(got) == len(prompts) and len(rows) == len(prompts)
    assert [r["slice"] for r in recs] == list(range(len(recs))) and len(recs) >= 2
    assert sum(r["rounds"] for r in recs) == len(history) == loop.rounds
    assert sum(r["tokens"] for r in recs) == sum(sum(h.taus) for h in history)
    assert sum(r["decode_s"] for r in recs) == pytest.approx(
        sum(h.round_s - h.join_s for h in history), rel=1e-9
    )
    assert [r["first_round"] for r in recs] == [3 * i for i in range(len(recs))]
    assert [r["variant"] for r in recs] == [slice_variant(("A", "B"), 5, i) for i in range(len(recs))]
    # every request is in the slice it joined in, and ran as that slice's variant, with its controller's block size
    joined = {rid: r for r in recs for rid in r["requests"]}
    assert sorted(joined) == sorted(rows)
    for rid, row in rows.items():
        assert row["variant"] == joined[rid]["variant"]
        assert row["block_size"] == {"A": 1, "B": 4}[row["variant"]]
    assert sorted(info["variant"] for info in got.values()) == sorted(r["variant"] for r in rows.values())
    # in B's slices every row verified at most B's rule's 2 blocks, whoever decided it
    for i, h in enumerate(history):
        if recs[i // 3]["variant"] == "B":
            assert max(h.block_sizes) <= 2
    # ab-report finds the slices and reports each variant's throughput over its own slices
    assert main(["ab-report", str(log), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)["switchback"]
    for v, d in rep["variants"].items():
        mine = [r for r in recs if r["variant"] == v and r["complete"]]
        assert d["slices"] == len(mine)
        assert d["tokens_per_s"] == pytest.approx(
            sum(r["tokens"] for r in mine) / sum(r["decode_s"] for r in mine), abs=1e-5
        )
    assert main(["ab-report", str(log)]) == 0
    assert "switchback:" in capsys.readouterr().out
