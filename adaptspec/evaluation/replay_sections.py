"""Sections 1-3: replay on the bundled trace set, the same acceptance re-timed for a GPU at
several batch sizes, and BlockPilot's published per-prompt acceptance.

Each function returns ``(data, plot)``: ``data`` is plain JSON (what the report is rendered
from and what ``results.json`` keeps), ``plot`` holds the arrays the figures need.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..costs.latency import get_profile
from ..reward.functions import DEFAULT_REWARD, pct_of, trace_costs, trace_rewards
from ..simulators.replay import finite_rewards
from .core import (
    Contender,
    ProgressBar,
    Scorer,
    Settings,
    Tally,
    ci95,
    contender_feedback,
    curve_points,
    fixed_contenders,
    make_contexts,
    provenance,
    run_contenders,
    shuffled_stream,
    spec_contender,
    split_requests,
    standard_lineup,
    train_heads,
)

#: the CPU profile used to put a cost on acceptance when a trace set has no timings
FALLBACK_PROFILE = "cpu-smollm2-bf16"


def default_reward(traces: Any) -> tuple[str, str | None]:
    """The product's default reward (measured ms per token) when the trace set has timings, else
    throughput modelled on the CPU profile."""
    return (DEFAULT_REWARD, None) if traces.has_timings else ("modelled", FALLBACK_PROFILE)


def arm_profile(R: np.ndarray, arms: tuple[int, ...]) -> dict[str, Any]:
    """Mean reward per block size over all requests, the best fixed block and the oracle's margin over it."""
    means = R.mean(axis=0)
    j = int(np.argmax(means))
    best_share = np.bincount(np.argmax(R, axis=1), minlength=len(arms)) / len(R)
    return {
        "mean_reward": {str(a): round(float(m), 5) for a, m in zip(arms, means)},
        "best_fixed": int(arms[j]),
        "oracle_gain_pct": round(float(pct_of(R.max(axis=1).sum(), R[:, j].sum()) - 100.0), 4),
        "oracle_best_share": {str(a): round(float(s), 4) for a, s in zip(arms, best_share)},
    }


@dataclass
class LineupResult:
    data: dict[str, Any]
    curves: dict[str, list[np.ndarray]] = field(default_factory=dict)
    steps: np.ndarray | None = None


def evaluate_lineup(
    traces: Any,
    reward: str,
    latency: str | None,
    batch_size: int,
    st: Settings,
    *,
    desc: str = "replay",
    domains: bool = False,
    curves: bool = False,
    seed: int = 0,
) -> LineupResult:
    """Every fixed block, the standard line-up and the oracle over ``st.splits`` training/evaluation
    splits x ``st.orders`` stream orders. Heads are trained on each split's training part with the
    same reward; the stream is ``st.passes`` shuffled passes over the evaluation part."""
    prof = None if latency is None else get_profile(latency)
    R = finite_rewards(traces, reward, prof, batch_size)
    arms = traces.arms
    scorer = Scorer(R, traces.tau_matrix(), trace_costs(traces, prof, batch_size))
    stream, first = Tally(), Tally()
    best_runs: list[int] = []
    reg: dict[str, list[np.ndarray]] = {}
    tallies = (stream, first, reg if curves else None)
    dom: dict[str, dict[str, list[float]]] = {}
    dom_best: dict[str, Counter] = {}
    dom_share: dict[str, float] = {}
    bar = ProgressBar(desc, st.progress)
    info: dict[str, Any] = {}
    pts = None
    try:
        for s in range(st.splits):
            tr, ev, ctx, lineup = _split_lineup(traces, R, st.train_fraction, seed + s)
            contenders = fixed_contenders(arms) + lineup
            if s == 0:  # every split's line-up has the same policies
                fb = contender_feedback(contenders, traces, R, reward, prof, batch_size)
            T = st.passes * len(ev)
            pts = curve_points(T)
            info = _split_info(ctx.description, tr, ev, T, lineup)
            for o in range(st.orders):
                run_seed = 1000 * (seed + s) + o
                idx = shuffled_stream(ev, T, run_seed)
                bar.plan(len(contenders) * T)
                fed = {"oracle": "oracle", "best fixed": "none"}
                chosen = run_contenders(
                    contenders, R, ctx.X, idx, arms, run_seed, bar, feedback=fb, kinds=fed
                )
                ref = int(np.argmax(R[idx].sum(axis=0)))
                best_runs.append(int(arms[ref]))
                chosen = {"oracle": scorer.oracle_choice(idx), "best fixed": np.full(T, ref), **chosen}
                _tally_order(scorer, idx, len(ev), chosen, ref, contenders, fed, tallies, pts)
                if domains:
                    _domain_scores(
                        traces.domains.astype(str)[idx], R[idx], chosen, ref, dom, dom_best, dom_share, arms
                    )
    finally:
        bar.close()
    data = {
        "reward": reward,
        "latency": None if prof is None else prof.name,
        "batch_size": int(batch_size),
        **info,
        "runs": st.runs,
        "splits": st.splits,
        "orders": st.orders,
        "passes": st.passes,
        "arms": [int(a) for a in arms],
        "best_fixed_per_run": best_runs,
        "best_fixed": Counter(best_runs).most_common(1)[0][0],
        "all_requests": arm_profile(R, arms),
        "stream": stream.summary(),
        "first_pass": first.summary(),
    }
    if domains:
        data["domains"] = _domain_rows(dom, dom_best, dom_share, st.runs)
    return LineupResult(data, reg, pts)


