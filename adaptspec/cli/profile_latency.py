"""``adaptspec profile-latency``: measure draft and verify times on this machine and fit a profile.

Runs the real decoder on a few held-out prompts at several block sizes, records every
round's draft and verify seconds with its context length, fits the monotone latency model
of :mod:`adaptspec.reward.latency` and writes it as JSON (usable anywhere a profile name is:
``adaptspec simulate --latency FILE``).
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from ._types import block_sizes, device, int_range, threads


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int_range(1), default=6, help="held-out prompts to decode (spread over domains)")
    p.add_argument("--arms", type=block_sizes, default=[1, 2, 4, 8, 12, 16, 24, 32])
    p.add_argument("--max-new-tokens", type=int_range(1), default=64)
    p.add_argument("--name", default="cpu-measured")
    p.add_argument("--out", type=Path, default=None, help="profile JSON (default: <cache>/latency/NAME.json); replaces only a latency profile")
    p.add_argument("--target", default=None, help="target model directory (default: bundled SmolLM2)")
    p.add_argument("--drafter", default=None, help="drafter directory: adaptspec's own or a published DFlash v1 one")
    p.add_argument("--verification", choices=["fast", "exact"], default="fast",
                   help="fast: the model's own kernels, plain speed at B=1 (default); exact: bit-identical to one-token greedy, slower")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", type=device, default="cpu", help="cpu, cuda, cuda:N or mps (checked before the model loads)")
    p.add_argument("--threads", type=threads, default=None)
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from ..errors import AdaptspecError
    from ..reward.latency import fit_profile
    from ..models import load_speculator
    from ..decoding.loading import cache_dir
    from ..models.prompts import heldout_prompts

    from .._util.outputs import check_output, write_file

    out = args.out or cache_dir() / "latency" / f"{args.name}.json"
    check_output(out, "latency-profile", replace=True)
    pool = heldout_prompts()
    domains = sorted({p.domain for p in pool})
    most = len(domains) * min(sum(p.domain == d for p in pool) for d in domains)
    if args.prompts > most:
        raise AdaptspecError(f"--prompts {args.prompts}: there are {most} held-out prompts to take in turn by domain")
    spec = load_speculator(args.target, args.drafter, dtype=args.dtype, device=args.device, threads=args.threads,
                           verification=args.verification)
    bad = [a for a in args.arms if not 1 <= a <= spec.max_block_size]
    if bad:
        raise AdaptspecError(f"--arms {bad} outside 1..{spec.max_block_size}")
    picked = [[p for p in pool if p.domain == domains[i % len(domains)]][i // len(domains)] for i in range(args.prompts)]
    rounds = []
    for p in tqdm(picked, desc="profile", unit="prompt"):
        ids = spec.target.encode_chat(p.prompt)
        pre = spec.prefill(ids)
        for b in args.arms:
            outcome = spec.decode(pre, b, args.max_new_tokens)
            ctx = len(ids) + 1
            for r in outcome.rounds:
                rounds.append({"block_size": r.block_size, "draft_s": r.draft_s, "verify_s": r.verify_s, "context_tokens": ctx})
                ctx += r.tau
    machine = f"{platform.machine()}, {args.device}, {args.dtype}, {torch.get_num_threads()} threads"
    profile = fit_profile(rounds, args.name, source=f"adaptspec profile-latency: {len(rounds)} rounds on {machine}")
    write_file(out, "latency-profile", True, profile.save)
    ctx = profile.context_tokens
    rows = [{"block_size": b, "draft_ms": float(profile.draft_s(b, ctx)) * 1e3, "verify_ms": float(profile.verify_s(b, ctx)) * 1e3}
            for b in args.arms]
    if args.json:
        print(json.dumps({"profile": str(out), "context_tokens": ctx, "rounds": len(rounds), "fit": rows}))
    else:
        print(f"fitted to {len(rounds)} rounds at a median context of {ctx} tokens; wrote {out}")
        print(f"{'B':>4} {'draft ms':>9} {'verify ms':>10}")
        for r in rows:
            print(f"{r['block_size']:>4} {r['draft_ms']:>9.1f} {r['verify_ms']:>10.1f}")
    return 0
