"""A few vLLM configurations compared in many short paired runs at one client count.

``bench_vllm.py`` measures the issue's whole grid, a few repeats a configuration; this asks one
question with more repeats: is configuration X slower than configuration Y here, and where does its
CPU go? Every configuration's server (``bench_vllm.server_command``: the same names, ``plain``,
``kK``, ``floor``, ``plugin-kK``, ``adaptive``, ``KIND@TAG`` for a second server of one kind) is
up at once; each pair runs every configuration once on the same prompts, ``clients`` closed-loop
clients, ``--requests-per-client`` requests each, the order reversed from one pair to the next.
Per run: tokens/s, the CPU seconds of the server's three processes (vLLM's API server, its engine
core, which runs the scheduler and the plug-in and waits on the worker by spinning, and the worker,
which runs the model), per token, and for the plug-in's servers its counters (decisions and decode
steps by block size, its own seconds against the steps'). Summary: each configuration against the
first, per pair, geometric mean and 95% t-interval (``bench_load_sweep.paired_ratio``). Two servers
of one kind (``k2,k2@b``) give the spread an A/A comparison shows on this host: there two servers
of one configuration, each up for the whole run, differed by 6.6% [1.5, 12.0] at 1 client
(BENCHMARKS.md), so ``--instances N`` starts every server afresh N times, the pairs shared out
between the instances, and the interval over all pairs then holds what a server's instance adds.

    flock /work/bench.lock nice -n -20 python benchmarks/bench_vllm_paired.py --target OUT/target \\
      --drafter OUT/drafter --configs plain,floor --clients 4 --pairs 8 --out RESULT.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_load_sweep import paired_ratio  # noqa: E402
from bench_vllm import CHECKOUT, DEFAULT_VLLM_PYTHON, Server, closed_loop, host  # noqa: E402


def process_cpu(server: Server) -> dict[str, float]:
    """CPU seconds so far of the server's API process, its engine core (a child) and the worker (below)."""
    import psutil

    root, out = psutil.Process(server.proc.pid), {"api": 0.0, "core": 0.0, "worker": 0.0}
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            role = "api" if p.pid == root.pid else "core" if p.ppid() == root.pid else "worker"
            out[role] += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def one_run(server: Server, prompts: list[str], clients: int, requests: int, max_tokens: int) -> dict:
    cpu0, counters0 = process_cpu(server), server.counters()
    done, wall = closed_loop(server.url, prompts, clients, requests, max_tokens)
    cpu1, counters1 = process_cpu(server), server.counters()
    tokens = sum(r["tokens"] for r in done)
    counters = {
        k: v - counters0.get(k, 0.0)
        for k, v in counters1.items()
        if k != "cpu_s" and v - counters0.get(k, 0.0)
    }
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "cpu_ms_per_token": {k: 1000 * (cpu1[k] - cpu0[k]) / tokens for k in cpu1},
        "counters": counters,
        "texts": [r["text"] for r in done],
    }


