"""Per-round schedules: their rules, the decoder running them, and the per-round oracle."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.costs.latency import CostCurve, LatencyProfile, get_profile
from adaptspec.errors import AdaptspecError
from adaptspec.schedules import (
    AcceptanceHistory,
    ConfidenceThreshold,
    FixedBlock,
    as_schedule,
    parse_schedule,
)
from adaptspec.simulators.rounds import evaluate_rounds, per_round_oracle_s, schedule_time_s
from adaptspec.speculator import Round
from adaptspec.traces.dense import DenseRequest, replay_rounds
from decoding_helpers import make_decoder, reference_greedy, tiny_target

probs = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=15)


@given(probs, st.floats(0.0, 1.0))
def test_confidence_verifies_the_longest_prefix_above_the_threshold(conf, t):
    v = ConfidenceThreshold(t, block_size=len(conf) + 1).verify_size(np.array(conf), [])
    k, prod = 0, 1.0  # reference: walk the drafts in order
    for c in conf:
        prod *= c
        if prod < t:
            break
        k += 1
    assert v == k + 1


@given(probs, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_a_higher_threshold_never_verifies_more(conf, a, b):
    lo, hi = sorted((a, b))
    n = len(conf) + 1
    assert ConfidenceThreshold(hi, block_size=n).verify_size(np.array(conf), []) <= ConfidenceThreshold(
        lo, block_size=n
    ).verify_size(np.array(conf), [])


def _round(drafted: int, verified: int, tau: int) -> Round:
    return Round(
        block_size=verified, tau=tau, draft_s=0.0, verify_s=0.0, drafted=drafted if drafted != verified else 0
    )


def test_confidence_backoff_doubles_the_plain_run_while_the_drafter_stays_unsure():
    s = ConfidenceThreshold(0.5, block_size=8, max_backoff=4)
    history: list[Round] = []
    drafts = []
    for _ in range(20):  # the drafter is never sure: every drafted round verifies 1
        b = s.draft_size(history)
        drafts.append(b)
        history.append(_round(b, 1, 1))
    # drafted, then 1, 2, 4, 4, ... plain steps between drafted rounds
    assert drafts == [8, 1, 8, 1, 1, 8, 1, 1, 1, 1, 8, 1, 1, 1, 1, 8, 1, 1, 1, 1]
    sure = history + [_round(8, 5, 3)]
    assert s.draft_size(sure) == 8  # a confident round resets the backoff
    assert ConfidenceThreshold(0.5, block_size=8, backoff=False).draft_size(history) == 8


@given(st.lists(st.tuples(st.integers(1, 16), st.integers(1, 16)), max_size=30), st.integers(1, 16))
def test_history_rule_stays_in_range(rows, start):
    s = AcceptanceHistory(block_size=start, max_block_size=16)
    history = [_round(b, b, min(t, b)) for b, t in rows]
    assert 1 <= s.draft_size(history) <= 16


def test_schedule_specs_and_bad_ones():
    assert parse_schedule("confidence").threshold == 0.4
    assert parse_schedule("confidence:0.2,nobackoff", max_block_size=8) == ConfidenceThreshold(
        0.2, 8, backoff=False
    )
    assert ConfidenceThreshold(0.3).with_block_size(1) == FixedBlock(1)
    for bad in ("confidence:2", "confidence:0.3,sometimes", "history:3", "fixed:x", ""):
        with pytest.raises(AdaptspecError):
            parse_schedule(bad)
    with pytest.raises(AdaptspecError, match="RoundSchedule"):
        as_schedule("4")


# ---------------------------------------------------------------- the decoder runs them
@pytest.mark.parametrize(
    "schedule",
    [
        ConfidenceThreshold(0.05, block_size=8, backoff=False),
        ConfidenceThreshold(0.3, block_size=6),
        AcceptanceHistory(2, 12),
    ],
)
def test_decoder_output_is_greedy_under_any_schedule(schedule):
    model = tiny_target("qwen3", eos=None)
    dec = make_decoder(model, drafter_seed=3, max_block_size=16)
    prompt = [11, 12, 13, 14]
    ref = reference_greedy(model, prompt, 30)
    out = dec.generate(prompt, schedule, 30)
    assert out.tokens == ref
    assert all(1 <= r.tau <= r.block_size <= r.draft_size for r in out.rounds)
    if schedule.uses_confidence and schedule.threshold > 0.1:
        assert any(r.block_size < r.draft_size for r in out.rounds)  # a prefix was verified


def test_a_schedule_that_verifies_outside_its_block_is_refused():
    class Greedy(ConfidenceThreshold):
        def verify_size(self, confidence, rounds):
            return len(confidence) + 2

    dec = make_decoder(tiny_target("llama", eos=None), max_block_size=8)
    with pytest.raises(AdaptspecError, match="outside 1..4"):
        dec.generate([5, 6, 7], Greedy(0.1, block_size=4), 10)


# ---------------------------------------------------------------- oracles
def _toy_profile() -> LatencyProfile:
    return LatencyProfile(
        "toy",
        draft=CostCurve((2.0, 8.0), (0.008, 0.010)),
        verify=CostCurve((1.0, 8.0), (0.036, 0.045), per_context_s=1e-5),
    )


def _request(accept: np.ndarray, top1: np.ndarray | None = None, prompt: int = 7) -> DenseRequest:
    n, k = accept.shape
    top1 = np.full((n, k), 0.5, np.float32) if top1 is None else top1
    return DenseRequest(
        np.arange(n + 1),
        accept.astype(np.uint8),
        top1,
        np.zeros((n, k), np.float32),
        np.zeros(2, np.float32),
        prompt,
        "length",
    )


def _random_accept(rng: np.random.Generator, n: int, largest: int) -> np.ndarray:
    """Acceptance a(p, b): a draft's correctness differs by block size, never beyond b - 1."""
    first = rng.random((n, largest - 1)) < 0.5
    return np.stack([np.cumprod(first[:, : b - 1], 1).sum(1) for b in range(2, largest + 1)], 1)


