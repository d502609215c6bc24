"""Markdown for ``docs/evaluation.md`` and the README's headline table, rendered from results only.

Nothing here computes a figure: every number comes from the results dictionary (what
``results.json`` stores), so a section carried over from an earlier run renders exactly as it
did then, labelled with that run.
"""

from __future__ import annotations

import json
from typing import Any

from .._util.markdown import ci, num, table
from ..reward.functions import REWARD_NAMES, REWARD_UNITS, pct_of
from . import findings as F

TITLES = {
    "replay": "1. Replay on the trace set",
    "hardware": "2. Same acceptance, other hardware",
    "blockpilot": "3. Real published acceptance: BlockPilot",
    "drift": "4. Drift",
    "coldstart": "5. Cold start",
    "e2e": "6. End to end on the real decoder",
    "rounds": "7. Per-round schedules",
    "load": "8. Under load",
    "full_info": "9. Full information",
}
SECTIONS = tuple(TITLES)


def bullets(lines: list[str]) -> str:
    return "\n".join(f"- {x}" for x in lines) if lines else "- (nothing to report)"


def provenance_text(p: dict[str, Any]) -> str:
    src = json.dumps(p.get("source"), sort_keys=True)
    out = (
        f"`{p.get('path') or '(in memory)'}`: {p['requests']} requests, block sizes {p['arms']}, domains "
        f"{', '.join(f'{k} {v}' for k, v in p['domains'].items())}; features: {p['features'] or 'none'}; "
        f"timings: {'yes' if p['timings'] else 'no'}; target `{p.get('target')}`, drafter `{p.get('drafter')}`, "
        f"hardware `{p.get('hardware')}`; meta.json source: `{src}`; fingerprint `{p['fingerprint']}`."
    )
    return out


def synthetic_warning(p: dict[str, Any]) -> str:
    if not p.get("synthetic"):
        return ""
    return (
        "> **Warning: this trace set is SYNTHETIC** (meta.json source kind "
        f"`{p.get('source_kind')}`). Its figures describe the simulator's model of the decoder, not the real "
        "decoder. Re-run the command once the real trace set is bundled.\n"
    )


# ============================================================================ sections
def _policy_table(rows: list[dict], reward: str, first: list[dict] | None = None) -> str:
    unit = REWARD_UNITS[reward]
    fp = F.rows_by_name(first or [])
    head = [
        "policy",
        "feedback",
        f"mean reward ({unit})",
        "mean tau",
        "aggregate tok/s",
        "% of oracle",
        "gain over best fixed, %",
    ]
    if first:
        head += ["first pass: % of oracle", "first pass: gain, %"]
    out = []
    for r in rows:
        if r["kind"] == "fixed":
            continue
        line = [
            f"`{r['policy']}`",
            r.get("feedback", "-"),
            ci(r["mean_reward"], 2),
            num(r["mean_tau"]["mean"]),
            num(r["throughput"]["mean"], 1),
            ci(r["pct_oracle"]),
            ci(r["gain_pct"], sign=True),
        ]
        if first:
            f = fp.get(r["policy"])
            line += [ci(f["pct_oracle"]) if f else "-", ci(f["gain_pct"], sign=True) if f else "-"]
        out.append(line)
    return table(head, out)


def _fixed_table(rows: list[dict]) -> str:
    out = [
        [
            r["policy"].split(":")[1],
            num(r["mean_reward"]["mean"]),
            num(r["mean_tau"]["mean"]),
            num(r["throughput"]["mean"], 1),
            num(r["pct_oracle"]["mean"], 1),
            num(r["gain_pct"]["mean"], 1),
        ]
        for r in rows
        if r["kind"] == "fixed"
    ]
    return table(
        ["B", "mean reward", "mean tau", "aggregate tok/s", "% of oracle", "gain over best fixed, %"], out
    )