def summarize(runs: dict[str, list[dict]], names: list[str], instances: int) -> dict:
    """Each configuration after the first against it: tokens/s per pair, geometric mean and 95%
    t-interval over the pairs; with several instances also ``by_instance``, the same over each
    instance's geometric mean (pairs on one instance share its servers, so that interval is the
    one that holds what an instance adds; each run's ``instance`` says which)."""
    base = [r["tokens_per_s"] for r in runs[names[0]]]
    out = {n: paired_ratio([r["tokens_per_s"] for r in runs[n]], base) for n in names[1:]}
    if instances > 1:
        order = [r["instance"] for r in runs[names[0]]]
        for s in out.values():
            logs = np.log(s["per_repeat"])
            per_instance = [
                float(np.exp(np.mean([x for x, j in zip(logs, order) if j == k]))) for k in range(instances)
            ]
            s["by_instance"] = paired_ratio(per_instance, [1.0] * instances)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--configs", required=True, help="bench_vllm configuration names, the first the baseline")
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument(
        "--instances",
        type=int,
        default=1,
        help="start every server afresh this many times, the pairs shared out between them",
    )
    ap.add_argument("--requests-per-client", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--max-num-seqs", type=int, default=8, help="vLLM's --max-num-seqs (bench_vllm: its largest level)"
    )
    ap.add_argument("--adaptive-max-k", type=int, default=8)
    ap.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON)
    ap.add_argument("--ld-preload", default=str(CHECKOUT / ".venv-vllm" / "lib" / "libiomp5.so"))
    ap.add_argument(
        "--plugin-entries",
        default="{}",
        help="settings of single plug-in configurations (JSON: configuration -> settings), as bench_vllm's, "
        'e.g. \'{"adaptive-bf16": {"latency": "cpu-smollm2-bf16"}}\'',
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    # what bench_vllm.server_command reads, at bench_vllm's defaults
    args.levels, args.table, args.plugin_entry = [args.max_num_seqs], "1-2:3,3-4:2,5-256:1", "{}"
    args.idle_drafter_skip, args.server_args, args.warm_spec, args.kv_cache_gib = True, "{}", None, 1
    from adaptspec.models.prompts import benchmark_prompts

    prompts = [p.prompt for p in benchmark_prompts()][1::2]  # the odd-numbered half, as bench_vllm's default
    names = args.configs.split(",")
    requests = args.clients * args.requests_per_client
    results: dict = {
        "settings": {k: str(v) for k, v in vars(args).items()},
        "host": host(),
        "runs": {n: [] for n in names},
    }
    t0 = time.time()
    if not 1 <= args.instances <= args.pairs:
        ap.error(f"--instances {args.instances}: give 1 to --pairs ({args.pairs})")
    for j in range(args.instances):
        with tempfile.TemporaryDirectory() as tmp:
            servers = {n: Server(n, args, Path(tmp)) for n in names}
            try:
                for s in servers.values():
                    s.wait_ready(600)
                for s in servers.values():  # first-call costs, unmeasured
                    closed_loop(s.url, prompts[-args.clients :], args.clients, args.clients, args.max_tokens)
                for i in range(j, args.pairs, args.instances):
                    start = (i * requests) % len(prompts)
                    these = prompts[start:] + prompts[:start]
                    for n in names if i % 2 == 0 else names[::-1]:
                        run = one_run(servers[n], these, args.clients, requests, args.max_tokens) | {
                            "pair": i,
                            "instance": j,
                        }
                        results["runs"][n].append(run)
                        print(
                            f"instance {j} pair {i} {n}: {run['tokens_per_s']:.1f} tok/s, CPU ms a token "
                            f"{ {k: round(v, 2) for k, v in run['cpu_ms_per_token'].items()} }",
                            flush=True,
                        )
            finally:
                for s in servers.values():
                    s.stop()
    base = names[0]
    results["summary"] = summarize(results["runs"], names, args.instances)
    results["identical_to_first"] = {
        n: sum(
            a == b
            for r, q in zip(results["runs"][n], results["runs"][base])
            for a, b in zip(r["texts"], q["texts"])
        )
        for n in names[1:]
    }
    for runs in results["runs"].values():
        for r in runs:
            r.pop("texts")
    results["wall_s"] = time.time() - t0
    results["host"]["load_average_at_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    for n, s in results["summary"].items():
        lo, hi = s["ci95"] or (None, None)
        inst = s.get("by_instance")
        over = f", over instances [{inst['ci95'][0]:.3f}, {inst['ci95'][1]:.3f}]" if inst else ""
        print(
            f"{n} / {base}: {s['geomean']:.3f} [{lo:.3f}, {hi:.3f}]{over}, identical responses "
            f"{results['identical_to_first'][n]} of {requests * args.pairs}"
        )


if __name__ == "__main__":
    main()
