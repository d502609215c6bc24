"""A/B analysis: per-variant figures with intervals, an always-valid sequential test, and
off-policy estimates of each variant from the other's logs.

**Per variant** (:func:`analyze`): mean reward, mean tau and mean decode latency with t
intervals; aggregate throughput (total tokens / total decode seconds) with a delta-method
interval; latency p50 / p95 with distribution-free order-statistic intervals; the block sizes
chosen. These intervals are fixed-sample ones: right for a report at a time chosen in advance.

**Sequential test** (:func:`sequential_test`): a mixture sequential probability ratio test
(mSPRT, Johari et al. 2017 "Always valid inference"; Robbins' normal mixture) on the
difference of mean rewards. With ``d`` the difference of the two sample means, ``V`` its
estimated variance (``s_A^2 / n_A + s_B^2 / n_B``) and a normal mixture of width ``tau`` over
the true difference,

    Lambda = sqrt(V / (V + tau^2)) * exp(tau^2 d^2 / (2 V (V + tau^2)))

is (asymptotically) a martingale under "no difference", so ``p = min over time of 1/Lambda``
is a p-value that stays valid however often it is looked at: stop the first time
``p <= alpha``; the variant with the larger mean then wins. ``tau`` is given in units of the
pooled standard deviation (``tau_sd``, default 0.2: tuned to effects of a fifth of a standard
deviation, the size that separates good block-size policies; smaller tau detects smaller effects later). The
matching always-valid confidence interval for the difference is
``d +- sqrt(2 V (V + tau^2) / tau^2 * (log(1 / alpha) + log((V + tau^2) / V) / 2))``. Rewards
are treated as independent draws; a learning policy's rewards drift as it learns, so the
test compares the variants' average reward over the requests seen so far.

**Off-policy** (:func:`analyze` with ``policies``): each variant's value estimated on the
other variant's logged requests (SNIPS and DR from :mod:`adaptspec.simulators.ope`), with the
target's *support*: the share of its probability on arms the logging variant could play.
A deterministic logging policy (``fixed:16``, NeuralLinear with UCB) supports only what it
plays; log with an ``epsilon`` floor for full support.

:func:`simulate_ab` replays an A/B test on a full-information trace set and says when the
test would have stopped and whether it picked the variant that is better on the whole stream.

>>> rng = np.random.default_rng(0)
>>> g = rng.integers(0, 2, 4000); y = rng.normal(10.0 + 0.5 * g, 2.0)
>>> t = sequential_test(g, y)
>>> t.winner, t.stopped_at is not None and t.stopped_at < 4000, t.p_value < 0.05
(1, True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats

from ..errors import AdaptspecError
from ..policies.variants import named_specs

__all__ = ["SequentialTest", "analyze", "rows_to_arrays", "sequential_test", "simulate_ab", "parse_ab_specs",
           "format_report", "format_simulation", "finite"]

_COLUMNS = ("variant", "reward", "new_tokens", "decode_ms", "mean_tau", "time", "block_size", "propensity",
            "policy")


# ============================================================================ sequential test
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

    def to_dict(self, names: Sequence[str] = ("0", "1")) -> dict[str, Any]:
        return {"n": {names[0]: self.n[0], names[1]: self.n[1]},
                "mean": {names[0]: _r(self.means[0]), names[1]: _r(self.means[1])},
                "diff": _r(self.diff), "diff_of": f"{names[0]} - {names[1]}",
                "p_value": _r(self.p_value), "always_valid_ci": [_r(self.ci[0]), _r(self.ci[1])],
                "alpha": self.alpha, "significant": self.stopped_at is not None,
                "stopped_at": self.stopped_at, "winner": None if self.winner is None else names[self.winner]}


def sequential_test(groups: Any, values: Any, *, alpha: float = 0.05, tau_sd: float = 0.2,
                    min_n: int = 10) -> SequentialTest:
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
    p_path = np.ones(T)
    if T == 0:
        return SequentialTest((0, 0), (math.nan, math.nan), math.nan, 1.0, (-math.inf, math.inf), None, None,
                              p_path, alpha)
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
    p_step = np.minimum(1.0, np.exp(-log_lam))
    p_path = np.minimum.accumulate(p_step)
    hit = np.flatnonzero(p_path <= alpha)
    stopped = int(hit[0]) + 1 if len(hit) else None
    winner = None
    if stopped is not None:
        winner = 0 if d[stopped - 1] > 0 else 1
    mean = y.mean()
    last = T - 1
    means = (float(a0[last] + mean) if n0[last] else math.nan, float(a1[last] + mean) if n1[last] else math.nan)
    if ok[last]:
        w = math.sqrt(2.0 * V[last] * (V[last] + tau2[last]) / tau2[last]
                      * (math.log(1.0 / alpha) + 0.5 * math.log((V[last] + tau2[last]) / V[last])))
        ci = (float(d[last] - w), float(d[last] + w))
    else:
        ci = (-math.inf, math.inf)
    return SequentialTest((int(n0[last]), int(n1[last])), means, float(means[0] - means[1]), float(p_path[last]), ci,
                          stopped, winner, p_path, alpha)


# ============================================================================ log rows
def rows_to_arrays(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Decision-log rows (dicts, as :func:`adaptspec.traces.log_writer.log_rows` gives) as arrays, in time order."""
    n = len(rows)

    def col(name: str, fill: float = np.nan) -> np.ndarray:
        return np.asarray([fill if r.get(name) is None else float(r[name]) for r in rows], dtype=np.float64)

    t = np.asarray([_seconds(r.get("time")) for r in rows], dtype=np.float64)
    order = np.argsort(t, kind="stable")
    out: dict[str, Any] = {
        "variant": np.asarray(["(none)" if r.get("variant") is None else str(r["variant"]) for r in rows], dtype=object),
        "policy": np.asarray([str(r.get("policy")) for r in rows], dtype=object),
        "reward": col("reward"), "new_tokens": col("new_tokens"), "decode_ms": col("decode_ms"),
        "mean_tau": col("mean_tau"), "time": t, "block_size": col("block_size").astype(np.int64) if n else
        np.zeros(0, np.int64), "propensity": col("propensity"),
        "probs": [r.get("probs") for r in rows], "arms": [tuple(r.get("arms") or ()) for r in rows],
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


# ============================================================================ per-variant figures
def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def _t_interval(x: np.ndarray, level: float) -> tuple[float, float] | None:
    if len(x) < 2:
        return None
    m, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))
    h = float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * se)
    return m - h, m + h