def render_replay(d: dict[str, Any], figs: list[str]) -> str:
    reward = d["reward"] + ("" if d["latency"] is None else f" (modelled on `{d['latency']}`: no timings)")
    parts = [
        f"Reward: {reward}. {d['splits']} training/evaluation splits (stratified by domain, "
        f"{d['n_train']} / {d['n_eval']} requests) x {d['orders']} stream orders = {d['runs']} runs. The heads are "
        f"trained on each split's training part only; the stream is {d['passes']} shuffled passes over the evaluation "
        f"part ({d['steps']} requests). Contexts: {d['contexts']}. Best fixed block = the best single B in hindsight "
        'on the same stream. Brackets: 95% t-intervals over runs. "First pass": the first '
        f'{d["n_eval"]} requests of the stream, each evaluation request once. "feedback": what a policy '
        "learns after each request, as the controller feeds it (full: every block size its rounds show, "
        "priced as the controller prices them; bandit: the block size that ran; none: it does not learn).",
        "",
        _policy_table(d["stream"], d["reward"], d["first_pass"]),
        "",
        "Every fixed block size (mean over runs):",
        "",
        _fixed_table(d["stream"]),
    ]
    if d.get("notes"):
        parts += ["", "Policies: " + "; ".join(f"`{k}`: {v}" for k, v in d["notes"].items()) + "."]
    if d.get("domains"):
        labels = [lbl for lbl in d["domains"][0]["gain_pct"]]
        head = ["domain", "share", "own best B"] + [f"`{lbl}`" for lbl in labels]
        rows = [
            [x["domain"], num(100 * x["share"], 0) + "%", x["best_fixed_in_domain"]]
            + [num(x["gain_pct"][lbl]["mean"], 1) for lbl in labels]
            for x in d["domains"]
        ]
        parts += [
            "",
            f"Per domain: % gain over the stream's best fixed block B={d['best_fixed']} on that domain's "
            'requests (mean over runs). "own best B": the domain\'s best fixed block.',
            "",
            table(head, rows),
        ]
    parts += [""] + [f"![replay]({f})" for f in figs]
    parts += ["", bullets(F.replay_findings(d))]
    return "\n".join(parts)


def render_hardware(d: dict[str, Any], figs: list[str]) -> str:
    b0 = d["batches"][0]
    settings = [("trace set's own costs", d["reference"])] + [
        (f"`{d['profile']}`, batch {b['batch_size']}", b["all_requests"]) for b in d["batches"]
    ]
    arms = b0["arms"]
    rows = []
    for name, prof in settings:
        best = max(prof["mean_reward"].values())
        rows.append(
            [name, prof["best_fixed"], num(prof["oracle_gain_pct"], 1)]
            + [num(float(pct_of(prof["mean_reward"][str(a)], best)), 0) for a in arms]
        )
    parts = [
        f"The trace set's acceptance (tau of every request at every B) re-timed with the `{d['profile']}` latency "
        "profile (a roofline of published H100 and Qwen3-8B figures, see docs/simulator.md) at each batch size: "
        "reward = modelled throughput. The acceptance stays the trace set's; only the cost of drafting and verifying "
        f"changes. Same protocol as section 1 ({b0['runs']} runs; heads trained on each split with the modelled "
        "reward of that batch size).",
        "",
        "Mean throughput of each fixed B, as % of the best fixed B, and the per-request oracle's margin over it "
        "(all requests):",
        "",
        table(["setting", "best fixed B", "oracle gain, %"] + [f"B={a}" for a in arms], rows),
        "",
        "Gain over the best fixed block on the evaluation streams, % (95% CI):",
        "",
    ]
    names = [r["policy"] for r in b0["stream"] if r["kind"] != "fixed" and r["policy"] != "best fixed"]
    rows = []
    for n in names:
        line = [f"`{n}`"]
        for b in d["batches"]:
            r = F.rows_by_name(b["stream"]).get(n)
            line.append(ci(r["gain_pct"], sign=True) if r else "-")
        rows.append(line)
    parts.append(table(["policy"] + [f"batch {b['batch_size']}" for b in d["batches"]], rows))
    parts += [""] + [f"![hardware]({f})" for f in figs]
    parts += ["", bullets(F.hardware_findings(d))]
    return "\n".join(parts)


