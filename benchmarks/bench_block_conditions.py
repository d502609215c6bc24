"""What block sizes other than the trained one cost in acceptance.

A drafter trained at block size ``Bt`` drafting a smaller ``B`` sees ``B - 1`` masks instead
of ``Bt - 1``: outside its training conditions. This measures, at every position of the
target's own greedy text, the greedy acceptance length (bonus included) of

- drafting ``B`` directly (what the decoder does for a round of size ``B``), against
- drafting ``Bt`` and keeping its first ``B - 1`` drafts (the training conditions),

so the difference is the cost of the shorter block alone (a shorter block gives up the
longer acceptances in both columns).

    python benchmarks/bench_block_conditions.py --trained 16                      # bundled pair
    python benchmarks/bench_block_conditions.py --target tests/data/dflash-reference-tiny/target \\
        --drafter tests/data/dflash-trained-tiny/drafter --dtype float32 --prompts 16
    python benchmarks/bench_block_conditions.py --target /models/Qwen3-8B \\
        --drafter /models/Qwen3-8B-DFlash-b16 --device cuda --prompts 40

Prompts: held-out prompts in turn over their domains (chat template) when the target has a
tokenizer, else random 12-token prompts (seed 999).
"""

from __future__ import annotations

import argparse
import json

import torch

from adaptspec.models import load_speculator
from adaptspec.models.prompts import heldout_prompts


def prompts_for(spec, n: int) -> list[list[int]]:
    if spec.target.tokenizer is None:
        g = torch.Generator().manual_seed(999)
        return [torch.randint(0, spec.target.vocab_size - 1, (12,), generator=g).tolist() for _ in range(n)]
    pool = heldout_prompts()
    domains = sorted({p.domain for p in pool})
    picked = [[p for p in pool if p.domain == domains[i % len(domains)]][i // len(domains)] for i in range(n)]
    return [spec.target.encode_chat(p.prompt) for p in picked]


def accepted(drafter, context: torch.Tensor, seq: list[int], at: int, block_size: int) -> torch.Tensor:
    """Whether each of the ``block_size - 1`` drafts after ``seq[at]`` equals the text (bool ``[<= B-1]``)."""
    logits = drafter.draft_logits(drafter.new_state(context[:at]), seq[at], block_size)
    drafts = drafter.to_target_ids(logits.float().argmax(-1)).cpu()
    want = torch.tensor(seq[at + 1 : at + block_size])
    return drafts[: len(want)] == want


def tau(ok: torch.Tensor) -> int:
    return int(ok.int().cumprod(0).sum()) + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target directory (default: the bundled SmolLM2)")
    ap.add_argument("--drafter", default=None, help="drafter directory (default: the bundled drafter)")
    ap.add_argument(
        "--trained", type=int, default=None, help="trained block size (default: the drafter's max_block_size)"
    )
    ap.add_argument("--sizes", default="2,3,4,6,8,12,16")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="also write the table as JSON to this file")
    a = ap.parse_args()
    spec = load_speculator(a.target, a.drafter, dtype=a.dtype, device=a.device, threads=a.threads)
    trained = a.trained or spec.max_block_size
    sizes = [b for b in (int(x) for x in a.sizes.split(",")) if 2 <= b <= trained]
    direct = {b: [] for b in sizes}
    cut = {b: [] for b in sizes}
    for ids in prompts_for(spec, a.prompts):
        seq = ids + spec.generate(ids, 1, a.max_new_tokens).tokens  # the target's greedy text
        context = spec.target.prefill(seq).context_hidden
        for at in range(len(ids), len(seq) - 1):
            full = accepted(spec.drafter, context, seq, at, trained)
            for b in sizes:
                direct[b].append(tau(full if b == trained else accepted(spec.drafter, context, seq, at, b)))
                cut[b].append(tau(full[: b - 1]))
    rows = [
        {
            "block_size": b,
            "tau_drafted_at_B": sum(direct[b]) / len(direct[b]),
            f"tau_drafted_at_{trained}_cut_to_B": sum(cut[b]) / len(cut[b]),
            "positions": len(direct[b]),
        }
        for b in sizes
    ]
    print(f"{'B':>3} {'drafted at B':>13} {f'at {trained}, cut':>13} {'change':>8} {'positions':>9}")
    for r, b in zip(rows, sizes):
        x, y = r["tau_drafted_at_B"], r[f"tau_drafted_at_{trained}_cut_to_B"]
        print(f"{b:>3} {x:>13.3f} {y:>13.3f} {100 * (x / y - 1):>+7.1f}% {r['positions']:>9}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "target": a.target or "bundled",
                    "drafter": a.drafter or "bundled",
                    "trained": trained,
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
