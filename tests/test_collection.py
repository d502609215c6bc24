"""Trace collection from a real (tiny) decoder: every arm, resumable, shareable between processes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaptspec._util.jsonlines import read_jsonl
from adaptspec.collect.every_arm import collect_traces
from adaptspec.errors import AdaptspecError
from adaptspec.traces import TraceSet
from decoding_helpers import make_decoder, reference_greedy, tiny_target

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def setup():
    model = tiny_target("llama")
    prompts = [(f"r{i}", "ab"[i % 2], [6 + i, 7, 8, 9, 10]) for i in range(6)]
    return model, make_decoder(model), prompts


def test_collect_every_arm_with_real_stats(setup, tmp_path):
    model, dec, prompts = setup
    ts = collect_traces(dec, prompts, [4, 1, 2], tmp_path / "t", max_new_tokens=12, progress=False)
    assert ts.arms == (1, 2, 4) and len(ts) == 6
    assert ts.features.shape == (6, dec.target.feature_dim)
    tau = ts.tau_matrix()
    assert np.all(tau[:, 0] == 1.0) and np.all((tau >= 1) & (tau <= np.array([1, 2, 4])))
    assert np.all(
        ts.new_tokens_matrix() == np.array([len(reference_greedy(model, p[2], 12)) for p in prompts])[:, None]
    )
    assert np.all(ts.decode_s_matrix() > 0)
    assert TraceSet.read(tmp_path / "t").info()["requests"] == 6
    with pytest.raises(AdaptspecError, match="exists"):
        collect_traces(dec, prompts, [1, 2], tmp_path / "t", progress=False)
    with pytest.raises(
        AdaptspecError, match=r"max_block_size is 32, so block sizes \[99\] cannot be drafted"
    ):
        collect_traces(dec, prompts, [1, 99], tmp_path / "u", progress=False)
    with pytest.raises(AdaptspecError, match="distinct integers >= 1"):
        collect_traces(dec, prompts, [2, 2, 4], tmp_path / "u", progress=False)


def test_parts_and_resume_give_the_same_trace_set(setup, tmp_path):
    _, dec, prompts = setup
    out = tmp_path / "t"
    assert collect_traces(dec, prompts, [1, 2], out, max_new_tokens=8, progress=False, part=(0, 2)) is None
    assert not out.exists()
    seen = []
    collect_traces(
        dec, prompts, [1, 2], out, max_new_tokens=8, progress=False, part=(1, 2), on_prompt=seen.append
    )
    assert len(seen) == 3
    again = []
    ts = collect_traces(dec, prompts, [1, 2], out, max_new_tokens=8, progress=False, on_prompt=again.append)
    assert again == []  # everything was done by the parts
    assert list(ts.request_ids) == [p[0] for p in prompts]
    assert not list(tmp_path.glob("t.partial*"))
    collect_traces(dec, prompts, [1, 2], tmp_path / "v", max_new_tokens=8, progress=False, part=(0, 2))
    with pytest.raises(AdaptspecError, match="collected with arms"):
        collect_traces(dec, prompts, [1, 4], tmp_path / "v", max_new_tokens=8, progress=False)


def test_a_crash_mid_row_is_resumed_and_the_next_rows_stay_readable(setup, tmp_path):
    _, dec, prompts = setup
    out = tmp_path / "t"
    collect_traces(dec, prompts, [1, 2], out, max_new_tokens=8, progress=False, part=(0, 2))
    partial = tmp_path / "t.partial-0-of-2.jsonl"
    data = partial.read_bytes()
    partial.write_bytes(data[: len(data) - 20])  # the crash: the last row's write never finished
    again = []
    collect_traces(
        dec, prompts, [1, 2], out, max_new_tokens=8, progress=False, part=(0, 2), on_prompt=again.append
    )
    assert again == [0]  # only the torn row is decoded again
    # the torn bytes were cut off, not glued to the new row's line
    assert [r["request_id"] for r in read_jsonl(partial).records] == ["r0", "r2", "r4"]
    collect_traces(dec, prompts, [1, 2], out, max_new_tokens=8, progress=False, part=(1, 2))
    last = []
    ts = collect_traces(dec, prompts, [1, 2], out, max_new_tokens=8, progress=False, on_prompt=last.append)
    assert last == []  # every row of both parts was read back
    fresh = collect_traces(dec, prompts, [1, 2], tmp_path / "fresh", max_new_tokens=8, progress=False)
    assert list(ts.request_ids) == list(fresh.request_ids)
    assert np.array_equal(ts.tau_matrix(), fresh.tau_matrix())
    assert np.array_equal(ts.new_tokens_matrix(), fresh.new_tokens_matrix())


def test_missing_parent_directories_are_created_and_the_function_is_exported(setup, tmp_path):
    import adaptspec.collect

    _, dec, prompts = setup
    out = tmp_path / "not" / "yet" / "there" / "t"
    ts = adaptspec.collect.collect_traces(dec, prompts[:2], [1, 2], out, max_new_tokens=4, progress=False)
    assert adaptspec.collect.collect_traces is collect_traces
    assert TraceSet.read(out).info()["requests"] == 2 == len(ts)
    assert not list(out.parent.glob("t.partial*"))