def _brute_force_s(req: DenseRequest, max_new: int, profile: LatencyProfile) -> float:
    """Least time over every sequence of (drafted b, verified v) actions, by exhaustive search."""
    n, largest = len(req.tokens), req.accept.shape[1] + 1

    @functools.lru_cache(None)
    def go(m: int) -> float:
        if m >= n:
            return 0.0
        ctx = req.prompt_tokens + m
        best = float(profile.verify_s(1, ctx)) + go(m + 1)
        for b in range(2, min(largest, max_new - m) + 1):
            for v in range(1, b + 1):
                j = min(int(req.accept[m - 1, b - 2]), v - 1, n - 1 - m)
                best = min(best, float(profile.draft_s(b, ctx) + profile.verify_s(v, ctx)) + go(m + j + 1))
        return best

    return go(1)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 14), st.integers(2, 6))
def test_per_round_oracle_equals_exhaustive_search(seed, n, largest):
    rng = np.random.default_rng(seed)
    req = _request(_random_accept(rng, n, largest))
    prof = _toy_profile()
    assert per_round_oracle_s(req, n + 1, prof) == pytest.approx(_brute_force_s(req, n + 1, prof), rel=1e-12)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000))
def test_no_schedule_beats_the_per_round_oracle(seed):
    rng = np.random.default_rng(seed)
    req = _request(_random_accept(rng, 30, 8), rng.random((30, 7)).astype(np.float32))
    prof = _toy_profile()
    oracle = per_round_oracle_s(req, 31, prof)
    for s in (1, 2, 5, 8, ConfidenceThreshold(0.3, block_size=8), AcceptanceHistory(3, 8)):
        assert oracle <= schedule_time_s(req, s, 31, prof) + 1e-12


def _fixed_time_s(req: DenseRequest, b: int, max_new: int) -> float:
    """Decode seconds of fixed block size ``b`` on the toy profile, walked by hand: a round from
    ``m`` committed tokens verifies ``min(b, room)`` tokens and commits the accepted drafts plus
    one; the toy's passes are piecewise linear in the block size (knots 2..8 and 1..8) and the
    verify pass adds 10 us per context token."""
    n, m, s = len(req.tokens), 1, 0.0
    while m < n:
        bb = min(b, max_new - m)
        ctx = req.prompt_tokens + m
        s += (0.008 + (bb - 2) * 0.002 / 6 if bb > 1 else 0.0) + 0.036 + (bb - 1) * 0.009 / 7 + 1e-5 * ctx
        m += 1 + (min(int(req.accept[m - 1, bb - 2]), n - 1 - m) if bb > 1 else 0)
    return s


