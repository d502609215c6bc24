"""The A/B report of a served decision log: per-variant figures, sequential tests, off-policy estimates.

**Per variant**: mean reward, mean tau and mean decode latency with t intervals; aggregate
throughput (total tokens / total decode seconds) with a delta-method interval; latency p50 /
p95 with distribution-free order-statistic intervals; the block sizes chosen. These intervals
are fixed-sample ones (:mod:`adaptspec.analysis.statistics`): right for a report at a time
chosen in advance.

**Sequential tests** on the reward of every pair of variants, in arrival order: the
always-valid mSPRT of :func:`~adaptspec.analysis.statistics.sequential_test` (stop when it is
significant: the answer stays valid however often the report is run). A learning policy's
rewards drift as it learns, so the test compares the variants' average reward over the
requests seen so far.

**Off-policy** (``policies`` given): each variant's value estimated on the other variant's
logged requests (SNIPS and DR from :mod:`adaptspec.analysis.ope`), with the target's
*support*: the share of its probability on arms the logging variant could play. A
deterministic logging policy (``fixed:16``, NeuralLinear with UCB) supports only what it
plays; log with an ``epsilon`` floor for full support.

**Switchback** (``slices`` given: the slice records of ``serve --batched --ab-design
switchback``): the design's own estimate, throughput per variant over its slices and the
difference and ratio with intervals over slices (:mod:`adaptspec.analysis.switchback`). The
per-request figures above still come from the decision log, but their intervals treat
requests as independent, which requests sharing a slice are not.

>>> rows = [{"variant": "AB"[i % 2], "reward": 1.0 + (i % 2) + 0.1 * (i % 3), "time": float(i),
...          "block_size": 4, "new_tokens": 8, "decode_ms": 20.0} for i in range(40)]
>>> rep = analyze(rows_to_arrays(rows))
>>> rep.variants["B"]["reward"]["mean"], rep.tests[0]["winner"]
(2.1, 'B')
>>> print(rep.to_text().splitlines()[0])
40 decisions; intervals are 95% (fixed-sample, except the sequential test's)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, Sequence

import numpy as np

from .._util.markdown import pm, sig, table
from .._util.numbers import finite, rounded
from ..errors import AdaptspecError
from .statistics import mean_interval, quantile_interval, ratio_interval, sequential_test, welch_p
from .switchback import analyze_slices, slices_text

__all__ = ["ABReport", "analyze", "rows_to_arrays"]


@dataclass
class ABReport:
    """What :func:`analyze` returns. ``variants`` maps each variant to its figures, ``tests`` holds
    one sequential test per pair of variants, ``off_policy`` the cross-variant estimates (None
    when no policies were given); ``logs`` names the decision logs the rows came from."""

    decisions: int
    level: float
    variants: dict[str, dict[str, Any]]
    tests: list[dict[str, Any]]
    tau_sd: float
    min_n: int
    off_policy: list[dict[str, Any]] | None = None
    logs: list[str] | None = None
    switchback: dict[str, Any] | None = None  # the slice-level analysis of a switchback test

    def to_json(self) -> dict[str, Any]:
        """The ``ab-report --json`` object (NaN and infinities as null)."""
        out: dict[str, Any] = {
            "decisions": self.decisions,
            "level": self.level,
            "variants": self.variants,
            "sequential": {
                "metric": "reward",
                "method": "mSPRT (normal mixture), always valid",
                "tau_sd": self.tau_sd,
                "min_n": self.min_n,
                "tests": self.tests,
            },
        }
        if self.off_policy is not None:
            out["off_policy"] = self.off_policy
        if self.switchback is not None:
            out["switchback"] = self.switchback
        if self.logs:
            out["log"] = self.logs[0] if len(self.logs) == 1 else _common_parent(self.logs)
            if len(self.logs) > 1:
                out["logs"] = list(self.logs)
        return finite(out)

    def to_text(self) -> str:
        """A plain-text report for people: a table of the variants, then one line per test and estimate."""
        lines = [
            f"{self.decisions} decisions; intervals are {int(100 * self.level)}% (fixed-sample, except the "
            "sequential test's)"
        ]
        head = ["variant", "decisions", "reward", "tau", "tok/s", "latency p50 ms", "p95 ms", "fallbacks"]
        rows = [
            [
                v,
                s["decisions"],
                pm(s["reward"]["mean"], s["reward"]["ci"]),
                pm(s["tau"]["mean"], s["tau"]["ci"]),
                pm(s["throughput"]["tokens_per_s"], s["throughput"]["ci"]),
                sig(s["latency_ms"]["p50"]),
                sig(s["latency_ms"]["p95"]),
                s["fallbacks"],
            ]
            for v, s in self.variants.items()
        ]
        lines.append(table(head, rows))
        for t in self.tests:
            a, b = list(t["n"])
            verdict = (
                f"{t['winner']} is better (stopped after {t['stopped_at']} requests)"
                if t["significant"]
                else "no significant difference yet"
            )
            lo, hi = t["always_valid_ci"]
            lines.append(
                f"sequential test {a} vs {b}: {verdict}; always-valid p = {sig(t['p_value'])}, "
                f"difference {sig(t['diff'])} ({a} - {b}), always-valid CI [{sig(lo)}, {sig(hi)}]"
            )
        for e in self.off_policy or []:
            if "skipped" in e:
                lines.append(f"off-policy {e['target']} on {e['logged_by']}'s log: skipped ({e['skipped']})")
                continue
            est = ", ".join(f"{k} {pm(v['value'], v['ci'])}" for k, v in e["estimates"].items())
            lines.append(
                f"off-policy {e['target']} on {e['logged_by']}'s log (n={e['n']}, support "
                f"{sig(100 * e['support'])}%): {est}; {e['logged_by']} itself got {sig(e['logged_value'])}"
            )
        if self.switchback is not None:
            lines += slices_text(self.switchback)
        return "\n".join(lines)


def _common_parent(paths: Sequence[str]) -> str:
    return os.path.commonpath(list(paths))


# ============================================================================ log rows
def rows_to_arrays(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Decision-log rows (dicts, as :func:`adaptspec.traces.log_writer.log_rows` gives) as arrays, in time order."""
    n = len(rows)

    def col(name: str) -> np.ndarray:
        return np.asarray([np.nan if r.get(name) is None else float(r[name]) for r in rows], dtype=np.float64)

    t = np.asarray([_seconds(r.get("time")) for r in rows], dtype=np.float64)
    order = np.argsort(t, kind="stable")
    out: dict[str, Any] = {
        "variant": np.asarray(
            ["(none)" if r.get("variant") is None else str(r["variant"]) for r in rows], dtype=object
        ),
        "policy": np.asarray([str(r.get("policy")) for r in rows], dtype=object),
        "reward": col("reward"),
        "new_tokens": col("new_tokens"),
        "decode_ms": col("decode_ms"),
        "mean_tau": col("mean_tau"),
        "time": t,
        "block_size": col("block_size").astype(np.int64) if n else np.zeros(0, np.int64),
        "propensity": col("propensity"),
        "probs": [r.get("probs") for r in rows],
        "arms": [tuple(r.get("arms") or ()) for r in rows],
        "features": [r.get("features") for r in rows],
    }
    for k, v in out.items():
        out[k] = v[order] if isinstance(v, np.ndarray) else [v[i] for i in order]
    return out


