"""Decoder costs on this machine: verify and draft time against block size, and tokens/s of
speculative against plain decoding of the same target, in one process.

    python benchmarks/bench_decoder.py                 # bundled target + bundled drafter
    python benchmarks/bench_decoder.py --untrained     # a fresh drafter: measures loop overhead
    python benchmarks/bench_decoder.py --json out.json --device cuda --dtype bfloat16

Verify time is measured after a context of ``--context`` tokens, with and without the
batch-invariant patch (the price of bit-exact losslessness). Speed is new tokens per second
of decoding (prefill excluded) on held-out prompts; plain decoding is block size 1 through
the same loop, and each block size is compared with it in the same run. A second baseline
is plain greedy decoding with transformers' own kernels and KV cache (no speculation, no
batch-invariant patch) on the same prompts: the fastest way to run the target alone.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time

import torch

from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
from adaptspec.decoding.greedy import plain_greedy
from adaptspec.models import BUNDLED_DRAFTER, load_target
from adaptspec.models.prompts import heldout_prompts


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_verify(
    target: TargetModel, context: int, block_sizes, repeats: int, device: str
) -> dict[int, float]:
    ids = torch.randint(100, 20000, (context,)).tolist()
    pre = target.prefill(ids)
    out = {}
    for b in block_sizes:
        times = []
        for _ in range(repeats):
            cache = copy.deepcopy(pre.cache)
            block = torch.randint(100, 20000, (b,), device=target.device)
            _sync(device)
            t = time.perf_counter()
            target.verify(block, cache)
            _sync(device)
            times.append(time.perf_counter() - t)
        out[b] = statistics.median(times) * 1000
    return out


def time_draft(
    drafter: BlockDiffusionDrafter, context: int, block_sizes, repeats: int, device: str
) -> dict[int, float]:
    ctx = torch.randn(context, drafter.context_width, device=device)
    state = drafter.new_state(ctx)
    drafter.draft_logits(state, 5, 2)  # project the context once, as decoding does
    out = {}
    for b in block_sizes:
        if b < 2:
            continue
        times = []
        for _ in range(repeats):
            _sync(device)
            t = time.perf_counter()
            drafter.draft_logits(state, 5, b)
            _sync(device)
            times.append(time.perf_counter() - t)
        out[b] = statistics.median(times) * 1000
    return out


def speed(decoder: SpeculativeDecoder, prompts, block_sizes, max_new: int, plain_model=None) -> dict:
    """Tokens/s of every block size on the same prefills, interleaved, and of ``plain_model``
    (transformers' greedy loop with standard kernels) on the same prompts; "hf" holds the latter
    and the share of prompts where its tokens equal the decoder's."""
    res = {b: {"tokens": 0, "seconds": 0.0, "taus": []} for b in block_sizes}
    hf = {"tokens": 0, "seconds": 0.0, "same": 0}
    for p in prompts:
        ids = decoder.target.encode_chat(p.prompt)
        pre = decoder.prefill(ids)
        ref = None
        for b in block_sizes:  # every block size on the same prefill, interleaved
            out = decoder.decode(pre, b, max_new)
            ref = ref or out.tokens
            assert out.tokens == ref, f"block size {b} changed the output"
            res[b]["tokens"] += out.new_tokens
            res[b]["seconds"] += out.decode_s
            res[b]["taus"].append(out.mean_tau)
        if plain_model is not None:
            toks, sec = plain_greedy(plain_model, ids, max_new, decoder.target.eos_token_ids)
            hf["tokens"] += len(toks)
            hf["seconds"] += sec
            hf["same"] += toks == ref
    plain = res[1]["tokens"] / res[1]["seconds"]
    out = {
        b: {
            "tokens_per_s": r["tokens"] / r["seconds"],
            "speedup": r["tokens"] / r["seconds"] / plain,
            "mean_tau": statistics.mean(r["taus"]),
        }
        for b, r in res.items()
    }
    if plain_model is not None:
        out["hf"] = {"tokens_per_s": hf["tokens"] / hf["seconds"], "same_output": hf["same"] / len(prompts)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", default=str(BUNDLED_DRAFTER))
    ap.add_argument("--untrained", action="store_true", help="a fresh random drafter (measures overhead)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument(
        "--prompts", type=int, default=10, help="held-out prompts for the speed test (spread over domains)"
    )
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sizes = [1, 2, 4, 8, 12, 16, 20, 24, 32]

    model, tok = load_target(None, dtype=args.dtype, device=args.device)
    standard = copy.deepcopy(model)
    fast = time_verify(
        TargetModel(standard, tok, verification="fast"), args.context, sizes, args.repeats, args.device
    )
    target = TargetModel(model, tok, verification="exact")
    exact = time_verify(target, args.context, sizes, args.repeats, args.device)
    if args.untrained:
        drafter = BlockDiffusionDrafter.for_target(model, num_layers=2, seed=0, max_block_size=32)
        drafter.to(dtype=getattr(torch, args.dtype))
    else:
        drafter = BlockDiffusionDrafter.from_pretrained(
            args.drafter, target=model, dtype=getattr(torch, args.dtype), device=args.device
        )
    draft = time_draft(drafter, args.context, sizes, args.repeats, args.device)
    decoder = SpeculativeDecoder(target, drafter)
    pool = heldout_prompts()
    domains = sorted({p.domain for p in pool})
    prompts = [
        p
        for i in range(args.prompts)
        for p in [[q for q in pool if q.domain == domains[i % len(domains)]][i // len(domains)]]
    ]
    spd = speed(decoder, prompts, [b for b in sizes if b <= drafter.max_block_size], args.max_new, standard)

    report = {
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}, {args.device}, {args.dtype}",
        "drafter": "untrained" if args.untrained else args.drafter,
        "verify_ms": exact,
        "verify_ms_standard_attention": fast,
        "draft_ms": draft,
        "speed": spd,
    }
    print(
        f"# {report['machine']}; drafter: {report['drafter']}; context {args.context}; max_new {args.max_new}"
    )
    print(
        "| B | verify ms (exact) | verify ms (standard) | draft ms | tokens/s | speedup vs B=1 | mean tau |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for b in sizes:
        s = spd.get(b, {})
        print(
            f"| {b} | {exact[b]:.1f} | {fast[b]:.1f} | {draft.get(b, 0):.1f} | {s.get('tokens_per_s', 0):.1f} | "
            f"{s.get('speedup', 0):.2f}x | {s.get('mean_tau', 0):.2f} |"
        )
    hf = spd["hf"]
    best = max((b for b in spd if b != "hf"), key=lambda b: spd[b]["tokens_per_s"])
    print(
        f"\nplain greedy with transformers' own kernels and cache: {hf['tokens_per_s']:.1f} tokens/s "
        f"(same tokens as the decoder on {hf['same_output']:.0%} of prompts); best block size {best}: "
        f"{spd[best]['tokens_per_s']:.1f} tokens/s = {spd[best]['tokens_per_s'] / hf['tokens_per_s']:.2f}x of it"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
