"""collect-vllm's trace sets pooled with the load (adaptspec.vllm.pool, ``adaptspec pool-vllm-traces``).

No vLLM here. The sets are built by hand as collect-vllm writes them (its meta keys, six prompt
features a request); the load features are checked against their definition written out again
(log2(1 + rows), log2(1 + queue), log2(prompt tokens), sampled, log2(max_tokens)), and a head
trained on a pooled set is checked to decide in a controller made as the plug-in makes one with
``load_features``: the prompt features and the load it is given, in that order.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.cli import main
from adaptspec.errors import AdaptspecError
from adaptspec.traces import TraceSet, load_traces
from adaptspec.vllm.pool import POOLED_FEATURES, with_load

ARMS = [1, 2, 3]
META = {
    "source": "adaptspec collect-vllm",
    "engine": "vLLM 0.32.0",
    "target": "T",
    "drafter": "D",
    "method": "dflash",
    "num_speculative_tokens": 2,
    "features": "vllm-prompt-tokens",
    "temperature": 0.0,
    "max_new_tokens": 64,
    "dtype": "float32",
}


def collected(concurrency, prompt_tokens, seed=0, **meta):
    """A trace set as collect-vllm writes it at ``concurrency``: one request per prompt length."""
    rng = np.random.default_rng(seed)
    n = len(prompt_tokens)
    taus = [[1] * 11, [2] * 5 + [1], [3, 3, 3, 2]] * n
    return TraceSet.from_arrays(
        [f"gsm8k-{i:04d}" for i in range(n)],
        ["gsm8k"] * n,
        ARMS,
        np.array([[np.mean(t) for t in taus[:3]]] * n),
        prompt_tokens=prompt_tokens,
        features=rng.random((n, 6)),
        new_tokens=np.full((n, 3), 12),
        rounds=np.array([[len(t) for t in taus[:3]]] * n),
        decode_ms=rng.uniform(100, 900, (n, 3)),
        tau=taus,
        meta={**META, "concurrency": concurrency, **meta},
    )


def expected_load(rows, prompt_tokens, max_tokens=64, sampled=0.0):
    return [np.log2(1 + rows), 0.0, np.log2(prompt_tokens), sampled, np.log2(max_tokens)]


@settings(max_examples=40, deadline=None)
@given(
    levels=st.lists(st.integers(1, 256), min_size=1, max_size=4, unique=True),
    lengths=st.lists(st.integers(1, 4000), min_size=1, max_size=5),
)
def test_every_request_gets_its_prompt_features_then_the_load_at_its_sets_concurrency(levels, lengths):
    sets = [collected(c, lengths, seed=i) for i, c in enumerate(levels)]
    pooled = with_load(sets)
    assert pooled.n_requests == len(levels) * len(lengths)
    assert pooled.meta["features"] == POOLED_FEATURES and pooled.meta["concurrency"] == sorted(levels)
    assert len(pooled.meta["feature_names"]) == pooled.features.shape[1] == 11
    for s, c in zip(sets, levels):
        for i, rid in enumerate(s.request_ids):
            j = list(pooled.request_ids).index(f"{rid}@c{c}")
            assert np.array_equal(pooled.features[j, :6], s.features[i])
            assert pooled.features[j, 6:] == pytest.approx(expected_load(c, lengths[i]), rel=1e-6)
            assert pooled.column("concurrency")[j] == c
            # its outcomes are the set's own, untouched
            assert np.array_equal(pooled.decode_s_matrix()[j], s.decode_s_matrix()[i])
            assert np.array_equal(pooled.tau_matrix()[j], s.tau_matrix()[i])


def test_a_sampled_set_and_its_max_tokens_reach_the_load():
    pooled = with_load([collected(4, [10, 20], temperature=0.7, max_new_tokens=128)])
    assert pooled.features[1, 6:] == pytest.approx(
        expected_load(4, 20, max_tokens=128, sampled=1.0), rel=1e-6
    )


@pytest.mark.parametrize(
    "second, words",
    [
        (lambda: collected(1, [5]), "a second trace set at concurrency 1"),
        (lambda: collected(4, [5], features="last:-1,mean:mid,len"), "not a collect-vllm trace set"),
        (lambda: collected(4, [5], target="other"), "meta.json target 'other'"),
        (lambda: collected(4, [5], max_new_tokens=32), "meta.json max_new_tokens 32"),
        (lambda: collected(0, [5]), "concurrency 0 is not an integer >= 1"),
    ],
)
def test_sets_that_cannot_be_pooled_are_refused_naming_why(second, words):
    with pytest.raises(AdaptspecError, match=words):
        with_load([collected(1, [5, 6]), second()])


@pytest.mark.slow
def test_the_command_writes_a_set_train_head_reads_and_the_head_decides_on_prompt_and_load(tmp_path, capsys):
    from adaptspec.control.controller import AdaptiveController
    from adaptspec.speculator import LoadState

    paths = [collected(c, [8, 30, 200, 900] * 4, seed=c).write(tmp_path / f"c{c}") for c in (1, 8)]
    assert main(["pool-vllm-traces", *map(str, paths), "--out", str(tmp_path / "pooled")]) == 0
    assert "32 requests x 3 block sizes" in capsys.readouterr().out
    pooled = load_traces(tmp_path / "pooled")
    assert json.loads((tmp_path / "pooled" / "meta.json").read_text())["concurrency"] == [1, 8]
    assert (
        main(["train-head", str(tmp_path / "pooled"), "--out", str(tmp_path / "head"), "--epochs", "3"]) == 0
    )
    # the plug-in's controller for a variant (adaptspec.vllm.plugin._controller): six prompt features, load_features
    c = AdaptiveController.for_engine(
        ARMS,
        6,
        f"neural-linear:head={tmp_path / 'head'}",
        load_features=True,
        decide_on_caller=True,
        prefix_drafts=True,
    )
    try:
        d = c.decide(
            pooled.features[0, :6],
            load=LoadState(rows=1, queue=0, context_tokens=8, temperature=0.0, max_tokens=64),
        )
        assert d.block_size in ARMS
    finally:
        c.close()
    # a second run refuses to overwrite without --force, in one line
    assert main(["pool-vllm-traces", *map(str, paths), "--out", str(tmp_path / "pooled")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "pooled" in err
