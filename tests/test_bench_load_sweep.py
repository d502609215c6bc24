"""The load sweep's plan and figures (benchmarks/bench_load_sweep.py), without servers: the phase
order and its rotation, pooling repeats, paired ratios with their t-intervals, the oracle's
table and share, and the markdown. Expected values come from closed forms and hand sums."""

from __future__ import annotations

import math
import statistics

import pytest

from _scripts import load_script


@pytest.fixture(scope="module")
def sweep():
    return load_script("bench_load_sweep")


def t975(df: int) -> float:
    """The t distribution's 97.5% quantile in closed form (df 1: Cauchy; df 2: (2p-1)/sqrt(2p(1-p)))."""
    p = 0.975
    return {1: math.tan(math.pi * (p - 0.5)), 2: (2 * p - 1) / math.sqrt(2 * p * (1 - p))}[df]


def run(tokens: int, wall: float, requests: int = 4) -> dict:
    return {
        "requests": requests,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "p50_s": 0.0,
        "p95_s": 0.0,
        "ttft_p50_s": None,
    }


def entry(*tps: float) -> dict:
    """A level's entry whose repeats ran at ``tps`` tokens/s (100 tokens each)."""
    reps = [run(100, 100 / x) for x in tps]
    tokens, wall = sum(r["tokens"] for r in reps), sum(r["wall_s"] for r in reps)
    return run(tokens, wall) | {"repeats": reps}


# -- the plan ----------------------------------------------------------------------------------------


def test_schedule_is_level_major_then_the_day_with_consecutive_prompts(sweep):
    plan = sweep.schedule(["a", "b"], [1, 4], [(1, 3), (2, 5)], 2, 2)
    assert [(s["label"], s["repeat"]) for s in plan] == [
        ("1", 0),
        ("1", 1),
        ("4", 0),
        ("4", 1),
        ("day", 0),
        ("day", 1),
    ]
    assert [s["phase"] for s in plan] == [[(1, 4)]] * 2 + [[(4, 8)]] * 2 + [[(1, 3), (2, 5)]] * 2
    # each phase sends the next prompts: 4, 4, 8, 8, 8 requests before
    assert [s["start"] for s in plan] == [0, 4, 8, 16, 24, 32]


def test_schedule_with_one_repeat_rotates_by_level_as_before(sweep):
    names = ["plain", "fixed:2", "learned"]
    plan = sweep.schedule(names, [1, 2, 4, 8], [(1, 4)], 1, 2)
    assert [s["order"] for s in plan] == [names[i % 3 :] + names[: i % 3] for i in range(5)]


def test_every_configuration_sits_at_every_position_over_the_repeats(sweep):
    names = ["plain", "fixed:2", "fixed:3", "table", "learned"]
    repeats = len(names) + 1  # the day has the oracle too
    plan = sweep.schedule(names, [1, 2, 8], [(1, 4), (8, 16)], repeats, 2, [sweep.ORACLE])
    for label in ("1", "2", "8", "day"):
        steps = [s for s in plan if s["label"] == label]
        assert len(steps) == repeats
        every = names + [sweep.ORACLE] if label == "day" else names
        for s in steps:
            assert sorted(s["order"]) == sorted(every)  # everyone once a phase; the oracle only in the day
        for n in every:
            assert {s["order"].index(n) for s in steps} == set(range(len(every))), (label, n)


# -- pooling and choosing ----------------------------------------------------------------------------


