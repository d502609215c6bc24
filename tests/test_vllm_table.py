"""vLLM's per-batch-size table from trace sets (adaptspec.vllm.table) and ``adaptspec export-vllm-table``.

No vLLM here: the table's rules are vLLM 0.32's parser's (``validate_and_normalize_dynamic_sd_schedule``:
3-item entries, positive ranges, start <= end, K >= 0, sorted and not overlapping, the first at 1),
re-derived below; tests_vllm/test_collect.py gives an exported table to a real engine.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.cli import main
from adaptspec.costs.latency import CostCurve, LatencyProfile
from adaptspec.errors import AdaptspecError
from adaptspec.traces import TraceSet
from adaptspec.vllm.table import (
    measured_levels,
    modelled_levels,
    rule_levels,
    speculative_entry,
    table_ranges,
)


def vllm_accepts(ranges) -> bool:
    """vLLM's rules for ``num_speculative_tokens_per_batch_size``, written out again here."""
    if not isinstance(ranges, list) or not ranges:
        return False
    previous_end = 0
    for entry in sorted(ranges, key=lambda e: e[0]):
        if len(entry) != 3 or not all(isinstance(x, int) for x in entry):
            return False
        start, end, k = entry
        if start <= 0 or end <= 0 or start > end or k < 0 or start <= previous_end:
            return False
        previous_end = end
    return min(e[0] for e in ranges) == 1


def lookup(ranges, rows: int) -> int:
    """The K a table gives ``rows`` rows."""
    return next(k for lo, hi, k in ranges if lo <= rows <= hi)


levels_strategy = st.lists(
    st.tuples(st.integers(1, 300), st.integers(1, 9)), min_size=1, max_size=8, unique_by=lambda lv: lv[0]
)


@settings(max_examples=200, deadline=None)
@given(levels=levels_strategy, extra=st.integers(0, 300))
def test_table_ranges_are_what_vllm_accepts_and_give_every_batch_its_levels_k(levels, extra):
    max_batch = max(s for s, _ in levels) + extra
    ranges = table_ranges(levels, max_batch)
    assert vllm_accepts(ranges)
    assert ranges[0][0] == 1 and ranges[-1][1] == max_batch
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, sorted
    assert all(a[2] != b[2] for a, b in zip(ranges, ranges[1:]))  # equal neighbours merged
    # every batch size: the block size of the largest level starting at or below it (the first's below it)
    ordered = sorted(levels)
    for rows in range(1, max_batch + 1):
        held = [b for s, b in ordered if s <= rows] or [ordered[0][1]]
        assert lookup(ranges, rows) == held[-1] - 1


def test_table_ranges_refuses_levels_it_cannot_place():
    with pytest.raises(AdaptspecError, match="two levels start at batch size 4"):
        table_ranges([(1, 2), (4, 3), (4, 1)], 16)
    with pytest.raises(AdaptspecError, match="beyond the largest batch 8"):
        table_ranges([(1, 2), (16, 1)], 8)
    with pytest.raises(AdaptspecError, match="at least one level"):
        table_ranges([], 8)
    with pytest.raises(AdaptspecError, match="block sizes >= 1"):
        table_ranges([(1, 0)], 8)
    with pytest.raises(AdaptspecError, match="largest batch must be an integer >= 1"):
        table_ranges([(1, 2)], 0)


def test_speculative_entry_asks_vllm_for_the_largest_k_and_at_least_one():
    assert speculative_entry([[1, 3, 4], [4, 8, 0]]) == {
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 3, 4], [4, 8, 0]],
    }
    assert speculative_entry([[1, 8, 0]])["num_speculative_tokens"] == 1  # vLLM needs K >= 1 even when unused


def hand_built(arms, taus_per_request, decode_s, concurrency=None, prompt_tokens=None):
    """A trace set from per-request, per-arm tau lists (new tokens: their sum + the prefill's one)."""
    n = len(taus_per_request)
    flat = [t for row in taus_per_request for t in row]
    return TraceSet.from_arrays(
        [f"r{i}" for i in range(n)],
        ["x"] * n,
        arms,
        np.array([[np.mean(t) for t in row] for row in taus_per_request]),
        new_tokens=np.array([[sum(t) + 1 for t in row] for row in taus_per_request]),
        rounds=np.array([[len(t) for t in row] for row in taus_per_request]),
        decode_ms=np.asarray(decode_s, dtype=float) * 1e3,
        tau=flat,
        prompt_tokens=prompt_tokens or [20] * n,
        meta={} if concurrency is None else {"concurrency": concurrency},
    )


