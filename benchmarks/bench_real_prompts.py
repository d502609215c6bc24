"""Speed and acceptance on prompts nobody here wrote: GSM8K, MT-Bench, HumanEval.

One process, one prompt at a time, every variant on the same prompt before the next prompt
(so machine noise lands on all of them alike): plain greedy decoding (transformers' own loop),
every fixed block size in fast and in exact verification, ``AdaptiveController`` with the
default policy (learning online over the run), and the per-request oracle (for each prompt
the fastest fixed block size in fast mode, "no speculation" included, read off the same run).
Aggregate tokens/s (all tokens over all decode time, prefill excluded) are reported as
ratios to plain decoding measured in the same run. Fast mode's divergence from plain greedy
is counted per decode, with the logit gap at the first divergent token.

    python benchmarks/bench_real_prompts.py --per-benchmark 16 --threads 2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from adaptspec import AdaptiveController
from adaptspec.decoding.greedy import PlainGreedy, divergence
from adaptspec.models import load_speculator
from adaptspec.models.prompts import BENCHMARKS, benchmark_prompts
from adaptspec.schedules import parse_schedule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-benchmark", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--arms", default="1,2,3,4,8,16", help="block sizes timed in fast mode")
    ap.add_argument("--exact-arms", default="1,4", help="block sizes also timed in exact mode ('' for none)")
    ap.add_argument("--policy", default=None, help="controller policy (default: the product default)")
    ap.add_argument(
        "--rules",
        default="history",
        help="per-round schedules also timed in fast mode, ';'-separated ('' for none)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafter", type=Path, default=None, help="drafter directory (default: the bundled one)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "real_prompts.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    arms = [int(a) for a in args.arms.split(",")]
    exact_arms = [int(a) for a in args.exact_arms.split(",") if a.strip()]
    rules = [r.strip() for r in args.rules.split(";") if r.strip()]
    fast = load_speculator(drafter=args.drafter, verification="fast")
    exact = load_speculator(drafter=args.drafter, verification="exact") if exact_arms else None
    plain = PlainGreedy(fast.target)
    prompts = benchmark_prompts(per_benchmark=args.per_benchmark)
    n = args.max_new_tokens
    warm = fast.target.encode_chat("Warm-up.")
    plain(warm, 8)
    for spec in (fast, exact) if exact is not None else (fast,):
        for b in (1, max(arms)):
            spec.decode(spec.prefill(warm), b, 8)

    rows = []
    with AdaptiveController(fast, args.policy) as ctl:
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            ids = fast.target.encode_chat(p.prompt)
            ptoks, psec = plain(ids, n)
            row = {
                "domain": p.domain,
                "benchmark": _bench(p.domain),
                "plain": {"tokens": len(ptoks), "s": psec},
            }
            for mode, spec, bs in (("fast", fast, arms), ("exact", exact, exact_arms)):
                if spec is None:
                    continue
                pre = spec.prefill(ids)
                for b in bs:
                    o = spec.decode(pre, b, n)
                    rec = {
                        "tokens": o.new_tokens,
                        "s": o.decode_s,
                        "tau": o.mean_tau,
                        "rounds": len(o.rounds),
                        "draft_s": o.draft_s,
                        "verify_s": o.verify_s,
                    }
                    if mode == "fast" and o.tokens != ptoks:
                        d = divergence(plain.model, ids, o.tokens, ptoks)
                        rec["diverged_at"], rec["gap"] = (None, None) if d is None else d
                    row[f"{mode}:{b}"] = rec
                if mode == "fast":
                    for rule in rules:
                        o = spec.decode(pre, parse_schedule(rule, spec.max_block_size), n)
                        row[f"rule:{rule}"] = {"tokens": o.new_tokens, "s": o.decode_s, "tau": o.mean_tau}
            g = ctl.generate(ids, max_new_tokens=n)
            row["controller"] = {
                "tokens": g.outcome.new_tokens,
                "s": g.outcome.decode_s,
                "tau": g.outcome.mean_tau,
                "block_size": g.decision.block_size,
                "overhead_s": g.overhead_s,
                "machine_speed": ctl.sync().stats()["machine_speed"],
            }
            rows.append(row)
            print(
                f"[{i + 1}/{len(prompts)} {time.perf_counter() - t0:.0f}s] {p.domain:<22} plain {len(ptoks) / psec:5.1f} tok/s  "
                + "  ".join(f"B{b} {_speed(row[f'fast:{b}']) / _speed(row['plain']):.2f}x" for b in arms)
                + f"  ctl B{g.decision.block_size} {_speed(row['controller']) / _speed(row['plain']):.2f}x",
                flush=True,
            )
        ctl.sync()
    summary = summarise(rows, arms, exact_arms, rules)
    summary["machine_speed"] = ctl.stats()[
        "machine_speed"
    ]  # the controller's measured/profile time at the end
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "config": vars(args) | {"out": str(args.out), "drafter": str(args.drafter or "bundled")},
                "summary": summary,
                "rows": rows,
            },
            indent=1,
        )
    )
    print(markdown(summary, arms, exact_arms))
    for rule in rules:
        print(
            f"rule {rule}: "
            + ", ".join(
                f"{k} {v[f'rule:{rule}']['speedup']:.2f}x"
                for k, v in summary.items()
                if isinstance(v, dict) and f"rule:{rule}" in v
            )
        )


def _bench(domain: str) -> str:
    return next(b for b in BENCHMARKS if domain.startswith(b))


def _speed(r: dict) -> float:
    return r["tokens"] / r["s"]


def _agg(rows: list[dict], key) -> float:
    recs = [key(r) for r in rows]
    return sum(x["tokens"] for x in recs) / sum(x["s"] for x in recs)


def _modes(arms: list[int], exact_arms: list[int]) -> list[tuple[str, int]]:
    return [("fast", b) for b in arms] + [("exact", b) for b in exact_arms]


def summarise(rows: list[dict], arms: list[int], exact_arms: list[int], rules: list[str] = ()) -> dict:
    out: dict = {}
    groups = {b: [r for r in rows if r["benchmark"] == b] for b in BENCHMARKS} | {"all": rows}
    for name, rs in groups.items():
        if not rs:
            continue
        base = _agg(rs, lambda r: r["plain"])
        g = {"requests": len(rs), "plain_tok_s": base}
        for m, b in _modes(arms, exact_arms):
            k = f"{m}:{b}"
            g[k] = {
                "speedup": _agg(rs, lambda r: r[k]) / base,
                "tau": float(np.mean([r[k]["tau"] for r in rs])),
            }
        for rule in rules:
            g[f"rule:{rule}"] = {
                "speedup": _agg(rs, lambda r: r[f"rule:{rule}"]) / base,
                "tau": float(np.mean([r[f"rule:{rule}"]["tau"] for r in rs])),
            }
        g["controller"] = {
            "speedup": _agg(rs, lambda r: r["controller"]) / base,
            "block_sizes": sorted({r["controller"]["block_size"] for r in rs}),
        }
        g["oracle"] = {
            "speedup": _agg(
                rs, lambda r: min((r[f"fast:{b}"] for b in arms), key=lambda x: x["s"] / x["tokens"])
            )
            / base
        }
        out[name] = g
    fast_spec = [r[f"fast:{b}"] for r in rows for b in arms if b > 1]
    div = [x for x in fast_spec if "gap" in x]
    out["divergence"] = {
        "decodes": len(fast_spec),
        "diverged": len(div),
        "max_gap": max((x["gap"] for x in div if x["gap"] is not None), default=None),
    }
    plain_step = sum(r["plain"]["s"] for r in rows) / sum(r["plain"]["tokens"] - 1 for r in rows)
    out["round_cost"] = {"plain_step_ms": 1e3 * plain_step}
    for m, b in _modes(arms, exact_arms):
        k = f"{m}:{b}"
        cost = sum(r[k]["draft_s"] + r[k]["verify_s"] for r in rows) / sum(r[k]["rounds"] for r in rows)
        out["round_cost"][k] = {"ms": 1e3 * cost, "break_even_tau": cost / plain_step}
    ctl = [r["controller"] for r in rows]
    out["controller_overhead_pct"] = 100 * sum(c["overhead_s"] for c in ctl) / sum(c["s"] for c in ctl)
    return out


def markdown(s: dict, arms: list[int], exact_arms: list[int]) -> str:
    cols = [f"{m} B={b}" for m, b in _modes(arms, exact_arms)]
    head = "| prompts | plain tok/s | " + " | ".join(cols) + " | controller | per-request oracle |"
    lines = [head, "|" + "---|" * (len(cols) + 4)]
    for name in [*BENCHMARKS, "all"]:
        if name not in s:
            continue
        g = s[name]
        cells = [
            f"{g[f'{m}:{b}']['speedup']:.2f}x (tau {g[f'{m}:{b}']['tau']:.2f})"
            for m, b in _modes(arms, exact_arms)
        ]
        lines.append(
            f"| {name} ({g['requests']}) | {g['plain_tok_s']:.1f} | "
            + " | ".join(cells)
            + f" | {g['controller']['speedup']:.2f}x | {g['oracle']['speedup']:.2f}x |"
        )
    rc = s["round_cost"]
    lines += ["", f"plain step {rc['plain_step_ms']:.1f} ms; round cost (draft + verify) and break-even tau:"]
    lines += [
        f"- {k}: {v['ms']:.1f} ms, break-even tau {v['break_even_tau']:.2f}"
        for k, v in rc.items()
        if k != "plain_step_ms"
    ]
    d = s["divergence"]
    lines += [
        "",
        f"fast mode differs from plain greedy in {d['diverged']}/{d['decodes']} speculative decodes; "
        f"largest logit gap at a divergence {d['max_gap']}",
        f"controller overhead {s['controller_overhead_pct']:.3f}% of decode time"
        + (
            ""
            if s.get("machine_speed") is None
            else f"; its machine-speed factor at the end {s['machine_speed']:.2f}"
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