def render_blockpilot(d: dict[str, Any], figs: list[str]) -> str:
    if d.get("status") != "ok":
        why = d.get("reason", "not run")
        return (
            f"Not run: {why}. This section needs a BlockPilot per-prompt result folder (`{{B}}.json` files of "
            "per-prompt mean tau, from the BlockPilot release, github AMAP-ML/BlockPilot, `utils/gsm8k_0T0.0`); "
            "it is not bundled. Run:\n\n"
            "```\npython benchmarks/evaluate.py --force --blockpilot PATH/TO/gsm8k_0T0.0\n```\n\n"
            "(any folder `adaptspec import-blockpilot` reads works, including a folder of such folders)."
        )
    parts = [
        f"Imported with `adaptspec import-blockpilot` from `{d['path']}`: {d['requests']} prompts, block sizes "
        f"{d['arms']}. **There are no features in this data** (only per-prompt mean tau at each block size), so "
        "contextual policies cannot run; there are no latencies either, so the data is paid in tau and in throughput "
        f"modelled on the GPU profile. Stream: {d['steps']} requests ({d['steps'] // d['requests']} shuffled passes), "
        f"{d['runs']} orders.",
    ]
    for rw in d["rewards"]:
        name = "tau" if rw["latency"] is None else f"throughput modelled on `{rw['latency']}`"
        parts += [
            "",
            f"Reward: {name}.",
            "",
            _policy_table(rw["policies"], rw["reward"]),
            "",
            "Fixed block sizes:",
            "",
            _fixed_table(rw["policies"]),
        ]
    if d.get("notes"):
        parts += ["", "Policies: " + "; ".join(f"`{k}`: {v}" for k, v in d["notes"].items()) + "."]
    parts += [""] + [f"![blockpilot]({f})" for f in figs]
    parts += ["", bullets(F.blockpilot_findings(d))]
    return "\n".join(parts)


def render_drift(d: dict[str, Any], figs: list[str]) -> str:
    s0 = d["streams"][0]
    parts = [
        "Each stream has two phases of equal length: first only the domains whose best fixed block is largest, then "
        "only the others (the switch is abrupt). Heads are trained beforehand on a separate split with the full mix. "
        f"Columns: % of the per-request oracle before the switch, in the first {s0['window']} requests after it, in "
        f"the last {s0['window']} of the stream; recovery = requests after the switch until a window of "
        f"{s0['window']} requests first earns {100 * s0['recovery_level']:.0f}% of what the new phase's best fixed "
        "block earns on the same requests (0: never fell below; never: not within the phase), per run.",
    ]
    for s in d["streams"]:
        rows = [
            [
                f"`{r['policy']}`",
                num(r["before"], 1),
                num(r["first_window"], 1),
                num(r["last_window"], 1),
                ", ".join("never" if x is None else str(x) for x in r["recovery"]),
            ]
            for r in s["policies"]
        ]
        parts += [
            "",
            f"**{s['label']}**: phase A = {', '.join(s['phase_a'])}; phase B = {', '.join(s['phase_b'])} "
            f"({s['phase_steps']} requests each, drawn from {s['pool_a']} and {s['pool_b']} evaluation "
            f"requests; heads trained on {s['n_train']}; {s['runs']} runs; contexts: {s['contexts']}).",
            "",
            table(
                ["policy", "before, %", "first window after, %", "last window, %", "recovery (requests)"],
                rows,
            ),
        ]
        if s["traces"].get("synthetic") and s["label"] == "trace set":
            parts += ["", "(This trace set is synthetic: see the warning at the top.)"]
    parts += [""] + [f"![drift]({f})" for f in figs]
    parts += ["", bullets(F.drift_findings(d))]
    return "\n".join(parts)


