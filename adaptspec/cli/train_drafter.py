"""``adaptspec train-drafter``: distillation data and training for a drafter, resumable.

Stages: ``data`` (prompts, greedy responses, hidden states), ``train`` (resumes from the
last checkpoint; trains on the shards present, picking up new ones), ``eval`` (held-out
greedy acceptance), ``export`` (bfloat16 weights + config: the DFlash v1 layout for a drafter
trained with ``--layout dflash``, else adaptspec's). ``all`` runs them in order.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from ..errors import AdaptspecError
from ._types import float_range, int_range, threads


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work", type=Path, default=None, help="work directory for data and checkpoints (default: cache dir)")
    p.add_argument("--stage", choices=["all", "data", "train", "eval", "export"], default="all")
    p.add_argument("--target", default=None, help="target model directory (default: the bundled SmolLM2)")
    p.add_argument("--per-domain", type=int_range(1), default=800, help="prompts per domain before the held-out split")
    p.add_argument("--eval-prompts", type=int_range(1), default=100, help="held-out prompts for evaluation")
    p.add_argument("--max-new-tokens", type=int_range(1), default=256)
    p.add_argument("--threads", type=threads, default=1, help="CPU threads (one core leaves the other free)")
    p.add_argument("--layers", type=int_range(1), default=2, help="drafter layers")
    p.add_argument("--steps", type=int_range(1), default=20_000, help="total optimiser steps (cosine schedule length)")
    p.add_argument("--minutes", type=float_range(0, lo_open=True), default=None, help="stop training after this long (resume later)")
    p.add_argument("--export", type=Path, default=None, help="directory for the final weights")
    p.add_argument("--checkpoints", type=Path, default=None, help="checkpoint directory (default: WORK/checkpoints)")
    p.add_argument("--layer-norm", action="store_true",
                   help="RMS-normalise each target layer's hidden state before fusing them")
    p.add_argument("--layout", choices=["adaptspec", "dflash"], default="adaptspec",
                   help="drafter architecture: dflash = the published DFlash v1 one (q/k norm, mask token), "
                        "exported in that layout (a resumed checkpoint keeps the layout it was trained with)")
    p.add_argument("--mask-token-id", type=int_range(0), default=None,
                   help="layout dflash: the target token whose embedding is the mask (default: pad token, else the last id)")
    p.add_argument("--draft-vocab-size", type=int_range(0), default=8192,
                   help="reduced draft vocabulary (0: the target's full vocabulary, which DFlash engines need)")
    p.add_argument("--gamma", type=float_range(0, lo_open=True), default=None,
                   help="loss weight decay over block positions, exp(-(k-1)/gamma) (default: DFlash's for the block size)")
    p.add_argument("--reverse", action="store_true",
                   help="data stage: take the prompt chunks from the last (run beside a forward run to share the work)")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..models.loading import cache_dir, load_target
    from ..models.train_drafter import TrainConfig, export, greedy_acceptance, prepare_data, train, ShardData

    work = args.work or cache_dir() / "drafter-work"
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    if args.stage in ("all", "data"):
        prepare_data(work, args.per_domain, args.eval_prompts, args.max_new_tokens, args.threads, args.target,
                     reverse=args.reverse)
    if args.stage == "data":
        return 0
    meta = work / "data.json"
    if not meta.exists():
        raise AdaptspecError(f"{work}: no distillation data yet; run --stage data first")
    layers = json.loads(meta.read_text())["layers"]
    target, _ = load_target(args.target, dtype="float32")
    cfg = TrainConfig(num_layers=args.layers, total_steps=args.steps, threads=args.threads,
                      normalize_context_layers=args.layer_norm, gamma=args.gamma, layout=args.layout,
                      mask_token_id=args.mask_token_id, draft_vocab_size=args.draft_vocab_size or None)
    ckpt = args.checkpoints or work / "checkpoints"
    if args.stage in ("all", "train"):
        drafter = train(target, [work / "train"], [work / "heldout"], ckpt, cfg, args.minutes,
                        target_layers=layers, vocab_prior=_prompt_token_counts(work, args.target))
    else:
        drafter = _load_checkpoint(target, ckpt, cfg, layers)
    if args.stage in ("all", "eval", "export"):
        ev = greedy_acceptance(drafter, ShardData([work / "heldout"]), block_sizes=(2, 4, 8, 12, 16, 24), max_seqs=400)
        print(json.dumps({"heldout_greedy_tau": ev}, indent=2))
        if args.export is not None:
            st = torch.load(ckpt / "state.pt", weights_only=False)
            data = ShardData([work / "train"])
            layout = export(drafter, args.export, {
                "steps": st["step"], "config": st.get("cfg", asdict(cfg)), "train_sequences": len(data),
                "train_response_tokens": data.n_tokens(), "heldout_greedy_tau": ev,
            })
            print(f"wrote {args.export} ({layout} layout)")
    return 0


def _prompt_token_counts(work: Path, target: str | None):
    """Token counts of all training prompts (chat template applied): a vocabulary prior."""
    from collections import Counter

    from transformers import AutoTokenizer

    from ..models.distill import chat_ids
    from ..models.loading import resolve_model_path
    from ..models.prompts import read_prompts

    path = work / "train_prompts.jsonl"
    if not path.exists():
        return None
    tok = AutoTokenizer.from_pretrained(resolve_model_path(target))
    counts: Counter = Counter()
    for p in read_prompts(path):
        counts.update(chat_ids(tok, p.prompt))
    return counts


def _load_checkpoint(target, ckpt: Path, cfg, layers):
    import torch

    from ..decoding.drafter import BlockDiffusionDrafter
    from ..models.train_drafter import checkpoint_architecture, max_block_size

    path = ckpt / "state.pt"
    if not path.exists():
        raise AdaptspecError(f"{path}: no checkpoint; run --stage train first")
    st = torch.load(path, weights_only=False)
    dv = st["draft_vocab"]
    arch = checkpoint_architecture(st)
    d = BlockDiffusionDrafter.for_target(
        target, num_layers=st["cfg"]["num_layers"], max_block_size=max_block_size(st["cfg"], arch["layout"]),
        target_layers=layers, draft_vocab=None if dv is None else dv.tolist(),
        normalize_context_layers=st["cfg"].get("normalize_context_layers", False), **arch,
    )
    d.load_state_dict(st["model"])
    return d.eval()
