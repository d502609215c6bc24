"""Latency model: the named profiles' figures, monotonicity, fitting, persistence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import adaptspec
from adaptspec.costs.latency import (
    PROFILES,
    CostCurve,
    LatencyProfile,
    RowsCostCurve,
    fit_curve,
    fit_profile,
    get_profile,
)
from adaptspec.errors import AdaptspecError
from adaptspec.speculator import Round


def test_cpu_profile_reproduces_the_measured_figures():
    p = get_profile("cpu-smollm2-bf16")
    np.testing.assert_allclose(1000 * p.verify_s([1, 8, 16, 32], 300), [40, 45, 52, 67], atol=1e-6)
    np.testing.assert_allclose(1000 * p.draft_s([8, 16], 300), [10, 16], atol=1e-6)
    assert float(p.draft_s(1)) == 0.0
    # break-even arithmetic of REFERENCES.md: ~1.4 tokens per round at B=8
    assert 1.3 < float(p.round_s(8) / p.plain_token_s()) < 1.5


def test_gpu_profile_is_a_roofline_consistent_with_dflash():
    p = get_profile("h100-qwen3-8b")
    flat = p.verify_s(np.array([1, 16, 64]))
    assert flat[1] / flat[0] < 1.05 and flat[2] / flat[0] < 1.2  # memory-bound: nearly flat
    assert p.verify_s(16, batch=64) / p.verify_s(16) > 2.0  # compute-bound under load
    speedup = 6.5 * p.plain_token_s() / p.round_s(16)
    assert 4.5 < float(speedup) < 6.0  # DFlash: 5.15x at tau 6.53
    assert "roofline" in p.source and "3.35 TB/s" in p.source


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(PROFILES)),
    b=st.integers(1, 63),
    c=st.integers(0, 8000),
    m=st.integers(1, 64),
    db=st.integers(0, 8),
    dc=st.integers(0, 500),
    dm=st.integers(0, 8),
)
def test_profiles_never_decrease(name, b, c, m, db, dc, dm):
    p = get_profile(name)
    # a profile by rows holds each row count's measured medians, and vLLM's steps here are cheaper
    # at 4 requests than at 2 and at 3-6 tokens than at 1-2 (BENCHMARKS.md): it never decreases in
    # the context; a monotone curve in all three
    if isinstance(p.verify, RowsCostCurve):
        dm = 0
        if not all(c.monotone for _, c in p.verify.curves):
            db = 0
    for f in (p.draft_s, p.verify_s, p.round_s):
        assert f(b + db, c + dc, m + dm) >= f(b, c, m) - 1e-15


def reference_rows_curve(curves, b, c, m):
    """A scalar reading of RowsCostCurve's docstring: the nearest measured row counts' curves at the
    same block size, weighted by distance in rows; the largest's over the tokens beyond it."""
    rows = [r for r, _ in curves]
    if m >= rows[-1]:
        return float(curves[-1][1](b, c, m))
    if m <= rows[0]:
        return float(curves[0][1](b, c, m))
    for (r0, f0), (r1, f1) in zip(curves, curves[1:]):
        if r0 <= m <= r1:
            return float(f0(b, c, r0)) + (m - r0) / (r1 - r0) * (float(f1(b, c, r1)) - float(f0(b, c, r0)))
    raise AssertionError("unreachable")


curve_strategy = st.builds(
    lambda base, rises, tail: CostCurve(
        tuple(float(2**i) for i in range(len(rises) + 1)), tuple(base + np.cumsum([0.0, *rises])), tail
    ),
    st.floats(0.001, 0.1),
    st.lists(st.floats(0, 0.05), max_size=4),
    st.floats(0, 0.01),
)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.integers(1, 16), min_size=1, max_size=4, unique=True),
    curves=st.lists(curve_strategy, min_size=4, max_size=4),
    b=st.lists(st.integers(1, 12), min_size=1, max_size=5),
    c=st.integers(0, 500),
    m=st.integers(1, 40),
)
def test_a_curve_by_rows_is_its_docstring(rows, curves, b, c, m):
    by_rows = tuple(zip(sorted(rows), curves))
    curve = RowsCostCurve(by_rows)
    got = curve(np.array(b), c, m)
    np.testing.assert_allclose(
        got, [reference_rows_curve(by_rows, x, c, m) for x in b], rtol=1e-12, atol=1e-15
    )
    again = RowsCostCurve.from_dict(json.loads(json.dumps(curve.to_dict())))
    assert again == curve


