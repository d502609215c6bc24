"""``adaptspec train-drafter``: distillation data and training for a drafter, resumable.

Stages: ``data`` (prompts, greedy responses, hidden states), ``train`` (resumes from the
last checkpoint; trains on the shards present, picking up new ones), ``eval`` (held-out
greedy acceptance), ``export`` (bfloat16 weights + config: the DFlash v1 layout for a drafter
trained with ``--layout dflash``, else adaptspec's). ``all`` runs them in order.

With ``--corpus DIR`` (a corpus grown by ``adaptspec distill``) the data stage recomputes the
target's hidden states for the corpus's token ids (:mod:`adaptspec.models.contexts`) instead
of generating, and held-out figures are the per-position tau on the public benchmark prompts'
greedy answers (:mod:`adaptspec.models.drafter_eval`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import AdaptspecError
from ._types import float_range, int_range, threads

#: the checkout this package lives in (the default --eval-dense is its datasets/dense/benchmarks-fast)
_CHECKOUT = Path(__file__).resolve().parents[2]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``adaptspec train-drafter``'s options, in the order ``--help`` lists them."""
    _data_options(p)
    _training_options(p)
    _drafter_options(p)
    _source_options(p)


def _data_options(p: argparse.ArgumentParser) -> None:
    """Where the work lives, the target, and the data stage's prompts and answers."""
    p.add_argument(
        "--work", type=Path, default=None, help="work directory for data and checkpoints (default: cache dir)"
    )
    p.add_argument("--stage", choices=["all", "data", "train", "eval", "export"], default="all")
    p.add_argument("--target", default=None, help="target model directory (default: the bundled SmolLM2)")
    p.add_argument(
        "--per-domain", type=int_range(1), default=800, help="prompts per domain before the held-out split"
    )
    p.add_argument(
        "--eval-prompts",
        type=int_range(1),
        default=100,
        help="held-out prompts for evaluation (with --corpus: the first N benchmark prompts, in turn)",
    )
    p.add_argument("--max-new-tokens", type=int_range(1), default=256)
    p.add_argument("--threads", type=threads, default=1, help="CPU threads (one core leaves the other free)")


def _training_options(p: argparse.ArgumentParser) -> None:
    """The drafter's depth and the training run: steps, batches, learning rate, evaluation, time."""
    p.add_argument("--layers", type=int_range(1), default=2, help="drafter layers")
    p.add_argument(
        "--steps", type=int_range(1), default=20_000, help="total optimiser steps (cosine schedule length)"
    )
    p.add_argument(
        "--anchors",
        type=int_range(1),
        default=8,
        help="blocks drafted per training sequence in one pass (random anchors in its response)",
    )
    p.add_argument(
        "--seqs-per-step",
        type=int_range(1),
        default=4,
        help="training sequences in one optimiser step (at most the sequences trained on)",
    )
    p.add_argument(
        "--max-seq-len",
        type=int_range(2),
        default=None,
        help="crop each training sequence's response to its first L tokens (the prompt stays) before "
        "anchors are drawn (default: the whole response)",
    )
    p.add_argument(
        "--soft-targets",
        type=int_range(1, 64),
        default=None,
        metavar="K",
        help="with --corpus: the data stage stores the target's top-K next tokens at every position "
        "beside the hidden states; training learns that distribution instead of the greedy token",
    )
    p.add_argument(
        "--seed", type=int_range(0), default=0, help="seed of the initial weights and of the batches drawn"
    )
    p.add_argument(
        "--lr", type=float_range(0, lo_open=True), default=6e-4, help="peak learning rate (cosine schedule)"
    )
    p.add_argument("--warmup", type=int_range(0), default=200, help="learning-rate warm-up steps")
    p.add_argument("--eval-every", type=int_range(1), default=500, help="steps between held-out evaluations")
    p.add_argument(
        "--minutes",
        type=float_range(0, lo_open=True),
        default=None,
        help="stop training after this long (resume later)",
    )


def _drafter_options(p: argparse.ArgumentParser) -> None:
    """Where the weights go, and the drafter's architecture and loss."""
    p.add_argument("--export", type=Path, default=None, help="directory for the final weights")
    p.add_argument(
        "--checkpoints", type=Path, default=None, help="checkpoint directory (default: WORK/checkpoints)"
    )
    p.add_argument(
        "--layer-norm",
        action="store_true",
        help="RMS-normalise each target layer's hidden state before fusing them",
    )
    p.add_argument(
        "--layout",
        choices=["adaptspec", "dflash"],
        default="adaptspec",
        help="drafter architecture: dflash = the published DFlash v1 one (q/k norm, mask token), "
        "exported in that layout (a resumed checkpoint keeps the layout it was trained with)",
    )
    p.add_argument(
        "--mask-token-id",
        type=int_range(0),
        default=None,
        help="layout dflash: the target token whose embedding is the mask (default: pad token, else the last id)",
    )
    p.add_argument(
        "--draft-vocab-size",
        type=int_range(0),
        default=8192,
        help="reduced draft vocabulary (0: the target's full vocabulary, which DFlash engines need)",
    )
    p.add_argument(
        "--gamma",
        type=float_range(0, lo_open=True),
        default=None,
        help="loss weight decay over block positions, exp(-(k-1)/gamma) (default: DFlash's for the block size)",
    )


