"""Dense traces: one greedy pass gives what every block size would do; replay equals the real decoder."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from _bundled import bundled_exact as load_bundled_exact
from _threads import torch_threads
from adaptspec.collect.dense import collect_dense, dense_request
from adaptspec.costs.latency import get_profile
from adaptspec.errors import AdaptspecError
from adaptspec.schedules import AcceptanceHistory, ConfidenceThreshold
from adaptspec.traces.dense import DenseTraceSet, replay, replay_rounds, to_traceset
from decoding_helpers import make_decoder, tiny_target


@pytest.fixture
def two_threads():
    """Two threads while a test decodes the 135M target; the tiny models keep the run's count."""
    with torch_threads(2):
        yield


@pytest.fixture(scope="module")
def bundled_exact():
    return load_bundled_exact()


def test_replay_equals_the_real_decoder_round_by_round(bundled_exact, two_threads):
    """Exact verification, the trained drafter: tokens, rounds and every round's tau agree."""
    from adaptspec.models.prompts import benchmark_prompts

    spec = bundled_exact
    n = 24  # 17 to 23 rounds a decode: each schedule cycles more than three times (40 tokens cost 60% more)
    schedule = lambda i, taus: (2, 8, 4, 16, 1)[i % 5]  # noqa: E731  a per-round schedule
    accepted = prefixes = 0
    worst = 0.0
    for p in benchmark_prompts(per_benchmark=1)[:2]:
        ids = spec.target.encode_chat(p.prompt)
        d = dense_request(spec, ids, n, 16)
        pre = spec.prefill(ids)
        for b in (2, 16, schedule):  # the schedule runs 4 and 8 (and 1) too
            out = spec.decode(pre, b if not callable(b) else (lambda i, rounds: schedule(i, None)), n)
            assert out.tokens == d.tokens.tolist()
            if out.finish_reason == "length":  # (after an EOS the decoder also checks drafts past it)
                assert replay(d.accept, len(d.tokens), n, b) == [r.tau for r in out.rounds], b
            accepted += sum(r.tau - 1 for r in out.rounds)
        # Per-round schedules: the drafted and verified size and the tau of every round agree, given
        # the confidences the decoder saw; those differ from the batched dense pass's by bf16 rounding
        # only (a threshold between the two could flip one round).
        for s in (
            ConfidenceThreshold(0.3),
            ConfidenceThreshold(0.6, backoff=False),
            AcceptanceHistory(4, 16),
        ):
            seen = _Recording(s)
            out = spec.decode(pre, seen, n)
            assert out.tokens == d.tokens.tolist()
            if out.finish_reason == "length":
                top1 = d.top1.copy()
                for m, conf in seen.confidences:
                    worst = max(worst, float(np.abs(top1[m - 1] - conf).max()))
                    top1[m - 1] = conf
                seen_d = dataclasses.replace(d, top1=top1)
                shape = lambda rs: [(r.draft_size, r.block_size, r.tau) for r in rs]  # noqa: E731
                assert shape(replay_rounds(seen_d, s, n)) == shape(out.rounds), s
                prefixes += sum(r.block_size < r.draft_size for r in out.rounds)
    assert worst < 0.1, (
        worst
    )  # the decoder's confidences and the dense set's agree to bf16 rounding (0.030 measured)
    assert accepted > 0  # the drafter was right sometimes: acceptance was exercised
    assert prefixes > 0  # a confidence schedule verified only part of a drafted block


class _Recording:
    """A schedule that passes every call through and records the confidences it was shown."""

    def __init__(self, inner):
        self.inner, self.uses_confidence, self.confidences = inner, inner.uses_confidence, []

    def draft_size(self, rounds):
        return self.inner.draft_size(rounds)

    def verify_size(self, confidence, rounds):
        self.confidences.append((1 + sum(r.tau for r in rounds), np.array(confidence)))
        return self.inner.verify_size(confidence, rounds)