def _split_lineup(traces: Any, R: np.ndarray, train_fraction: float, seed: int) -> tuple:
    """A training/evaluation split, its contexts, and the standard line-up with heads trained on it."""
    tr, ev = split_requests(traces.domains, train_fraction, seed)
    ctx = make_contexts(traces, tr)
    heads = None if ctx.X is None else train_heads(ctx.X[tr], R[tr], traces.arms, seed=seed)
    return tr, ev, ctx, standard_lineup(heads, ctx.X is not None)


def _split_info(
    contexts: str, tr: np.ndarray, ev: np.ndarray, T: int, lineup: list[Contender]
) -> dict[str, Any]:
    """What a split ran on: its contexts, its training and evaluation sizes, the stream's steps and the
    line-up's notes."""
    return {
        "contexts": contexts,
        "n_train": int(len(tr)),
        "n_eval": int(len(ev)),
        "steps": int(T),
        "notes": {c.label: c.note for c in lineup if c.note},
    }


def _tally_order(
    scorer: Scorer,
    idx: np.ndarray,
    n_eval: int,
    chosen: dict[str, np.ndarray],
    ref: int,
    contenders: list[Contender],
    fed: dict[str, str],
    tallies: tuple[Tally, Tally, dict[str, list[np.ndarray]] | None],
    pts: np.ndarray,
) -> None:
    """Scores one stream order for every policy: the whole stream against its best fixed block size
    ref, the first pass (its first n_eval steps) against that pass's; with reg, each learner's regret
    at the curve points pts (tallies: the stream's, the first pass's and the regret curves', or None)."""
    stream, first, reg = tallies
    kinds = {c.label: c.kind for c in contenders}
    one = idx[:n_eval]
    ref1 = int(np.argmax(scorer.R[one].sum(axis=0)))
    for label, a in chosen.items():
        kind = kinds.get(label, "reference")
        stream.add(label, scorer.score(idx, a, ref), kind=kind, feedback=fed[label])
        a1 = np.full(len(one), ref1) if label == "best fixed" else a[: len(one)]
        first.add(label, scorer.score(one, a1, ref1), kind=kind, feedback=fed[label])
        if reg is not None and kind != "fixed":
            reg.setdefault(label, []).append(scorer.regret(idx, a)[pts - 1])


def _domain_rows(
    dom: dict[str, dict[str, list[float]]],
    dom_best: dict[str, Counter],
    dom_share: dict[str, float],
    runs: int,
) -> list[dict[str, Any]]:
    """Each domain's share of the stream, its most often best fixed block size and each policy's gain."""
    return [
        {
            "domain": str(d),
            "share": round(dom_share[d] / runs, 4),
            "best_fixed_in_domain": dom_best[d].most_common(1)[0][0],
            "gain_pct": {label: _mci(v) for label, v in dom[d].items()},
        }
        for d in sorted(dom)
    ]


def _mci(v: list[float]) -> dict[str, float]:
    m, lo, hi = ci95(v)
    return {"mean": round(m, 4), "lo": round(lo, 4), "hi": round(hi, 4)}


def _domain_scores(
    doms: np.ndarray,
    R: np.ndarray,
    chosen: dict[str, np.ndarray],
    ref: int,
    acc: dict[str, dict[str, list[float]]],
    best: dict[str, Counter],
    share: dict[str, float],
    arms: tuple[int, ...],
) -> None:
    """Gain over the stream's best fixed block, per domain, for every non-fixed contender, plus what the
    domain's own best fixed block would give (a per-domain lookup table)."""
    rows = np.arange(len(R))
    for d in np.unique(doms):
        m = doms == d
        base = R[m, ref].sum()
        j = int(np.argmax(R[m].sum(axis=0)))
        best.setdefault(d, Counter())[int(arms[j])] += 1
        share[d] = share.get(d, 0.0) + float(m.mean())
        entry = acc.setdefault(d, {})
        entry.setdefault("domain's own best fixed", []).append(float(pct_of(R[m, j].sum(), base)) - 100.0)
        for label, a in chosen.items():
            if label.startswith("fixed:") or label == "best fixed":
                continue
            entry.setdefault(label, []).append(float(pct_of(R[rows[m], a[m]].sum(), base)) - 100.0)