def test_report_speedups_are_plain_time_over_schedule_time():
    rng = np.random.default_rng(0)
    items = [(f"r{i}", "a" if i % 2 else "b", _request(_random_accept(rng, 20, 4))) for i in range(6)]
    prof = _toy_profile()
    rep = evaluate_rounds(items, {"hist": AcceptanceHistory(2, 4)}, prof, max_new_tokens=21)
    t = lambda b, rows: sum(_fixed_time_s(items[i][2], b, 21) for i in rows)  # noqa: E731
    assert rep.speedup("fixed:3") == pytest.approx(t(1, range(6)) / t(3, range(6)), rel=1e-9)
    assert rep.speedup("fixed:2", "a") == pytest.approx(t(1, [1, 3, 5]) / t(2, [1, 3, 5]), rel=1e-9)
    per_request = sum(min(_fixed_time_s(r, b, 21) for b in (1, 2, 3, 4)) for _, _, r in items)
    assert rep.speedup("per-request oracle") == pytest.approx(t(1, range(6)) / per_request, rel=1e-9)
    assert (
        rep.speedup("per-round oracle") >= rep.speedup("per-request oracle") >= rep.speedup(rep.best_fixed())
    )


def test_replayed_rounds_are_timed_at_their_drafted_and_verified_sizes():
    accept = np.array([[1, 2, 3]] * 8)
    top1 = np.tile(np.array([0.9, 0.8, 0.1], np.float32), (8, 1))  # cumulative 0.9, 0.72, 0.07
    req = _request(accept, top1, prompt=10)
    prof = get_profile("cpu-smollm2-bf16")
    rounds = replay_rounds(req, ConfidenceThreshold(0.5, block_size=4), 9, prof)
    # verify 3 of 4 drafted: both drafts accepted, tau 3, every round; the last shortened by the end
    assert [(r.draft_size, r.block_size, r.tau) for r in rounds] == [(4, 3, 3), (4, 3, 3), (4, 2, 2)]
    ctx = 10 + np.array([1, 4, 7])
    assert [r.draft_s for r in rounds] == pytest.approx(prof.draft_s(np.array([4, 4, 4]), ctx).tolist())
    assert [r.verify_s for r in rounds] == pytest.approx(prof.verify_s(np.array([3, 3, 2]), ctx).tolist())
    with pytest.raises(AdaptspecError, match="stored for block size 4 only"):
        replay_rounds(req, ConfidenceThreshold(0.5, block_size=3), 9)


def test_evaluation_section_replays_the_dense_set_the_trace_set_names(tmp_path):
    from types import SimpleNamespace

    from adaptspec.evaluation.core import Settings
    from adaptspec.evaluation.rounds import render_rounds, section_rounds
    from adaptspec.traces.dense import DenseTraceSet

    rng = np.random.default_rng(1)
    ds = DenseTraceSet.create(tmp_path / "dense", {"max_new_tokens": 21, "max_block_size": 16})
    ds.write_part(
        [
            (
                f"r{i}",
                ("gsm8k", "mt-bench/writing")[i % 2],
                _request(_random_accept(rng, 20, 16), rng.random((20, 15)).astype(np.float32)),
            )
            for i in range(4)
        ]
    )
    d = section_rounds(SimpleNamespace(meta={"dense": str(tmp_path / "dense")}), Settings(batch_sizes=(1, 8)))
    assert d["status"] == "ok" and d["requests"] == 4
    assert [(p["profile"], p["batch"]) for p in d["profiles"]] == [
        ("cpu-smollm2-fast", 1),
        ("h100-qwen3-8b", 1),
        ("h100-qwen3-8b", 8),
    ]
    for p in d["profiles"]:
        rows = {r["schedule"]: r for r in p["rows"]}
        assert p["domains"] == ["gsm8k", "mt-bench"]
        assert rows["plain"]["all"] == 1.0 and rows["per-round oracle"]["headroom"] == pytest.approx(1.0)
        assert (
            rows["per-round oracle"]["all"]
            >= rows["per-request oracle"]["all"]
            >= rows[p["best_fixed"]]["all"]
        )
    assert "confidence threshold 0.4" in render_rounds(d, [])
    gone = section_rounds(SimpleNamespace(meta={}), Settings())
    assert gone["status"] == "absent" and render_rounds(gone, []).startswith("Not run")
