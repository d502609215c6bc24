"""The embedded default on the host it runs on, against plain decoding and fixed block sizes.

One process, one prompt at a time, every variant on the same prompt before the next prompt, in
an order rotated from prompt to prompt (so a busy spell of a shared host lands on all of them
alike): plain greedy decoding of the target alone (transformers' own loop), the default as
``adaptspec demo`` runs it (the host measured and chosen by :mod:`adaptspec.host`: the dtype, the
bundled head re-priced by this host's curve, counterfactuals priced on it; learning online over
the run), the previous default (the bundled head as shipped, priced on the developers' host,
bfloat16), and fixed block sizes. Prompts: the public benchmark prompts (GSM8K, MT-Bench,
HumanEval in turn) from ``--offset`` on, past the demo's ten. Aggregate tokens/s (all tokens over
all decode time) as ratios to plain decoding in the same run, with a 95% bootstrap interval over
prompts (paired: each resample takes a prompt's every variant).

    python benchmarks/bench_host_default.py --prompts 24 --threads 2 --out benchmarks/results/host-default.json
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/bench_host_default.py ...
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from adaptspec import AdaptiveController
from adaptspec.control.policy_build import default_policy_spec
from adaptspec.decoding.greedy import PlainGreedy
from adaptspec.host import for_models
from adaptspec.models import load_speculator
from adaptspec.models.prompts import benchmark_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument(
        "--offset", type=int, default=400, help="first benchmark prompt (the demo takes the first ten)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--fixed", default="2,4", help="fixed block sizes also timed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--remeasure", action="store_true")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time each request (prefill and decode, every variant alike) in the process's CPU seconds: "
        "with --threads 1 the request's own work, robust to other programs on a shared host",
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    host = for_models(None, None, "fast", torch.get_num_threads(), None, args.remeasure)
    print(host.summary(), f"({time.perf_counter() - t0:.1f} s)", flush=True)
    spec = load_speculator(dtype=host.dtype)
    old = spec if host.dtype == "bfloat16" else load_speculator(dtype="bfloat16")
    fixed = [int(b) for b in args.fixed.split(",") if b.strip()]
    plain = PlainGreedy(spec.target)
    n = args.max_new_tokens
    warm = spec.target.encode_chat("Warm-up.")
    for s in {id(spec): spec, id(old): old}.values():
        PlainGreedy(s.target)(warm, 8)
        for b in (1, *fixed, s.max_block_size):
            s.decode(s.prefill(warm), b, 8)
    prompts = benchmark_prompts()[args.offset : args.offset + args.prompts]
    rows = []
    # the product default as `adaptspec demo` builds it (policy None: default_on_host, priced by this host's record)
    new_ctl = AdaptiveController(spec, latency=str(host.profile_path))
    print(f"default: {new_ctl.policy_choice}", flush=True)
    old_ctl = AdaptiveController(
        old, default_policy_spec(speculator=old)
    )  # the previous default: the shipped head
    # as shipped (policy=None is now the host-priced one), bfloat16
    variants = ["plain", "default", "previous", *[f"fixed:{b}" for b in fixed]]
    with new_ctl, old_ctl:
        for i, p in enumerate(prompts):
            ids = spec.target.encode_chat(p.prompt)
            row: dict = {"domain": p.domain}
            order = variants[i % len(variants) :] + variants[: i % len(variants)]
            for v in order:
                c0 = time.process_time()
                if v == "plain":
                    toks, s = plain(ids, n)
                    row[v] = {"tokens": len(toks), "s": s}
                elif v in ("default", "previous"):
                    g = (new_ctl if v == "default" else old_ctl).generate(ids, max_new_tokens=n)
                    row[v] = {
                        "tokens": g.outcome.new_tokens,
                        "s": g.outcome.decode_s,
                        "tau": g.outcome.mean_tau,
                        "block_size": g.decision.block_size,
                    }
                else:
                    o = spec.decode(spec.prefill(ids), int(v.split(":")[1]), n)
                    row[v] = {"tokens": o.new_tokens, "s": o.decode_s, "tau": o.mean_tau}
                row[v]["cpu_s"] = time.process_time() - c0
                if args.cpu_time:
                    row[v]["wall_s"], row[v]["s"] = row[v]["s"], row[v]["cpu_s"]
            rows.append(row)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.with_suffix(".partial.json").write_text(
                json.dumps({"summary": host.summary(), "rows": rows}, default=str)
            )
            base = row["plain"]["tokens"] / row["plain"]["s"]
            print(
                f"[{i + 1}/{len(prompts)} {time.perf_counter() - t0:.0f}s] {p.domain:<20} plain {base:5.1f} tok/s  "
                + "  ".join(
                    f"{v} {row[v]['tokens'] / row[v]['s'] / base:.2f}x"
                    + (f" B{row[v]['block_size']}" if "block_size" in row[v] else "")
                    for v in variants[1:]
                ),
                flush=True,
            )
        new_ctl.sync()
        old_ctl.sync()
        speeds = {"default": new_ctl.stats()["machine_speed"], "previous": old_ctl.stats()["machine_speed"]}
    summary = summarise(rows, variants)
    out = {
        "host": host.to_dict(),
        "summary": host.summary(),
        "config": {k: str(v) for k, v in vars(args).items()},
        "ratios_to_plain": summary,
        "machine_speed": speeds,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))
    for v, r in summary.items():
        print(
            f"{v:<10} {r['ratio']:.3f}x plain [{r['lo']:.3f}, {r['hi']:.3f}]"
            + (f"  block sizes {r['block_sizes']}" if r.get("block_sizes") else "")
        )


def summarise(rows: list[dict], variants: list[str], n_boot: int = 2000, seed: int = 0) -> dict:
    """Each variant's aggregate tok/s over plain's, with a paired 95% bootstrap interval over prompts."""
    rng = np.random.default_rng(seed)
    tok = {v: np.array([r[v]["tokens"] for r in rows], dtype=float) for v in variants}
    sec = {v: np.array([r[v]["s"] for r in rows], dtype=float) for v in variants}
    idx = rng.integers(0, len(rows), size=(n_boot, len(rows)))
    out = {}
    for v in variants[1:]:

        def ratio(i):
            return (tok[v][i].sum() / sec[v][i].sum()) / (tok["plain"][i].sum() / sec["plain"][i].sum())

        boot = np.array([ratio(i) for i in idx])
        out[v] = {
            "ratio": float(ratio(np.arange(len(rows)))),
            "lo": float(np.quantile(boot, 0.025)),
            "hi": float(np.quantile(boot, 0.975)),
        }
        sizes = [r[v].get("block_size") for r in rows if "block_size" in r[v]]
        if sizes:
            out[v]["block_sizes"] = {str(b): sizes.count(b) for b in sorted(set(sizes))}
    return out


if __name__ == "__main__":
    main()