def _ratio_interval(num: np.ndarray, den: np.ndarray, level: float) -> tuple[float, tuple[float, float] | None]:
    """sum(num) / sum(den) and its delta-method interval."""
    if len(num) == 0 or den.sum() <= 0:
        return math.nan, None
    R = float(num.sum() / den.sum())
    if len(num) < 2:
        return R, None
    dm = den.mean()
    resid = num - R * den
    se = float(np.sqrt(resid.var(ddof=1) / len(num)) / dm)
    z = float(stats.norm.ppf(0.5 + level / 2))
    return R, (R - z * se, R + z * se)


def _quantile_interval(x: np.ndarray, q: float, level: float) -> tuple[float, tuple[float, float] | None]:
    """Sample quantile and its distribution-free interval from binomial order statistics."""
    n = len(x)
    if n == 0:
        return math.nan, None
    s = np.sort(x)
    point = float(np.quantile(s, q))
    a = (1 - level) / 2
    lo = int(stats.binom.ppf(a, n, q))
    hi = int(stats.binom.ppf(1 - a, n, q))
    if lo < 1 or hi >= n:
        return point, None
    return point, (float(s[lo - 1]), float(s[hi]))


def _summary(mask: np.ndarray, data: Mapping[str, Any], level: float) -> dict[str, Any]:
    r = data["reward"][mask]
    has_r = np.isfinite(r)
    tau = data["mean_tau"][mask]
    tau = tau[np.isfinite(tau)]
    tok, ms = data["new_tokens"][mask], data["decode_ms"][mask]
    ok = np.isfinite(tok) & np.isfinite(ms) & (ms > 0)
    tput, tput_ci = _ratio_interval(tok[ok], ms[ok] / 1000.0, level)
    lat = ms[np.isfinite(ms)]
    p50, p50_ci = _quantile_interval(lat, 0.5, level)
    p95, p95_ci = _quantile_interval(lat, 0.95, level)
    bs = data["block_size"][mask]
    pol = data["policy"][mask]
    uniq, cnt = np.unique(bs, return_counts=True)

    def ci(c: tuple[float, float] | None) -> list[float | None] | None:
        return None if c is None else [_r(c[0]), _r(c[1])]

    return {
        "decisions": int(mask.sum()),
        "with_reward": int(has_r.sum()),
        "fallbacks": int(sum(str(p).startswith("fallback:") for p in pol)),
        "reward": {"mean": _r(r[has_r].mean()) if has_r.any() else None, "ci": ci(_t_interval(r[has_r], level))},
        "tau": {"mean": _r(tau.mean()) if len(tau) else None, "ci": ci(_t_interval(tau, level))},
        "throughput": {"tokens_per_s": _r(tput), "ci": ci(tput_ci), "tokens": int(tok[ok].sum()),
                       "decode_s": _r(float(ms[ok].sum()) / 1000.0)},
        "latency_ms": {"mean": _r(lat.mean()) if len(lat) else None, "ci": ci(_t_interval(lat, level)),
                       "p50": _r(p50), "p50_ci": ci(p50_ci), "p95": _r(p95), "p95_ci": ci(p95_ci)},
        "block_sizes": {str(int(b)): int(c) for b, c in zip(uniq, cnt)},
    }


