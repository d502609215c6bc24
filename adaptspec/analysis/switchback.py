"""The analysis of a switchback A/B test: throughput per variant over its slices, and the difference.

A switchback test (``serve --batched --ab-design switchback``, :mod:`adaptspec.serving.engine.switchback`)
runs each slice of rounds on one variant, drawn at random; its records (:mod:`adaptspec.traces.slice_log`)
hold each slice's tokens and decode seconds round by round. The **slice** is the unit of
randomisation, so it is the unit of analysis here: requests in one slice share its rounds and
are not independent of each other.

**Estimand**: the throughput of the whole server (tokens committed per second of decode time)
when all traffic runs on variant ``a``, minus (and over) the same with all traffic on ``b``.

**Estimator**: per variant, the ratio of sums ``R = sum(tokens) / sum(decode_s)`` over its slices
(each slice's first ``burn_in`` rounds dropped; slices cut short by a shutdown, ``complete:
false``, left out). Its standard error is the delta method's with slices as the units: with
``z_s = (T_s - R D_s) / mean(D)``, ``se = sd(z) / sqrt(n)``. The difference ``R_a - R_b`` gets
a Welch t interval on those linearised values (``se^2 = se_a^2 + se_b^2``, Welch-Satterthwaite
degrees of freedom); the ratio ``R_a / R_b`` the same on the log scale (``(se/R)^2`` per
variant), exponentiated. When every slice has the same decode time the interval of the
difference is exactly Welch's interval for the difference of mean per-slice throughputs.
These are fixed-sample intervals: read them at a number of slices chosen in advance.

>>> recs = [{"variant": v, "complete": True, "round_tokens": [t, t], "round_decode_s": [1.0, 1.0],
...          "round_rows": [2, 2], "round_carried": [0, 0]}
...         for v, t in [("A", 10), ("B", 5), ("B", 6), ("A", 12), ("A", 11), ("B", 4)]]
>>> r = analyze_slices(recs)
>>> r["variants"]["A"]["tokens_per_s"], r["variants"]["B"]["tokens_per_s"], r["comparisons"][0]["diff"]
(11.0, 5.0, 6.0)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from scipy import stats

from .._util.numbers import rounded
from ..errors import AdaptspecError

__all__ = ["analyze_slices", "slices_text"]

METHOD = (
    "ratio of sums over each variant's slices; delta-method standard errors with slices as units; "
    "Welch t intervals for the difference and (log scale) the ratio"
)


def _slice_figures(
    r: Mapping[str, Any], burn_in: int, where: str
) -> tuple[float, float, int, int, int] | None:
    """(tokens, decode seconds, rounds, row-rounds, carried row-rounds) of a slice after its burn-in."""
    try:
        tok = [float(x) for x in r["round_tokens"]]
        sec = [float(x) for x in r["round_decode_s"]]
        rows = [int(x) for x in r.get("round_rows") or [0] * len(tok)]
        car = [int(x) for x in r.get("round_carried") or [0] * len(tok)]
    except (KeyError, TypeError, ValueError) as e:
        raise AdaptspecError(f"{where}: not a switchback slice record ({type(e).__name__}: {e})") from None
    if not len(tok) == len(sec) == len(rows) == len(car):
        raise AdaptspecError(f"{where}: its per-round lists have different lengths")
    if not all(math.isfinite(x) and x >= 0 for x in tok + sec):
        raise AdaptspecError(f"{where}: a round's tokens or decode seconds are negative or not finite")
    tok, sec, rows, car = tok[burn_in:], sec[burn_in:], rows[burn_in:], car[burn_in:]
    if not tok or sum(sec) <= 0:
        return None
    return sum(tok), sum(sec), len(tok), sum(rows), sum(car)


def _se(T: np.ndarray, D: np.ndarray) -> tuple[float, float]:
    """``sum(T) / sum(D)`` and its delta-method standard error, slices as units (nan with < 2)."""
    R = float(T.sum() / D.sum())
    if len(T) < 2:
        return R, math.nan
    z = (T - R * D) / D.mean()
    return R, float(z.std(ddof=1) / math.sqrt(len(T)))


def _welch(se_a: float, n_a: int, se_b: float, n_b: int) -> tuple[float, float]:
    """The combined standard error and the Welch-Satterthwaite degrees of freedom."""
    va, vb = se_a**2, se_b**2
    se = math.sqrt(va + vb)
    den = va**2 / (n_a - 1) + vb**2 / (n_b - 1)
    return se, (va + vb) ** 2 / den if den > 0 else math.inf


def analyze_slices(
    records: Sequence[Mapping[str, Any]], burn_in: int = 0, level: float = 0.95
) -> dict[str, Any]:
    """The switchback report of slice ``records`` (see the module docstring): per variant its
    slices, tokens, decode seconds, throughput with a t interval and the share of its row-rounds
    carried over from another slice; per pair of variants the difference and the ratio of
    throughputs with Welch t intervals."""
    if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 0:
        raise AdaptspecError(f"the slice burn-in must be an int >= 0, got {burn_in!r}")
    if not 0 < level < 1:
        raise AdaptspecError(f"level must be in (0, 1), got {level!r}")
    per, incomplete, too_short = _slices_by_variant(records, burn_in)
    q = lambda df: float(stats.t.ppf(0.5 + level / 2, df))  # noqa: E731
    variants: dict[str, dict[str, Any]] = {}
    est: dict[str, tuple[float, float, int]] = {}
    for v in sorted(per):
        variants[v], est[v] = _variant(per[v], q)
    comparisons = []
    names = sorted(est)
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            comparisons.append(_compare(x, est[x], y, est[y], q))
    return {
        "design": "switchback",
        "metric": "tokens per decode second",
        "method": METHOD,
        "level": level,
        "burn_in": burn_in,
        "slices": {
            "used": sum(len(p) for p in per.values()),
            "incomplete": incomplete,
            "too_short": too_short,
        },
        "variants": variants,
        "comparisons": comparisons,
    }


def _slices_by_variant(
    records: Sequence[Mapping[str, Any]], burn_in: int
) -> tuple[dict[str, list[tuple[float, float, int, int, int]]], int, int]:
    """Each variant's complete slices' figures (tokens, decode seconds, rounds, row-rounds, carried
    row-rounds), and how many slices were incomplete and how many too short after the burn-in."""
    per: dict[str, list[tuple[float, float, int, int, int]]] = {}
    incomplete = too_short = 0
    for i, r in enumerate(records):
        where = f"slice record {i} (run {r.get('run')!r}, slice {r.get('slice')!r})"
        v = r.get("variant")
        if not isinstance(v, str):
            raise AdaptspecError(f"{where}: no variant")
        if r.get("complete") is False:
            incomplete += 1
            continue
        f = _slice_figures(r, burn_in, where)
        if f is None:
            too_short += 1
            continue
        per.setdefault(v, []).append(f)
    return per, incomplete, too_short


def _variant(
    figures: list[tuple[float, float, int, int, int]], q: Callable[[float], float]
) -> tuple[dict[str, Any], tuple[float, float, int]]:
    """A variant's row of the report (q: the t quantile for a number of degrees of freedom), and its
    throughput, standard error and slice count."""
    a = np.asarray(figures, dtype=np.float64)
    T, D = a[:, 0], a[:, 1]
    R, se = _se(T, D)
    ci = None if not math.isfinite(se) else [rounded(R - q(len(T) - 1) * se), rounded(R + q(len(T) - 1) * se)]
    row = {
        "slices": int(len(T)),
        "rounds": int(a[:, 2].sum()),
        "tokens": int(T.sum()),
        "decode_s": rounded(float(D.sum())),
        "tokens_per_s": rounded(R),
        "ci": ci,
        "se": rounded(se) if math.isfinite(se) else None,
        "row_rounds": int(a[:, 3].sum()),
        "carried_share": rounded(float(a[:, 4].sum() / a[:, 3].sum())) if a[:, 3].sum() > 0 else None,
    }
    return row, (R, se, len(T))


def _compare(
    x: str, ex: tuple[float, float, int], y: str, ey: tuple[float, float, int], q: Callable[[float], float]
) -> dict[str, Any]:
    """Variant x against variant y: the difference and the ratio of their throughputs, with Welch t
    intervals where both have a standard error."""
    (Ra, sa, na), (Rb, sb, nb) = ex, ey
    c: dict[str, Any] = {
        "a": x,
        "b": y,
        "diff": rounded(Ra - Rb),
        "ratio": rounded(Ra / Rb) if Rb > 0 else None,
        "diff_ci": None,
        "ratio_ci": None,
        "p_value": None,
        "df": None,
    }
    if math.isfinite(sa) and math.isfinite(sb):
        se, df = _welch(sa, na, sb, nb)
        if se > 0:
            c["diff_ci"] = [rounded(Ra - Rb - q(df) * se), rounded(Ra - Rb + q(df) * se)]
            c["p_value"] = rounded(float(2 * stats.t.sf(abs(Ra - Rb) / se, df)))
            c["df"] = rounded(df)
        else:
            c["diff_ci"] = [rounded(Ra - Rb)] * 2
        if Ra > 0 and Rb > 0:
            lse, ldf = _welch(sa / Ra, na, sb / Rb, nb)
            d = math.log(Ra / Rb)
            c["ratio_ci"] = [rounded(math.exp(d - q(ldf) * lse)), rounded(math.exp(d + q(ldf) * lse))]
    return c


def slices_text(s: Mapping[str, Any]) -> list[str]:
    """The switchback part of ``ab-report``'s text: one line per variant and per comparison."""
    from .._util.markdown import pm, sig

    n = s["slices"]
    lines = [
        f"switchback: {n['used']} slices (burn-in {s['burn_in']} rounds; {n['incomplete']} incomplete and "
        f"{n['too_short']} too short left out); throughput = tokens / decode s over each variant's slices, "
        f"{int(100 * s['level'])}% intervals with slices as units"
    ]
    for v, d in s["variants"].items():
        carried = (
            ""
            if d["carried_share"] is None
            else f", {sig(100 * d['carried_share'])}% of row-rounds carried over"
        )
        lines.append(
            f"  {v}: {pm(d['tokens_per_s'], d['ci'])} tok/s over {d['slices']} slices ({d['rounds']} rounds"
            f"{carried})"
        )
    for c in s["comparisons"]:
        lo, hi = c["diff_ci"] or (None, None)
        rlo, rhi = c["ratio_ci"] or (None, None)
        lines.append(
            f"  {c['a']} - {c['b']}: {sig(c['diff'])} tok/s, CI [{sig(lo)}, {sig(hi)}], p = {sig(c['p_value'])}; "
            f"{c['a']} / {c['b']}: {sig(c['ratio'])}, CI [{sig(rlo)}, {sig(rhi)}]"
        )
    return lines