def render_coldstart(d: dict[str, Any], figs: list[str]) -> str:
    if d.get("status") != "ok":
        why = {
            "no-features": "the trace set has no features, so there is no head to warm-start from",
            "too-small": "the training split is too small to train a head",
        }.get(d.get("status"), d.get("status"))
        return f"Not computed: {why}."
    parts = [
        f"Heads trained on random subsets of the training split ({d['n_train']} requests; {d['repeats']} subsets "
        f"per size, each scored on its own stream order) and used to warm-start the default policy; the evaluation "
        f"stream is {d['steps']} requests over {d['n_eval']} evaluation requests. Cold bandits run on the same "
        f"streams. Contexts: {d['contexts']}. Values: % of the per-request oracle, mean [95% CI].",
    ]
    for key, title in (
        ("first_pass", "First pass (each evaluation request once)"),
        ("stream", "Whole stream"),
    ):
        h = d["horizons"][key]
        warm = h["warm"]
        labels = list(warm)
        rows = [[s] + [ci(warm[lbl][i]["pct_oracle"]) for lbl in labels] for i, s in enumerate(d["sizes"])]
        cold = ", ".join(f"`{c['policy']}` {ci(c['pct_oracle'])}" for c in h["cold"])
        parts += [
            "",
            f"**{title}.** Without offline data: {cold}.",
            "",
            table(["offline requests"] + [f"`{lbl}`" for lbl in labels], rows),
        ]
    parts += [""] + [f"![cold start]({f})" for f in figs]
    parts += ["", bullets(F.coldstart_findings(d))]
    return "\n".join(parts)


def render_e2e(d: dict[str, Any] | None, figs: list[str]) -> str:
    if not d:
        return (
            "Not run yet. It is expensive (the real decoder, every prompt three times), so it has its own flag:\n\n"
            "```\npython benchmarks/evaluate.py --force --e2e 50              # 50 held-out prompts\n"
            "python benchmarks/evaluate.py --force --e2e 3 --e2e-max-new-tokens 32 --sections e2e   # a quick check\n```"
        )
    parts = [
        f"Target {d['target']}, drafter `{d['drafter']}`, {d['machine']}; temperature 0, up to {d['max_new_tokens']} "
        f"new tokens per prompt; {d['prompts']} {d['prompt_selection']}. Policy: {d['policy_description']}. "
        "Tokens/s = new tokens / decode seconds, prefill excluded; the three methods take turns first per prompt.",
        "",
        table(
            ["method", "B", "tokens/s", "speedup", "mean tau", "new tokens", "decode s"],
            _e2e_method_rows(d),
            "lllrrrr",
        ),
        "",
        _e2e_overhead(d),
        "",
        table(
            [
                "request",
                "domain",
                "prompt tokens",
                "plain tok/s",
                f"fixed B={d['fixed_block']} tok/s",
                "controller B",
                "controller tok/s",
                "controller tau",
                "identical",
            ],
            _e2e_request_rows(d),
            "llrrrrrrl",
        ),
        "",
        bullets(F.e2e_findings(d)),
    ]
    return "\n".join(parts)


def _e2e_method_rows(d: dict[str, Any]) -> list[list[Any]]:
    """Plain decoding, the best fixed block size and the controller: speed, tau and output."""
    m = d["methods"]
    plain = f"plain decoding ({d['plain']})" if d.get("plain") else "plain decoding"
    return [
        [
            plain,
            1,
            num(m["plain"]["tokens_per_s"], 2),
            "1.00x",
            num(m["plain"]["mean_tau"]),
            m["plain"]["new_tokens"],
            num(m["plain"]["decode_s"], 1),
        ],
        [
            f"best fixed ({d['fixed_how']})",
            d["fixed_block"],
            num(m["fixed"]["tokens_per_s"], 2),
            f"{m['fixed']['speedup']:.2f}x",
            num(m["fixed"]["mean_tau"]),
            m["fixed"]["new_tokens"],
            num(m["fixed"]["decode_s"], 1),
        ],
        [
            f"AdaptiveController, `{d['policy']}` learning online",
            "chosen per request",
            num(m["controller"]["tokens_per_s"], 2),
            f"{m['controller']['speedup']:.2f}x",
            num(m["controller"]["mean_tau"]),
            m["controller"]["new_tokens"],
            num(m["controller"]["decode_s"], 1),
        ],
    ]