def test_dense_set_resumes_and_refuses_foreign_directories(tmp_path):
    model = tiny_target("llama", eos=None)
    dec = make_decoder(model, max_block_size=8)
    prompts = [(f"r{i}", "d", [6 + i, 7, 8 + i]) for i in range(5)]
    ds = collect_dense(
        dec,
        prompts[:3],
        tmp_path / "dense",
        max_new_tokens=12,
        max_block_size=8,
        rows_per_part=2,
        progress=False,
    )
    assert ds.request_ids() == {"r0", "r1", "r2"} and len(ds.parts()) == 2
    before = [p.read_bytes() for p in ds.parts()]
    ds = collect_dense(
        dec, prompts, tmp_path / "dense", max_new_tokens=12, max_block_size=8, rows_per_part=2, progress=False
    )
    assert (
        ds.request_ids() == {f"r{i}" for i in range(5)} and [p.read_bytes() for p in ds.parts()[:2]] == before
    )
    stored = {rid: r for rid, _, r in DenseTraceSet.open(tmp_path / "dense").requests()}
    fresh = dense_request(dec, prompts[4][2], 12, 8)
    np.testing.assert_array_equal(stored["r4"].accept, fresh.accept)
    np.testing.assert_array_equal(stored["r4"].tokens, fresh.tokens)
    with pytest.raises(AdaptspecError, match="other settings"):
        collect_dense(dec, prompts, tmp_path / "dense", max_new_tokens=20, max_block_size=8, progress=False)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(AdaptspecError, match="not a dense trace set"):
        collect_dense(dec, prompts, tmp_path / "mine", max_block_size=8, progress=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


class _CountingDecodes:
    """A decoder that counts its decode calls (everything else passes through)."""

    def __init__(self, inner):
        self.inner, self.decodes = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decode(self, *a, **kw):
        self.decodes += 1
        return self.inner.decode(*a, **kw)


def test_reused_greedy_outputs_give_the_tables_a_full_collection_gives(tmp_path):
    """A second drafter's dense set from the first set's greedy outputs equals its own full collection."""
    model = tiny_target("llama", eos=None)
    first, second = (
        make_decoder(model, drafter_seed=0, max_block_size=8),
        make_decoder(model, drafter_seed=1, max_block_size=8),
    )
    prompts = [(f"r{i}", "d", [6 + i, 7, 8 + i]) for i in range(4)]
    kw = dict(max_new_tokens=12, max_block_size=8, progress=False)
    collect_dense(first, prompts[:3], tmp_path / "first", meta={"drafter": "seed 0"}, **kw)
    full = collect_dense(second, prompts, tmp_path / "full", meta={"drafter": "seed 1"}, **kw)
    counting = _CountingDecodes(second)
    lent = collect_dense(
        counting, prompts, tmp_path / "lent", meta={"drafter": "seed 1"}, greedy_from=tmp_path / "first", **kw
    )
    assert counting.decodes == 1  # only r3, which the first set lacks, was decoded
    want = {rid: r for rid, _, r in full.requests()}
    got = {rid: r for rid, _, r in lent.requests()}
    assert got.keys() == want.keys()
    for rid in want:
        for field in ("tokens", "accept", "top1", "entropy", "features"):
            np.testing.assert_array_equal(
                getattr(got[rid], field), getattr(want[rid], field), err_msg=f"{rid} {field}"
            )
        assert got[rid].finish_reason == want[rid].finish_reason
    firsts = {rid: r for rid, _, r in DenseTraceSet.open(tmp_path / "first").requests()}
    assert any((firsts[r].accept != want[r].accept).any() for r in firsts)  # the drafters do differ
    with pytest.raises(AdaptspecError, match="other settings .*max_new_tokens"):
        collect_dense(
            second,
            prompts,
            tmp_path / "other",
            max_new_tokens=10,
            max_block_size=8,
            progress=False,
            greedy_from=tmp_path / "first",
        )
    with pytest.raises(AdaptspecError, match="not the same prompt"):
        collect_dense(
            second, [("r0", "d", [6, 7, 8, 9])], tmp_path / "wrong", greedy_from=tmp_path / "first", **kw
        )


def test_derived_trace_set_times_rounds_with_the_profile(tmp_path):
    model = tiny_target("qwen3", eos=None)
    dec = make_decoder(model, max_block_size=8)
    ds = collect_dense(
        dec,
        [("a", "d", [9, 10, 11, 12])],
        tmp_path / "dense",
        max_new_tokens=10,
        max_block_size=8,
        progress=False,
    )
    profile = get_profile("cpu-smollm2-bf16")
    traces = to_traceset(ds, [1, 4], profile)
    ((_, _, r),) = ds.requests()
    # B = 1: one plain step per token after the first, at contexts prompt + 1 .. prompt + 9
    ctx = 4 + np.arange(1, 10)
    expect = 1e3 * float(np.sum(profile.verify_s(np.ones(9), ctx)))
    assert 1e3 * traces.decode_s_matrix()[0, 0] == pytest.approx(expect)
    assert traces.rounds_matrix()[0, 0] == 9 and traces.tau_matrix()[0, 0] == 1.0
    taus = replay(r.accept, len(r.tokens), 10, 4)
    assert traces.rounds_matrix()[0, 1] == len(taus) and traces.tau_matrix()[0, 1] == pytest.approx(
        np.mean(taus)
    )
    with pytest.raises(AdaptspecError, match="arms must be block sizes in 1..8"):
        to_traceset(ds, [1, 16], profile)