# ============================================================================ section 1
def section_replay(traces: Any, st: Settings) -> tuple[dict[str, Any], LineupResult]:
    """Replay on the bundled (or given) trace set with its own reward (measured throughput)."""
    reward, latency = default_reward(traces)
    res = evaluate_lineup(traces, reward, latency, 1, st, desc="1 replay", domains=True, curves=True)
    res.data["traces"] = provenance(traces)
    return res.data, res


# ============================================================================ section 2
def section_hardware(traces: Any, st: Settings) -> tuple[dict[str, Any], dict[str, Any]]:
    """The trace set's acceptance re-timed with the GPU latency profile at each batch size."""
    reward, latency = default_reward(traces)
    base = arm_profile(trace_rewards(traces, reward, latency), traces.arms)
    out: dict[str, Any] = {
        "profile": st.gpu_profile,
        "reference": {"reward": reward, "latency": latency, **base},
        "batches": [],
    }
    plot: dict[str, Any] = {"arms": list(traces.arms), "reference": base, "batches": []}
    for b in st.batch_sizes:
        res = evaluate_lineup(traces, "modelled", st.gpu_profile, b, st, desc=f"2 gpu batch {b}")
        out["batches"].append(res.data)
        plot["batches"].append(res.data)
    out["traces"] = provenance(traces)
    return out, plot


# ============================================================================ section 3
BANDITS = (
    ("ucb-throughput", "ucb-throughput", "BanditSpec-style UCB, 8 round-robin warm-up rounds"),
    ("thompson", "ts", "Gaussian Thompson sampling"),
    ("exp3", "exp3", "EXP3 (adversarial bandit), rewards rescaled online to [0, 1]"),
)


def section_blockpilot(
    folder: str | Path | None, st: Settings
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Fixed blocks, the oracle, context-free bandits and BlockPilot's own released choices on a
    BlockPilot per-prompt result folder, paid in tau and in throughput modelled on the GPU profile."""
    if folder is None:
        return {"status": "not-run", "reason": "no BlockPilot folder was given (--blockpilot DIR)"}, None
    p = Path(folder)
    if not p.is_dir():
        return {"status": "absent", "path": str(p), "reason": f"{p} does not exist"}, None
    from ..traces import import_blockpilot

    ts = import_blockpilot(p)
    arms = ts.arms
    n = ts.n_requests
    contenders = fixed_contenders(arms) + [
        spec_contender(lbl, spec, "context-free", note) for lbl, spec, note in BANDITS
    ]
    choice = ts.column("blockpilot_choice") if "blockpilot_choice" in ts.requests.column_names else None
    if choice is not None and np.all(np.isfinite(choice.astype(float))):
        pos = {a: j for j, a in enumerate(arms)}
        contenders.append(
            Contender(
                "BlockPilot's selector (released choices)",
                "offline",
                choices=np.array([pos[int(c)] for c in choice]),
                note="the block size BlockPilot's classifier chose per prompt, as published",
            )
        )
    out: dict[str, Any] = {
        "status": "ok",
        "path": str(p),
        "traces": provenance(ts),
        "arms": [int(a) for a in arms],
        "requests": n,
        "steps": st.blockpilot_passes * n,
        "runs": st.runs,
        "rewards": [],
        "notes": {c.label: c.note for c in contenders if c.note},
    }
    bar = ProgressBar("3 blockpilot", st.progress)
    try:
        for reward, latency in (("tau", None), ("modelled", st.gpu_profile)):
            R = trace_rewards(ts, reward, latency)
            fb = contender_feedback(contenders, ts, R, reward, latency)
            scorer = Scorer(R, ts.tau_matrix(), trace_costs(ts, latency) if latency else None)
            tally = Tally()
            T = st.blockpilot_passes * n
            for r in range(st.runs):
                idx = shuffled_stream(np.arange(n), T, r)
                bar.plan(len(contenders) * T)
                fed = {"oracle": "oracle", "best fixed": "none"}
                chosen = run_contenders(contenders, R, None, idx, arms, r, bar, feedback=fb, kinds=fed)
                ref = int(np.argmax(R[idx].sum(axis=0)))
                kinds = {c.label: c.kind for c in contenders}
                for label, a in {
                    "oracle": scorer.oracle_choice(idx),
                    "best fixed": np.full(T, ref),
                    **chosen,
                }.items():
                    tally.add(
                        label,
                        scorer.score(idx, a, ref),
                        kind=kinds.get(label, "reference"),
                        feedback=fed[label],
                    )
            out["rewards"].append(
                {
                    "reward": reward,
                    "latency": latency,
                    "all_requests": arm_profile(R, arms),
                    "mean_tau": {str(a): round(float(v), 4) for a, v in zip(arms, ts.tau_matrix().mean(0))},
                    "policies": tally.summary(),
                }
            )
    finally:
        bar.close()
    return out, out
