"""Draft trees against chains at batch 1 on this host: acceptance (tau) and tokens/s.

The bundled pair (``load_speculator``: SmolLM2-135M-Instruct and its drafter, bfloat16, fast
verification, the default), one process, one torch thread, one prompt at a time; every variant on
the same prompt before the next prompt, in an order rotated from prompt to prompt. Variants:
chains ``B`` (``B = 1`` is plain decoding: the model's own one-token step), fixed trees of ``N``
nodes (``FixedTree``), and CaDDTree's per-round rule priced by this host's measured curve
(``CostAwareTree.from_profile`` on :func:`adaptspec.host.for_models`' profile). Each request's
decode is timed in the process's CPU seconds (one thread: the request's own work, which other
programs on a shared host do not inflate) and in wall seconds; tokens/s = new tokens / decode
seconds. Ratios: aggregate tokens/s of a variant over another's, with a paired 95% bootstrap
interval over prompts. Every output is compared with plain decoding's (fast verification may
differ at near-ties: the first differing token and the plain step's logit gap there are recorded).

Before the requests, the passes themselves: CPU ms (the fastest of ``--repeats``) of a target
pass over a chain of ``b`` positions and over a tree of ``N`` nodes, of the drafter pass, and of
building a tree (top-k, the heap, the mask): what a round costs here, by part.

    flock /work/bench.lock nice -n -20 python benchmarks/bench_trees.py --prompts 24 --offset 346 \\
        --out benchmarks/results/trees-avx512.json
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 flock /work/bench.lock nice -n -20 \\
        python benchmarks/bench_trees.py ... --out benchmarks/results/trees-avx2.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from adaptspec.decoding.greedy import divergence
from adaptspec.decoding.tree import build_tree, top_candidates
from adaptspec.decoding.tree_budget import DEFAULT_DEPTH, CostAwareTree, FixedTree
from adaptspec.decoding.tree_verify import tree_inputs, verify_tree
from adaptspec.models import load_speculator
from adaptspec.models.prompts import benchmark_prompts


def parse_variant(v: str, args, profile):
    """``chain:B``, ``tree:N`` or ``auto:N`` (CaDDTree's rule up to N nodes, priced by the host)."""
    kind, n = v.split(":")
    if kind == "chain":
        return int(n)
    if kind == "tree":
        return FixedTree(int(n), args.top_k, args.depth)
    return CostAwareTree.from_profile(profile, max_nodes=int(n), top_k=args.top_k, depth=args.depth)


def cpu_ms(f, repeats: int) -> float:
    f()  # warm
    best = float("inf")
    for _ in range(repeats):
        c = time.process_time()
        f()
        best = min(best, time.process_time() - c)
    return 1000 * best


def time_passes(spec, ids: list[int], args) -> dict:
    """CPU ms of each part of a round at the context of ``ids`` (its prompt and 64 decoded tokens)."""
    t, d = spec.target, spec.drafter
    out = spec.generate(ids, 1, 64)
    ctx = list(ids) + out.tokens[:-1]
    pre = spec.prefill(ctx)
    cache0, state0 = pre.state.cache, pre.state.context_hidden
    n, last = len(ctx), out.tokens[-1]
    depth = args.depth or DEFAULT_DEPTH
    res: dict = {
        "context_tokens": n,
        "chain_verify_ms": {},
        "tree_verify_ms": {},
        "draft_ms": {},
        "build_ms": {},
    }
    for b in (1, 2, 3, 4, 6, 8, 16, 32, 64):
        block = torch.tensor([last] + out.tokens[: b - 1] if b > 1 else [last])
        res["chain_verify_ms"][b] = cpu_ms(lambda: t.verify(block, copy.deepcopy(cache0)), args.repeats)
    state = d.new_state(state0)
    d.draft_logits(state, last, 2)  # the context projected once, as decoding keeps it
    for b in (4, depth + 1):
        res["draft_ms"][b] = cpu_ms(lambda: d.draft_logits(state, last, b), args.repeats)
    scores = d.draft_logits(state, last, depth + 1).float()
    for nodes in (4, 8, 16, 32, 64):
        k = args.top_k or min(nodes, 16)

        def build():
            values, idx = top_candidates(torch.log_softmax(scores, -1), k)
            tree = build_tree(values, d.to_target_ids(idx), nodes)
            tree_inputs(tree, last, n, t.device)
            return tree

        res["build_ms"][nodes] = cpu_ms(build, args.repeats)
        tree = build()
        res["tree_verify_ms"][nodes] = cpu_ms(
            lambda: verify_tree(t, tree, last, n, copy.deepcopy(cache0)), args.repeats
        )
    base = res["chain_verify_ms"][1]
    res["verify_ratio_4_to_1"] = res["chain_verify_ms"][4] / base
    return res


def summarise(rows: list[dict], variants: list[str], base: str, n_boot: int = 2000, seed: int = 0) -> dict:
    """Per variant: tau (tokens per round over all rounds), tokens/s on CPU and wall time, and paired
    ratios of aggregate tokens/s to ``base`` with 95% bootstrap intervals over prompts."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(rows), size=(n_boot, len(rows)))
    out = {}
    for v in variants:
        tok = np.array([r[v]["tokens"] for r in rows], float)
        s = {"cpu": np.array([r[v]["cpu_s"] for r in rows]), "wall": np.array([r[v]["wall_s"] for r in rows])}
        tau = sum(r[v]["committed"] for r in rows) / sum(r[v]["rounds"] for r in rows)
        rec = {
            "tau": tau,
            "cpu_tok_s": tok.sum() / s["cpu"].sum(),
            "wall_tok_s": tok.sum() / s["wall"].sum(),
            "differs_from_plain": sum(r[v]["divergence"] is not None for r in rows),
        }
        for clock in ("cpu", "wall"):
            btok = np.array([r[base]["tokens"] for r in rows], float)
            bs = np.array([r[base][f"{clock}_s"] for r in rows])

            def ratio(i):
                return (tok[i].sum() / s[clock][i].sum()) / (btok[i].sum() / bs[i].sum())

            boot = np.array([ratio(i) for i in idx])
            rec[f"{clock}_ratio_to_{base}"] = [
                float(ratio(np.arange(len(rows)))),
                float(np.quantile(boot, 0.025)),
                float(np.quantile(boot, 0.975)),
            ]
        out[v] = rec
    return out


def paired(
    rows: list[dict], a: str, b: str, clock: str = "cpu", n_boot: int = 2000, seed: int = 1
) -> list[float]:
    """Aggregate tokens/s of ``a`` over ``b`` and its paired 95% bootstrap interval over prompts."""
    rng = np.random.default_rng(seed)
    ta, tb = (np.array([r[v]["tokens"] for r in rows], float) for v in (a, b))
    sa, sb = (np.array([r[v][f"{clock}_s"] for r in rows]) for v in (a, b))

    def ratio(i):
        return (ta[i].sum() / sa[i].sum()) / (tb[i].sum() / sb[i].sum())

    boot = np.array([ratio(i) for i in rng.integers(0, len(rows), size=(n_boot, len(rows)))])
    return [
        float(ratio(np.arange(len(rows)))),
        float(np.quantile(boot, 0.025)),
        float(np.quantile(boot, 0.975)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument(
        "--offset", type=int, default=346, help="first benchmark prompt (346 on: unseen by the head)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--chains", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--trees", default="4,8,16,32,64")
    ap.add_argument("--auto", default="64", help="CaDDTree's rule up to these node counts ('' for none)")
    ap.add_argument("--top-k", type=int, default=0, help="candidates per depth (0: min(nodes, 16))")
    ap.add_argument("--depth", type=int, default=None, help=f"tree depth (None: {DEFAULT_DEPTH})")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5, help="repeats of each pass timing")
    ap.add_argument("--no-passes", action="store_true", help="skip the pass timings")
    ap.add_argument(
        "--combine", type=Path, nargs="+", help="summarise these results' rows together (runs nothing)"
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.combine:
        return combine(args.combine, args.out)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    spec = load_speculator()
    from adaptspec.costs.latency import LatencyProfile
    from adaptspec.host import for_models

    host = for_models(None, None, "fast", args.threads, "bfloat16")
    profile = LatencyProfile.load(host.profile_path)
    print(host.summary(), flush=True)
    variants = (
        [f"chain:{b}" for b in args.chains.split(",") if b]
        + [f"tree:{n}" for n in args.trees.split(",") if n]
        + [f"auto:{n}" for n in args.auto.split(",") if n]
    )
    budgets = {v: parse_variant(v, args, profile) for v in variants}
    prompts = benchmark_prompts()[args.offset : args.offset + args.prompts]
    warm = spec.target.encode_chat("Warm-up.")
    for b in budgets.values():
        spec.decode(spec.prefill(warm), b, 8)
    passes = None if args.no_passes else time_passes(spec, spec.target.encode_chat(prompts[0].prompt), args)
    if passes:
        print("passes (CPU ms):", json.dumps(passes), flush=True)
    rows = []
    for i, p in enumerate(prompts):
        ids = spec.target.encode_chat(p.prompt)
        row: dict = {"domain": p.domain, "index": args.offset + i}
        order = variants[i % len(variants) :] + variants[: i % len(variants)]
        for v in order:
            pre = spec.prefill(ids)
            c0 = time.process_time()
            o = spec.decode(pre, budgets[v], args.max_new_tokens)
            cpu = time.process_time() - c0
            row[v] = {
                "tokens": o.new_tokens,
                "cpu_s": cpu,
                "wall_s": o.decode_s,
                "rounds": len(o.rounds),
                "committed": sum(r.tau for r in o.rounds),
                "verified": sum(r.block_size for r in o.rounds),
                "draft_s": o.draft_s,
                "verify_s": o.verify_s,
                "out": o.tokens,
            }
        plain = row["chain:1"]["out"]
        for v in variants:
            d = None if row[v]["out"] == plain else divergence(spec.target.model, ids, row[v]["out"], plain)
            row[v]["divergence"] = None if d is None else {"position": d[0], "gap": d[1]}
            del row[v]["out"]
        rows.append(row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".partial.json").write_text(
            json.dumps({"passes": passes, "rows": rows}, default=str)
        )
        base = row["chain:1"]["tokens"] / row["chain:1"]["cpu_s"]
        print(
            f"[{i + 1}/{len(prompts)} {time.perf_counter() - t0:.0f}s] {p.domain:<12} plain {base:5.1f} tok/s "
            + " ".join(
                f"{v} {row[v]['committed'] / row[v]['rounds']:.2f}/{row[v]['tokens'] / row[v]['cpu_s'] / base:.2f}x"
                for v in variants[1:]
            ),
            flush=True,
        )
    result = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "host": host.to_dict(),
        "host_summary": host.summary(),
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "env": {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")},
        "load_average_start": load0,
        "load_average_end": os.getloadavg(),
        "seconds": time.perf_counter() - t0,
        "passes": passes,
        "variants": variants,
        "rows": rows,
    }
    report(result, args.out)
    args.out.with_suffix(".partial.json").unlink(missing_ok=True)


def combine(paths: list[Path], out: Path) -> None:
    """One result from several runs' rows (the same variants; e.g. two halves of the prompts run
    in two locked runs): the first run's settings and passes, every run's rows, host and load."""
    runs = [json.loads(p.read_text()) for p in paths]
    variants = runs[0]["variants"]
    if any(r["variants"] != variants for r in runs):
        raise SystemExit("bench_trees --combine: the runs timed different variants")
    result = dict(
        runs[0],
        rows=[row for r in runs for row in r["rows"]],
        runs=[
            {
                k: r[k]
                for k in ("config", "load_average_start", "load_average_end", "seconds", "torch_capability")
            }
            for r in runs
        ],
        combined_from=[str(p) for p in paths],
    )
    report(result, out)


def report(result: dict, out: Path) -> None:
    """Summarise ``result``'s rows (per variant, and the best tree against the best chain), write it, print it."""
    rows, variants = result["rows"], result["variants"]
    summary = summarise(rows, variants, "chain:1")
    chains = [v for v in variants if v.startswith("chain:")]
    trees = [v for v in variants if not v.startswith("chain:")]
    best_chain = max(chains, key=lambda v: summary[v]["cpu_tok_s"])
    best_tree = max(trees, key=lambda v: summary[v]["cpu_tok_s"]) if trees else None
    verdict = {"prompts": len(rows), "best_chain": best_chain, "best_tree": best_tree}
    if best_tree:
        verdict["best_tree_over_best_chain_cpu"] = paired(rows, best_tree, best_chain, "cpu")
        verdict["best_tree_over_best_chain_wall"] = paired(rows, best_tree, best_chain, "wall")
        verdict["tau_best_tree"] = summary[best_tree]["tau"]
        verdict["tau_best_chain"] = summary[best_chain]["tau"]
        verdict["tau_highest_tree"] = max(summary[v]["tau"] for v in trees)
    result = dict(result, summary=summary, verdict=verdict)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    for v in variants:
        r = summary[v]
        print(
            f"{v:<10} tau {r['tau']:.3f}  cpu {r['cpu_tok_s']:5.1f} tok/s ({r['cpu_ratio_to_chain:1'][0]:.3f}x plain "
            f"[{r['cpu_ratio_to_chain:1'][1]:.3f}, {r['cpu_ratio_to_chain:1'][2]:.3f}])  wall {r['wall_tok_s']:5.1f} tok/s"
            f"  differs from plain: {r['differs_from_plain']}"
        )
    print(json.dumps(verdict))


if __name__ == "__main__":
    main()