# ============================================================================ the report
def analyze(data: Mapping[str, Any], *, policies: Mapping[str, Any] | None = None, alpha: float = 0.05,
            tau_sd: float = 0.2, min_n: int = 10, level: float = 0.95, n_boot: int = 200,
            estimators: Sequence[str] = ("snips", "dr"), seed: int = 0) -> dict[str, Any]:
    """The A/B report of a decision log (arrays from :func:`rows_to_arrays`).

    ``policies`` maps variant -> a policy object (its current state is evaluated) for the
    off-policy estimates; variants without one get none.
    """
    names = sorted(set(data["variant"].tolist()))
    out: dict[str, Any] = {"decisions": int(len(data["variant"])), "level": level,
                           "variants": {v: _summary(data["variant"] == v, data, level) for v in names}}
    # sequential tests on the reward, every pair of variants, in arrival order
    tests = []
    has_r = np.isfinite(data["reward"])
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            m = has_r & np.isin(data["variant"], [a, b])
            g = (data["variant"][m] == b).astype(np.int64)
            t = sequential_test(g, data["reward"][m], alpha=alpha, tau_sd=tau_sd, min_n=min_n)
            d = t.to_dict((a, b))
            if t.stopped_at is not None:
                d["stopped_at_time"] = float(data["time"][m][t.stopped_at - 1])
            d["naive_t_test_p"] = _naive_p(data["reward"][m], g)
            tests.append(d)
    out["sequential"] = {"metric": "reward", "method": "mSPRT (normal mixture), always valid", "tau_sd": tau_sd,
                         "min_n": min_n, "tests": tests}
    if policies:
        out["off_policy"] = _off_policy(data, names, policies, n_boot, estimators, seed)
    return out


def _naive_p(y: np.ndarray, g: np.ndarray) -> float | None:
    a, b = y[g == 0], y[g == 1]
    if len(a) < 2 or len(b) < 2:
        return None
    p = stats.ttest_ind(a, b, equal_var=False).pvalue
    return _r(float(p))


def _off_policy(data: Mapping[str, Any], names: list[str], policies: Mapping[str, Any], n_boot: int,
                estimators: Sequence[str], seed: int) -> list[dict[str, Any]]:
    from .ope import evaluate, policy_probs

    results = []
    for target, pol in policies.items():
        if target not in names:
            continue
        arms_t = tuple(int(a) for a in pol.arms)
        for logging in names:
            if logging == target:
                continue
            entry: dict[str, Any] = {"target": target, "logged_by": logging}
            m = (data["variant"] == logging) & np.isfinite(data["reward"])
            idx = np.flatnonzero(m)
            if len(idx) < 2:
                entry["skipped"] = "fewer than 2 logged rewards"
                results.append(entry)
                continue
            arms_l = {data["arms"][i] for i in idx}
            if len(arms_l) != 1 or tuple(next(iter(arms_l))) != arms_t:
                entry["skipped"] = f"arms differ ({sorted(arms_l)} logged, {list(arms_t)} in the policy)"
                results.append(entry)
                continue
            feats = [data["features"][i] for i in idx]
            contextual = bool(getattr(pol, "contextual", True))
            if contextual and any(f is None for f in feats):
                entry["skipped"] = "the log has no features for a contextual policy"
                results.append(entry)
                continue
            X = np.asarray(feats, dtype=np.float64) if feats[0] is not None and all(f is not None for f in feats) else None
            try:
                P = policy_probs(pol, X if contextual else None, len(idx))
            except AdaptspecError as e:
                entry["skipped"] = str(e)
                results.append(entry)
                continue
            a = np.searchsorted(np.asarray(arms_t), data["block_size"][idx])
            Lp = np.asarray([data["probs"][i] for i in idx], dtype=np.float64)
            support = float(np.mean(np.sum(P * (Lp > 0), axis=1)))
            est = evaluate(data["reward"][idx], a, data["propensity"][idx], P, X, estimators=estimators,
                           n_boot=n_boot, seed=seed, progress=False)
            entry.update(n=int(len(idx)), support=_r(support), logged_value=_r(float(data["reward"][idx].mean())),
                         estimates={k: e.to_dict() for k, e in est.items()})
            if support < 0.999:
                entry["note"] = (f"the target puts {100 * (1 - support):.1f}% of its probability on arms {logging} never "
                                 "plays: the estimates cover only the rest")
            results.append(entry)
    return results


