"""The statistics of an A/B test: an always-valid sequential test and fixed-sample intervals.

**Sequential test** (:func:`sequential_test`): a mixture sequential probability ratio test
(mSPRT, Johari et al. 2017 "Always valid inference"; Robbins' normal mixture) on the
difference of two means. With ``d`` the difference of the two sample means, ``V`` its
estimated variance (``s_A^2 / n_A + s_B^2 / n_B``) and a normal mixture of width ``tau`` over
the true difference,

    Lambda = sqrt(V / (V + tau^2)) * exp(tau^2 d^2 / (2 V (V + tau^2)))

is (asymptotically) a martingale under "no difference", so ``p = min over time of 1/Lambda``
is a p-value that stays valid however often it is looked at: stop the first time
``p <= alpha``; the group with the larger mean then wins. ``tau`` is given in units of the
pooled standard deviation (``tau_sd``, default 0.2: tuned to effects of a fifth of a standard
deviation, the size that separates good block-size policies; smaller tau detects smaller
effects later). The matching always-valid confidence interval for the difference is
``d +- sqrt(2 V (V + tau^2) / tau^2 * (log(1 / alpha) + log((V + tau^2) / V) / 2))``. Values
are treated as independent draws.

**Fixed-sample intervals**, right for a report at a time chosen in advance: the t interval of
a mean (:func:`mean_interval`), the delta-method interval of a ratio of sums such as tokens
per second (:func:`ratio_interval`), the distribution-free order-statistic interval of a
quantile (:func:`quantile_interval`, scipy's ``quantile_test``), and Welch's t-test p-value
(:func:`welch_p`), what a naive peek would report.

>>> rng = np.random.default_rng(0)
>>> g = rng.integers(0, 2, 4000); y = rng.normal(10.0 + 0.5 * g, 2.0)
>>> t = sequential_test(g, y)
>>> t.winner, t.stopped_at is not None and t.stopped_at < 4000, t.p_value < 0.05
(1, True, True)
>>> [round(v, 3) for v in mean_interval(np.array([1.0, 2.0, 3.0]), 0.95)]   # 2 -+ t(0.975, 2) / sqrt(3)
[-0.484, 4.484]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import stats

from .._util.numbers import rounded
from ..errors import AdaptspecError

__all__ = [
    "SequentialTest",
    "sequential_test",
    "mean_interval",
    "ratio_interval",
    "quantile_interval",
    "welch_p",
]


@dataclass
class SequentialTest:
    """Result of :func:`sequential_test` on one stream of two groups."""

    n: tuple[int, int]
    means: tuple[float, float]
    diff: float
    p_value: float
    ci: tuple[float, float]
    stopped_at: int | None
    winner: int | None
    p_path: np.ndarray
    alpha: float

    def to_json(self, names: Sequence[str] = ("0", "1")) -> dict[str, Any]:
        """The test as a JSON object, the groups called ``names``."""
        a, b = names
        return {
            "n": {a: self.n[0], b: self.n[1]},
            "mean": {a: rounded(self.means[0]), b: rounded(self.means[1])},
            "diff": rounded(self.diff),
            "diff_of": f"{a} - {b}",
            "p_value": rounded(self.p_value),
            "always_valid_ci": [rounded(self.ci[0]), rounded(self.ci[1])],
            "alpha": self.alpha,
            "significant": self.stopped_at is not None,
            "stopped_at": self.stopped_at,
            "winner": None if self.winner is None else names[self.winner],
        }


def sequential_test(
    groups: Any, values: Any, *, alpha: float = 0.05, tau_sd: float = 0.2, min_n: int = 10
) -> SequentialTest:
    """Always-valid test of ``mean(values | group 0) != mean(values | group 1)`` along the stream.

    ``groups`` (0/1) and ``values`` are in arrival order. ``stopped_at`` is the number of
    observations (both groups) when ``p`` first reached ``alpha`` (None if it never did),
    ``winner`` the group with the larger mean at that time; ``p_value`` and ``ci`` are those
    at the end of the stream. Nothing is computed before both groups have ``min_n`` values.
    """
    g = np.asarray(groups)
    y = np.asarray(values, dtype=np.float64)
    if g.ndim != 1 or y.shape != g.shape:
        raise AdaptspecError(f"groups and values must be 1-D of one length, got {g.shape} and {y.shape}")
    if not np.all(np.isin(g, (0, 1))):
        raise AdaptspecError("groups must be 0 or 1")
    if not np.all(np.isfinite(y)):
        raise AdaptspecError(f"value {int(np.flatnonzero(~np.isfinite(y))[0])} is not finite")
    if not 0 < alpha < 1:
        raise AdaptspecError(f"alpha must be in (0, 1), got {alpha}")
    if not tau_sd > 0:
        raise AdaptspecError(f"tau_sd must be > 0, got {tau_sd}")
    min_n = max(2, int(min_n))
    T = len(y)
    if T == 0:
        return SequentialTest(
            (0, 0), (math.nan, math.nan), math.nan, 1.0, (-math.inf, math.inf), None, None, np.ones(0), alpha
        )
    # running means and variances of both groups after every observation
    yc = y - y.mean()  # centring keeps the running sums of squares accurate
    m1 = g == 1
    n1 = np.cumsum(m1)
    n0 = np.arange(1, T + 1) - n1
    s1 = np.cumsum(np.where(m1, yc, 0.0))
    s0 = np.cumsum(np.where(m1, 0.0, yc))
    q1 = np.cumsum(np.where(m1, yc * yc, 0.0))
    q0 = np.cumsum(np.where(m1, 0.0, yc * yc))
    ok = (n0 >= min_n) & (n1 >= min_n)
    with np.errstate(divide="ignore", invalid="ignore"):
        a0, a1 = s0 / n0, s1 / n1
        v0 = np.maximum(q0 - n0 * a0 * a0, 0.0) / (n0 - 1)
        v1 = np.maximum(q1 - n1 * a1 * a1, 0.0) / (n1 - 1)
        V = v0 / n0 + v1 / n1
        tau2 = tau_sd * tau_sd * 0.5 * (v0 + v1)
        d = a0 - a1
        ok &= (V > 0) & (tau2 > 0)
        log_lam = np.where(ok, 0.5 * np.log(V / (V + tau2)) + tau2 * d * d / (2.0 * V * (V + tau2)), -np.inf)
    p_path = np.minimum.accumulate(np.minimum(1.0, np.exp(-log_lam)))
    hit = np.flatnonzero(p_path <= alpha)
    stopped = int(hit[0]) + 1 if len(hit) else None
    winner = None if stopped is None else (0 if d[stopped - 1] > 0 else 1)
    last = T - 1
    means = (
        float(a0[last] + y.mean()) if n0[last] else math.nan,
        float(a1[last] + y.mean()) if n1[last] else math.nan,
    )
    if ok[last]:
        w = math.sqrt(
            2.0
            * V[last]
            * (V[last] + tau2[last])
            / tau2[last]
            * (math.log(1.0 / alpha) + 0.5 * math.log((V[last] + tau2[last]) / V[last]))
        )
        ci = (float(d[last] - w), float(d[last] + w))
    else:
        ci = (-math.inf, math.inf)
    return SequentialTest(
        (int(n0[last]), int(n1[last])),
        means,
        float(means[0] - means[1]),
        float(p_path[last]),
        ci,
        stopped,
        winner,
        p_path,
        alpha,
    )


def mean_interval(x: np.ndarray, level: float) -> tuple[float, float] | None:
    """The t interval of the mean of ``x`` (None with fewer than 2 values)."""
    if len(x) < 2:
        return None
    m, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))
    if se == 0:
        return m, m
    lo, hi = stats.t.interval(level, len(x) - 1, loc=m, scale=se)
    return float(lo), float(hi)


def ratio_interval(
    num: np.ndarray, den: np.ndarray, level: float
) -> tuple[float, tuple[float, float] | None]:
    """``sum(num) / sum(den)`` and its delta-method normal interval (None with fewer than 2 pairs)."""
    if len(num) == 0 or den.sum() <= 0:
        return math.nan, None
    R = float(num.sum() / den.sum())
    if len(num) < 2:
        return R, None
    se = float(np.sqrt((num - R * den).var(ddof=1) / len(num)) / den.mean())
    if se == 0:
        return R, (R, R)
    lo, hi = stats.norm.interval(level, loc=R, scale=se)
    return R, (float(lo), float(hi))


def quantile_interval(x: np.ndarray, q: float, level: float) -> tuple[float, tuple[float, float] | None]:
    """The sample ``q``-quantile and its distribution-free interval from the binomial law of the
    order statistics (None when ``x`` has too few values for one at ``level``)."""
    if len(x) == 0:
        return math.nan, None
    point = float(np.quantile(x, q))
    lo, hi = stats.quantile_test(x, q=point, p=q).confidence_interval(level)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return point, None
    return point, (float(lo), float(hi))


def welch_p(y: np.ndarray, g: np.ndarray) -> float | None:
    """Welch's two-sample t-test p-value of group 0 against group 1 (None with fewer than 2 in either)."""
    a, b = y[g == 0], y[g == 1]
    if len(a) < 2 or len(b) < 2:
        return None
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)
