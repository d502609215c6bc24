"""Section 5: cold start. How many offline (full-information) requests the head needs before the
warm-started default policy beats bandits that start from nothing.

The training split is fixed (the evaluation requests never train anything); heads are trained
on random subsets of it of growing size, several subsets per size. The featurizer (for wide
features) is fitted once on the whole training split: it uses no rewards, so it needs prefill
features only, which any deployment has in plenty. Every head, and every cold bandit, is then
scored on the same streams over the evaluation split, over the first pass (each evaluation
request once) and over the whole stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..reward.functions import trace_rewards
from .core import (
    Contender,
    ProgressBar,
    Scorer,
    Settings,
    Tally,
    contender_feedback,
    make_contexts,
    provenance,
    run_contenders,
    shuffled_stream,
    spec_contender,
    split_requests,
    train_heads,
)
from .replay_sections import default_reward

#: the smallest head training set tried
MIN_SIZE = 8
COLD = (("linucb (cold)", "linucb"), ("squarecb (cold)", "squarecb"), ("ucb-throughput", "ucb-throughput"))


def training_sizes(n_train: int, smallest: int = MIN_SIZE) -> list[int]:
    """Doubling sizes from ``smallest`` up to, and including, ``n_train``.

    >>> training_sizes(100)
    [8, 16, 32, 64, 100]
    """
    sizes, s = [], smallest
    while s < n_train:
        sizes.append(s)
        s *= 2
    return sizes + [n_train]


def crossing(sizes: list[int], warm: list[float], cold: float) -> int | None:
    """The smallest size from which the warm-started policy's score stays at or above ``cold``.

    >>> crossing([8, 16, 32], [90.0, 95.0, 96.0], 94.0)
    16
    >>> crossing([8, 16], [90.0, 91.0], 94.0) is None
    True
    """
    for i in range(len(sizes)):
        if all(w >= cold for w in warm[i:]):
            return sizes[i]
    return None


def section_coldstart(
    traces: Any, st: Settings, seed: int = 0
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Learning curve of the warm start over head training-set sizes, against cold bandits."""
    reward, latency = default_reward(traces)
    base = {"traces": provenance(traces), "reward": reward, "latency": latency}
    if traces.features is None:
        return {**base, "status": "no-features"}, None
    R = trace_rewards(traces, reward, latency)
    arms = traces.arms
    tr, ev = split_requests(traces.domains, st.train_fraction, seed)
    ctx = make_contexts(traces, tr)
    if len(tr) < MIN_SIZE:
        return {**base, "status": "too-small", "n_train": int(len(tr))}, None
    scorer = Scorer(R, traces.tau_matrix())
    T = st.passes * len(ev)
    sizes = training_sizes(len(tr))
    reps = st.coldstart_repeats
    cold, first_cold = Tally(), Tally()
    warm = {k: {s: Tally() for s in sizes} for k in ("stream", "first_pass")}
    bar = ProgressBar("5 cold start", st.progress)
    cold_c = [
        spec_contender(lbl, spec, "context-free" if "ucb" in spec else "contextual") for lbl, spec in COLD
    ]
    fb = contender_feedback(cold_c, traces, R, reward, latency)  # the warm ones learn from the arm that ran
    fed = {"best fixed": "none"}
    try:
        for r in range(reps):
            idx = shuffled_stream(ev, T, 7000 + r)
            one = idx[: len(ev)]
            bar.plan(len(cold_c) * T)
            chosen = run_contenders(cold_c, R, ctx.X, idx, arms, 7000 + r, bar, feedback=fb, kinds=fed)
            chosen["best fixed"] = np.full(T, int(np.argmax(R[idx].sum(axis=0))))
            for lbl, a in chosen.items():
                cold.add(lbl, scorer.score(idx, a), feedback=fed[lbl])
                first_cold.add(lbl, scorer.score(one, a[: len(ev)]), feedback=fed[lbl])
            rng = np.random.default_rng([seed, r, 77])
            for s in sizes:
                sub = np.sort(rng.choice(tr, size=s, replace=False)) if s < len(tr) else tr
                heads = train_heads(ctx.X[sub], R[sub], arms, seed=1000 * r + s, classification=False)
                warm_c = _warm_contenders(heads.regression)
                bar.plan(len(warm_c) * T)
                ch = run_contenders(warm_c, R, ctx.X, idx, arms, 7000 + r, bar, feedback=fb)
                for lbl, a in ch.items():
                    warm["stream"][s].add(lbl, scorer.score(idx, a))
                    warm["first_pass"][s].add(lbl, scorer.score(one, a[: len(ev)]))
    finally:
        bar.close()
    out: dict[str, Any] = {
        **base,
        "status": "ok",
        "contexts": ctx.description,
        "n_train": int(len(tr)),
        "n_eval": int(len(ev)),
        "steps": int(T),
        "repeats": reps,
        "sizes": sizes,
        "horizons": {},
    }
    for key, cold_t in (("stream", cold), ("first_pass", first_cold)):
        out["horizons"][key] = _horizon(cold_t, warm[key], sizes)
    return out, out


def _warm_contenders(head: Any) -> list[Contender]:
    """The warm start (neural-linear on the head) and the head alone."""
    from ..policies.neural_linear import NeuralLinear
    from ..policies.offline_head import OfflineHead

    return [
        Contender("neural-linear (warm)", "contextual", lambda ar, sd, h=head: NeuralLinear(h, seed=sd)),
        Contender("head alone (regression)", "offline", lambda ar, sd, h=head: OfflineHead(h, seed=sd)),
    ]


def _horizon(cold_t: Tally, warm_t: dict[int, Tally], sizes: list[int]) -> dict[str, Any]:
    """One horizon (the stream or the first pass): the cold policies, the warm ones' curve over the
    head's training-set sizes, and the size where the warm start overtakes the best cold policy and
    the best fixed block size."""
    cold_rows = cold_t.summary()
    curve = {lbl: [] for lbl in ("neural-linear (warm)", "head alone (regression)")}
    for s in sizes:
        for row in warm_t[s].summary():
            curve[row["policy"]].append(
                {"size": s, "pct_oracle": row["pct_oracle"], "gain_pct": row["gain_pct"]}
            )
    best_cold = max(
        (c for c in cold_rows if c["policy"] != "best fixed"), key=lambda c: c["pct_oracle"]["mean"]
    )
    nl = [p["pct_oracle"]["mean"] for p in curve["neural-linear (warm)"]]
    return {
        "cold": cold_rows,
        "warm": curve,
        "best_cold": best_cold["policy"],
        "crossing": crossing(sizes, nl, best_cold["pct_oracle"]["mean"]),
        "crossing_best_fixed": crossing(
            sizes, nl, next(c for c in cold_rows if c["policy"] == "best fixed")["pct_oracle"]["mean"]
        ),
    }