def _seconds(t: Any) -> float:
    if t is None:
        return math.nan
    if isinstance(t, datetime):
        return t.timestamp()
    return float(t)


# ============================================================================ the report
def analyze(
    data: Mapping[str, Any],
    *,
    policies: Mapping[str, Any] | None = None,
    alpha: float = 0.05,
    tau_sd: float = 0.2,
    min_n: int = 10,
    level: float = 0.95,
    n_boot: int = 200,
    estimators: Sequence[str] = ("snips", "dr"),
    seed: int = 0,
    slices: Sequence[Mapping[str, Any]] | None = None,
    slice_burn_in: int = 0,
) -> ABReport:
    """The A/B report of a decision log (arrays from :func:`rows_to_arrays`).

    ``policies`` maps variant -> a policy object (its current state is evaluated) for the
    off-policy estimates; variants without one get none. ``slices``: a switchback test's slice
    records (:func:`adaptspec.traces.slice_log.slice_rows`), analysed with each slice's first
    ``slice_burn_in`` rounds left out (:func:`~adaptspec.analysis.switchback.analyze_slices`).
    """
    names = sorted(set(data["variant"].tolist()))
    tests = []
    has_r = np.isfinite(data["reward"])
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            m = has_r & np.isin(data["variant"], [a, b])
            g = (data["variant"][m] == b).astype(np.int64)
            t = sequential_test(g, data["reward"][m], alpha=alpha, tau_sd=tau_sd, min_n=min_n)
            d = t.to_json((a, b))
            if t.stopped_at is not None:
                d["stopped_at_time"] = float(data["time"][m][t.stopped_at - 1])
            d["naive_t_test_p"] = rounded(welch_p(data["reward"][m], g))
            tests.append(d)
    return ABReport(
        int(len(data["variant"])),
        level,
        {v: _summary(data["variant"] == v, data, level) for v in names},
        tests,
        tau_sd,
        min_n,
        off_policy=_off_policy(data, names, policies, n_boot, estimators, seed) if policies else None,
        switchback=analyze_slices(slices, slice_burn_in, level) if slices else None,
    )


