"""``adaptspec train-head``: train the BlockPilot-style offline head on a trace set.

The head maps a request's prefill features to the expected reward of every block size
(``--mode regression``, the default, which NeuralLinear and SquareCB build on) or to the best
block size (``--mode classification``, as BlockPilot). It is written as a directory with
``model.safetensors`` and ``config.json``, usable as ``head:path=HEAD`` or
``neural-linear:head=HEAD``.

Examples::

    adaptspec train-head TRACES --out runs/head
    adaptspec train-head TRACES --out runs/head --reward modelled --latency cpu-smollm2-bf16 --json
    adaptspec simulate TRACES --policy neural-linear:head=runs/head --policy head:path=runs/head
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from ..costs.machine_speed import MEASURED_REWARDS
from ..errors import AdaptspecError
from ..reward.functions import REWARDS, trace_reward_name, trace_rewards
from ._types import float_range, int_range, seed


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "traces",
        nargs="?",
        default=None,
        metavar="TRACES",
        help="trace set directory with features (default: the bundled public benchmark "
        "set, adaptspec/data/traces/benchmarks)",
    )
    p.add_argument("--out", required=True, metavar="HEAD", help="directory to write the head to")
    p.add_argument(
        "--mode",
        choices=("regression", "classification"),
        default="regression",
        help="predict every arm's reward (default) or the best arm (BlockPilot)",
    )
    p.add_argument(
        "--reward",
        choices=REWARDS,
        default=None,
        help="reward the head predicts (default: token_latency when the trace set has timings, "
        "else modelled with --latency, else tau)",
    )
    p.add_argument(
        "--latency",
        metavar="PROFILE",
        default=None,
        help="latency profile for --reward modelled (cpu-smollm2-bf16, h100-qwen3-8b or a JSON file)",
    )
    p.add_argument(
        "--batch-size",
        type=int_range(1),
        default=1,
        metavar="N",
        help="batch size the latency profile is taken at",
    )
    p.add_argument(
        "--pca",
        type=int_range(0),
        default=None,
        metavar="N",
        help="fit a featurizer (standardise + whitened PCA to N dims, keeping the log prompt length) "
        "and save it with the head; default 32 when there are more than 64 features, 0 disables",
    )
    p.add_argument(
        "--hidden",
        type=_hidden,
        default=(64, 32),
        metavar="W1,W2,...",
        help="hidden layer widths (default 64,32)",
    )
    p.add_argument(
        "--val-fraction",
        type=float_range(0, 1, lo_open=True, hi_open=True),
        default=0.2,
        metavar="F",
        help="held-out share for early stopping",
    )
    p.add_argument("--epochs", type=int_range(1), default=300, metavar="N", help="maximum epochs")
    p.add_argument(
        "--patience",
        type=int_range(1),
        default=20,
        metavar="N",
        help="epochs without validation improvement before stopping",
    )
    p.add_argument("--lr", type=float_range(0, lo_open=True), default=1e-3, help="Adam learning rate")
    p.add_argument("--weight-decay", type=float_range(0), default=1e-4, help="Adam weight decay")
    p.add_argument("--batch", type=int_range(1), default=128, metavar="N", help="mini-batch size")
    p.add_argument(
        "--seed", type=seed, default=0, help="seed of the split, the initialisation and the batches"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing head at --out (only a head: any other file or directory is refused)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")


def _hidden(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected widths like 64,32, got {text!r}") from None
    if not sizes or min(sizes) < 1 or max(sizes) > 65536:
        raise argparse.ArgumentTypeError(f"widths must be integers in 1..65536, got {text!r}")
    return sizes


def run(args: argparse.Namespace) -> int:
    from .._util.outputs import check_output, write_dir
    from ..policies.offline_head import train_head
    from ..traces import load_traces

    hidden = args.hidden
    out = Path(args.out)
    check_output(out, "head", args.overwrite, "--overwrite", reads=[args.traces])

    traces = load_traces(args.traces)
    X = traces.features
    if X is None:
        raise AdaptspecError(
            f"trace set {traces.path or ''} has no features: the head learns from the prefill "
            "features (collect traces with features, or use a synthetic set)"
        )
    reward = args.reward or trace_reward_name(traces.has_timings, args.latency)
    R = trace_rewards(traces, reward, args.latency, args.batch_size)
    X, featurizer = _reduced(traces, X, args.pca)
    ok = np.isfinite(R).all(axis=1)
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        raise AdaptspecError(f"reward {reward} is not finite for request {traces.request_ids[bad]!r}")
    info = _training_info(traces, args, reward, X, featurizer)
    head = train_head(
        np.asarray(X, dtype=np.float64),
        R,
        traces.arms,
        mode=args.mode,
        hidden=hidden,
        val_fraction=args.val_fraction,
        max_epochs=args.epochs,
        patience=args.patience,
        lr=args.lr,
        weight_decay=args.weight_decay,
        batch_size=args.batch,
        seed=args.seed,
        info=info,
    )

    def write(tmp: Path) -> None:
        head.save(tmp)
        if featurizer is not None:
            featurizer.save(tmp)

    write_dir(out, "head", args.overwrite, write, "--overwrite", reads=[args.traces])
    _print_summary(head, out, reward, args.json)
    return 0


def _reduced(traces: Any, X: np.ndarray, pca: int | None) -> tuple[np.ndarray, Any]:
    """The features the head learns from, and the featurizer that made them (None: the raw features);
    by default a PCA to 32 dimensions for features wider than 64 (keeping the length feature)."""
    pca = pca if pca is not None else (32 if X.shape[1] > 64 else 0)
    featurizer = None
    if pca:
        from ..policies.featurizer import Featurizer

        keep = [-1] if str(traces.meta.get("features", "")).endswith("len") else []
        featurizer = Featurizer.fit_traces(traces, dim=pca, keep=keep)
        X = featurizer.transform(X)
    return X, featurizer


def _training_info(
    traces: Any, args: argparse.Namespace, reward: str, X: np.ndarray, featurizer: Any
) -> dict[str, Any]:
    """What the head was trained on, saved with it."""
    from ..traces import path_label

    return {
        "traces": path_label(traces.path),
        "reward": reward,
        "latency": args.latency,
        "batch_size": args.batch_size,
        "features": int(X.shape[1]),
        "featurizer": None if featurizer is None else featurizer.fingerprint,
        # the profile that timed these rewards: a controller calibrates its machine to it (MachineSpeed)
        "timings": traces.meta.get("latency_profile") if reward in MEASURED_REWARDS else None,
        # what it was trained on (training and validation parts): a replay on these requests warns it is in-sample
        "request_ids": [str(r) for r in traces.request_ids.tolist()],
    }


def _print_summary(head: Any, out: Path, reward: str, as_json: bool) -> None:
    """The head's training and validation figures, as one JSON object or as sentences."""
    keys = (
        "n_train",
        "n_val",
        "best_epoch",
        "epochs",
        "val_loss",
        "val_accuracy",
        "val_pct_oracle",
        "val_pct_best_fixed",
    )
    summary = {
        "out": str(out),
        "mode": head.mode,
        "arms": list(head.arms),
        "hidden": list(head.hidden_sizes),
        "reward": reward,
        **{k: head.info[k] for k in keys},
    }
    if as_json:
        print(json.dumps(summary))
    else:
        print(
            f"head ({head.mode}, hidden {list(head.hidden_sizes)}) trained on {summary['n_train']} requests, "
            f"validated on {summary['n_val']}; best epoch {summary['best_epoch']} of {summary['epochs']}"
        )
        print(
            f"validation: {summary['val_pct_oracle']:.1f}% of the per-request oracle, "
            f"{summary['val_pct_best_fixed']:.1f}% of the best fixed block size, "
            f"best arm picked {100 * summary['val_accuracy']:.1f}% of the time (reward {reward})"
        )
        print(f"wrote {out}  (use: --policy head:path={out}  or  --policy neural-linear:head={out})")