def _e2e_request_rows(d: dict[str, Any]) -> list[list[Any]]:
    """Each prompt's speed under the three methods, and whether their outputs are identical."""
    return [
        [
            r["request_id"],
            r["domain"],
            r["prompt_tokens"],
            num(r["plain"]["new_tokens"] / r["plain"]["decode_s"], 1),
            num(r["fixed"]["new_tokens"] / r["fixed"]["decode_s"], 1),
            r["controller"]["block_size"],
            num(r["controller"]["new_tokens"] / r["controller"]["decode_s"], 1),
            num(r["controller"]["mean_tau"]),
            ("yes*" if r.get("plain_kernels_differ") else "yes") if r["identical"] else "**no**",
        ]
        for r in d["rows"]
    ]


def _e2e_overhead(d: dict[str, Any]) -> str:
    """The controller's overhead per request, its updates, fallbacks and the identical outputs."""
    c = d["controller"]
    return (
        f"Controller overhead (featurize + decide + reward + log + enqueue, per request): mean "
        f"{c['overhead_ms_mean']:.2f} ms, max {c['overhead_ms_max']:.2f} ms = {num(c['overhead_pct_of_decode'], 2)}% of "
        f"decode time; tokens/s counting it: {num(c['tokens_per_s_with_overhead'], 2)}. Policy updates (background "
        f"thread): {c['updates']} updates, {c['update_mean_ms']:.3f} ms each"
        + (
            ""
            if c.get("machine_speed") is None
            else f", rewards calibrated to the `{d.get('speed_reference')}` profile (machine-speed factor at the end "
            f"{c['machine_speed']:.2f})"
        )
        + f". Fallback decisions: {c['fallbacks']}. "
        f"Identical outputs across the three methods: {d['identical_outputs']} of {d['prompts']} prompts"
        + (
            " (yes*: the speculative outputs equal the target's own greedy output under the decoder's batch-invariant "
            "kernels; transformers' standard bfloat16 kernels round differently and drifted on that prompt)."
            if any(r.get("plain_kernels_differ") for r in d["rows"])
            else "."
        )
    )


def _render_rounds(d: dict[str, Any] | None, figs: list[str]) -> str:
    from .rounds import render_rounds

    return render_rounds(d, figs)


def _render_load(d: dict[str, Any] | None, figs: list[str]) -> str:
    from .under_load import render_load

    return render_load(d, figs)


def _render_full_info(d: dict[str, Any] | None, figs: list[str]) -> str:
    from .full_info import render_full_info

    return render_full_info(d, figs)


RENDER = {
    "replay": render_replay,
    "hardware": render_hardware,
    "blockpilot": render_blockpilot,
    "drift": render_drift,
    "coldstart": render_coldstart,
    "e2e": render_e2e,
    "rounds": _render_rounds,
    "load": _render_load,
    "full_info": _render_full_info,
}


# ============================================================================ documents
def headline_rows(d: dict[str, Any]) -> list[list[str]]:
    rows = F.rows_by_name(d["stream"])
    order = [
        "best fixed",
        F.BANDITSPEC,
        F.BLOCKPILOT,
        F.DEFAULT,
        "linucb (cold)",
        "squarecb (cold)",
        "oracle",
    ]
    out = []
    for n in order:
        if n in rows:
            r = rows[n]
            name = (
                f"best fixed block (B={d['best_fixed']})"
                if n == "best fixed"
                else ("per-request oracle" if n == "oracle" else f"`{n}`")
            )
            out.append([name, ci(r["pct_oracle"]), ci(r["gain_pct"], sign=True), num(r["mean_tau"]["mean"])])
    return out


