"""GPU check of the batching engine: exactness per row and the cost surface, on random weights.

Builds a Qwen3-shaped target (default: Qwen3-4B's shape, the DFlash reference pair's size)
and a 5-layer DFlash-layout drafter with random weights directly on the device (no
downloads), then:

1. fast verification: the cost surface, draft and verify seconds over rows x tokens per row x
   context (:func:`adaptspec.batching.cost_surface.measure_surface`), and how many rows of a
   batched run differ from the target's own batch-1 greedy ``generate``;
2. exact verification (the model patched in place, :mod:`adaptspec.decoding.batch_invariant`):
   every request of several batch compositions (rows, block sizes, staggered joins) against
   the patched target's own greedy ``generate`` of that request alone; reports each mismatch.

One command, under 8 minutes on one H100/H200:

    python benchmarks/gpu_check_batching.py --out benchmarks/results/gpu-batching.json

``--tiny`` runs the same steps on a tiny model (CPU is fine): the test suite runs it so the
script keeps working between GPU sessions. Exit status 1 when exact mode mismatched.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

SIZES = {  # Qwen3 shapes (config.json of the published models); tiny: for the CPU test
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
    ),
    "4b": dict(
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
    "8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
}


def build(size: str, device: str, dtype: torch.dtype, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from adaptspec.decoding import BlockDiffusionDrafter

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        **SIZES[size],
        max_position_embeddings=4096,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(dtype).eval()
        with torch.no_grad():  # sharper logits than the default init: fewer exact ties, like a trained model
            model.lm_head.weight.mul_(8.0)
        drafter = BlockDiffusionDrafter.for_target(
            model, num_layers=5 if size != "tiny" else 1, seed=seed, max_block_size=16, layout="dflash"
        ).to(device=device, dtype=dtype)
    return model, drafter


def compositions(vocab: int, tiny: bool, seed: int = 1) -> list[list[tuple[int, list[int], int, int]]]:
    """Batch compositions: lists of (arrival round, prompt, block size, new tokens)."""
    g = torch.Generator().manual_seed(seed)

    def prompt(n):
        return torch.randint(vocab, (n,), generator=g).tolist()

    n_new = 12 if tiny else 32
    lens = (5, 17, 40, 3, 64, 9, 120, 30)
    return [
        [(0, prompt(lens[0]), 4, n_new)],  # one row
        [(0, prompt(n), b, n_new) for n, b in zip(lens[:3], (1, 4, 8))],  # three rows, mixed blocks
        [
            (k, prompt(n), b, n_new - k) for k, (n, b) in enumerate(zip(lens, (1, 2, 4, 8, 16, 3, 1, 6)))
        ],  # staggered joins
    ]


def greedy_alone(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    return model.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n)[0, len(prompt) :].tolist()


def run_composition(engine, comp) -> list:
    handles, rnd = {}, 0
    while len(handles) < len(comp) or engine.busy:
        for i, (at, p, b, n) in enumerate(comp):
            if at == rnd:
                handles[i] = engine.submit(p, block_size=b, max_new_tokens=n)
        engine.step()
        rnd += 1
    return [handles[i].result().tokens for i in range(len(comp))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="4b")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape, for a CPU smoke run")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--tokens", default="1,2,4,8,16")
    ap.add_argument("--contexts", default="256,1024")
    ap.add_argument("--out", default=None, help="JSON results (default: print only)")
    args = ap.parse_args(argv)
    from adaptspec.batching import BatchEngine
    from adaptspec.batching.cost_surface import measure_surface, surface_table
    from adaptspec.decoding import TargetModel

    size = "tiny" if args.tiny else args.size
    if args.tiny:
        args.rows, args.tokens, args.contexts = "1,3", "1,4", "16"
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    model, drafter = build(size, args.device, dtype)
    report: dict = dict(
        size=size,
        device=args.device,
        dtype=args.dtype,
        torch=torch.__version__,
        gpu=torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        build_s=time.perf_counter() - t0,
    )
    print(f"built {size} on {args.device} in {report['build_s']:.0f} s", flush=True)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731

    # 1. fast verification: the cost surface, and divergence from batch-1 greedy
    fast = TargetModel(model, verification="fast")
    surface = measure_surface(
        fast, drafter, ints(args.rows), ints(args.tokens), ints(args.contexts), repeats=3
    )
    report["surface"] = surface
    print(surface_table(surface, "verify_s"), surface_table(surface, "draft_s"), sep="\n", flush=True)
    comps = compositions(model.config.vocab_size, args.tiny)
    refs = [[greedy_alone(model, p, n) for _, p, _, n in comp] for comp in comps]
    differ = 0
    for comp, ref in zip(comps, refs):
        got = run_composition(BatchEngine(fast, drafter, max_rows=8), comp)
        differ += sum(g != r for g, r in zip(got, ref))
    report["fast_rows_differing_from_greedy"] = f"{differ}/{sum(map(len, comps))}"
    print(
        f"fast mode: {report['fast_rows_differing_from_greedy']} rows differ from batch-1 greedy", flush=True
    )

    # 2. exact verification: patch in place; the patched model's own generate is the reference
    exact = TargetModel(model, verification="exact")
    mismatches = []
    for c, comp in enumerate(comps):
        ref = [greedy_alone(model, p, n) for _, p, _, n in comp]
        got = run_composition(BatchEngine(exact, drafter, max_rows=8), comp)
        for i, (g, r) in enumerate(zip(got, ref)):
            if g != r:
                first = next((k for k, (a, b) in enumerate(zip(g, r)) if a != b), min(len(g), len(r)))
                mismatches.append(dict(composition=c, request=i, first_difference=first))
    report["exact_mismatches"] = mismatches
    report["exact_rows"] = sum(map(len, comps))
    report["total_s"] = time.perf_counter() - t0
    print(
        f"exact mode: {len(mismatches)} of {report['exact_rows']} rows differ from the target's own greedy; "
        f"{report['total_s']:.0f} s in all",
        flush=True,
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
