"""``adaptspec collect``: run the real decoder at every candidate block size to build a trace set."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import AdaptspecError


def _arms(text: str) -> list[int]:
    try:
        arms = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--arms takes comma-separated block sizes, got {text!r}") from None
    if not arms:
        raise argparse.ArgumentTypeError("--arms is empty")
    return arms


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=Path, default=None,
                   help="JSONL with 'prompt' and optional 'domain' (default: the held-out prompts minus the demo's)")
    p.add_argument("--arms", type=_arms, default=[1, 2, 4, 6, 8, 12, 16], help="comma-separated block sizes")
    p.add_argument("--out", type=Path, required=True, help="trace set directory to write")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="only N prompts, taking the domains in turn")
    p.add_argument("--target", default=None, help="target model directory (default: bundled SmolLM2)")
    p.add_argument("--drafter", default=None, help="drafter directory: adaptspec's own or a published DFlash v1 one (default: the bundled drafter)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--part", default=None, metavar="I/N",
                   help="collect only prompts I, I+N, ... (run N processes, then once without --part to write OUT)")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..collection import collect_traces
    from ..models import load_speculator
    from ..models.prompts import read_prompts, trace_prompts

    if args.max_new_tokens < 1:
        raise AdaptspecError("--max-new-tokens must be >= 1")
    numbered = list(enumerate(read_prompts(args.prompts))) if args.prompts else trace_prompts()
    if args.limit:
        by: dict[str, list] = {}
        for item in numbered:
            by.setdefault(item[1].domain, []).append(item)
        turns = [by[d][i] for i in range(max(map(len, by.values()))) for d in sorted(by) if i < len(by[d])]
        numbered = sorted(turns[: args.limit])
    spec = load_speculator(args.target, args.drafter, dtype=args.dtype, device=args.device, threads=args.threads)
    bad = [a for a in args.arms if not 1 <= a <= spec.max_block_size]
    if bad:
        raise AdaptspecError(f"--arms {bad} outside 1..{spec.max_block_size}")
    triples = [(f"{p.domain}-{i:04d}", p.domain, spec.target.encode_chat(p.prompt)) for i, p in numbered]
    part = None
    if args.part:
        try:
            i, n = (int(x) for x in args.part.split("/"))
        except ValueError:
            raise AdaptspecError(f"--part takes I/N, e.g. 0/2, got {args.part!r}") from None
        part = (i, n)
    traces = collect_traces(
        spec, triples, args.arms, args.out, args.max_new_tokens, args.temperature, args.seed, overwrite=args.force, part=part,
        meta={"target": args.target or "smollm2-135m-instruct", "drafter": args.drafter or "bundled",
              "dtype": args.dtype, "device": args.device, "features": spec.target.feature_spec,
              "threads": torch.get_num_threads()},
    )
    if traces is None:
        print(f"part {args.part} done; run again without --part to write {args.out}")
    else:
        print(f"wrote {args.out}: {len(traces)} requests x {len(args.arms)} block sizes")
    return 0
