"""``adaptspec import-blockpilot DIR --out TRACES``: a BlockPilot result folder as a trace set.

Example::

    adaptspec import-blockpilot BlockPilot/utils/gsm8k_0T0.0 --out runs/bp --target Qwen3-8B
    adaptspec simulate runs/bp --policy fixed:16 --reward tau
"""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dir",
        metavar="DIR",
        help="a {dataset}_{N}T{temperature} folder of {B}.json files, or a folder of such folders",
    )
    p.add_argument("--out", required=True, metavar="TRACES", help="trace set directory to write")
    p.add_argument("--target", default=None, help="target model name to record in meta.json")
    p.add_argument("--drafter", default=None, help="drafter name to record in meta.json")
    p.add_argument("--hardware", default=None, help="hardware to record in meta.json")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing trace set at --out (only a trace set: anything else is refused)",
    )
    p.add_argument("--json", action="store_true", help="print the new trace set's summary as JSON")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from .._util.outputs import check_output
    from ..traces import TraceSet, import_blockpilot

    check_output(args.out, "traceset", args.force, reads=[args.dir])
    ts = import_blockpilot(args.dir, target=args.target, drafter=args.drafter, hardware=args.hardware)
    path = ts.write(args.out, overwrite=args.force)
    info = TraceSet.read(path).info()
    choice = ts.column("blockpilot_choice")
    if np.isfinite(choice).all():
        tau = ts.tau_matrix()
        at = tau[np.arange(len(ts)), np.searchsorted(ts.arm_array, choice.astype(np.int64))]
        info["blockpilot_choice_mean_tau"] = round(float(at.mean()), 4)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"wrote {path}: {info['requests']} requests, arms {info['arms']}, domains {info['domains']}")
    print("mean tau per block size: " + ", ".join(f"{b}: {v:.2f}" for b, v in info["mean_tau"].items()))
    print(f"per-request best: {info['oracle_mean_tau']:.2f}")
    if "blockpilot_choice_mean_tau" in info:
        print(
            f"BlockPilot's choice (request column blockpilot_choice): mean tau {info['blockpilot_choice_mean_tau']:.2f}"
        )
    return 0