def test_measured_levels_pick_the_highest_aggregate_throughput():
    # two requests; tokens after the first over all decode seconds, per arm:
    # B=1: (8 + 4) / (1.0 + 0.5) = 8; B=2: (8 + 4) / (0.6 + 0.9) = 8 (a tie: the smaller block); B=4: 12 / 1.0 = 12
    arms = [1, 2, 4]
    taus = [[[1] * 8, [2] * 4, [4, 4]], [[1] * 4, [2, 2], [4]]]
    one = hand_built(arms, taus, [[1.0, 0.6, 0.6], [0.5, 0.9, 0.4]])
    (lv,) = measured_levels([one])
    assert lv[0] == 1 and lv[1] == 4 and lv[3] == arms
    assert lv[2] == pytest.approx([8.0, 8.0, 12.0])
    slow_b4 = hand_built(arms, taus, [[1.0, 0.6, 3.0], [0.5, 0.9, 3.0]], concurrency=8)
    two = measured_levels([slow_b4, one])  # sorted by concurrency
    assert [(r, b) for r, b, _, _ in two] == [(1, 4), (8, 1)]  # 8 = 8 on B=1 and 2: the smaller
    assert table_ranges(two, 16) == [[1, 7, 3], [8, 16, 0]]


def test_measured_levels_refuse_sets_they_cannot_place():
    arms = [1, 2]
    taus = [[[1, 1], [2]]]
    a = hand_built(arms, taus, [[0.2, 0.1]], concurrency=2)
    b = hand_built(arms, taus, [[0.2, 0.1]], concurrency=2)
    with pytest.raises(AdaptspecError, match="a second trace set at concurrency 2"):
        measured_levels([a, b])
    bad = hand_built(arms, taus, [[0.2, 0.1]], concurrency=0)
    with pytest.raises(AdaptspecError, match="concurrency 0 is not an integer >= 1"):
        measured_levels([bad])
    untimed = TraceSet.from_arrays(
        ["r"], ["x"], arms, np.array([[1.0, 2.0]]), new_tokens=np.array([[3, 3]]), rounds=np.array([[2, 1]])
    )
    with pytest.raises(AdaptspecError, match="no decode times"):
        measured_levels([untimed])


def toy_profile() -> LatencyProfile:
    """A flat target pass up to 8 tokens in the batch, then 4 ms a token; a 2 ms drafter pass."""
    return LatencyProfile(
        "toy",
        draft=CostCurve((1,), (0.002,)),
        verify=CostCurve((1, 8), (0.010, 0.010), tail_slope_s=0.004),
        context_tokens=100,
    )


def brute_force_best(taus_per_request, arms, profile, rows, context):
    """Each arm's tokens a second for ``rows`` rows of it, by loops over every round."""
    rates = []
    for j, b in enumerate(arms):
        tokens = sum(sum(row[j]) for row in taus_per_request)
        rounds = sum(len(row[j]) for row in taus_per_request)
        seconds = float(profile.verify(b, context, rows)) + (
            float(profile.draft(b, context, rows)) if b > 1 else 0.0
        )
        rates.append(rows * (tokens / rounds) / seconds)
    return arms[int(np.argmax(rates))], rates


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_modelled_levels_match_a_brute_force_recomputation(seed):
    rng = np.random.default_rng(seed)
    arms = [1, 2, 3, 5]
    taus = [
        [[1] * int(rng.integers(3, 9))]
        + [rng.integers(1, b + 1, int(rng.integers(2, 7))).tolist() for b in arms[1:]]
        for _ in range(5)
    ]
    prompts = rng.integers(10, 200, 5).tolist()
    ts = hand_built(arms, taus, np.ones((5, 4)), prompt_tokens=prompts)
    new = np.array([[sum(t) + 1 for t in row] for row in taus])
    context = np.mean(prompts) + 0.5 * new.mean()
    profile = toy_profile()
    sizes = [1, 2, 3, 4, 8, 16, 64]
    levels = modelled_levels(ts, profile, sizes)
    assert [lv[0] for lv in levels] == sizes
    for rows, b, rate, got_arms in levels:
        best, rates = brute_force_best(taus, arms, profile, rows, context)
        assert got_arms == arms and rate == pytest.approx(rates, rel=1e-9) and b == best
    assert levels[-1][1] == 1  # 64 rows: the target pass is paid by the token, speculating cannot pay
    fixed_context = modelled_levels(ts, profile, [4], max_new_tokens=40)[0]
    assert fixed_context[2] == pytest.approx(
        brute_force_best(taus, arms, profile, 4, np.mean(prompts) + 20)[1]
    )