def test_pool_sums_tokens_and_wall_and_takes_percentiles_over_every_request(sweep):
    reqs = [
        [{"tokens": 10, "latency_s": 1.0, "ttft_s": 0.1}, {"tokens": 20, "latency_s": 5.0, "ttft_s": None}],
        [
            {"tokens": 30, "latency_s": 2.0, "ttft_s": 0.3},
            {"tokens": 40, "latency_s": 4.0, "ttft_s": 0.2},
            {"tokens": 50, "latency_s": 3.0, "ttft_s": 0.4},
        ],
    ]
    eng = [
        {
            "rule_s": 1.0,
            "rule_wall_s": 2.0,
            "decode_s": 10.0,
            "rounds": 5.0,
            "rounds_by_rows_x_width": {"1x2": 5},
        },
        {
            "rule_s": 3.0,
            "rule_wall_s": 2.0,
            "decode_s": 30.0,
            "rounds": 7.0,
            "rounds_by_rows_x_width": {"1x2": 3, "2x1": 4},
        },
    ]
    runs = [sweep.run_figures(r, w) | {"engine": e} for r, w, e in zip(reqs, (2.0, 8.0), eng)]
    p = sweep.pool(runs, reqs)
    assert (p["requests"], p["tokens"], p["wall_s"]) == (5, 150, 10.0)
    assert p["tokens_per_s"] == pytest.approx(15.0)  # 150 / 10, not the mean of 15 and 15.
    # latencies 1..5: median 3; p95 at rank 0.95 * 4 = 3.8: 4 + 0.8 * (5 - 4)
    assert p["p50_s"] == pytest.approx(3.0) and p["p95_s"] == pytest.approx(4.8)
    assert p["ttft_p50_s"] == pytest.approx(0.25)  # of 0.1, 0.2, 0.3, 0.4
    e = p["engine"]
    assert (e["rule_s"], e["decode_s"], e["rounds"]) == (4.0, 40.0, 12.0) and e[
        "rule_share"
    ] == pytest.approx(0.1)
    assert e["rounds_by_rows_x_width"] == {"1x2": 8, "2x1": 4}
    assert p["repeats"] == runs


def test_tuned_table_chooses_by_the_mean_over_repeats_not_the_pooled_rate(sweep):
    # fixed:2 at 100 then 10 tok/s: mean 55, pooled 200 tokens / 11 s = 18.2; plain 30 and 30
    tuning = {
        "plain": {"runs": {"1": entry(30, 30), "2": entry(40, 40)}},
        "fixed:2": {"runs": {"1": entry(100, 10), "2": entry(10, 10)}},
    }
    assert tuning["fixed:2"]["runs"]["1"]["tokens_per_s"] < tuning["plain"]["runs"]["1"]["tokens_per_s"]
    assert sweep.tuned_table(tuning, [1, 2]) == "table:1=2,2=1"


# -- ratios, intervals, the oracle's share -------------------------------------------------------------


def test_paired_ratio_two_repeats_against_the_closed_form(sweep):
    s = sweep.paired_ratio([2.0, 80.0], [1.0, 10.0])  # ratios 2 and 8
    assert s["per_repeat"] == pytest.approx([2.0, 8.0])
    assert s["geomean"] == pytest.approx(4.0)
    # log ratios ln 2, 3 ln 2: sd sqrt(2) ln 2, standard error ln 2
    t = t975(1)
    assert s["ci95"] == pytest.approx([4 * 2**-t, 4 * 2**t])


def test_paired_ratio_three_repeats_against_a_hand_interval(sweep):
    xs, ys = [11.0, 24.0, 9.0], [10.0, 20.0, 10.0]
    s = sweep.paired_ratio(xs, ys)
    logs = [math.log(1.1), math.log(1.2), math.log(0.9)]
    assert s["geomean"] == pytest.approx((1.1 * 1.2 * 0.9) ** (1 / 3))
    half = t975(2) * statistics.stdev(logs) / math.sqrt(3)
    assert s["ci95"] == pytest.approx(
        [math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half)]
    )


def test_paired_ratio_one_repeat_has_no_interval_and_unpaired_is_refused(sweep):
    assert sweep.paired_ratio([3.0], [2.0]) == {
        "per_repeat": [1.5],
        "geomean": pytest.approx(1.5),
        "ci95": None,
    }
    with pytest.raises(ValueError):
        sweep.paired_ratio([1.0, 2.0], [1.0])


def test_oracle_share(sweep):
    assert sweep.oracle_share(110.0, 100.0, 120.0) == pytest.approx(0.5)
    assert sweep.oracle_share(90.0, 100.0, 120.0) == pytest.approx(-0.5)
    assert sweep.oracle_share(130.0, 100.0, 100.0) is None and sweep.oracle_share(1.0, 100.0, 90.0) is None


