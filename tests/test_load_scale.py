"""Batched rewards on the scale of one row (adaptspec/reward/load_scale.py, the engine loop's use of it)."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.batching import BatchEngine
from adaptspec.costs.latency import CostCurve, LatencyProfile, get_profile
from adaptspec.reward.load_scale import OneRowScale
from adaptspec.serving.engine.loop import EngineLoop
from adaptspec.serving.tiny import tiny_speculator


def linear(a: float, k: float) -> LatencyProfile:
    """A plain pass of ``a + k x rows`` seconds (one token a row: ``k`` per position beyond the first)."""
    return LatencyProfile(
        "linear", draft=CostCurve((1,), (0.0,)), verify=CostCurve((1,), (a + k,), tail_slope_s=k)
    )


@settings(max_examples=60, deadline=None)
@given(a=st.floats(1e-4, 0.1), k=st.floats(0.0, 0.01), rows=st.integers(1, 64), context=st.integers(1, 4000))
def test_the_factor_is_the_closed_form_of_a_linear_pass(a, k, rows, context):
    assert OneRowScale(linear(a, k)).factor(rows, context) == pytest.approx(rows * (a + k) / (a + k * rows))


def test_a_plain_row_costs_one_plain_round_alone_at_every_load_when_the_model_is_right():
    """The point of the scale: measured time = the model's plain round, split equally among n
    plain rows, comes back as one row's plain round, whatever n."""
    prof = get_profile("cpu-smollm2-batched")
    scale = OneRowScale(prof)
    alone = float(prof.verify(1, 260, 1))
    for n in (1, 2, 4, 8, 16):
        share = float(prof.verify(1, 260, n)) / n
        assert share * scale.factor(n, 260) == pytest.approx(alone, rel=1e-9)
    assert (
        scale.factor(16, 260) > 5
    )  # and the raw shares differ by that much: what a load-blind policy would learn


def test_the_engine_loop_rescales_each_rounds_share_by_its_rows():
    """Plain requests sharing rounds: every row pays an equal share of each round (serial cost
    sharing on equal widths), so a request's one-row time is the sum over its rounds of
    ``round decode time x (a + k) / (a + k x rows)`` (the closed form), and its attributed time
    the same sum without the factor."""
    spec, codec = tiny_speculator(seed=2, verification="exact")
    a, k = 0.020, 0.004
    with EngineLoop(BatchEngine(spec.target, spec.drafter, max_rows=4), profile=linear(a, k)) as loop:
        hold = (
            threading.Event()
        )  # hold the engine's thread until every request is queued, so they share rounds
        blocker = loop.submit(codec.encode("wait"), max_new_tokens=2, on_tokens=lambda ids: hold.wait(60))
        tickets = [
            loop.submit(codec.encode(p), block_size=1, max_new_tokens=n)
            for p, n in (("one", 5), ("two words", 9), ("three", 13))
        ]
        deadline = time.time() + 60
        while loop.queue_length < 3 and time.time() < deadline:
            time.sleep(0.005)
        hold.set()
        for t in tickets:
            t.wait(timeout=120)
        blocker.wait(60)
        history = list(loop.engine.history)
    assert max(r.rows for r in history) == 4  # they really shared rounds
    for t in [blocker, *tickets]:
        mine = [r for r in history if t.handle.id in r.requests]
        decode = [r.round_s - r.join_s for r in mine]
        assert t.attributed_s == pytest.approx(sum(d / r.rows for d, r in zip(decode, mine)), rel=1e-9)
        assert t.one_row_s == pytest.approx(
            sum(d * (a + k) / (a + k * r.rows) for d, r in zip(decode, mine)), rel=1e-9
        )


def test_without_a_cost_model_the_one_row_time_is_the_attributed_time():
    spec, codec = tiny_speculator(seed=2, verification="exact")
    with EngineLoop(BatchEngine(spec.target, spec.drafter, max_rows=4)) as loop:
        ts = [loop.submit(codec.encode(p), block_size=b, max_new_tokens=6) for p, b in (("x", 1), ("yy", 4))]
        for t in ts:
            t.wait(timeout=120)
    assert all(t.one_row_s == t.attributed_s > 0 for t in ts)