def test_a_profile_by_rows_round_trips_and_bad_rows_are_refused(tmp_path):
    one, four = CostCurve((1,), (0.05,)), CostCurve((4, 8), (0.05, 0.07))
    p = LatencyProfile("rows", draft=CostCurve((1,), (0.0,)), verify=RowsCostCurve(((1, one), (4, four))))
    p.save(tmp_path / "p.json")
    assert LatencyProfile.load(tmp_path / "p.json") == p
    assert float(p.verify_s(2, None, 4)) == pytest.approx(0.07)  # 4 rows, 8 tokens
    from adaptspec.simulators.load_sim import misjudged

    assert float(misjudged(p, 2.0).verify_s(2, None, 4)) == pytest.approx(
        0.05 + 2 * 0.02
    )  # each further token 2x
    for rows, msg in (
        ({}, "one or more row counts"),
        ({"0": one.to_dict()}, "row count '0' is not a positive"),
        ({"x": one.to_dict()}, "row count 'x'"),
        ({"1": one.to_dict(), "01": one.to_dict()}, "must increase"),
        ({"1": {"knots": [1]}}, "missing or bad field"),
    ):
        (tmp_path / "bad.json").write_text(json.dumps({**p.to_dict(), "verify": {"rows": rows}}))
        with pytest.raises(AdaptspecError, match=msg):
            LatencyProfile.load(tmp_path / "bad.json")
    with pytest.raises(AdaptspecError, match="verify times must be > 0"):
        LatencyProfile("z", draft=one, verify=RowsCostCurve(((1, one), (2, CostCurve((1,), (0.0,))))))


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 64), min_size=2, max_size=12),
    secs=st.lists(st.floats(0.001, 0.2), min_size=12, max_size=12),
    seed=st.integers(0, 100),
)
def test_fit_is_monotone_whatever_the_data(sizes, secs, seed):
    c = fit_curve(np.array(sizes), np.array(secs[: len(sizes)]))
    grid = np.arange(1, 100)
    assert np.all(np.diff(c(grid)) >= -1e-12)
    assert c.tail_slope_s >= 0 and np.all(np.asarray(c.values_s) >= 0)


def test_fit_recovers_a_known_curve_with_context_terms():
    rng = np.random.default_rng(0)
    truth = CostCurve(
        knots=(1, 8, 32),
        values_s=(0.02, 0.025, 0.05),
        tail_slope_s=0.001,
        per_context_s=2e-6,
        per_pair_s=1e-9,
    )
    b = rng.choice([1, 2, 4, 8, 16, 24, 32, 48], 600)
    ctx = rng.integers(50, 3000, 600)
    m = rng.choice([1, 2, 4], 600)
    y = truth(b, ctx, m) * np.exp(rng.normal(0, 0.01, 600))
    c = fit_curve(b, y, ctx, m)
    grid_b, grid_c = np.meshgrid([1, 4, 8, 16, 32, 48], [100, 1000, 2500])
    np.testing.assert_allclose(c(grid_b, grid_c, 2), truth(grid_b, grid_c, 2), rtol=0.03)
    assert c.per_context_s == pytest.approx(2e-6, rel=0.2)


def test_fit_profile_from_rounds_and_json_round_trip(tmp_path):
    rounds = [Round(b, 1, 0.005 + 0.0004 * b, 0.03 + 0.001 * b) for b in (1, 2, 4, 8, 16) for _ in range(4)]
    p = fit_profile(rounds, "mine", context_tokens=200)
    assert p.name == "mine" and p.context_tokens == 200
    assert float(p.verify_s(8)) == pytest.approx(0.038, rel=1e-6)
    assert float(p.draft_s(8)) == pytest.approx(0.0082, rel=1e-6) and float(p.draft_s(1)) == 0.0
    p.save(tmp_path / "p.json")
    q = get_profile(str(tmp_path / "p.json"))
    assert q == p
    np.testing.assert_array_equal(q.round_s(np.arange(1, 40)), p.round_s(np.arange(1, 40)))
    assert not list(tmp_path.glob(".*"))


def test_vectorised_prediction_broadcasts():
    p = get_profile("cpu-smollm2-bf16")
    out = p.round_s(np.array([1, 4, 16])[None, :], np.array([[100], [1000]]), 1)
    assert out.shape == (2, 3)
    assert out[1, 2] > out[0, 2] > out[0, 1] > out[0, 0]


