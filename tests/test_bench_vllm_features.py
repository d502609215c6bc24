"""The figures of benchmarks/bench_vllm_features.py, without
vLLM or a model: a split's scores against hand sums, the prompt splits, and each context's columns
(the hidden features' reduction fitted on the training prompts alone)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from _scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_vllm_features")


def test_a_splits_scores_are_the_hand_sums(bench):
    # token_latency rewards (minus ms per token) of two requests at block sizes (1, 2)
    R = np.array([[-10.0, -20.0], [-30.0, -15.0]])
    tokens = np.array([[10.0, 10.0], [20.0, 20.0]])
    secs = np.array([[1.0, 2.0], [4.0, 2.0]])
    m = bench.score(np.array([1, 1]), R, tokens, secs)
    # oracle -10 + -15 = -25; chosen -20 + -15 = -35: 25/35 of the oracle's speed
    assert m["pct_oracle"] == pytest.approx(100 * 25 / 35)
    # the best fixed is block size 2 (-35 against -40): the choice is it
    assert m["pct_best_fixed"] == pytest.approx(100.0)
    # tokens a second: (10 + 20) / (2 + 2) chosen; the best fixed rate is max(30/5, 30/4)
    assert m["throughput_vs_best_fixed"] == pytest.approx((30 / 4) / (30 / 4))
    m = bench.score(np.array([0, 0]), R, tokens, secs)
    assert m["pct_best_fixed"] == pytest.approx(100 * 35 / 40) and m["pct_oracle"] == pytest.approx(
        100 * 25 / 40
    )
    assert m["throughput_vs_best_fixed"] == pytest.approx((30 / 5) / (30 / 4))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 300), s=st.integers(0, 50), f=st.floats(0.05, 0.95))
def test_a_split_holds_out_its_share_of_the_prompts_never_none_never_all_and_the_same_each_time(
    bench, n, s, f
):
    held = bench.split(n, s, f)
    assert 1 <= len(held) <= n - 1 and len(set(held.tolist())) == len(held)
    assert len(held) == min(max(1, round(f * n)), n - 1)
    assert np.all((held >= 0) & (held < n)) and np.array_equal(held, bench.split(n, s, f))


def test_each_context_is_its_columns_and_the_hidden_reduction_never_sees_the_held_out_prompts(bench):
    rng = np.random.default_rng(0)
    n_prompts, loads = 40, 3
    P = np.repeat(np.arange(n_prompts), loads)  # every prompt at three loads
    H = rng.normal(size=(n_prompts, 50))
    Xp = rng.random((len(P), 6))
    L = rng.random((len(P), 5))
    held = bench.split(n_prompts, 0, 0.3)
    test, train = np.flatnonzero(np.isin(P, held)), np.flatnonzero(~np.isin(P, held))
    tr, te = bench.contexts("load", train, test, P, H, L, Xp)
    assert np.array_equal(tr, L[train]) and np.array_equal(te, L[test])
    tr, te = bench.contexts("prompt+load", train, test, P, H, L, Xp)
    assert np.array_equal(tr, np.hstack([Xp[train], L[train]])) and np.array_equal(
        te, np.hstack([Xp[test], L[test]])
    )
    tr, te = bench.contexts("hidden+load", train, test, P, H, L, Xp)
    assert tr.shape[1] == te.shape[1] and np.array_equal(tr[:, -5:], L[train])
    # the same prompt at every load gets the same hidden columns
    assert np.array_equal(tr[P[train] == P[train][0], :-5][0], tr[P[train] == P[train][0], :-5][-1])
    # the held-out prompts' hidden features changed: the training contexts are unchanged (fitted without them)
    H2 = H.copy()
    H2[held] = rng.normal(size=(len(held), 50)) * 100
    tr2, _ = bench.contexts("hidden+load", train, test, P, H2, L, Xp)
    assert np.array_equal(tr, tr2)
    # the PCA keeps the last raw column (the log length) as it is
    tr3, _ = bench.contexts("hidden+prompt+load", train, test, P, H, L, Xp)
    assert tr3.shape[1] == tr.shape[1] + 6