def render_headline(results: dict[str, Any], report_link: str) -> str:
    sec = results["sections"].get("replay")
    if not sec:
        return "<!-- generated by `python benchmarks/evaluate.py`; section 1 has not been run -->\n"
    d = sec["data"]
    p = d["traces"]
    unit = REWARD_NAMES[d["reward"]]
    lines = [
        f"<!-- generated by `python benchmarks/evaluate.py` (run {sec['run']}); do not edit by hand -->",
        table(
            ["policy", "% of per-request oracle", "gain over best fixed B, %", "mean tau"], headline_rows(d)
        ),
        "",
        f"Replay of {p['requests']} requests ({', '.join(p['domains'])}) from `{p.get('target')}` + "
        f"`{p.get('drafter')}` on `{p.get('hardware')}`, reward {unit}; {d['runs']} runs ({d['splits']} train/eval "
        f"splits x {d['orders']} stream orders), 95% intervals in brackets; heads trained on a split disjoint from "
        f"the evaluation stream. Full report: [{report_link}]({report_link}); regenerate with "
        "`python benchmarks/evaluate.py --force` (or `adaptspec evaluate --force`).",
    ]
    if p.get("synthetic"):
        lines += [
            "",
            "**These figures come from the synthetic placeholder trace set, not the real decoder.**",
        ]
    return "\n".join(lines) + "\n"


def _in_distribution_note(current: dict[str, Any]) -> list[str]:
    """A trace set of template prompts measures the drafter's training distribution: say so."""
    if "benchmark" in str(current.get("path", "")) or "benchmark" in str(current.get("source", "")):
        return []
    return [
        "**In-distribution figures.** Unless the trace set above is the public benchmark prompts' "
        "(`adaptspec/data/traces/benchmarks`, the bundled default), its prompts come from the same "
        "templates as a drafter's training prompts (the bundled template set: the previous drafter's, collected "
        "with it): these figures describe that training distribution, "
        "not prompts nobody here wrote. "
        "The headline on the public benchmark prompts (GSM8K, MT-Bench, HumanEval) is in "
        "[BENCHMARKS.md](../BENCHMARKS.md#decoding-and-the-bundled-pair).",
        "",
    ]


def render_report(results: dict[str, Any], current: dict[str, Any], headline_link: str) -> str:
    """The whole ``docs/evaluation.md``."""
    runs = results["runs"]
    secs = results["sections"]
    out = [
        *_header(current),
        *_provenance(runs, secs, current),
        "",
        "## Headline",
        "",
        *_headline(secs, headline_link),
        *_sections(secs, current),
        *_what_the_numbers_say(secs),
    ]
    return "\n".join(out).rstrip() + "\n"


def _header(current: dict[str, Any]) -> list[str]:
    """The title, the commands that regenerate the file and the trace set under evaluation."""
    return [
        "# Evaluation",
        "",
        "<!-- generated by `python benchmarks/evaluate.py` (= `adaptspec evaluate`); do not edit by hand -->",
        "",
        "Every figure in this file is recomputed from data in the repository by one command:",
        "",
        "```",
        "python benchmarks/evaluate.py --force                 # sections 1-5, 7, 8 and 9 (replay; minutes)",
        "python benchmarks/evaluate.py --force --blockpilot DIR        # + section 3 on a BlockPilot result folder",
        "python benchmarks/evaluate.py --force --e2e 50                # + section 6 on the real decoder (slow)",
        "```",
        "",
        "(`--force`: replace this file and its figures; only files a run wrote are ever replaced.)",
        "",
        f"**Trace set under evaluation:** {provenance_text(current)}",
        "",
        *(_in_distribution_note(current)),
        synthetic_warning(current),
        "## Which run produced which section",
        "",
        "A run regenerates the sections it was asked for and keeps the others from the run that last produced "
        "them (stored in `evaluation/results.json`).",
        "",
    ]


