"""Section 4: drift. Streams whose domain mix changes abruptly, and how fast each policy recovers.

Two sources: a synthetic trace set (``cpu-small``, whose ground truth is known) and the trace
set under evaluation. Domains are split in two groups by the block size that suits them best:
phase A streams only the large-block domains, phase B only the others, so the best *fixed* block
changes at the switch. Heads are trained before the stream on a separate split with the full mix.

Recovery time: requests after the switch until a window of ``W`` requests first earns at least
98% of what the best fixed block of the new phase earns on the same requests (0 = never fell
below; None = never within the phase). That reference is the best any context-free policy can
do once it has adapted; a contextual policy that reads the domain from the features should never
fall below it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..reward.functions import pct_of, trace_rewards
from .core import (
    Contender,
    ProgressBar,
    Scorer,
    Settings,
    ci95,
    contender_feedback,
    curve_points,
    make_contexts,
    provenance,
    run_contenders,
    shuffled_stream,
    split_requests,
    standard_lineup,
    train_heads,
)
from .replay_sections import default_reward

#: a window is "recovered" when it earns this share of the new phase's best fixed block
RECOVERY_LEVEL = 0.98


def phase_domains(
    domains: np.ndarray, R: np.ndarray, pool: np.ndarray
) -> tuple[list[str], list[str], dict[str, int]]:
    """Split the domains in two: those whose best fixed arm (on ``pool``) is largest go first."""
    doms = np.asarray(domains).astype(str)
    best: dict[str, int] = {}
    score: dict[str, float] = {}
    for d in sorted(set(doms[pool].tolist())):
        m = pool[doms[pool] == d]
        j = int(np.argmax(R[m].mean(axis=0)))
        best[d] = j
        score[d] = float(R[m, j].mean())
    order = sorted(best, key=lambda d: (-best[d], -score[d], d))
    h = max(1, (len(order) + 1) // 2)
    if len(order) < 2:
        return order, order, best
    return order[:h], order[h:], best


def recovery_time(r: np.ndarray, ref: np.ndarray, window: int, level: float = RECOVERY_LEVEL) -> int | None:
    """First offset ``t`` with ``sum(r[t:t+window]) >= level * sum(ref[t:t+window])`` (None if never).

    >>> recovery_time(np.array([0, 0, 1, 1, 1.0]), np.ones(5), 2)
    2
    >>> recovery_time(np.zeros(4), np.ones(4), 2) is None
    True
    """
    if len(r) < window:
        return None
    cr = np.concatenate([[0.0], np.cumsum(r)])
    cf = np.concatenate([[0.0], np.cumsum(ref)])
    ws = cr[window:] - cr[:-window]
    wf = cf[window:] - cf[:-window]
    ok = np.flatnonzero(pct_of(ws, wf) >= 100.0 * level - 1e-9)
    return int(ok[0]) if len(ok) else None


def windowed_pct(r: np.ndarray, best: np.ndarray, window: int, points: np.ndarray) -> np.ndarray:
    """% of the oracle over the ``window`` requests ending at each of ``points`` (1-based)."""
    cr = np.concatenate([[0.0], np.cumsum(r)])
    cb = np.concatenate([[0.0], np.cumsum(best)])
    lo = np.maximum(points - window, 0)
    return pct_of(cr[points] - cr[lo], cb[points] - cb[lo])


def drift_stream(
    traces: Any, label: str, st: Settings, train_fraction: float, seed: int = 0
) -> tuple[dict, dict]:
    """One source: train heads on a split with the full mix, then stream phase A then phase B."""
    reward, latency = default_reward(traces)
    R = trace_rewards(traces, reward, latency)
    arms = traces.arms
    scorer = Scorer(R, traces.tau_matrix())
    tr, pool = split_requests(traces.domains, train_fraction, seed)
    ctx = make_contexts(traces, tr)
    heads = None if ctx.X is None else train_heads(ctx.X[tr], R[tr], arms, seed=seed)
    contenders = _contenders(traces, R[tr], heads, ctx.X is not None)
    fb = contender_feedback(contenders, traces, R, reward, latency)
    fed = {"best fixed of each phase (reference)": "none", "oracle": "oracle"}
    a_doms, b_doms, dom_best = phase_domains(traces.domains, R, pool)
    doms = traces.domains.astype(str)
    pool_a = pool[np.isin(doms[pool], a_doms)]
    pool_b = pool[np.isin(doms[pool], b_doms)]
    P = st.drift_phase_steps
    W = max(10, P // 10)
    pts = curve_points(2 * P, 160)
    rows: dict[str, dict[str, list]] = {}
    curves: dict[str, list[np.ndarray]] = {}
    refs = []
    bar = ProgressBar(f"4 drift {label}", st.progress)
    try:
        for o in range(st.orders):
            idx = np.concatenate([shuffled_stream(pool_a, P, 2 * o), shuffled_stream(pool_b, P, 2 * o + 1)])
            bar.plan(len(contenders) * 2 * P)
            chosen = run_contenders(contenders, R, ctx.X, idx, arms, 5000 + o, bar, feedback=fb, kinds=fed)
            ra = int(np.argmax(R[idx[:P]].sum(axis=0)))
            rb = int(np.argmax(R[idx[P:]].sum(axis=0)))
            refs.append((int(arms[ra]), int(arms[rb])))
            chosen = {
                "best fixed of each phase (reference)": np.concatenate([np.full(P, ra), np.full(P, rb)]),
                "oracle": scorer.oracle_choice(idx),
                **chosen,
            }
            _record_order(rows, curves, chosen, R, idx, P, (ra, rb), W, pts)
    finally:
        bar.close()
    kinds = {c.label: c.kind for c in contenders}
    table = [_policy_row(lbl, e, kinds.get(lbl, "reference"), fed[lbl]) for lbl, e in rows.items()]
    data = {
        "label": label,
        "traces": provenance(traces),
        "reward": reward,
        "latency": latency,
        "contexts": ctx.description,
        "phase_a": a_doms,
        "phase_b": b_doms,
        "domain_best_fixed": {d: int(arms[j]) for d, j in dom_best.items()},
        "phase_best_fixed": refs,
        "phase_steps": P,
        "window": W,
        "runs": st.orders,
        "n_train": int(len(tr)),
        "pool_a": int(len(pool_a)),
        "pool_b": int(len(pool_b)),
        "recovery_level": RECOVERY_LEVEL,
        "policies": table,
    }
    return data, {
        "label": label,
        "steps": pts,
        "change": P,
        "window": W,
        "curves": {k: np.mean(v, axis=0) for k, v in curves.items()},
    }


def _contenders(traces: Any, R_train: np.ndarray, heads: Any, contextual: bool) -> list[Contender]:
    """The block size best on the training split, then the standard lineup (discounted)."""
    fixed_tr = int(np.argmax(R_train.mean(axis=0)))
    return [
        Contender(
            f"fixed:{traces.arms[fixed_tr]} (best on the training split)",
            "fixed",
            choices=np.full(traces.n_requests, fixed_tr),
        ),
        *standard_lineup(heads, contextual, discount=True),
    ]


def _record_order(
    rows: dict[str, dict[str, list]],
    curves: dict[str, list[np.ndarray]],
    chosen: dict[str, np.ndarray],
    R: np.ndarray,
    idx: np.ndarray,
    P: int,
    phase_best: tuple[int, int],
    W: int,
    pts: np.ndarray,
) -> None:
    """Adds one shuffled order's scores (phase A, phase B, the windows after the change, the recovery
    time against each phase's best fixed block size) and windowed curve to every policy's; the first P
    requests of the order are phase A's."""
    ra, rb = phase_best
    best = R[idx].max(axis=1)
    ref_r = np.concatenate([R[idx[:P], ra], R[idx[P:], rb]])
    for lbl, a in chosen.items():
        r = R[idx, a]
        e = rows.setdefault(
            lbl, {"before": [], "first_window": [], "last_window": [], "recovery": [], "phase_b": []}
        )
        e["before"].append(float(pct_of(r[:P].sum(), best[:P].sum())))
        e["phase_b"].append(float(pct_of(r[P:].sum(), best[P:].sum())))
        e["first_window"].append(float(pct_of(r[P : P + W].sum(), best[P : P + W].sum())))
        e["last_window"].append(float(pct_of(r[-W:].sum(), best[-W:].sum())))
        e["recovery"].append(recovery_time(r[P:], ref_r[P:], W))
        curves.setdefault(lbl, []).append(windowed_pct(r, best, W, pts))


def _policy_row(label: str, e: dict[str, list], kind: str, feedback: str) -> dict[str, Any]:
    """A policy's mean scores over the orders and its recovery times."""
    rec = e["recovery"]
    return {
        "policy": label,
        "kind": kind,
        "feedback": feedback,
        **{k: round(ci95(e[k])[0], 3) for k in ("before", "first_window", "last_window", "phase_b")},
        "recovery": rec,
        "recovered_runs": sum(x is not None for x in rec),
        "recovery_median": None if any(x is None for x in rec) else float(np.median(rec)),
    }


def section_drift(traces: Any, st: Settings) -> tuple[dict[str, Any], list[dict]]:
    """A synthetic stream with a known optimum and one built from the trace set under evaluation."""
    from ..simulators.synthetic import generate

    syn = generate(
        "cpu-small", n_requests=st.drift_synthetic_requests, seed=7, per_round=False, progress=False
    )
    out, plots = [], []
    for label, ts, frac in (("synthetic (cpu-small)", syn, 0.25), ("trace set", traces, st.train_fraction)):
        d, p = drift_stream(ts, label, st, frac)
        out.append(d)
        plots.append(p)
    return {"streams": out}, plots
