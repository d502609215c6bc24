"""Throughput of the ways to make distillation data for a drafter on this CPU (issue: 7x the data).

Measures useful tokens per second (tokens a drafter can train on) of:

- ``hf-generate``: transformers' ``generate`` on a left-padded batch (rows keep stepping
  after their EOS until the longest answer ends: those steps are wasted);
- ``retire``: :func:`adaptspec.models.distill_generator.generate`, which drops a finished row from the
  batch and its KV cache (what ``adaptspec distill`` uses);
- ``relabel``: one teacher-forced pass over existing text, keeping the target's argmax at
  every position (no generation at all; the labels after the first position of a block then
  follow the text, not the target's own continuation).

    python benchmarks/bench_distill.py --threads 1 --prompts 64
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from adaptspec.decoding.loading import load_target
from adaptspec.models.distill import chat_ids
from adaptspec.models.distill_generator import generate
from adaptspec.models.prompts import build_prompt_pool, split_pool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_target(dtype="bfloat16")
    eos = {tok.eos_token_id}
    pool = split_pool(build_prompt_pool(args.prompts))[0][: args.prompts]
    ids = sorted((chat_ids(tok, p.prompt)[-384:] for p in pool), key=len)
    bs, n = args.batch_size, args.max_new_tokens
    out = {}

    t0, useful = time.perf_counter(), 0
    answers = []
    for i in range(0, len(ids), bs):
        a = generate(model, ids[i : i + bs], n, eos, pad_id=tok.pad_token_id)
        answers += a
        useful += sum(map(len, a))
    out["retire"] = useful / (time.perf_counter() - t0)

    t0, useful = time.perf_counter(), 0
    for i in range(0, len(ids), bs):
        rows = ids[i : i + bs]
        w = max(map(len, rows))
        x = torch.tensor([[tok.pad_token_id] * (w - len(r)) + r for r in rows])
        m = torch.tensor([[0] * (w - len(r)) + [1] * len(r) for r in rows])
        with torch.inference_mode():
            g = model.generate(
                input_ids=x,
                attention_mask=m,
                do_sample=False,
                max_new_tokens=n,
                pad_token_id=tok.pad_token_id,
            )
        for r in g[:, w:].tolist():
            useful += next((k + 1 for k, t in enumerate(r) if t in eos), len(r))
    out["hf-generate"] = useful / (time.perf_counter() - t0)

    seqs = [p + a for p, a in zip(ids, answers)]  # stands in for real text of the same lengths
    t0, useful = time.perf_counter(), 0
    for i in range(0, len(seqs), 8):
        rows = seqs[i : i + 8]
        w = max(map(len, rows))
        x = torch.tensor([r + [tok.pad_token_id] * (w - len(r)) for r in rows])
        m = torch.tensor([[1] * len(r) + [0] * (w - len(r)) for r in rows])
        with torch.inference_mode():
            model(input_ids=x, attention_mask=m).logits.argmax(-1)
        useful += sum(len(r) - len(p) for r, p in zip(rows, ids[i : i + 8]))
    out["relabel"] = useful / (time.perf_counter() - t0)
    print(
        json.dumps(
            {
                "threads": args.threads,
                "batch_size": bs,
                "tokens_per_s": {k: round(v, 1) for k, v in out.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
