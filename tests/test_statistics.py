"""adaptspec.analysis.statistics: the always-valid sequential test and the fixed-sample intervals.

Expected values come from a second method: the mSPRT recomputed from each prefix of the stream
with numpy's own means and variances, t and normal quantiles from printed tables, the
order-statistic interval from the binomial law directly, Welch's test by hand, and coverage
measured on simulated data with a known truth.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats

from adaptspec import AdaptspecError
from adaptspec.analysis.statistics import (
    mean_interval,
    quantile_interval,
    ratio_interval,
    sequential_test,
    welch_p,
)


# ============================================================================ the sequential test
def msprt_by_prefix(g, y, alpha=0.05, tau_sd=0.2, min_n=10):
    """The always-valid p after every observation and the final interval, each prefix recomputed
    from scratch from the closed form (no running sums)."""
    p, best = [], 1.0
    ci = (-math.inf, math.inf)
    for t in range(1, len(y) + 1):
        a, b = y[:t][g[:t] == 0], y[:t][g[:t] == 1]
        if len(a) >= min_n and len(b) >= min_n:
            V = a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b)
            tau2 = tau_sd**2 * (a.var(ddof=1) + b.var(ddof=1)) / 2
            d = a.mean() - b.mean()
            lam = math.sqrt(V / (V + tau2)) * math.exp(tau2 * d * d / (2 * V * (V + tau2)))
            best = min(best, 1 / lam)
            w = math.sqrt(2 * V * (V + tau2) / tau2 * (math.log(1 / alpha) + math.log((V + tau2) / V) / 2))
            ci = (d - w, d + w)
        p.append(best)
    return np.array(p), ci


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000), n=st.integers(0, 120), shift=st.floats(0.0, 2.0), scale=st.floats(0.1, 50.0)
)
def test_sequential_test_matches_the_closed_form_on_every_prefix(seed, n, shift, scale):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, 2, n)
    y = 100.0 + scale * rng.normal(size=n) + shift * scale * g
    t = sequential_test(g, y)
    p, ci = msprt_by_prefix(g, y)
    np.testing.assert_allclose(t.p_path, p, rtol=1e-7, atol=1e-12)
    assert t.ci == pytest.approx(ci, rel=1e-7, abs=1e-9)
    assert t.n == (int((g == 0).sum()), int((g == 1).sum()))
    hit = np.flatnonzero(p <= 0.05)
    assert t.stopped_at == (int(hit[0]) + 1 if len(hit) else None)
    if t.stopped_at is not None:
        k = t.stopped_at
        a, b = y[:k][g[:k] == 0], y[:k][g[:k] == 1]
        assert t.winner == (0 if a.mean() > b.mean() else 1)


@pytest.mark.slow  # ~14 s
def test_type_one_error_holds_under_continuous_monitoring():
    # 300 A/A streams of 1,500 skewed rewards, looked at after every single request
    rng = np.random.default_rng(0)
    stopped_msprt = stopped_naive = 0
    for _ in range(300):
        g = rng.integers(0, 2, 1500)
        y = rng.gamma(2.0, 15.0, 1500)
        stopped_msprt += sequential_test(g, y).stopped_at is not None
        # what peeking with a plain t-test every 50 requests would do
        stopped_naive += any(
            stats.ttest_ind(y[:n][g[:n] == 0], y[:n][g[:n] == 1]).pvalue < 0.05 for n in range(100, 1501, 50)
        )
    assert stopped_msprt / 300 <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 300)
    assert stopped_naive / 300 > 0.12  # the reason for an always-valid test


def test_detects_a_real_difference_and_names_the_winner():
    rng = np.random.default_rng(1)
    wins, stops = 0, []
    for _ in range(40):
        g = rng.integers(0, 2, 3000)
        y = rng.normal(30.0 + 1.5 * g, 5.0)  # 0.3 standard deviations
        t = sequential_test(g, y)
        if t.stopped_at is not None:
            stops.append(t.stopped_at)
            wins += t.winner == 1
    assert len(stops) >= 36 and wins == len(stops) and np.median(stops) < 1500


def test_always_valid_interval_covers_the_truth_and_is_wider_than_a_fixed_one():
    rng = np.random.default_rng(2)
    cover = 0
    for _ in range(100):
        g = rng.integers(0, 2, 800)
        y = rng.normal(10.0 - 0.5 * g, 3.0)
        t = sequential_test(g, y)
        cover += t.ci[0] <= 0.5 <= t.ci[1]
        fixed = 1.959964 * math.sqrt(np.var(y[g == 0], ddof=1) / t.n[0] + np.var(y[g == 1], ddof=1) / t.n[1])
        assert (t.ci[1] - t.ci[0]) / 2 > fixed
    assert cover >= 95


def test_sequential_test_edge_cases():
    t = sequential_test(np.array([0, 1] * 4), np.arange(8.0))  # fewer than min_n: nothing tested
    assert t.stopped_at is None and t.p_value == 1.0 and t.ci == (-math.inf, math.inf)
    assert t.means == (3.0, 4.0)
    assert sequential_test(np.array([], int), np.array([])).n == (0, 0)
    p = sequential_test(np.tile([0, 1], 200), np.tile([5.0, 5.0], 200) + np.arange(400) * 1e-9).p_path
    assert np.all(np.diff(p) <= 0)  # the always-valid p never goes back up
    with pytest.raises(AdaptspecError, match="0 or 1"):
        sequential_test(np.array([0, 2]), np.array([1.0, 2.0]))
    with pytest.raises(AdaptspecError, match="not finite"):
        sequential_test(np.array([0, 1]), np.array([1.0, np.nan]))
    with pytest.raises(AdaptspecError, match="alpha"):
        sequential_test(np.array([0, 1]), np.array([1.0, 2.0]), alpha=1.5)
    with pytest.raises(AdaptspecError, match="tau_sd"):
        sequential_test(np.array([0, 1]), np.array([1.0, 2.0]), tau_sd=0)


def test_to_json_names_the_groups():
    rng = np.random.default_rng(3)
    g = rng.integers(0, 2, 2000)
    d = sequential_test(g, rng.normal(5.0 + g, 1.0)).to_json(("ctl", "new"))
    assert d["diff_of"] == "ctl - new" and d["winner"] == "new" and d["significant"] is True
    assert set(d["n"]) == {"ctl", "new"} and d["n"]["new"] == int(g.sum())


# ============================================================================ fixed-sample intervals
def test_mean_interval_is_the_tabled_t_interval():
    lo, hi = mean_interval(np.array([1.0, 2.0, 3.0]), 0.95)
    half = 4.302653 / math.sqrt(3)  # t(0.975, 2 df) from a t table; s = 1
    assert (lo, hi) == pytest.approx((2 - half, 2 + half), abs=1e-6)
    lo, hi = mean_interval(np.array([10.0, 12.0, 14.0, 16.0, 18.0]), 0.90)
    half = 2.131847 * math.sqrt(10.0) / math.sqrt(5)  # t(0.95, 4 df); s^2 = 10
    assert (lo, hi) == pytest.approx((14 - half, 14 + half), abs=1e-6)
    assert mean_interval(np.array([1.0]), 0.95) is None
    assert mean_interval(np.array([2.0, 2.0]), 0.95) == (2.0, 2.0)


def test_ratio_interval_with_a_constant_denominator_is_the_normal_interval_of_the_mean():
    rng = np.random.default_rng(4)
    num = rng.normal(50.0, 8.0, 400)
    R, (lo, hi) = ratio_interval(num, np.full(400, 0.5), 0.95)  # sum(num) / sum(0.5) = 2 mean(num)
    half = 1.959964 * 2 * num.std(ddof=1) / math.sqrt(400)
    assert R == pytest.approx(2 * num.mean()) and (lo, hi) == pytest.approx((R - half, R + half), rel=1e-6)
    assert math.isnan(ratio_interval(np.zeros(0), np.zeros(0), 0.95)[0])
    assert ratio_interval(np.array([3.0]), np.array([2.0]), 0.95) == (1.5, None)


def test_ratio_interval_covers_the_ratio_of_means():
    # tokens / seconds with random lengths and speeds: the truth is E[tokens] / E[seconds]
    rng = np.random.default_rng(5)
    cover = 0
    for _ in range(200):
        sec = rng.gamma(4.0, 0.25, 300)  # mean 1 s
        tok = sec * rng.normal(40.0, 6.0, 300)  # 40 tokens per second on average, independent of length
        _, (lo, hi) = ratio_interval(tok, sec, 0.95)
        cover += lo <= 40.0 <= hi
    assert cover >= 180  # 95% nominal: at least 90% of 200


def binomial_order_statistics(x, q, level):
    """The classical interval [x_(l), x_(u)] with l, u from the Binomial(n, q) quantiles."""
    n, s = len(x), np.sort(x)
    a = (1 - level) / 2
    lo, hi = int(stats.binom.ppf(a, n, q)), int(stats.binom.ppf(1 - a, n, q))
    return None if lo < 1 or hi >= n else (s[lo - 1], s[hi])


@pytest.mark.parametrize("n", [5, 20, 101, 1000])
@pytest.mark.parametrize("q", [0.5, 0.95])
def test_quantile_interval_is_the_order_statistic_interval(n, q):
    x = np.random.default_rng(n).lognormal(3.0, 0.5, n)
    point, ci = quantile_interval(x, q, 0.95)
    assert point == pytest.approx(np.quantile(x, q))
    want = binomial_order_statistics(x, q, 0.95)
    if want is None:
        assert ci is None
    else:
        assert ci == pytest.approx(want)


def test_quantile_interval_covers_the_true_median():
    rng = np.random.default_rng(6)
    true_median = math.exp(3.0)  # lognormal(3, 0.5)
    cover = sum(
        lo <= true_median <= hi
        for lo, hi in (quantile_interval(rng.lognormal(3.0, 0.5, 200), 0.5, 0.95)[1] for _ in range(300))
    )
    assert cover >= 0.92 * 300


def test_welch_p_by_hand():
    a = np.array([10.0, 12.0, 9.0, 11.0, 13.0])
    b = np.array([14.0, 15.0, 13.5, 16.0])
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    y, g = np.concatenate([a, b]), np.array([0] * 5 + [1] * 4)
    assert welch_p(y, g) == pytest.approx(2 * stats.t.sf(abs(t), df), rel=1e-9)
    assert welch_p(np.array([1.0, 2.0, 3.0]), np.array([0, 0, 1])) is None