def _summary(mask: np.ndarray, data: Mapping[str, Any], level: float) -> dict[str, Any]:
    r = data["reward"][mask]
    has_r = np.isfinite(r)
    tau = data["mean_tau"][mask]
    tau = tau[np.isfinite(tau)]
    tok, ms = data["new_tokens"][mask], data["decode_ms"][mask]
    ok = np.isfinite(tok) & np.isfinite(ms) & (ms > 0)
    tput, tput_ci = ratio_interval(tok[ok], ms[ok] / 1000.0, level)
    lat = ms[np.isfinite(ms)]
    p50, p50_ci = quantile_interval(lat, 0.5, level)
    p95, p95_ci = quantile_interval(lat, 0.95, level)
    uniq, cnt = np.unique(data["block_size"][mask], return_counts=True)

    def ci(c: tuple[float, float] | None) -> list[float | None] | None:
        return None if c is None else [rounded(c[0]), rounded(c[1])]

    def mean(x: np.ndarray) -> float | None:
        return rounded(x.mean()) if len(x) else None

    return {
        "decisions": int(mask.sum()),
        "with_reward": int(has_r.sum()),
        "fallbacks": int(sum(str(p).startswith("fallback:") for p in data["policy"][mask])),
        "reward": {"mean": mean(r[has_r]), "ci": ci(mean_interval(r[has_r], level))},
        "tau": {"mean": mean(tau), "ci": ci(mean_interval(tau, level))},
        "throughput": {
            "tokens_per_s": rounded(tput),
            "ci": ci(tput_ci),
            "tokens": int(tok[ok].sum()),
            "decode_s": rounded(float(ms[ok].sum()) / 1000.0),
        },
        "latency_ms": {
            "mean": mean(lat),
            "ci": ci(mean_interval(lat, level)),
            "p50": rounded(p50),
            "p50_ci": ci(p50_ci),
            "p95": rounded(p95),
            "p95_ci": ci(p95_ci),
        },
        "block_sizes": {str(int(b)): int(c) for b, c in zip(uniq, cnt)},
    }


def _off_policy(
    data: Mapping[str, Any],
    names: list[str],
    policies: Mapping[str, Any],
    n_boot: int,
    estimators: Sequence[str],
    seed: int,
) -> list[dict[str, Any]]:
    """Each given policy evaluated on every other variant's logged requests."""
    results = []
    for target, pol in policies.items():
        if target not in names:
            continue
        for logging in names:
            if logging != target:
                entry: dict[str, Any] = {"target": target, "logged_by": logging}
                results.append(entry)
                _estimate(entry, data, pol, logging, n_boot, estimators, seed)
    return results


def _estimate(
    entry: dict[str, Any],
    data: Mapping[str, Any],
    pol: Any,
    logging: str,
    n_boot: int,
    estimators: Sequence[str],
    seed: int,
) -> None:
    """Fill ``entry`` with the estimates of ``pol`` on ``logging``'s rows, or with why it was skipped."""
    from .ope import evaluate, policy_probs  # the policies, only when there is something to estimate

    arms_t = tuple(int(a) for a in pol.arms)
    idx = np.flatnonzero((data["variant"] == logging) & np.isfinite(data["reward"]))
    if len(idx) < 2:
        entry["skipped"] = "fewer than 2 logged rewards"
        return
    arms_l = {data["arms"][i] for i in idx}
    if len(arms_l) != 1 or tuple(next(iter(arms_l))) != arms_t:
        entry["skipped"] = f"arms differ ({sorted(arms_l)} logged, {list(arms_t)} in the policy)"
        return
    feats = [data["features"][i] for i in idx]
    contextual = bool(getattr(pol, "contextual", True))
    if contextual and any(f is None for f in feats):
        entry["skipped"] = "the log has no features for a contextual policy"
        return
    X = None if any(f is None for f in feats) else np.asarray(feats, dtype=np.float64)
    try:
        P = policy_probs(pol, X if contextual else None, len(idx))
    except AdaptspecError as e:
        entry["skipped"] = str(e)
        return
    a = np.searchsorted(np.asarray(arms_t), data["block_size"][idx])
    logged_probs = np.asarray([data["probs"][i] for i in idx], dtype=np.float64)
    support = float(np.mean(np.sum(P * (logged_probs > 0), axis=1)))
    est = evaluate(
        data["reward"][idx],
        a,
        data["propensity"][idx],
        P,
        X,
        estimators=estimators,
        n_boot=n_boot,
        seed=seed,
        progress=False,
    )
    entry.update(
        n=int(len(idx)),
        support=rounded(support),
        logged_value=rounded(float(data["reward"][idx].mean())),
        estimates={k: e.to_dict() for k, e in est.items()},
    )
    if support < 0.999:
        entry["note"] = (
            f"the target puts {100 * (1 - support):.1f}% of its probability on arms {logging} never "
            "plays: the estimates cover only the rest"
        )
