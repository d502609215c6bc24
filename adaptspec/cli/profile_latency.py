"""``adaptspec profile-latency``: measure draft and verify times on this machine and fit a profile.

Runs the real decoder on a few held-out prompts at several block sizes, records every
round's draft and verify seconds with its context length, fits the monotone latency model
of :mod:`adaptspec.latency` and writes it as JSON (usable anywhere a profile name is:
``adaptspec simulate --latency FILE``).
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from .collect import _arms


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=6, help="held-out prompts to decode (spread over domains)")
    p.add_argument("--arms", type=_arms, default=[1, 2, 4, 8, 12, 16, 24, 32])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--name", default="cpu-measured")
    p.add_argument("--out", type=Path, default=None, help="profile JSON (default: <cache>/latency/NAME.json)")
    p.add_argument("--target", default=None, help="target model directory (default: bundled SmolLM2)")
    p.add_argument("--drafter", default=None, help="drafter directory: adaptspec's own or a published DFlash v1 one")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from ..errors import AdaptspecError
    from ..latency import fit_profile
    from ..models import load_speculator
    from ..models.loading import cache_dir
    from ..models.prompts import heldout_prompts

    spec = load_speculator(args.target, args.drafter, dtype=args.dtype, device=args.device, threads=args.threads)
    bad = [a for a in args.arms if not 1 <= a <= spec.max_block_size]
    if bad:
        raise AdaptspecError(f"--arms {bad} outside 1..{spec.max_block_size}")
    pool = heldout_prompts()
    domains = sorted({p.domain for p in pool})
    picked = [[p for p in pool if p.domain == domains[i % len(domains)]][i // len(domains)] for i in range(args.prompts)]
    rounds = []
    for p in tqdm(picked, desc="profile", unit="prompt"):
        ids = spec.target.encode_chat(p.prompt)
        pre = spec.prefill(ids)
        for b in args.arms:
            out = spec.decode(pre, b, args.max_new_tokens)
            ctx = len(ids) + 1
            for r in out.rounds:
                rounds.append({"block_size": r.block_size, "draft_s": r.draft_s, "verify_s": r.verify_s, "context_tokens": ctx})
                ctx += r.tau
    machine = f"{platform.machine()}, {args.device}, {args.dtype}, {torch.get_num_threads()} threads"
    profile = fit_profile(rounds, args.name, source=f"adaptspec profile-latency: {len(rounds)} rounds on {machine}")
    out = args.out or cache_dir() / "latency" / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(out)
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
