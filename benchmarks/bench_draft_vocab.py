"""What the reduced draft vocabulary saves: the drafter's LM-head matmul per draft, and the head slice.

The drafter has no LM head of its own: each draft multiplies the ``B - 1`` final hidden
states by the target's LM head, all ``V`` rows, or only the ``V_draft`` rows of the reduced
draft vocabulary (``BlockDiffusionDrafter.lm_weight``, which gathers those rows once and reuses them). Timed here on random tensors of the given sizes, one thread, median of ``--repeats``:

- ``full``: ``h[B-1, H] @ W[V, H].T``;
- ``reduced, gather + matmul``: ``h @ W[draft_vocab].T``, gathering at every draft (what ``draft_logits`` did before the slice was cached);
- ``reduced, matmul only``: ``h @ W_draft.T`` with the slice gathered once beforehand.

    python benchmarks/bench_draft_vocab.py                       # SmolLM2-135M sizes
    python benchmarks/bench_draft_vocab.py --hidden 4096 --vocab 151936 --draft-vocab 32768
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    rows = args.block - 1
    out = {
        "hidden": args.hidden,
        "vocab": args.vocab,
        "draft_vocab": args.draft_vocab,
        "block": args.block,
        "threads": args.threads,
        "head_params": {"full": args.vocab * args.hidden, "reduced": args.draft_vocab * args.hidden},
    }
    idx = torch.randperm(args.vocab, generator=g)[: args.draft_vocab].sort().values
    for dtype in (torch.float32, torch.bfloat16):
        w = torch.randn(args.vocab, args.hidden, generator=g).to(dtype)
        h = torch.randn(rows, args.hidden, generator=g).to(dtype)
        ws = w[idx].contiguous()
        size = torch.tensor([], dtype=dtype).element_size()
        out[str(dtype).removeprefix("torch.")] = {
            "head_bytes": {
                "full": args.vocab * args.hidden * size,
                "reduced": args.draft_vocab * args.hidden * size,
            },
            "ms_per_draft": {
                "full": round(median_ms(lambda: h @ w.T, args.repeats), 4),
                "reduced_gather_matmul": round(median_ms(lambda: h @ w[idx].T, args.repeats), 4),
                "reduced_matmul_only": round(median_ms(lambda: h @ ws.T, args.repeats), 4),
            },
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