def test_summarize_pairs_by_repeat_picks_the_best_static_and_scores_the_day(sweep):
    runs = {
        "plain": {"1": entry(10, 20), "day": entry(10, 10)},
        "fixed:2": {"1": entry(15, 30), "day": entry(12, 14)},
        "learned": {"1": entry(12, 36), "day": entry(16, 14)},
        sweep.ORACLE: {"day": entry(18, 18)},
    }
    s = sweep.summarize(runs)
    assert list(s) == ["1", "day"] and s["1"]["best"] == "fixed:2" and s["day"]["best"] == "fixed:2"
    one = s["1"]["configs"]
    assert sweep.ORACLE not in one
    assert one["learned"]["vs_plain"]["per_repeat"] == pytest.approx([1.2, 1.8])
    assert one["learned"]["vs_best"]["per_repeat"] == pytest.approx([0.8, 1.2])
    assert one["learned"]["vs_best"]["geomean"] == pytest.approx(math.sqrt(0.8 * 1.2))
    assert one["fixed:2"]["vs_best"]["per_repeat"] == pytest.approx([1.0, 1.0])
    assert one["plain"]["tokens_per_s_mean"] == pytest.approx(15.0)
    day = s["day"]["configs"]
    # mean tok/s: best fixed 13, learned 15, oracle 18: (15 - 13) / (18 - 13)
    assert day["learned"]["oracle_share"] == pytest.approx(0.4)
    assert day[sweep.ORACLE]["vs_best"]["per_repeat"] == pytest.approx([1.5, 18 / 14])
    assert "oracle_share" not in day["plain"] and "oracle_share" not in day[sweep.ORACLE]


def test_summarize_reads_single_runs_without_repeats(sweep):
    runs = {"plain": {"1": run(100, 10)}, "goodput": {"1": run(150, 10)}}
    g = sweep.summarize(runs)["1"]["configs"]["goodput"]
    assert g["vs_plain"]["geomean"] == pytest.approx(1.5) and g["vs_plain"]["ci95"] is None


def test_tables_render_with_the_oracle_only_in_the_day(sweep):
    runs = {
        "plain": {"1": entry(10, 20), "day": entry(10, 10)},
        "learned": {"1": entry(12, 36), "day": entry(16, 14)},
        sweep.ORACLE: {"day": entry(18, 18)},
    }
    text = sweep.table({"runs": runs})
    assert f"| {sweep.ORACLE} | — | 18.0 (1.80x) |" in text
    md = sweep.summary_table(sweep.summarize(runs))
    assert "| (best) | plain | plain |" in md
    lo, hi = sweep.paired_ratio([12, 36], [10, 20])["ci95"]
    assert f"| learned | {math.sqrt(1.2 * 1.8):.2f}x [{lo:.2f}, {hi:.2f}] |" in md
    assert "| learned | 15.0 | 0.62 |" in md  # (15 - 10) / (18 - 10)


def test_pool_files_keeps_shared_configurations_and_pairs_repeats_within_their_run(sweep):
    a = {
        "runs": {
            "plain": {"1": entry(10, 20), "day": entry(30, 30)},
            "controller": {"1": entry(12, 18)},
            "goodput": {"1": entry(50, 50)},
        }
    }
    b = {"runs": {"plain": {"1": entry(40, 40, 40)}, "controller": {"1": entry(44, 40, 36)}}}
    runs = sweep.pool_files([a, b])
    assert set(runs) == {"plain", "controller"}  # goodput ran in one file only
    assert set(runs["plain"]) == {"1"}  # so did the day
    assert sweep.repeat_tps(runs["controller"]["1"]) == pytest.approx([12, 18, 44, 40, 36])
    assert runs["plain"]["1"]["tokens_per_s"] == pytest.approx(500 / (100 / 10 + 100 / 20 + 3 * 100 / 40))
    ratios = sweep.summarize(runs)["1"]["configs"]["controller"]["vs_plain"]["per_repeat"]
    assert ratios == pytest.approx([1.2, 0.9, 1.1, 1.0, 0.9])  # each against plain in its own run and repeat
