"""The bundled speculator's figures: tau and speedup for every block size, per domain.

Reads trace sets collected with ``adaptspec collect`` (every block size run on every
prompt in the same process, B = 1 being plain decoding through the same loop) and prints
markdown tables:

- per domain and overall: mean tau and speedup over B = 1 for each block size;
- the best fixed block size per domain, and how often each block size is a prompt's best;
- the per-prompt oracle's gain over the best fixed block size.

    python benchmarks/bench_bundled.py TRACES_T0 [TRACES_T1 ...] [--json out.json]
    python benchmarks/bench_bundled.py adaptspec/data/traces/benchmarks --group benchmark

Speedup is tokens per second of decoding (prefill excluded): the sum of new tokens over the
sum of decode seconds of the prompts of a domain, divided by the same at B = 1. The
per-request oracle's speedup is the same aggregate with each prompt at its fastest block size.
``--group benchmark`` pools the domains by the part before ``/`` (the eight MT-Bench
categories become ``mt-bench``).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import numpy as np

from adaptspec.traces import TraceSet


def summarise(ts: TraceSet, group: str = "domain") -> dict:
    arms = list(ts.arms)
    if 1 not in arms:
        raise SystemExit(f"{ts}: needs block size 1 (plain decoding) as the baseline")
    tau = ts.tau_matrix()
    tokens = ts.new_tokens_matrix().astype(float)
    secs = ts.decode_s_matrix()
    rate = tokens / secs  # per prompt tokens/s
    base = arms.index(1)
    out: dict = {
        "arms": arms,
        "meta": {k: ts.meta.get(k) for k in ("temperature", "max_new_tokens", "hardware", "source")},
    }
    labels = ts.domains if group == "domain" else np.array([d.split("/")[0] for d in ts.domains])
    domains = ["all"] + sorted(set(labels.tolist()))
    for d in domains:
        rows = np.ones(len(ts), bool) if d == "all" else labels == d
        speed = tokens[rows].sum(0) / secs[rows].sum(0)
        # each prompt at its fastest block size; every block size makes the same tokens at T = 0
        oracle = tokens[rows, base].sum() / secs[rows].min(1).sum()
        best_prompt = rate[rows].argmax(1)
        fixed = rate[rows].mean(0)
        out[d] = {
            "prompts": int(rows.sum()),
            "tau": tau[rows].mean(0).round(3).tolist(),
            "speedup": (speed / speed[base]).round(3).tolist(),
            "oracle_speedup": round(float(oracle / speed[base]), 3),
            "best_fixed": arms[int(np.argmax(speed))],
            "best_per_prompt": {arms[k]: int(v) for k, v in sorted(Counter(best_prompt.tolist()).items())},
            "oracle_gain_pct": float(100 * (rate[rows].max(1).mean() / fixed.max() - 1)),
        }
    return out


def print_tables(s: dict, label: str) -> None:
    arms = s["arms"]
    doms = [k for k in s if k not in ("arms", "meta")]
    print(
        f"\n### {label} (temperature {s['meta']['temperature']}, {s['meta']['max_new_tokens']} new tokens)\n"
    )
    for key, name in (("tau", "mean tau"), ("speedup", "speedup over B=1")):
        oracle = key == "speedup"
        print(f"{name} | " + " | ".join(f"B={b}" for b in arms) + (" | per-request oracle" if oracle else ""))
        print("---|" + "|".join("---:" for _ in arms) + ("|---:" if oracle else ""))
        for d in doms:
            vals = s[d][key]
            fmt = (lambda v: f"{v:.2f}") if key == "tau" else (lambda v: f"{v:.2f}x")
            extra = f" | {s[d]['oracle_speedup']:.2f}x" if oracle else ""
            print(f"{d} ({s[d]['prompts']}) | " + " | ".join(fmt(v) for v in vals) + extra)
        print()
    print("domain | best fixed B | prompts whose best B is ... | per-prompt oracle vs best fixed")
    print("---|---:|---|---:")
    for d in doms:
        hist = ", ".join(f"{b}: {n}" for b, n in s[d]["best_per_prompt"].items())
        print(f"{d} | {s[d]['best_fixed']} | {hist} | +{s[d]['oracle_gain_pct']:.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--group",
        choices=("domain", "benchmark"),
        default="domain",
        help="rows per domain, or per benchmark (the part of the domain before '/')",
    )
    args = ap.parse_args()
    res = {}
    for path in args.traces:
        s = summarise(TraceSet.read(path), args.group)
        res[path] = s
        print_tables(s, path)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
