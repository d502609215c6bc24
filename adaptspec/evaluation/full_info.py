"""Section 9: full information. Learning from every block size a request's rounds reveal
(:mod:`adaptspec.reward.counterfactual`) against learning from the one that ran.

Three parts, all on data in the repository:

- **How good the counterfactuals are.** The dense set the trace set was derived from (T = 0,
  every position and block size) re-derived at every block size 1-16 on the measured CPU profile:
  for every request and every block size that could run, each other block size's counterfactual
  reward (from the rounds that ran) against its own replay (drafting that block alone), and, per
  round, how often a prefix of a longer draft accepts a different number of drafts than the
  shorter block drafted alone.
- **Cold, on prompts no policy has seen.** The same 16 block sizes, every prompt of the dense
  set streamed once in shuffled orders to policies that start from nothing: % of the best fixed
  block size's reward over the first 48 and 240 requests, requests until the running total stays
  within 1% of it, and the first pass against the per-request oracle.
- **The trace set, cold.** Section 1's protocol (training/evaluation splits x stream orders,
  passes over the evaluation requests) for the cold bandits under bandit feedback and full
  information: first pass and whole stream, % of the per-request oracle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._util.markdown import ci, num, table
from ..reward.functions import pct_of, trace_rewards
from .core import (
    ProgressBar,
    Scorer,
    Settings,
    Tally,
    ci95,
    make_contexts,
    provenance,
    run_contenders,
    shuffled_stream,
    spec_contender,
    split_requests,
)
from .replay_sections import default_reward

#: the block sizes of the cold setting (every size the dense set holds, up to 16)
ARMS = tuple(range(1, 17))
CPU_PROFILE = "cpu-smollm2-fast"
#: horizons of the cold setting, in requests
HORIZONS = (48, 240)
#: within this share of the best fixed block size counts as "there"
WITHIN = 0.99
#: (label, spec, kind): bandit feedback beside full information, cold
COLD = (
    ("ucb", "ucb", "context-free"),
    ("fi-ucb", "fi-ucb", "context-free"),
    ("linucb", "linucb", "contextual"),
    ("fi-linucb", "fi-linucb", "contextual"),
    ("squarecb", "squarecb", "contextual"),
)
#: stream orders of the cold setting
ORDERS = 20


def section_full_info(traces: Any, st: Settings) -> dict[str, Any]:
    from ..costs.latency import get_profile
    from ..simulators.counterfactuals import trace_feedback
    from ..traces.dense import DenseTraceSet, to_traceset

    out: dict[str, Any] = {"traces": provenance(traces), "status": "ok"}
    bar = ProgressBar("9 full information", st.progress)
    try:
        out["trace_set"] = _trace_set_part(traces, st, bar, trace_feedback)
        where = (getattr(traces, "meta", None) or {}).get("dense")
        if not where or not (Path(where) / "meta.json").is_file():
            out["dense"] = {
                "status": "absent",
                "reason": f"the trace set names no dense set on disk ({where!r})",
            }
            return out
        ds = DenseTraceSet.open(where)
        arms = tuple(a for a in ARMS if a <= ds.max_block_size)
        ts = to_traceset(ds, arms, get_profile(CPU_PROFILE))
        R = trace_rewards(ts, "token_latency")
        fb = trace_feedback(ts, R, "token_latency")
        out["dense"] = {
            "status": "ok",
            "path": str(where),
            "requests": int(ts.n_requests),
            "arms": list(arms),
            "profile": CPU_PROFILE,
            "errors": counterfactual_errors(R, fb),
            "rounds": round_disagreement(ds),
        }
        out["cold"] = _cold_part(ts, R, fb, st, bar)
    finally:
        bar.close()
    return out


# ============================================================================ part 1: the error
def counterfactual_errors(R: np.ndarray, fb: Any) -> dict[str, Any]:
    """Relative error of every observed counterfactual reward ``fb.rewards[i, j, k]`` (arm ``k``
    from arm ``j``'s rounds, ``k != j``) against arm ``k``'s own reward ``R[i, k]``, for ``k < j``
    (a prefix: shorter blocks) and ``k > j`` (longer blocks, uncensored); the share censored; and
    what choosing by them costs: the arm with the best counterfactual reward among those observed,
    against the truly best of the same arms, in % of the latter's speed."""
    n, k = R.shape
    j_idx, k_idx = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
    rel = pct_of(fb.rewards, R[:, None, :]) - 100.0  # speed of the estimate over the truth, -100..
    res: dict[str, Any] = {}
    for key, sel in (("shorter", k_idx < j_idx), ("longer", k_idx > j_idx)):
        m = fb.observed & sel[None]
        e = rel[m]
        res[key] = {
            "pairs": int(m.sum()),
            "mae_pct": round(float(np.abs(e).mean()), 3),
            "bias_pct": round(float(e.mean()), 3),
            "p90_abs_pct": round(float(np.quantile(np.abs(e), 0.9)), 3),
            "observed_share": round(float(m.sum() / max(n * sel.sum(), 1)), 4),
        }
    loss = []
    for i in range(n):
        for j in range(k):
            m = fb.observed[i, j]
            pick = int(np.flatnonzero(m)[np.argmax(fb.rewards[i, j][m])])
            best = float(R[i][m].max())
            loss.append(float(pct_of(R[i, pick], best)) - 100.0)
    res["choice_loss_pct"] = round(float(np.mean(loss)), 3)
    res["choice_exact_share"] = round(float(np.mean(np.asarray(loss) == 0.0)), 4)
    return res


def round_disagreement(ds: Any) -> dict[str, Any]:
    """Per position and pair of block sizes ``B' < B``: how often the first ``B' - 1`` drafts of a
    block of ``B`` accept a different number than a block of ``B'`` drafted alone
    (``min(accept[p, B], B' - 1)`` against ``accept[p, B']``), and by how much on average."""
    diff, total, absd, more = 0, 0, 0.0, 0
    for _, _, r in ds.requests():
        acc = r.accept.astype(np.int64)  # [L - 1, max - 1]: column b - 2 is block size b
        nb = acc.shape[1] + 1
        for b in range(3, nb + 1):
            for b2 in range(2, b):
                pre = np.minimum(acc[:, b - 2], b2 - 1)
                alone = acc[:, b2 - 2]
                d = pre - alone
                diff += int(np.count_nonzero(d))
                more += int(np.count_nonzero(d > 0))
                absd += float(np.abs(d).sum())
                total += d.size
    return {
        "comparisons": total,
        "differ_share": round(diff / max(total, 1), 4),
        "prefix_more_share": round(more / max(total, 1), 4),
        "mean_abs_drafts": round(absd / max(total, 1), 4),
    }


# ============================================================================ part 2: cold, unseen prompts
def _cold_part(ts: Any, R: np.ndarray, fb: Any, st: Settings, bar: ProgressBar) -> dict[str, Any]:
    n = ts.n_requests
    everything = np.arange(n)
    ctx = make_contexts(ts, everything)  # prompts' features only (no reward): what a cold deployment has
    contexts = ctx.description.replace(
        "fitted on the training split", "fitted on every prompt's features, no reward"
    )
    H = [h for h in HORIZONS if h <= n]
    contenders = [spec_contender(lbl, spec, kind) for lbl, spec, kind in COLD]
    per: dict[str, dict[str, list[float]]] = {c.label: {} for c in contenders}
    fed: dict[str, str] = {}
    bar.plan(len(contenders) * n * ORDERS)
    for o in range(ORDERS):
        idx = shuffled_stream(everything, n, 9000 + o)
        chosen = run_contenders(contenders, R, ctx.X, idx, ts.arms, 9000 + o, bar, feedback=fb, kinds=fed)
        Ri = R[idx]
        cum_best = np.cumsum(Ri, axis=0).max(axis=1)  # the best fixed block size on the first h requests
        oracle = Ri.max(axis=1).sum()
        for lbl, a in chosen.items():
            got = np.cumsum(Ri[np.arange(n), a])
            pct = pct_of(got, cum_best)
            d = per[lbl]
            for h in H:
                d.setdefault(f"pct_best_fixed_{h}", []).append(float(pct[h - 1]))
            below = np.flatnonzero(pct < 100.0 * WITHIN)
            d.setdefault("requests_to_within", []).append(float(0 if below.size == 0 else below[-1] + 2))
            d.setdefault("first_pass_pct_oracle", []).append(float(pct_of(got[-1], oracle)))
            d.setdefault("arm_at_end", []).append(float(ts.arms[int(a[-1])]))
    rows = []
    for c in contenders:
        row: dict[str, Any] = {"policy": c.label, "kind": c.kind, "feedback": fed[c.label]}
        for key, vals in per[c.label].items():
            m, lo, hi = ci95(vals)
            row[key] = {"mean": round(m, 4), "lo": round(lo, 4), "hi": round(hi, 4)}
        v = np.asarray(per[c.label]["requests_to_within"])
        row["requests_to_within"]["median"] = float(np.median(v))
        row["requests_to_within"]["never_share"] = float(np.mean(v > n))
        rows.append(row)
    best = int(np.argmax(R.sum(axis=0)))
    return {
        "requests": n,
        "orders": ORDERS,
        "horizons": H,
        "within": WITHIN,
        "contexts": contexts,
        "best_fixed": int(ts.arms[best]),
        "oracle_gain_pct": round(float(pct_of(R.max(axis=1).sum(), R[:, best].sum()) - 100), 3),
        "rows": rows,
    }


# ============================================================================ part 3: the trace set
def _trace_set_part(traces: Any, st: Settings, bar: ProgressBar, trace_feedback: Any) -> dict[str, Any]:
    reward, latency = default_reward(traces)
    if (
        reward != "token_latency"
        or "tau" not in traces.outcomes.column_names
        or not traces.meta.get("latency_profile")
    ):
        return {
            "status": "absent",
            "reason": "the trace set has no timings, per-round taus and latency profile "
            "to price counterfactual rounds with",
        }
    R = trace_rewards(traces, reward)
    fb = trace_feedback(traces, R, reward)
    scorer = Scorer(R, traces.tau_matrix())
    stream, first = Tally(), Tally()
    contenders = [spec_contender(lbl, spec, kind) for lbl, spec, kind in COLD]
    info: dict[str, Any] = {}
    for s in range(st.splits):
        tr, ev = split_requests(traces.domains, st.train_fraction, s)
        ctx = make_contexts(traces, tr)
        T = st.passes * len(ev)
        info = {"contexts": ctx.description, "n_eval": int(len(ev)), "steps": int(T)}
        for o in range(st.orders):
            run_seed = 1000 * s + o
            idx = shuffled_stream(ev, T, run_seed)
            bar.plan(len(contenders) * T)
            fed = {"best fixed": "none"}
            chosen = run_contenders(
                contenders, R, ctx.X, idx, traces.arms, run_seed, bar, feedback=fb, kinds=fed
            )
            ref = int(np.argmax(R[idx].sum(axis=0)))
            one = idx[: len(ev)]
            ref1 = int(np.argmax(R[one].sum(axis=0)))
            chosen = {"best fixed": np.full(T, ref), **chosen}
            for lbl, a in chosen.items():
                stream.add(lbl, scorer.score(idx, a, ref), feedback=fed[lbl])
                first.add(
                    lbl,
                    scorer.score(
                        one, np.full(len(one), ref1) if lbl == "best fixed" else a[: len(one)], ref1
                    ),
                    feedback=fed[lbl],
                )
    return {
        "status": "ok",
        "reward": reward,
        "runs": st.runs,
        "passes": st.passes,
        **info,
        "stream": stream.summary(),
        "first_pass": first.summary(),
    }


# ============================================================================ rendering
def render_full_info(d: dict[str, Any] | None, figs: list[str]) -> str:
    if not d or d.get("status") != "ok":
        return "Not run yet."
    out = [
        "After a request, every block size up to the one that ran is known from its rounds: a round that verified "
        "`B` positions and committed `tau` tokens would have committed `min(tau, B')` at `B' <= B`, and at a longer "
        "`B'` too unless it accepted everything (then the longer sizes are censored). A full-information learner "
        "(`fi-ucb`, `fi-linucb`: `update_full`) learns every observed size after every request; the bandit "
        "versions learn the one that ran. Counterfactual rewards are priced by the latency profile and scaled to "
        "the measured time of what ran ([simulator.md](simulator.md#counterfactual-outcomes)).",
        "",
    ]
    dn = d.get("dense", {})
    if dn.get("status") == "ok":
        out += _counterfactual_quality(dn)
        out += _cold_section(d["cold"], dn)
    t = d.get("trace_set", {})
    if t.get("status") != "ok":
        out += [f"The trace set part was not run: {t.get('reason')}.", ""]
    if dn.get("status") != "ok":
        out += [f"The dense parts were not run: {dn.get('reason')}.", ""]
    if t.get("status") == "ok":
        out += _trace_set_section(t)
    out += ["", *[f"- {x}" for x in full_info_findings(d)]]
    return "\n".join(out).rstrip()


def _counterfactual_quality(dn: dict[str, Any]) -> list[str]:
    """How close each block size's counterfactual comes to its own replay, on the dense set."""
    e, rd = dn["errors"], dn["rounds"]
    return [
        f"**How good the counterfactuals are** (dense set `{dn['path']}`, {dn['requests']} requests, block "
        f"sizes {dn['arms'][0]}-{dn['arms'][-1]}, `{dn['profile']}`): each block size's counterfactual ms per "
        "token, from the rounds of another, against its own replay (drafting that block alone, the truth at "
        "T = 0). Error in % of speed.",
        "",
        table(
            ["counterfactual of", "pairs", "observed", "mean abs error, %", "bias, %", "90th pct abs, %"],
            [
                [
                    f"a {k} block size",
                    f"{e[k]['pairs']:,}",
                    f"{100 * e[k]['observed_share']:.0f}%",
                    num(e[k]["mae_pct"], 2),
                    f"{e[k]['bias_pct']:+.2f}",
                    num(e[k]["p90_abs_pct"], 2),
                ]
                for k in ("shorter", "longer")
            ],
            "lrrrrr",
        ),
        "",
        f"- Per round, a prefix of a longer draft accepts a different number of drafts than the shorter block "
        f"drafted alone in {100 * rd['differ_share']:.1f}% of {rd['comparisons']:,} (position, B, B') "
        f"comparisons (more in {100 * rd['prefix_more_share']:.1f}%), {rd['mean_abs_drafts']:.3f} drafts "
        "apart on average: the drafter attends both ways inside a block, so these counterfactuals are "
        "approximate; they are exact for a speculator that drafts once and verifies a prefix.",
        f"- Choosing the block size with the best counterfactual reward among those a request shows loses "
        f"{-e['choice_loss_pct']:.2f}% of the speed of the truly best of them on average (the same choice "
        f"in {100 * e['choice_exact_share']:.0f}% of (request, block size) pairs).",
        "",
    ]


def _cold_section(c: dict[str, Any], dn: dict[str, Any]) -> list[str]:
    """Each policy's reward on prompts no policy has seen, against the best fixed block size."""
    H = c["horizons"]
    rows = []
    for r in c["rows"]:
        rtw = r["requests_to_within"]
        rows.append(
            [
                f"`{r['policy']}`",
                *[ci(r[f"pct_best_fixed_{h}"]) for h in H],
                (f"{rtw['median']:.0f}" if rtw["median"] <= c["requests"] else f"not in {c['requests']}")
                + (
                    f" ({100 * rtw['never_share']:.0f}% of orders never)"
                    if 0 < rtw["never_share"] < 1
                    else ""
                ),
                ci(r["first_pass_pct_oracle"]),
            ]
        )
    return [
        f"**Cold, on prompts no policy has seen** (block sizes {dn['arms'][0]}-{dn['arms'][-1]}, "
        f"`{dn['profile']}`; every one of the {c['requests']} prompts once, {c['orders']} shuffled orders; "
        f"contextual policies: {c['contexts']}). % of the best fixed block "
        "size's reward on the same requests so far (B = "
        f"{c['best_fixed']} over all; the per-request oracle is {c['oracle_gain_pct']:+.1f}% over it); "
        f"requests until the running total stays within {100 - 100 * c['within']:.0f}% of it (median over "
        "orders).",
        "",
        table(
            [
                "policy",
                *[f"% of best fixed, first {h}" for h in H],
                "requests to within 1%",
                "first pass, % of oracle",
            ],
            rows,
            "l" + "r" * (len(H) + 2),
        ),
        "",
    ]


def _trace_set_section(t: dict[str, Any]) -> list[str]:
    """Each policy's first pass and stream over the trace set, cold."""
    fp = {r["policy"]: r for r in t["first_pass"]}
    rows = [
        [
            f"`{r['policy']}`",
            ci(fp[r["policy"]]["pct_oracle"]),
            ci(fp[r["policy"]]["gain_pct"], sign=True),
            ci(r["pct_oracle"]),
            ci(r["gain_pct"], sign=True),
        ]
        for r in t["stream"]
    ]
    return [
        f"**The trace set, cold** (section 1's protocol: {t['runs']} runs, {t['passes']} passes over "
        f"{t['n_eval']} evaluation requests; contexts: {t['contexts']}). % of the per-request oracle and gain "
        "over the best fixed block size:",
        "",
        table(
            [
                "policy",
                "first pass: % of oracle",
                "first pass: gain, %",
                "stream: % of oracle",
                "stream: gain, %",
            ],
            rows,
            "lrrrr",
        ),
        "",
    ]


def full_info_findings(d: dict[str, Any]) -> list[str]:
    """The section's key sentences (also used in the summary)."""
    out: list[str] = []
    c = d.get("cold")
    if c:
        rows = {r["policy"]: r for r in c["rows"]}
        for bandit, full in (("ucb", "fi-ucb"), ("linucb", "fi-linucb")):
            if bandit in rows and full in rows:
                b, f = rows[bandit], rows[full]
                hs = c["horizons"]
                out.append(
                    f"Cold on unseen prompts, `{full}` earns "
                    + " and ".join(f"{f[f'pct_best_fixed_{h}']['mean']:.1f}%" for h in hs)
                    + f" of the best fixed block size over the first {' and '.join(map(str, hs))} requests "
                    f"(`{bandit}`: "
                    + " and ".join(f"{b[f'pct_best_fixed_{h}']['mean']:.1f}%" for h in hs)
                    + f"); median requests to within 1%: {_within(f, c)} against {_within(b, c)}."
                )
    t = d.get("trace_set", {})
    if t.get("status") == "ok":
        fp = {r["policy"]: r for r in t["first_pass"]}
        st = {r["policy"]: r for r in t["stream"]}
        best = max((p for p in fp if p != "best fixed"), key=lambda p: fp[p]["pct_oracle"]["mean"])
        out.append(
            f"On the trace set, cold, the best first pass is `{best}`'s: {fp[best]['pct_oracle']['mean']:.1f}% "
            f"of the per-request oracle ({st[best]['pct_oracle']['mean']:.1f}% over the whole stream)."
        )
    return out


def _within(row: dict[str, Any], c: dict[str, Any]) -> str:
    m = row["requests_to_within"]["median"]
    return f"{m:.0f}" if m <= c["requests"] else f"not within {c['requests']}"