# ============================================================================ offline A/B replay
def parse_ab_specs(text: str) -> dict[str, str]:
    """``"A=fixed:16,B=linucb:alpha=0.5"`` -> ``{"A": "fixed:16", "B": "linucb:alpha=0.5"}``.

    A comma starts a new variant only when what follows is ``NAME=`` and a known policy name;
    ``;`` always separates variants.

    >>> parse_ab_specs("A=fixed:16,B=linucb:alpha=0.5,lam=2")
    {'A': 'fixed:16', 'B': 'linucb:alpha=0.5,lam=2'}
    """
    from ..policies.spec import REGISTRY

    pieces: list[str] = []
    for chunk in text.split(";"):
        for part in chunk.split(","):
            name, eq, rest = part.partition("=")
            head = rest.split(":")[0].strip().lower()
            if pieces and not (eq and name.strip().isidentifier() and head in REGISTRY):
                pieces[-1] += "," + part
            else:
                pieces.append(part)
        pieces.append("\x00")  # ';' boundary
    out = named_specs((p for p in pieces if p != "\x00"), "--ab", "A=fixed:16,B=ucb")
    if len(out) != 2:
        raise AdaptspecError(f"--ab needs exactly two variants, got {len(out)} in {text!r}")
    return out


def simulate_ab(traces: Any, specs: Mapping[str, str], *, reward: str = "tau", latency: Any = None,
                batch_size: int = 1, seeds: Sequence[int] = (0,), order: str = "shuffled", n_steps: int | None = None,
                split: float = 0.5, alpha: float = 0.05, tau_sd: float = 0.2, min_n: int = 10) -> dict[str, Any]:
    """Replay an A/B test of two policy specs on a full-information trace set.

    Each request of the stream (``stream_order``) goes to the first variant with probability
    ``split``; each variant's policy decides and learns on its own requests only, paid from
    the trace's reward matrix. The sequential test watches the rewards; the truth is each
    policy's mean reward when it alone serves the whole stream (possible because every arm's
    reward is in the trace), so "correct" means the test picked the policy that is better.
    """
    from ..reward.latency import get_profile
    from ..policies.spec import make_policy
    from .replay import run_policy, stream_order

    names = list(specs)
    if len(names) != 2:
        raise AdaptspecError(f"an A/B simulation needs two variants, got {len(names)}")
    if not 0 < split < 1:
        raise AdaptspecError(f"split must be in (0, 1), got {split}")
    prof = None if latency is None else get_profile(latency)
    R = traces.reward_matrix(reward, prof, batch_size)
    X = traces.features
    arms = traces.arms
    runs = []
    truth = {n: [] for n in names}
    for seed in seeds:
        idx = stream_order(traces, order, seed, n_steps)
        T = len(idx)
        to_b = np.random.default_rng([int(seed), 99]).random(T) >= split
        r = np.empty(T)
        for k, name in enumerate(names):
            mask = to_b if k == 1 else ~to_b
            pol = make_policy(specs[name], arms, seed=seed)
            if getattr(pol, "full_information", False):
                raise AdaptspecError(f"{specs[name]} sees every arm's reward: it cannot run in an A/B test")
            j = idx[mask]
            if len(j):
                r[mask] = R[j, run_policy(pol, R, j, X)]
            alone = make_policy(specs[name], arms, seed=seed)
            truth[name].append(float(R[idx, run_policy(alone, R, idx, X)].mean()))
        t = sequential_test(to_b.astype(np.int64), r, alpha=alpha, tau_sd=tau_sd, min_n=min_n)
        d = t.to_dict(names)
        d["seed"] = int(seed)
        d["requests"] = T
        d["true_value"] = {n: _r(truth[n][-1]) for n in names}
        better_here = names[int(truth[names[1]][-1] > truth[names[0]][-1])]
        d["better"] = better_here
        d["correct"] = None if t.winner is None else names[t.winner] == better_here
        d["naive_t_test_p"] = _naive_p(r, to_b.astype(np.int64))
        runs.append(d)
    true = {n: float(np.mean(v)) for n, v in truth.items()}
    better = max(names, key=lambda n: true[n])
    stops = [d["stopped_at"] for d in runs if d["stopped_at"] is not None]
    decided = [d for d in runs if d["winner"] is not None]
    return {
        "variants": {n: {"spec": specs[n], "true_value": _r(true[n])} for n in names},
        "better": better,
        "true_difference": _r(true[names[0]] - true[names[1]]),
        "reward": reward, "latency": None if prof is None else prof.name, "order": order, "split": split,
        "alpha": alpha, "tau_sd": tau_sd, "min_n": min_n,
        "stopped": len(stops), "runs": len(runs),
        "median_stop": None if not stops else float(np.median(stops)),
        "correct": sum(bool(d["correct"]) for d in decided),
        "wrong": sum(d["correct"] is False for d in decided),
        "seeds": runs,
    }