def test_rule_levels_read_a_warm_learned_rules_prior_choice():
    # a warm learned rule starts from the goodput model at its prior per-draft acceptance a: a batch
    # all at B commits E[tau_B] = (1 - a^B) / (1 - a) tokens a row in one round (a drafter pass
    # when B > 1, a target pass over B tokens a row), plain decoding one in a plain round; its
    # load levels stand for 1, 2, 4, 8, 16, 32 and 64 rows
    from adaptspec.load_rules import Learned

    profile, arms, a = toy_profile(), [1, 2, 3, 5], 0.6
    rule = Learned(arms, profile, prior=a, seed=0)
    level_rows = {1: 1, 2: 2, 3: 4, 4: 4, 6: 8, 16: 16, 40: 64}

    def best(rows):
        ctx = profile.context_tokens

        def round_s(b):
            return float(profile.verify(b, ctx, rows)) + (
                float(profile.draft(b, ctx, rows)) if b > 1 else 0.0
            )

        speedup = [(1 - a**b) / (1 - a) * round_s(1) / round_s(b) for b in arms]
        return arms[int(np.argmax(speedup))]

    got = rule_levels(rule, list(level_rows))
    assert got == [(r, best(level_rows[r])) for r in sorted(level_rows)]
    assert got[0][1] > 1 and got[-1][1] == 1  # speculation at one row, none at 40
    assert vllm_accepts(table_ranges(got, 64))
    cold = Learned(arms, profile, seed=0)  # no prior: every block size ties
    assert rule_levels(cold, [1, 8]) == []


# ---------------------------------------------------------------------------- the command
def test_the_command_writes_vllms_speculative_config_keys(tmp_path, capsys):
    arms = [1, 2, 4]
    taus = [[[1] * 8, [2] * 4, [4, 4]]]
    fast_b4 = hand_built(arms, taus, [[1.0, 0.6, 0.4]], concurrency=1).write(tmp_path / "c1")
    slow_b4 = hand_built(arms, taus, [[0.2, 0.6, 0.9]], concurrency=4).write(tmp_path / "c4")
    out = tmp_path / "table.json"
    assert (
        main(["export-vllm-table", str(slow_b4), str(fast_b4), "--max-batch", "32", "--out", str(out)]) == 0
    )
    said = capsys.readouterr()
    want = {"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 3, 3], [4, 32, 0]]}
    assert json.loads(out.read_text()) == want
    assert f"{slow_b4} at batch size 4" in said.out and f"{fast_b4} at batch size 1" in said.out
    assert "batch size 1: K = 3" in said.err and "batch size 4: K = 0" in said.err
    # printed without --out; replaced with --force
    assert main(["export-vllm-table", str(fast_b4), "--max-batch", "8"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 8, 3]],
    }
    assert main(["export-vllm-table", str(fast_b4), "--out", str(out), "--force"]) == 0
    assert json.loads(out.read_text())["num_speculative_tokens_per_batch_size"] == [[1, 256, 3]]


def test_the_command_models_a_table_from_a_latency_profile(tmp_path, capsys):
    arms = [1, 2, 3]
    taus = [[[1] * 6, [2, 2, 2], [3, 3]], [[1] * 4, [2, 1, 1], [3, 1]]]
    ts = hand_built(arms, taus, np.ones((2, 3)), prompt_tokens=[40, 60])
    path = ts.write(tmp_path / "t")
    profile = tmp_path / "toy.json"
    toy_profile().save(profile)
    assert (
        main(
            [
                "export-vllm-table",
                str(path),
                "--latency",
                str(profile),
                "--batch-sizes",
                "1,2,8,64",
                "--max-batch",
                "64",
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)["num_speculative_tokens_per_batch_size"]
    context = 50 + 0.5 * np.mean([[sum(t) + 1 for t in row] for row in taus])
    expected = table_ranges(
        [(r, brute_force_best(taus, arms, toy_profile(), r, context)[0]) for r in (1, 2, 8, 64)], 64
    )
    assert got == expected and vllm_accepts(got)


def exit_status(argv):
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--latency", "no-such-profile"], "unknown latency profile 'no-such-profile'"),
        (["{t}", "--latency", "cpu-smollm2-bf16"], "--latency re-times one trace set"),
        (["--max-batch", "0"], "expected an integer >= 1"),
        (["--batch-sizes", "0,4", "--latency", "cpu-smollm2-bf16"], "batch sizes >= 1"),
        (["--max-batch", "2"], "beyond the largest batch 2"),
        (["--out", "{tmp}/nodir/table.json"], "does not exist"),
        (["--out", "{tmp}/other.json"], "exists"),
        (["--out", "{tmp}/other.json", "--force"], "not a table this command wrote"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, says):
    arms = [1, 2]
    ts = hand_built(arms, [[[1, 1], [2]]], [[0.2, 0.1]], concurrency=4).write(tmp_path / "t")
    (tmp_path / "other.json").write_text('{"mine": 1}\n')
    argv = [a.format(t=ts, tmp=tmp_path) for a in argv]
    assert exit_status(["export-vllm-table", str(ts), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert json.loads((tmp_path / "other.json").read_text()) == {"mine": 1}


def test_the_table_and_its_command_import_no_vllm():
    import subprocess

    code = (
        "import sys, adaptspec.vllm.table, adaptspec.cli.export_vllm_table, adaptspec.cli.collect_vllm; "
        "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0
