"""The target's passes by dtype: bfloat16, float32, and ``mixed`` (float32 with a bfloat16 weight copy
for products of one or two rows, :mod:`adaptspec.decoding.prepacked`), at 1, 2, 4 and 8 rows x 1, 2
and 4 tokens a row, 128 tokens of context: the engine's own drafter and verify passes
(:func:`adaptspec.batching.cost_surface.measure_surface`), each the fastest of ``--repeats`` in the
process's CPU seconds on one thread (what other load on a shared host does not inflate), the dtypes
interleaved ``--rounds`` times and the fastest round kept.

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/bench_weight_copies.py \\
        --out benchmarks/results/weight-copies-avx2.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from adaptspec.batching.cost_surface import measure_surface
from adaptspec.models import load_speculator

DTYPES = ("bfloat16", "float32", "mixed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--tokens", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [int(x) for x in args.rows.split(",")]
    tokens = [int(x) for x in args.tokens.split(",")]
    specs = {d: load_speculator(dtype=d) for d in DTYPES}
    best: dict[str, dict[tuple[int, int], dict]] = {d: {} for d in DTYPES}
    for _ in range(args.rounds):
        for d, spec in specs.items():
            for r in measure_surface(
                spec.target,
                spec.drafter,
                rows=rows,
                tokens=tokens,
                contexts=[128],
                repeats=args.repeats,
                cpu_time=True,
            ):
                cell = (r["batch_size"], r["block_size"])
                if (
                    cell not in best[d]
                    or r["verify_s"] + r["draft_s"] < best[d][cell]["verify_s"] + best[d][cell]["draft_s"]
                ):
                    best[d][cell] = r
    table = {
        d: [
            {
                "rows": m,
                "tokens": b,
                "verify_ms": round(1e3 * r["verify_s"], 2),
                "draft_ms": round(1e3 * r["draft_s"], 2),
            }
            for (m, b), r in sorted(cells.items())
        ]
        for d, cells in best.items()
    }
    out = {"capability": str(torch.backends.cpu.get_cpu_capability()), "threads": 1, "passes": table}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"{'rows x tokens':<14}" + "".join(f"{d:>12}" for d in DTYPES) + "   verify ms (CPU, one thread)")
    for i, row in enumerate(table[DTYPES[0]]):
        print(
            f"{row['rows']} x {row['tokens']:<10}"
            + "".join(f"{table[d][i]['verify_ms']:>12.1f}" for d in DTYPES)
        )


if __name__ == "__main__":
    main()