@pytest.mark.parametrize(
    "content,msg",
    [
        ("{", "not valid JSON (a JSON latency profile expected"),
        ("[]", "top level is not an object"),
        (
            json.dumps({"name": "x", "verify": {"knots": [1], "values_s": [0.01]}}),
            "missing or bad field 'draft'",
        ),
        (
            json.dumps(
                {
                    "name": "x",
                    "draft": {"knots": [1, 2], "values_s": [0.02, 0.01]},
                    "verify": {"knots": [1], "values_s": [0.01]},
                }
            ),
            "never decrease",
        ),
    ],
)
def test_bad_profile_files_name_the_file(tmp_path, content, msg):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(AdaptspecError) as e:
        LatencyProfile.load(f)
    assert msg in str(e.value) and str(f) in str(e.value)


def test_bad_inputs():
    with pytest.raises(AdaptspecError, match="unknown latency profile 'nope'"):
        get_profile("nope")
    with pytest.raises(AdaptspecError, match="knots must increase"):
        CostCurve(knots=(2, 1), values_s=(0.1, 0.2))
    with pytest.raises(AdaptspecError, match="values must be >= 0 and never decrease"):
        CostCurve(knots=(1, 2), values_s=(0.2, 0.1))
    table = CostCurve(
        knots=(1, 2, 3), values_s=(0.056, 0.065, 0.049), monotone=False
    )  # measured medians may fall
    assert CostCurve.from_dict(json.loads(json.dumps(table.to_dict()))) == table
    assert float(table(2.5)) == pytest.approx(0.057)
    with pytest.raises(AdaptspecError, match="values must be >= 0, got"):
        CostCurve(knots=(1, 2), values_s=(0.1, -0.1), monotone=False)
    with pytest.raises(AdaptspecError, match="monotone must be true or false"):
        CostCurve.from_dict({"knots": [1], "values_s": [0.1], "monotone": "no"})
    with pytest.raises(AdaptspecError, match="per_context_s must be finite and >= 0"):
        CostCurve(knots=(1,), values_s=(0.1,), per_context_s=-1.0)
    with pytest.raises(AdaptspecError, match="seconds has NaN"):
        fit_curve([1, 2], [0.1, float("nan")])
    with pytest.raises(AdaptspecError, match="needs at least one measured round"):
        fit_profile([])
    with pytest.raises(AdaptspecError, match="round 1: block_size 0"):
        fit_profile([Round(2, 1, 0.01, 0.02), {"block_size": 0, "draft_s": 0.0, "verify_s": 0.01}])


def test_the_shipped_measured_profiles_are_found():
    # the JSON profiles shipped in adaptspec/data/latency/ (the bundled head's rewards were timed by one)
    shipped = sorted(p.stem for p in (Path(adaptspec.__file__).parent / "data" / "latency").glob("*.json"))
    assert "cpu-smollm2-fast" in shipped
    for name in shipped:
        assert get_profile(name).name == name


@settings(max_examples=25, deadline=None)
@given(
    st.floats(0.01, 0.05),
    st.floats(1e-4, 3e-3),
    st.floats(0, 2e-5),
    st.floats(1e-3, 8e-3),
    st.floats(0, 3e-3),
)
def test_whole_round_fit_recovers_a_batched_cost_it_can_represent(
    base, per_token, per_ctx, draft_base, per_row
):
    # rounds generated from a known model: target pass a + k * tokens + e * context * rows, and for
    # speculating rounds a draft pass d + r * rows; the joint fit must reproduce every total
    from adaptspec.costs.latency import fit_round_totals

    rounds = [
        dict(
            block_size=b,
            batch_size=m,
            context_tokens=c,
            draft_s=0.0,
            verify_s=base + per_token * b * m + per_ctx * c * m + (b > 1) * (draft_base + per_row * m),
        )
        for b in (1, 2, 3, 4, 8)
        for m in (1, 2, 4, 8, 16)
        for c in (64, 256)
    ]
    p = fit_round_totals(rounds, "known")
    for r in rounds:
        want = r["verify_s"]
        got = float(p.round_s(r["block_size"], r["context_tokens"], r["batch_size"]))
        assert got == pytest.approx(want, rel=2e-3, abs=2e-5)
    assert float(p.draft_s(1, 100, 8)) == 0.0  # plain rounds draft nothing
