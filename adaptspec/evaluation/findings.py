"""Section 7: what the numbers say, written from the numbers.

Every sentence here is a template filled from a section's results, and every comparison word
("beats", "loses to", "cannot be told apart from") is chosen from the 95% interval, so the
text stays true whatever numbers a run produces.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .core import ci95

DEFAULT = "neural-linear (default)"
BLOCKPILOT = "head, classifier (BlockPilot-style)"
BANDITSPEC = "ucb-throughput"
OWN = "domain's own best fixed"
#: an oracle margin below this (percent) leaves too little for per-request choice to matter
SMALL_HEADROOM = 3.0


def pct(x: float | None, sign: bool = False) -> str:
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x:+.1f}%" if sign else f"{x:.1f}%"


def with_ci(m: dict[str, Any], sign: bool = True) -> str:
    """``+2.9% (95% CI +2.6 to +3.3)``; just the value when the interval is a point."""
    if m["lo"] is None or m["hi"] is None or m["lo"] == m["hi"]:
        return pct(m["mean"], sign)
    f = "{:+.1f}" if sign else "{:.1f}"
    return f"{pct(m['mean'], sign)} (95% CI {f.format(m['lo'])} to {f.format(m['hi'])})"


def verdict(m: dict[str, Any], other: str = "the best fixed block") -> str:
    """``beats`` / ``loses to`` / ``cannot be told apart from`` ``other``, from a gain's interval.

    When every run gave the same value (a policy that does not depend on the stream order,
    evaluated on one split) there is no interval: the words then say "in every run".
    """
    if m["lo"] is not None and m["lo"] == m["hi"]:
        if m["mean"] > 0:
            return f"beats {other} in every run (no spread across runs)"
        if m["mean"] < 0:
            return f"loses to {other} in every run (no spread across runs)"
        return f"equals {other}"
    if m["lo"] is not None and m["lo"] > 0:
        return f"beats {other}"
    if m["hi"] is not None and m["hi"] < 0:
        return f"loses to {other}"
    return f"cannot be told apart from {other}"


def paired(a: dict[str, Any], b: dict[str, Any], metric: str) -> dict[str, float]:
    """Mean and 95% interval of ``a - b`` run by run (the runs share splits and stream orders)."""
    va, vb = np.asarray(a[metric]["values"], float), np.asarray(b[metric]["values"], float)
    m, lo, hi = ci95(va - vb)
    return {"mean": m, "lo": lo, "hi": hi}


def rows_by_name(rows: list[dict]) -> dict[str, dict]:
    return {r["policy"]: r for r in rows}


# ============================================================================ per section
def replay_findings(d: dict[str, Any]) -> list[str]:
    rows = rows_by_name(d["stream"])
    first = rows_by_name(d["first_pass"])
    out = []
    bf = d["best_fixed"]
    n_bf = sum(1 for b in d["best_fixed_per_run"] if b == bf)
    head = rows["best fixed"]["pct_oracle"]["mean"]
    room = rows["oracle"]["gain_pct"]["mean"]
    out.append(
        f"The best single block size is B={bf} (best in {n_bf} of {len(d['best_fixed_per_run'])} runs); it earns "
        f"{pct(head)} of what the per-request oracle earns, so choosing per request can add at most "
        f"{pct(room, True)} on this trace set."
    )
    for name in (
        BANDITSPEC,
        BLOCKPILOT,
        "head, regression (greedy)",
        DEFAULT,
        "linucb (cold)",
        "squarecb (cold)",
    ):
        if name in rows:
            r = rows[name]
            out.append(
                f"`{name}` earns {pct(r['pct_oracle']['mean'])} of the oracle and "
                f"{verdict(r['gain_pct'])}: {with_ci(r['gain_pct'])}."
            )
    if DEFAULT in rows and BLOCKPILOT in rows:
        diff = paired(rows[DEFAULT], rows[BLOCKPILOT], "gain_pct")
        out.append(
            f"Against the BlockPilot-style head alone, the default policy {_diff_word(diff)}: "
            f"{_points(diff)} points of gain over the best fixed block, paired by run."
        )
    reg = "head, regression (greedy)"
    if DEFAULT in rows and reg in rows:
        a, b = paired(rows[DEFAULT], rows[reg], "gain_pct"), paired(first[DEFAULT], first[reg], "gain_pct")
        out.append(
            f"Against the regression head it starts from (frozen), learning online {_diff_word(a)} over the "
            f"whole stream ({_points(a)} points) and {_diff_word(b)} over the first pass ({_points(b)} points): "
            "the difference between what exploring costs and what the feedback teaches."
        )
    if DEFAULT in first and "best fixed" in first:
        f = first[DEFAULT]
        out.append(
            f"Over the first pass alone (each evaluation request seen once, nothing repeated) the default policy "
            f"earns {pct(f['pct_oracle']['mean'])} of the oracle and {verdict(f['gain_pct'])} "
            f"({with_ci(f['gain_pct'])}); over the whole stream of {d['passes']} passes "
            f"{pct(rows[DEFAULT]['pct_oracle']['mean'])}."
        )
    cold = [n for n in ("linucb (cold)", "squarecb (cold)") if n in first]
    if cold and DEFAULT in first:
        best_cold = max(cold, key=lambda n: first[n]["pct_oracle"]["mean"])
        gap = first[DEFAULT]["pct_oracle"]["mean"] - first[best_cold]["pct_oracle"]["mean"]
        out.append(
            f"In that first pass the warm start is {abs(gap):.1f} points of the oracle "
            f"{'ahead of' if gap >= 0 else 'behind'} the best cold contextual bandit (`{best_cold}`)."
        )
    return out


def _diff_word(diff: dict[str, float]) -> str:
    if diff["lo"] == diff["hi"]:
        return (
            "is ahead in every run"
            if diff["mean"] > 0
            else ("is behind in every run" if diff["mean"] < 0 else "is level")
        )
    if diff["lo"] > 0:
        return "is ahead"
    if diff["hi"] < 0:
        return "is behind"
    return "cannot be told apart from it"


def _points(d: dict[str, float]) -> str:
    if d["lo"] == d["hi"]:
        return f"{d['mean']:+.1f}"
    return f"{d['mean']:+.1f} (95% CI {d['lo']:+.1f} to {d['hi']:+.1f})"


def domain_findings(d: dict[str, Any]) -> list[str]:
    """Where per-request choice does not pay: domains with no headroom, or where the default loses."""
    out = []
    bf = d["best_fixed"]
    for row in d.get("domains", []):
        g = row["gain_pct"]
        room = g["oracle"]["mean"]
        own = row["best_fixed_in_domain"]
        dom = row["domain"]
        if room < SMALL_HEADROOM:
            out.append(
                f"`{dom}`: the overall best fixed block B={bf} is already within {room:.1f}% of the per-request "
                f"oracle there; adaptation has almost nothing to win."
            )
        elif own != bf and g[OWN]["mean"] >= 0.5 * room:
            out.append(
                f"`{dom}`: at least half of the headroom ({room:.1f}%) comes from one other block size for the "
                f"whole domain (B={own}: {pct(g[OWN]['mean'], True)}); a per-domain lookup would capture that "
                "part without per-request features."
            )
        if DEFAULT in g and g[DEFAULT]["hi"] < 0:
            out.append(
                f"`{dom}`: the default policy loses to the overall best fixed block ({with_ci(g[DEFAULT])})."
            )
    return out


def hardware_findings(d: dict[str, Any]) -> list[str]:
    ref = d["reference"]
    gpu = [b["all_requests"]["best_fixed"] for b in d["batches"]]
    if all(g == ref["best_fixed"] for g in gpu):
        out = [
            f"The best fixed block is B={ref['best_fixed']} with the trace set's own costs and stays B="
            f"{ref['best_fixed']} at every batch size on the `{d['profile']}` profile."
        ]
    else:
        parts = [f"B={g} at batch {b['batch_size']}" for g, b in zip(gpu, d["batches"])]
        out = [
            f"The same acceptance moves the best fixed block: B={ref['best_fixed']} with the trace set's own costs, "
            f"{', '.join(parts)} on the `{d['profile']}` profile."
        ]
    heads = [
        f"{pct(b['all_requests']['oracle_gain_pct'], True)} at batch {b['batch_size']}" for b in d["batches"]
    ]
    out.append(
        f"The per-request oracle's margin over the best fixed block is {pct(ref['oracle_gain_pct'], True)} with "
        f"the trace set's own costs and {', '.join(heads)} on the GPU profile."
    )
    for b in d["batches"]:
        rows = rows_by_name(b["stream"])
        if DEFAULT in rows:
            r = rows[DEFAULT]
            out.append(
                f"Batch {b['batch_size']}: the default policy {verdict(r['gain_pct'])} "
                f"({with_ci(r['gain_pct'])}; {pct(r['pct_oracle']['mean'])} of the oracle)."
            )
    return out


def blockpilot_findings(d: dict[str, Any]) -> list[str]:
    if d.get("status") != "ok":
        return []
    out = [
        "The BlockPilot data has no prefill features, so no contextual policy (head, NeuralLinear, LinUCB, "
        "SquareCB) can run on it: only fixed blocks, context-free bandits and the choices published with it."
    ]
    for rw in d["rewards"]:
        rows = rows_by_name(rw["policies"])
        unit = "tau" if rw["reward"] == "tau" else f"throughput modelled on `{rw['latency']}`"
        bf = rw["all_requests"]["best_fixed"]
        out.append(
            f"Paid in {unit}: the best fixed block is B={bf}; the per-prompt oracle is "
            f"{pct(rw['all_requests']['oracle_gain_pct'], True)} above it, which bounds what any per-request "
            "policy could add."
        )
        for name in ("ucb-throughput", "thompson", "exp3"):
            if name in rows:
                out.append(f"`{name}` {verdict(rows[name]['gain_pct'])} ({with_ci(rows[name]['gain_pct'])}).")
        sel = "BlockPilot's selector (released choices)"
        if sel in rows:
            out.append(
                f"BlockPilot's published choices earn {pct(rows[sel]['pct_oracle']['mean'])} of the oracle "
                f"({pct(rows[sel]['gain_pct']['mean'], True)} over B={bf}); they are reported as published, "
                "since the classifier cannot be re-run without features."
            )
    return out


def drift_findings(d: dict[str, Any]) -> list[str]:
    out = []
    for s in d["streams"]:
        a = sorted({x[0] for x in s["phase_best_fixed"]})
        b = sorted({x[1] for x in s["phase_best_fixed"]})
        lbl = s["label"]
        if a == b:
            out.append(
                f"{lbl}: the switch from {', '.join(s['phase_a'])} to {', '.join(s['phase_b'])} does not "
                f"move the best fixed block (B={a}), so there is little to recover from."
            )
        else:
            out.append(
                f"{lbl}: the switch from {', '.join(s['phase_a'])} to {', '.join(s['phase_b'])} moves the "
                f"best fixed block from B={'/'.join(map(str, a))} to B={'/'.join(map(str, b))}."
            )
        rows = [r for r in s["policies"] if r["kind"] != "reference" and not r["policy"].startswith("fixed:")]
        never = [r["policy"] for r in rows if r["recovered_runs"] == 0]
        steady = [r["policy"] for r in rows if r["recovery"] and all(x == 0 for x in r["recovery"])]
        slow = [
            f"`{r['policy']}` ({_rec(r)})"
            for r in rows
            if r["policy"] not in never
            and r["policy"] not in steady
            and r["recovered_runs"] == len(r["recovery"])
        ]
        some = [
            f"`{r['policy']}` ({_rec(r)})"
            for r in rows
            if r["policy"] not in never
            and r["policy"] not in steady
            and r["recovered_runs"] < len(r["recovery"])
        ]
        if steady:
            out.append(
                f"{lbl}: never fell below {100 * s['recovery_level']:.0f}% of the new phase's best fixed block: "
                + ", ".join(f"`{x}`" for x in steady)
                + "."
            )
        if slow:
            out.append(f"{lbl}: recovered in every run after a dip: " + ", ".join(slow) + ".")
        if some:
            out.append(f"{lbl}: recovered in some runs only: " + ", ".join(some) + ".")
        if never:
            out.append(
                f"{lbl}: did not recover within {s['phase_steps']} requests in any run: "
                + ", ".join(f"`{x}`" for x in never)
                + "."
            )
    return out


def _rec(r: dict) -> str:
    vals = ["never" if x is None else str(x) for x in r["recovery"]]
    return "requests per run: " + ", ".join(vals)


def coldstart_findings(d: dict[str, Any]) -> list[str]:
    if d.get("status") != "ok":
        return []
    out = []
    for key, name in (("first_pass", "over the first pass"), ("stream", "over the whole stream")):
        h = d["horizons"][key]
        c = h["crossing"]
        if c is None:
            out.append(
                f"{name.capitalize()}, the warm-started default's mean never stays above the best cold bandit's "
                f"(`{h['best_cold']}`) within the sizes tried (up to {d['sizes'][-1]} requests)."
            )
        else:
            out.append(
                f"{name.capitalize()}, the warm-started default's mean stays at or above the best cold "
                f"bandit's (`{h['best_cold']}`) from {c} offline requests on."
            )
        cb = h["crossing_best_fixed"]
        out.append(
            f"{name.capitalize()}, its mean stays at or above the best fixed block's "
            + (
                "from " + str(cb) + " offline requests on."
                if cb is not None
                else "at none of the sizes tried."
            )
        )
        nl = [p["pct_oracle"]["mean"] for p in h["warm"].get("neural-linear (warm)", [])]
        hd = [p["pct_oracle"]["mean"] for p in h["warm"].get("head alone (regression)", [])]
        behind = sum(1 for a, b in zip(nl, hd) if a < b)
        if nl and behind == len(nl):
            out.append(
                f"{name.capitalize()}, the frozen head alone is ahead of the warm-started default at every "
                "size: exploring has not paid for itself yet at that horizon."
            )
        elif nl and behind == 0:
            out.append(
                f"{name.capitalize()}, the warm-started default is ahead of the frozen head alone at every "
                "size: the feedback corrects the head."
            )
    return out


def e2e_findings(d: dict[str, Any]) -> list[str]:
    if not d or "methods" not in d:
        return []
    m = d["methods"]
    c = d["controller"]
    out = [
        f"On {d['prompts']} prompts of up to {d['max_new_tokens']} new tokens: fixed B={d['fixed_block']} runs at "
        f"{m['fixed']['speedup']:.2f}x plain decoding and the controller at {m['controller']['speedup']:.2f}x "
        f"(mean tau {_f2(m['fixed']['mean_tau'])} and {_f2(m['controller']['mean_tau'])})."
    ]
    if m["fixed"]["speedup"] < 1.0:
        noisy = f" (only {d['prompts']} prompts: this may be timing noise)" if d["prompts"] < 20 else ""
        out.append(
            f"Speculation at fixed B={d['fixed_block']} was slower than plain decoding{noisy}: at mean tau "
            f"{_f2(m['fixed']['mean_tau'])} a round's drafting and verification cost more than the tokens it "
            "commits save."
        )
    out.append(
        f"The controller's own time is {c['overhead_ms_mean']:.2f} ms per request on average "
        f"({pct(c['overhead_pct_of_decode'])} of decode time); its updates take {c['update_mean_ms']:.3f} ms "
        "on the background thread."
    )
    if d["identical_outputs"] != d["prompts"]:
        out.append(
            f"Outputs differed between methods on {d['prompts'] - d['identical_outputs']} prompts: "
            "at temperature 0 they must not (investigate before trusting the speed figures)."
        )
    if d["prompts"] < 20:
        out.append(
            f"With {d['prompts']} prompts these timings are anecdotal; run `--e2e 50` or more for figures."
        )
    return out


def _f2(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def where_it_does_not_help(results: dict[str, Any]) -> list[str]:
    """The cases, across sections, in which adaptation adds nothing, each with its reason."""
    out = []
    rep = results.get("replay", {}).get("data")
    if rep:
        out += _replay_limits(rep)
        out += domain_findings(rep)
    hw = results.get("hardware", {}).get("data")
    if hw:
        out += _hardware_limits(hw)
    bp = results.get("blockpilot", {}).get("data")
    if bp and bp.get("status") == "ok":
        g = bp["rewards"][0]["all_requests"]["oracle_gain_pct"]
        out.append(
            f"BlockPilot's data: the per-prompt oracle is {pct(g, True)} above the best fixed block in tau, "
            "and without features a policy cannot tell prompts apart, so it can at best match the best fixed "
            "block: the headroom is out of reach of anything but a selector that sees the prompt."
        )
    cs = results.get("coldstart", {}).get("data")
    if cs and cs.get("status") == "ok" and cs["horizons"]["first_pass"]["crossing"] is None:
        out.append("With too little offline data the warm start does not pay off early: see section 5.")
    e2e = results.get("e2e", {}).get("data")
    if e2e and "methods" in e2e and e2e["methods"]["fixed"]["speedup"] < 1.0:
        few = f" (on {e2e['prompts']} prompts)" if e2e["prompts"] < 20 else ""
        out.append(
            f"End to end{few}, speculation at fixed B={e2e['fixed_block']} lost to plain decoding with drafter "
            f"`{e2e['drafter']}`: where the drafter's acceptance does not pay for a block, the right choice is "
            "B=1, and a policy can only gain by learning that."
        )
    return out


def _replay_limits(rep: dict[str, Any]) -> list[str]:
    """Section 1's: too little headroom, policies that do not reliably beat the best fixed block
    size, and the default policy's first pass."""
    out = []
    rows = rows_by_name(rep["stream"])
    room = rows["oracle"]["gain_pct"]["mean"]
    if room < SMALL_HEADROOM:
        out.append(
            f"On the trace set the per-request oracle is only {pct(room, True)} above the best fixed block: "
            "the requests' best block sizes barely differ, so no policy can gain much."
        )
    first = rows_by_name(rep["first_pass"])
    for name in (DEFAULT, BLOCKPILOT, BANDITSPEC, "linucb (cold)", "squarecb (cold)"):
        if name in rows and rows[name]["gain_pct"]["lo"] is not None and rows[name]["gain_pct"]["lo"] <= 0:
            if name == BANDITSPEC:
                why = "it is context-free: it can at best find the best fixed block, and pays for exploring"
            elif "(cold)" in name:
                why = (
                    f"it starts without offline data; over the first pass it is at "
                    f"{pct(first[name]['gain_pct']['mean'], True)} against the best fixed block"
                )
            else:
                why = "its per-request choices are not reliably better than one well-chosen block"
            out.append(
                f"`{name}` does not reliably beat the best fixed block on the trace set "
                f"({with_ci(rows[name]['gain_pct'])}): {why}."
            )
    fp = rows_by_name(rep["first_pass"]).get(DEFAULT)
    if (
        fp
        and fp["gain_pct"]["lo"] is not None
        and fp["gain_pct"]["lo"] <= 0 < rows[DEFAULT]["gain_pct"]["lo"]
    ):
        out.append(
            f"Over the first pass (each request seen once) the default policy does not reliably beat the "
            f"best fixed block ({with_ci(fp['gain_pct'])}): its gain comes from learning on repeated traffic."
        )
    return out


def _hardware_limits(hw: dict[str, Any]) -> list[str]:
    """The GPU profile's: batch sizes with too little headroom, or where the default policy does not
    reliably beat the best fixed block size."""
    out = []
    for b in hw["batches"]:
        g = b["all_requests"]["oracle_gain_pct"]
        if g < SMALL_HEADROOM:
            out.append(
                f"GPU profile, batch {b['batch_size']}: the oracle is only {pct(g, True)} above fixed "
                f"B={b['all_requests']['best_fixed']}: one block size is right for nearly every request."
            )
        r = rows_by_name(b["stream"]).get(DEFAULT)
        if r and r["gain_pct"]["lo"] is not None and r["gain_pct"]["lo"] <= 0:
            out.append(
                f"GPU profile, batch {b['batch_size']}: the default policy does not reliably beat fixed "
                f"B={b['all_requests']['best_fixed']} ({with_ci(r['gain_pct'])}; the oracle's margin there "
                f"is {pct(g, True)})."
            )
    return out