def _source_options(p: argparse.ArgumentParser) -> None:
    """Training from a distillation corpus or from earlier weights; the data stage's direction."""
    p.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help="train on a distillation corpus (adaptspec distill): the data stage recomputes its "
        "hidden states into WORK instead of generating; evaluation is on the benchmark prompts",
    )
    p.add_argument(
        "--eval-dense",
        type=Path,
        default=None,
        help="with --corpus: dense traces of the benchmark prompts whose greedy answers are the "
        "held-out text (default: the checkout's datasets/dense/benchmarks-fast)",
    )
    p.add_argument(
        "--train-tokens",
        type=int_range(1),
        default=None,
        help="train on the first corpus shards holding this many response tokens (a learning-curve "
        "point); the data stage computes only those",
    )
    p.add_argument(
        "--init-from-target",
        action="store_true",
        help="start the drafter's layers as copies of the target's last layers (same shapes)",
    )
    p.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="start from the weights of this checkpoint directory (another run's), with a new "
        "optimiser and schedule; its architecture and draft vocabulary carry over",
    )
    p.add_argument(
        "--reverse",
        action="store_true",
        help="data stage: take the prompt chunks from the last (run beside a forward run to share the work)",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from ..decoding.loading import cache_dir, load_target
    from ..models.train_drafter import ShardData, greedy_acceptance, prepare_data, train

    if args.soft_targets and args.corpus is None:
        raise AdaptspecError(
            "--soft-targets: needs --corpus (only the corpus data stage stores the target's distribution)"
        )
    work = args.work or cache_dir() / "drafter-work"
    if args.export is not None:  # an earlier export (its training.json card and weights) and nothing else
        from .._util.outputs import check_output

        check_output(args.export, "drafter", replace=True)
    if args.corpus is not None:  # its inputs, before WORK is created
        from ..models.corpus import Corpus

        Corpus(args.corpus)
        _eval_dense(args)
    if work.exists() and not work.is_dir():
        raise AdaptspecError(f"--work {work}: exists and is not a directory")
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AdaptspecError(f"--work {work}: cannot create it ({e.strerror or e})") from None
    torch.set_num_threads(args.threads)
    if args.corpus is not None:
        return _run_corpus(args, work)
    if args.stage in ("all", "data"):
        prepare_data(
            work,
            args.per_domain,
            args.eval_prompts,
            args.max_new_tokens,
            args.threads,
            args.target,
            reverse=args.reverse,
        )
    if args.stage == "data":
        return 0
    meta = work / "data.json"
    if not meta.exists():
        raise AdaptspecError(f"{work}: no distillation data yet; run --stage data first")
    layers = _layers(meta)
    target, _ = load_target(args.target, dtype="float32")
    cfg = _train_config(args)
    ckpt = args.checkpoints or work / "checkpoints"
    if args.stage in ("all", "train"):
        drafter = train(
            target,
            [work / "train"],
            [work / "heldout"],
            ckpt,
            cfg,
            args.minutes,
            target_layers=layers,
            vocab_prior=_prompt_token_counts(work, args.target),
        )
    else:
        drafter = _load_checkpoint(target, ckpt, cfg, layers)
    if args.stage in ("all", "eval", "export"):
        ev = greedy_acceptance(
            drafter, ShardData([work / "heldout"]), block_sizes=(2, 4, 8, 12, 16, 24), max_seqs=400
        )
        print(json.dumps({"heldout_greedy_tau": ev}, indent=2))
        if args.export is not None:
            _export(args.export, drafter, ckpt, work / "train", {"heldout_greedy_tau": ev})
    return 0


def _eval_dense(args: argparse.Namespace) -> Path:
    """The dense set whose greedy answers are the held-out text, checked when the data stage
    will read it (a missing or foreign one is one line before any model loads)."""
    dense = args.eval_dense or _CHECKOUT / "datasets" / "dense" / "benchmarks-fast"
    if args.stage in ("all", "data"):
        from ..traces.dense import DenseTraceSet

        if not dense.is_dir():
            raise AdaptspecError(
                f"--eval-dense {dense}: no such dense trace set"
                + ("" if args.eval_dense else " (the default, in the checkout; pass --eval-dense DIR)")
            )
        DenseTraceSet.open(dense)
    return dense


def _run_corpus(args: argparse.Namespace, work: Path) -> int:
    """The corpus path: contexts (teacher-forced hidden states) -> training -> benchmark evaluation."""

    from ..decoding.loading import load_target
    from ..models.corpus import Corpus
    from ..models.drafter_eval import acceptance_everywhere, drafter_figures
    from ..models.train_drafter import ShardData, train

    corpus = Corpus(args.corpus)  # refuses a directory that is not one, before any model loads
    meta = work / "data.json"
    dense = _eval_dense(args)
    cfg = _train_config(args)
    if args.stage in ("all", "data"):
        from ..decoding.drafter import default_target_layers
        from ..models.contexts import benchmark_sequences, build_benchmark_contexts, build_corpus_contexts
        from ..models.distill import chat_ids

        model, tok = load_target(args.target, dtype="bfloat16")  # the dtype decoding runs in
        layers = default_target_layers(model.config.num_hidden_layers, 5)
        if meta.exists() and _layers(meta) != layers:
            raise AdaptspecError(f"{meta}: made for other context layers; use another --work")
        meta.write_text(json.dumps({"layers": layers, "corpus": str(args.corpus), "eval_dense": str(dense)}))
        build_benchmark_contexts(
            benchmark_sequences(dense, lambda t: chat_ids(tok, t)), model, work / "benchmarks", layers
        )
        n = build_corpus_contexts(
            corpus,
            model,
            work / "corpus",
            layers,
            max_seq_len=cfg.max_seq_len,
            max_response_tokens=args.train_tokens,
            top_k=args.soft_targets or 0,
        )
        print(f"{work}: contexts of {n} new corpus shards")
        if args.stage == "data":
            return 0
    if not meta.exists():
        raise AdaptspecError(f"{work}: no contexts yet; run --stage data --corpus {args.corpus} first")
    layers = _layers(meta)
    target, _ = load_target(args.target, dtype="float32")
    ckpt = args.checkpoints or work / "checkpoints"
    if args.stage in ("all", "train"):
        drafter = train(
            target,
            [work / "corpus"],
            [work / "benchmarks"],
            ckpt,
            cfg,
            args.minutes,
            target_layers=layers,
            evaluate=lambda d, h: acceptance_everywhere(d, h, (4, 16), max_seqs=60),
        )
    else:
        drafter = _load_checkpoint(target, ckpt, cfg, layers)
    if args.stage in ("all", "eval", "export"):
        ev = drafter_figures(
            drafter, ShardData([work / "benchmarks"]), (2, 4, 8, 12, 16), max_seqs=args.eval_prompts
        )
        figures = {
            "benchmark_tau_every_position": ev["tau"],
            "benchmark_first_draft_every_position": ev["first_draft"],
        }
        print(json.dumps(figures, indent=2))
        if args.export is not None:
            _export(args.export, drafter, ckpt, work / "corpus", {"corpus": str(args.corpus), **figures})
    return 0


def _prompt_token_counts(work: Path, target: str | None):
    """Token counts of all training prompts (chat template applied): a vocabulary prior."""
    from collections import Counter

    from transformers import AutoTokenizer

    from ..decoding.loading import resolve_model_path
    from ..models.distill import chat_ids
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
    """The drafter of a training checkpoint, or an exported one (evaluation only)."""
    from ..decoding.dflash_format import is_dflash_dir
    from ..models.train_drafter import weights_to_start_from

    if not ((ckpt / "state.pt").exists() or (ckpt / "drafter_config.json").exists() or is_dflash_dir(ckpt)):
        raise AdaptspecError(f"{ckpt / 'state.pt'}: no checkpoint; run --stage train first")
    return weights_to_start_from(ckpt, target, layers)[0].eval()


def _train_config(args: argparse.Namespace):
    from ..models.train_drafter import TrainConfig

    return TrainConfig(
        num_layers=args.layers,
        total_steps=args.steps,
        threads=args.threads,
        normalize_context_layers=args.layer_norm,
        gamma=args.gamma,
        layout=args.layout,
        mask_token_id=args.mask_token_id,
        draft_vocab_size=args.draft_vocab_size or None,
        max_train_tokens=args.train_tokens,
        init_from_target=args.init_from_target,
        anchors_per_seq=args.anchors,
        lr=args.lr,
        eval_every=args.eval_every,
        warmup_steps=args.warmup,
        seqs_per_step=args.seqs_per_step,
        seed=args.seed,
        max_response_len=args.max_seq_len,
        soft_targets=args.soft_targets or 0,
        init_from=None if args.init_from is None else str(args.init_from),
    )


def _export(out: Path, drafter, ckpt: Path, train_dir: Path, card: dict) -> None:
    """Weights to ``out`` and a ``training.json`` card: steps, config, data trained on, ``card``."""
    from ..models.train_drafter import ShardData, export, load_state

    if not (ckpt / "state.pt").exists():
        raise AdaptspecError(f"{ckpt / 'state.pt'}: export needs a training checkpoint")
    st = load_state(ckpt / "state.pt")
    data = ShardData([train_dir], st["cfg"].get("max_train_tokens"))
    layout = export(
        drafter,
        out,
        {
            "steps": st["step"],
            "config": st["cfg"],
            "train_sequences": len(data),
            "train_response_tokens": data.n_tokens(),
            **card,
        },
    )
    print(f"wrote {out} ({layout} layout)")


def _layers(meta: Path) -> list[int]:
    """The target layers a work directory's data were made with (its ``data.json``), checked."""
    from .._util.files import read_json_object

    layers = read_json_object(meta, "a train-drafter work directory's data.json").get("layers")
    if (
        not isinstance(layers, list)
        or not layers
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
    ):
        raise AdaptspecError(f"{meta}: 'layers' must be a list of layer indices, got {layers!r}")
    return layers