def finite(obj: Any) -> Any:
    """A copy of a report with NaN and infinities as None (JSON has neither)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


# ============================================================================ text
def format_report(rep: Mapping[str, Any]) -> str:
    """A plain-text A/B report for people."""
    lines = [f"{rep['decisions']} decisions; intervals are {int(100 * rep['level'])}% (fixed-sample, except the "
             "sequential test's)"]
    head = ["variant", "decisions", "reward", "tau", "tok/s", "latency p50 ms", "p95 ms", "fallbacks"]
    rows = []
    for v, s in rep["variants"].items():
        rows.append([v, str(s["decisions"]), _pm(s["reward"]["mean"], s["reward"]["ci"]),
                     _pm(s["tau"]["mean"], s["tau"]["ci"]),
                     _pm(s["throughput"]["tokens_per_s"], s["throughput"]["ci"]),
                     _f(s["latency_ms"]["p50"]), _f(s["latency_ms"]["p95"]), str(s["fallbacks"])])
    lines += _table(head, rows)
    for t in rep["sequential"]["tests"]:
        (a, b) = list(t["n"])
        verdict = (f"{t['winner']} is better (stopped after {t['stopped_at']} requests)" if t["significant"]
                   else "no significant difference yet")
        lo, hi = t["always_valid_ci"]
        lines.append(f"sequential test {a} vs {b}: {verdict}; always-valid p = {_f(t['p_value'])}, "
                     f"difference {_f(t['diff'])} ({a} - {b}), always-valid CI [{_f(lo)}, {_f(hi)}]")
    for e in rep.get("off_policy", []):
        if "skipped" in e:
            lines.append(f"off-policy {e['target']} on {e['logged_by']}'s log: skipped ({e['skipped']})")
            continue
        est = ", ".join(f"{k} {_pm(v['value'], v['ci'])}" for k, v in e["estimates"].items())
        lines.append(f"off-policy {e['target']} on {e['logged_by']}'s log (n={e['n']}, support "
                     f"{_f(100 * e['support'])}%): {est}; {e['logged_by']} itself got {_f(e['logged_value'])}")
    return "\n".join(lines)


def format_simulation(sim: Mapping[str, Any]) -> str:
    names = list(sim["variants"])
    lines = [f"A/B replay: {names[0]} = {sim['variants'][names[0]]['spec']}, {names[1]} = "
             f"{sim['variants'][names[1]]['spec']}; reward {sim['reward']}, split {sim['split']:.2f}, "
             f"alpha {sim['alpha']}, order {sim['order']}",
             "true value on the whole stream: " + ", ".join(f"{n} {_f(sim['variants'][n]['true_value'])}" for n in names)
             + f" -> {sim['better']} is better"]
    head = ["seed", "requests", "stopped at", "winner", "correct", "final p", f"mean {names[0]}", f"mean {names[1]}"]
    rows = [[str(d["seed"]), str(d["requests"]), "-" if d["stopped_at"] is None else str(d["stopped_at"]),
             d["winner"] or "-", "-" if d["correct"] is None else ("yes" if d["correct"] else "NO"), _f(d["p_value"]),
             _f(d["mean"][names[0]]), _f(d["mean"][names[1]])] for d in sim["seeds"]]
    lines += _table(head, rows)
    lines.append(f"stopped in {sim['stopped']}/{sim['runs']} runs (median after {_f(sim['median_stop'])} requests); "
                 f"picked the better policy {sim['correct']} times, the worse {sim['wrong']} times")
    return "\n".join(lines)


def _f(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    a = abs(float(x))
    return f"{x:.0f}" if a >= 1000 else f"{x:.1f}" if a >= 100 else f"{x:.2f}" if a >= 1 else f"{x:.3g}"


def _pm(m: Any, ci: Any) -> str:
    if m is None:
        return "-"
    if not ci or ci[0] is None:
        return _f(m)
    return f"{_f(m)} ± {_f((ci[1] - ci[0]) / 2)}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return [line(head), line(["-" * w for w in widths]), *[line(r) for r in rows]]
