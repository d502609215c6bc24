"""Dense traces: one greedy pass gives what every block size would do; replay equals the real decoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaptspec.dense import DenseTraceSet, collect_dense, dense_request, replay, to_traceset
from adaptspec.errors import AdaptspecError
from adaptspec.latency import get_profile

from decoding_helpers import make_decoder, tiny_target

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def bundled_exact():
    from adaptspec.models import load_speculator

    return load_speculator(verification="exact")


def test_replay_equals_the_real_decoder_round_by_round(bundled_exact):
    """Exact verification, the trained drafter: tokens, rounds and every round's tau agree."""
    from adaptspec.models.prompts import benchmark_prompts

    spec = bundled_exact
    n = 40
    schedule = lambda i, taus: (2, 8, 4, 16, 1)[i % 5]  # noqa: E731  a per-round schedule
    accepted = 0
    for p in benchmark_prompts(per_benchmark=1)[:2]:
        ids = spec.target.encode_chat(p.prompt)
        d = dense_request(spec, ids, n, 16)
        pre = spec.prefill(ids)
        for b in (2, 4, 8, 16, schedule):
            out = spec.decode(pre, b if not callable(b) else (lambda i, rounds: schedule(i, None)), n)
            assert out.tokens == d.tokens.tolist()
            if out.finish_reason == "length":  # (after an EOS the decoder also checks drafts past it)
                assert replay(d.accept, len(d.tokens), n, b) == [r.tau for r in out.rounds], b
            accepted += sum(r.tau - 1 for r in out.rounds)
    assert accepted > 0  # the drafter was right sometimes: acceptance was exercised


def test_dense_set_resumes_and_refuses_foreign_directories(tmp_path):
    model = tiny_target("llama", eos=None)
    dec = make_decoder(model, max_block_size=8)
    prompts = [(f"r{i}", "d", [6 + i, 7, 8 + i]) for i in range(5)]
    ds = collect_dense(dec, prompts[:3], tmp_path / "dense", max_new_tokens=12, max_block_size=8, rows_per_part=2,
                       progress=False)
    assert ds.request_ids() == {"r0", "r1", "r2"} and len(ds.parts()) == 2
    before = [p.read_bytes() for p in ds.parts()]
    ds = collect_dense(dec, prompts, tmp_path / "dense", max_new_tokens=12, max_block_size=8, rows_per_part=2,
                       progress=False)
    assert ds.request_ids() == {f"r{i}" for i in range(5)} and [p.read_bytes() for p in ds.parts()[:2]] == before
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


def test_derived_trace_set_times_rounds_with_the_profile(tmp_path):
    model = tiny_target("qwen3", eos=None)
    dec = make_decoder(model, max_block_size=8)
    ds = collect_dense(dec, [("a", "d", [9, 10, 11, 12])], tmp_path / "dense", max_new_tokens=10, max_block_size=8,
                       progress=False)
    profile = get_profile("cpu-smollm2-bf16")
    traces = to_traceset(ds, [1, 4], profile)
    (_, _, r), = ds.requests()
    # B = 1: one plain step per token after the first, at contexts prompt + 1 .. prompt + 9
    ctx = 4 + np.arange(1, 10)
    expect = 1e3 * float(np.sum(profile.verify_s(np.ones(9), ctx)))
    assert 1e3 * traces.decode_s_matrix()[0, 0] == pytest.approx(expect)
    assert traces.rounds_matrix()[0, 0] == 9 and traces.tau_matrix()[0, 0] == 1.0
    taus = replay(r.accept, len(r.tokens), 10, 4)
    assert traces.rounds_matrix()[0, 1] == len(taus) and traces.tau_matrix()[0, 1] == pytest.approx(np.mean(taus))
    with pytest.raises(AdaptspecError, match="arms must be block sizes in 1..8"):
        to_traceset(ds, [1, 16], profile)
