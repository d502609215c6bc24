"""The starting point of the DFlash-layout drafter for vLLM: the bundled drafter re-laid and calibrated.

Builds, from the shipped adaptspec-layout drafter, a DFlash v1 drafter for the bundled target
(:func:`adaptspec.models.relayout.to_dflash_layout`: every tensor kept; q/k norms added; the
mask becomes the target's embedding of ``--mask-token-id``), sets its q/k norms to the mean
head lengths the bundled drafter's queries and keys have on training batches (``--batches``
batches of the work directory's corpus contexts, never the benchmark prompts), and writes it
with ``dflash_format.save`` to ``--out``. ``adaptspec train-drafter --layout dflash --init-from
OUT`` then fine-tunes it (docs/dflash.md, "A DFlash drafter for vLLM"). ``--block-size`` is the
DFlash ``block_size`` it declares, the block it is then trained at.

The default mask token, 16 (``<empty_output>``), is one of SmolLM2's unused special tokens: their
embeddings are all alike and the nearest the bundled drafter's learned mask (cosine 0.81).

    python benchmarks/bench_vllm_drafter_build.py --work WORK --out INIT
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--work", type=Path, required=True, help="train-drafter --corpus work directory (its corpus contexts)"
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mask-token-id", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import numpy as np
    import torch

    from adaptspec.decoding import BlockDiffusionDrafter, dflash_format
    from adaptspec.decoding.loading import load_target
    from adaptspec.models.bundled import BUNDLED_DRAFTER
    from adaptspec.models.relayout import calibrate_qk_norms, qk_scales, to_dflash_layout
    from adaptspec.models.train_drafter import (
        ShardData,
        TrainConfig,
        block_loss,
        block_position_weights,
        make_batch,
        vocab_index,
    )

    torch.set_num_threads(1)
    target, _ = load_target(None, dtype="float32")
    bundled = BlockDiffusionDrafter.from_pretrained(BUNDLED_DRAFTER, target, dtype=torch.float32).eval()
    data = ShardData([args.work / "corpus"])
    cfg = TrainConfig(
        block_size=16, anchors_per_seq=32, seqs_per_step=4
    )  # the bundled drafter's training block
    rng = np.random.default_rng(args.seed)
    vmap = vocab_index(bundled.draft_vocab, target.config.vocab_size)
    weights = block_position_weights(cfg.block_size, None)

    def run() -> None:
        for _ in range(args.batches):
            batch = make_batch(
                data, rng.choice(len(data), cfg.seqs_per_step, replace=False), cfg, rng, vmap, "cpu"
            )
            block_loss(bundled, batch, weights)

    scales = qk_scales(bundled, run)
    out, fresh = to_dflash_layout(bundled, target, args.mask_token_id, max_block_size=args.block_size)
    calibrate_qk_norms(out, scales)
    dflash_format.save(out, args.out, dtype=torch.float32)
    print(
        f"wrote {args.out}: fresh {fresh}, q/k norm scales {[(round(q, 3), round(k, 3)) for q, k in scales]}"
    )


if __name__ == "__main__":
    main()
