"""What a drafter training step costs, by sequences per step and response crop (issue 29, item 1).

For each ``(sequences a step, --max-seq-len)`` it runs the project's own training loop
(:func:`adaptspec.models.train_drafter.train`) on a fresh drafter for ``--warmup + --steps``
steps with a log line every step, and reads the CPU seconds of the measured steps from the
loop's own ``cpu_s`` (process time of the steps, so a paused or shared machine does not
change it). Blocks trained = sequences x anchors x steps.

    setsid nice -n 19 python benchmarks/bench_drafter_cost.py --work W --out results.json

``W`` holds the contexts of ``train-drafter --corpus ... --stage data`` (``W/corpus``,
``W/data.json``); checkpoints go to ``W/cost/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path


def measure(
    target,
    work: Path,
    layers,
    seqs: int,
    crop: int | None,
    anchors: int,
    warmup: int,
    steps: int,
    train_tokens: int | None,
) -> dict:
    from adaptspec.models.train_drafter import TrainConfig, train

    ckpt = work / "cost" / f"s{seqs}-L{crop or 'full'}"
    shutil.rmtree(ckpt, ignore_errors=True)
    cfg = TrainConfig(
        seqs_per_step=seqs,
        max_response_len=crop,
        anchors_per_seq=anchors,
        total_steps=warmup + steps,
        warmup_steps=warmup,
        lr=6e-4,
        gamma=4.0,
        threads=1,
        log_every=1,
        eval_every=10**9,
        checkpoint_every_s=10**9,
        max_train_tokens=train_tokens,
    )
    train(target, [work / "corpus"], [], ckpt, cfg, log=lambda *_: None, target_layers=layers)
    cpu = [json.loads(line)["cpu_s"] for line in (ckpt / "train_log.jsonl").read_text().splitlines()]
    per_step = [b - a for a, b in zip(cpu[warmup - 1 : -1], cpu[warmup:])]
    (ckpt / "state.pt").unlink()  # 100 MB of weights and optimiser nobody needs
    total = sum(per_step)
    return {
        "seqs_per_step": seqs,
        "max_seq_len": crop,
        "anchors": anchors,
        "steps": len(per_step),
        "cpu_s": total,
        "cpu_s_per_step_mean": total / len(per_step),
        "cpu_s_per_step_median": statistics.median(per_step),
        "blocks_per_cpu_s": seqs * anchors * len(per_step) / total,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--grid",
        default="2:full,4:full,8:full,16:full,4:64,4:128,4:192,16:128",
        help="SEQS:CROP pairs (CROP a number of response tokens or 'full')",
    )
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3, help="steps not measured")
    ap.add_argument("--steps", type=int, default=20, help="steps measured")
    ap.add_argument("--train-tokens", type=int, default=120_000)
    args = ap.parse_args()

    import torch

    from adaptspec.decoding.loading import load_target

    torch.set_num_threads(1)
    layers = json.loads((args.work / "data.json").read_text())["layers"]
    target, _ = load_target(None, dtype="float32")
    rows = []
    for cell in args.grid.split(","):
        seqs, crop = cell.split(":")
        t0 = time.time()
        row = measure(
            target,
            args.work,
            layers,
            int(seqs),
            None if crop == "full" else int(crop),
            args.anchors,
            args.warmup,
            args.steps,
            args.train_tokens,
        )
        row["wall_s"] = time.time() - t0
        rows.append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(
            json.dumps({"bench": "drafter training step cost", "threads": 1, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
