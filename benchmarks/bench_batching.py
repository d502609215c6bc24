"""Continuous batching against one thread per request, at 1..16 concurrent requests.

For each load level ``c`` a closed loop keeps ``c`` requests in flight (a new one starts as
soon as one ends) over the same public benchmark prompts (GSM8K, MT-Bench, HumanEval, chat
template, bundled pair, fast verification, greedy):

- ``threads``: today's path, as the server runs it: ``c`` threads, each running
  ``SpeculativeDecoder`` prefill + plain decoding (B = 1) for one request at a time;
- ``batched B=b``: one :class:`~adaptspec.batching.BatchEngine` with ``max_rows = c``, every
  request at fixed block size ``b`` (``b = 1``: batched plain decoding).

Reported per level and variant: aggregate tokens/s (all new tokens over the level's wall
time, prefill included), tokens per CPU-second of the process (with one intra-op thread this
does not count time the process waited for a shared machine's cores), per-request latency p50/p95 and time to first token p50/p95
(from the moment the request starts), the drafter's share of round time, and how many
requests' tokens differ from batch-1 plain greedy (the threads' output: fast verification
can differ where logits tie within rounding). One run, every variant on the same prompts.

    nice -n 19 python benchmarks/bench_batching.py --levels 1,2,4,8,16 --requests 2 --blocks 1,2,4,8
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from adaptspec.batching import BatchEngine
from adaptspec.batching.engine import DEFAULT_CHUNK_TOKENS
from adaptspec.models import load_speculator
from adaptspec.models.prompts import benchmark_prompts

RESULTS = Path(__file__).resolve().parent / "results"


def run_threads(spec, prompts: list[list[int]], concurrency: int, max_new: int, threads: int) -> dict:
    """One thread per request, ``concurrency`` at a time (the server's path)."""
    out: list = [None] * len(prompts)
    lock = threading.Lock()
    nxt = [0]

    def worker():
        torch.set_num_threads(threads)  # per OS thread: a new thread starts with the default (all cores)
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(prompts):
                return
            t0 = time.perf_counter()
            pre = spec.prefill(prompts[i])
            t1 = time.perf_counter()
            res = spec.decode(pre, 1, max_new)
            out[i] = (res.tokens, t1 - t0, time.perf_counter() - t0)

    start, cpu = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(concurrency) as ex:
        for f in [ex.submit(worker) for _ in range(concurrency)]:
            f.result()
    wall = time.perf_counter() - start
    return _summary(
        [o[0] for o in out], [o[1] for o in out], [o[2] for o in out], wall, time.process_time() - cpu
    )


def run_engine(
    spec,
    prompts: list[list[int]],
    concurrency: int,
    block: int,
    max_new: int,
    chunk_tokens: int | None = DEFAULT_CHUNK_TOKENS,
) -> dict:
    """A closed loop of ``concurrency`` requests over one engine (joining prompts ``chunk_tokens`` a pass)."""
    engine = BatchEngine(spec.target, spec.drafter, max_rows=concurrency, chunk_tokens=chunk_tokens)
    queue, handles = list(prompts), []
    start, cpu = time.perf_counter(), time.process_time()
    while queue or engine.busy:
        while queue and len(engine.rows) + engine.joining + len(engine.waiting) < concurrency:
            handles.append(engine.submit(queue.pop(0), block_size=block, max_new_tokens=max_new))
        engine.step()
    wall = time.perf_counter() - start
    draft = sum(r.draft_s for r in engine.history)
    rounds = sum(r.round_s for r in engine.history)
    s = _summary(
        [h.result().tokens for h in handles],
        [h.first_token_at - h.submitted_at for h in handles],
        [h.finished_at - h.submitted_at for h in handles],
        wall,
        time.process_time() - cpu,
    )
    s.update(
        draft_share=draft / max(rounds, 1e-9),
        rounds=len(engine.history),
        mean_tau=float(np.mean([r.tau for h in handles for r in h.rounds])) if handles else float("nan"),
    )
    return s


def _summary(tokens, ttft, latency, wall, cpu) -> dict:
    n = sum(len(t) for t in tokens)
    return dict(
        tokens=n,
        wall_s=wall,
        tok_s=n / wall,
        cpu_s=cpu,
        tok_per_cpu_s=n / cpu,
        latency_p50=float(np.percentile(latency, 50)),
        latency_p95=float(np.percentile(latency, 95)),
        ttft_p50=float(np.percentile(ttft, 50)),
        ttft_p95=float(np.percentile(ttft, 95)),
        outputs=tokens,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,2,4,8,16", help="concurrent requests")
    ap.add_argument(
        "--requests", type=int, default=4, help="requests per level, in units of the level (K = r x c)"
    )
    ap.add_argument("--blocks", default="1,2,3,4,8", help="fixed block sizes of the batched engine")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument(
        "--joins",
        default="",
        help="also batched plain decoding with these prompt budgets a pass (e.g. none,16,64; none: each "
        "prompt prefilled alone while the rows wait), in their own table",
    )
    ap.add_argument("--out", default=str(RESULTS / "batching.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    levels = [int(x) for x in args.levels.split(",")]
    blocks = [int(x) for x in args.blocks.split(",")]
    joins = [j for j in args.joins.split(",") if j]
    spec = load_speculator(verification="fast")
    need = max(levels) * args.requests
    pool = [spec.target.encode_chat(p.prompt) for p in benchmark_prompts()[:need]]
    spec.generate(pool[0], 1, 4)  # warm-up
    results = []
    for c in levels:
        prompts = pool[: c * args.requests]
        rows = {"threads": run_threads(spec, prompts, c, args.max_new_tokens, args.threads)}
        for b in blocks:
            rows[f"B={b}"] = run_engine(spec, prompts, c, b, args.max_new_tokens)
        for j in joins:
            rows[f"joins={j}"] = run_engine(
                spec, prompts, c, 1, args.max_new_tokens, None if j == "none" else int(j)
            )
        plain = rows["threads"].pop("outputs")
        for name, r in rows.items():
            outs = r.pop("outputs", None)
            if outs is not None:
                r["differ_from_plain"] = sum(o != p for o, p in zip(outs, plain))
            print(
                f"c={c:2d} {name:8s} {r['tok_s']:7.1f} tok/s  {r['tok_per_cpu_s']:7.1f} tok/cpu-s  p50 {r['latency_p50']:6.2f} s  "
                f"p95 {r['latency_p95']:6.2f} s  ttft {r['ttft_p50']:5.2f} s  "
                f"draft {r.get('draft_share', 0):.0%}  differ {r.get('differ_from_plain', 0)}",
                flush=True,
            )
        results.append(dict(concurrency=c, requests=len(prompts), variants=rows))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    meta = dict(
        levels=levels,
        blocks=blocks,
        joins=joins,
        requests_per_level=args.requests,
        max_new_tokens=args.max_new_tokens,
        threads=args.threads,
        torch=torch.__version__,
        verification="fast",
        dtype="bfloat16",
        chunk_tokens=DEFAULT_CHUNK_TOKENS,
    )
    Path(args.out).write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    text = table(results, blocks) + (joins_table(results, joins) if joins else "")
    Path(args.out).with_suffix(".md").write_text(text)
    print(text)


def joins_table(results: list[dict], joins: list[str]) -> str:
    """Markdown: batched plain decoding by prompt budget (tok/s, ratio to joins alone, TTFT p50)."""
    lines = [
        "",
        "Batched plain decoding by the prompt tokens a pass carries (none: each prompt prefilled alone):",
        "",
        "| concurrent | " + " | ".join(f"joins={j} tok/s (TTFT p50 s)" for j in joins) + " |",
        "|" + "---:|" * (len(joins) + 1),
    ]
    for res in results:
        v = res["variants"]
        base = v["joins=none"]["tok_s"] if "none" in joins else None
        cells = [
            f"{v[f'joins={j}']['tok_s']:.1f}"
            + (f" ({v[f'joins={j}']['tok_s'] / base:.2f}x)" if base else "")
            + f" ({v[f'joins={j}']['ttft_p50']:.2f})"
            for j in joins
        ]
        lines.append(f"| {res['concurrency']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table(results: list[dict], blocks: list[int]) -> str:
    """Markdown: tok/s per variant (ratio to threads), the best fixed block and its ratio to batched plain."""
    head = (
        "| concurrent | threads (B=1) | "
        + " | ".join(f"batched B={b}" for b in blocks)
        + " | best B (vs batched plain) |"
    )
    lines = [head, "|" + "---:|" * (len(blocks) + 3)]
    for res in results:
        v = res["variants"]
        base = v["threads"]["tok_s"]
        cells = [f"{v[f'B={b}']['tok_s']:.1f} ({v[f'B={b}']['tok_s'] / base:.2f}x)" for b in blocks]
        best = max(blocks, key=lambda b: v[f"B={b}"]["tok_s"])
        ratio = v[f"B={best}"]["tok_s"] / v["B=1"]["tok_s"] if "B=1" in v else float("nan")
        lines.append(
            f"| {res['concurrency']} | {base:.1f} | " + " | ".join(cells) + f" | {best} ({ratio:.2f}x) |"
        )
    lines += [
        "",
        "Tokens per CPU-second of the process (robust to other load on a shared machine):",
        "",
        "| concurrent | threads (B=1) | " + " | ".join(f"batched B={b}" for b in blocks) + " |",
        "|" + "---:|" * (len(blocks) + 2),
    ]
    for res in results:
        v = res["variants"]
        base = v["threads"]["tok_per_cpu_s"]
        lines.append(
            f"| {res['concurrency']} | {base:.1f} | "
            + " | ".join(
                f"{v[f'B={b}']['tok_per_cpu_s']:.1f} ({v[f'B={b}']['tok_per_cpu_s'] / base:.2f}x)"
                for b in blocks
            )
            + " |"
        )
    lines += [
        "",
        "| concurrent | variant | latency p50 / p95 (s) | TTFT p50 / p95 (s) | draft share | differ from plain |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for res in results:
        for name, r in res["variants"].items():
            lines.append(
                f"| {res['concurrency']} | {name} | {r['latency_p50']:.2f} / {r['latency_p95']:.2f} | "
                f"{r['ttft_p50']:.2f} / {r['ttft_p95']:.2f} | {r.get('draft_share', 0):.0%} | "
                f"{r.get('differ_from_plain', 0)}/{res['requests']} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