def _provenance(runs: dict[str, Any], secs: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Which run produced which section, and each run's command, commit, machine and settings."""
    rows = []
    for key in SECTIONS:
        s = secs.get(key)
        if not s:
            rows.append([TITLES[key], "never run", "-", "-", "-"])
            continue
        r = runs.get(s["run"], {})
        stale = (
            ""
            if s.get("trace_fingerprint") in (None, current["fingerprint"])
            else " **(computed on another trace set)**"
        )
        rows.append(
            [
                TITLES[key],
                f"`{s['run']}`",
                r.get("finished", "-"),
                f"{s['seconds']:.0f} s",
                f"`{s.get('trace_fingerprint') or '-'}`{stale}",
            ]
        )
    out = [table(["section", "run", "finished (UTC)", "time", "trace set"], rows, "lllrl"), ""]
    used = sorted({s["run"] for s in secs.values() if s}, reverse=True)
    for rid in used:
        r = runs[rid]
        sets = ", ".join(f"{k}={v}" for k, v in r["settings"].items())
        out.append(
            f"- Run `{rid}`: `{r['command']}`; git {r['git']}; {r['machine']}; settings: {sets}; "
            f"{r['seconds']:.0f} s in all."
        )
    return out


def _headline(secs: dict[str, Any], headline_link: str) -> list[str]:
    """Section 1's stream table, the same as the README's."""
    if secs.get("replay"):
        return [
            table(
                ["policy", "% of per-request oracle", "gain over best fixed B, %", "mean tau"],
                headline_rows(secs["replay"]["data"]),
            ),
            "",
            f"(Section 1, stream over all passes; the same table is in [{headline_link}]({headline_link}) for the "
            "README.)",
            "",
        ]
    return ["Section 1 has not been run.", ""]


def _sections(secs: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Every section's text, each marked when computed on another trace set."""
    out = []
    for key in SECTIONS:
        out += [f"## {TITLES[key]}", ""]
        s = secs.get(key)
        if s and s.get("trace_fingerprint") not in (None, current["fingerprint"]):
            out += [
                f"> Computed in run `{s['run']}` on a different trace set (fingerprint "
                f"`{s['trace_fingerprint']}`); regenerate it.",
                "",
            ]
        out += [
            RENDER[key](s["data"] if s else None, s.get("figures", []) if s else [])
            if (s or key == "e2e")
            else "Not run yet.",
            "",
        ]
    return out


def _what_the_numbers_say(secs: dict[str, Any]) -> list[str]:
    """The summary generated from the sections' numbers, and where adaptation does not help."""
    return [
        f"## {len(SECTIONS) + 1}. What the numbers say",
        "",
        "Generated from the numbers above (comparison words follow the 95% intervals); each section's own "
        "list has the details.",
        "",
        "**In short:**",
        "",
        bullets(summary_lines(secs)),
        "",
        "**Where adaptation does not help, and why:**",
        "",
        bullets(F.where_it_does_not_help({k: v for k, v in secs.items() if v})),
        "",
    ]


def _full_info_findings(d: dict[str, Any]) -> list[str]:
    from .full_info import full_info_findings

    return full_info_findings(d) if d.get("status") == "ok" else []


def _load_findings(d: dict[str, Any]) -> list[str]:
    from .under_load import load_findings

    return load_findings(d) if d.get("status") == "ok" else []


def summary_lines(secs: dict[str, Any]) -> list[str]:
    """The key sentence(s) of each section that has results."""
    out: list[str] = []
    pick = {
        "replay": (F.replay_findings, lambda xs: xs[:1] + [x for x in xs if F.DEFAULT in x][:1]),
        "hardware": (F.hardware_findings, lambda xs: xs[:2]),
        "blockpilot": (F.blockpilot_findings, lambda xs: xs[1:2]),
        "drift": (
            F.drift_findings,
            lambda xs: [
                x
                for x in xs
                if "best fixed block from" in x or "does not move" in x or "did not recover" in x
            ],
        ),
        "coldstart": (F.coldstart_findings, lambda xs: xs[:1]),
        "e2e": (F.e2e_findings, lambda xs: xs[:2]),
        "load": (_load_findings, lambda xs: [x for x in xs if "learned (warm)" in x]),
        "full_info": (_full_info_findings, lambda xs: xs),
    }
    for key, (fn, sel) in pick.items():
        s = secs.get(key)
        if s:
            out += [f"{TITLES[key].split('. ', 1)[1]}: {x}" for x in sel(fn(s["data"]))]
    return out
