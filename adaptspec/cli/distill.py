"""``adaptspec distill``: grow a drafter's distillation corpus (token ids), resumable.

Runs until the corpus holds ``--tokens`` response tokens; stop it at any time and run the
same command again to continue (every shard is written atomically). ``--info`` prints what
the corpus holds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, help="corpus directory (created, or continued if it exists)")
    p.add_argument(
        "--tokens",
        type=_positive,
        default=3_000_000,
        help="stop when the corpus holds this many response tokens",
    )
    p.add_argument("--target", default=None, help="target model directory (default: the bundled SmolLM2)")
    p.add_argument("--max-new-tokens", type=_positive, default=256)
    p.add_argument("--max-prompt-tokens", type=_positive, default=384)
    p.add_argument("--batch-size", type=_positive, default=32)
    p.add_argument("--threads", type=_positive, default=1, help="CPU threads of this worker")
    p.add_argument("--worker", type=int, default=0, help="this worker's index (0..workers-1)")
    p.add_argument("--workers", type=_positive, default=1, help="processes sharing the corpus by shard index")
    p.add_argument("--info", action="store_true", help="print what the corpus holds and exit")


def run(args: argparse.Namespace) -> int:
    from ..errors import AdaptspecError
    from ..models import corpus as corpus_mod

    if not 0 <= args.worker < args.workers:
        raise AdaptspecError(f"--worker {args.worker} outside 0..{args.workers - 1}")
    if args.info:
        print(json.dumps(corpus_mod.Corpus(args.out).stats(), indent=2))
        return 0
    import torch

    from ..decoding.loading import BUNDLED_TARGET, load_target

    c = corpus_mod.create(
        args.out, args.target or BUNDLED_TARGET, args.max_new_tokens, args.max_prompt_tokens
    )
    torch.set_num_threads(args.threads)
    model, tok = load_target(args.target, dtype="bfloat16")
    n = corpus_mod.extend(
        c, model, tok, args.tokens, worker=args.worker, workers=args.workers, batch_size=args.batch_size
    )
    print(f"wrote {n} shards; {json.dumps(c.stats())}")
    return 0
