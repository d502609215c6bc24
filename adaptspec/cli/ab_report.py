"""``adaptspec ab-report LOGS``: A/B analysis of a decision log written by ``adaptspec serve``.

Per variant: reward, tau, throughput and latency with intervals; an always-valid sequential
test of the difference in reward between every pair of variants (stop when it is
significant: the answer stays valid however often the report is run); off-policy estimates
of each variant's value on the other variants' logged requests when the variants' policies
are given (``--checkpoint-dir`` of the server, or ``--policy NAME=SPEC``). Journal rows not
yet rolled into Parquet parts are included. A switchback test's slice records (``serve
--batched --ab-design switchback``) add the design's own estimate: throughput per variant
over its slices, and the difference and ratio with intervals over slices. See docs/serving.md.

Examples::

    adaptspec ab-report runs/serve/log
    adaptspec ab-report runs/serve/log --checkpoint-dir runs/serve/ckpt --json
    adaptspec ab-report runs/serve/log --policy B=fixed:16 --alpha 0.01
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from ..errors import AdaptspecError
from ._types import float_range, input_dir, int_range


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "logs",
        metavar="LOGS",
        nargs="+",
        help="decision log directory; several (one per replica of a fleet), or a parent directory of "
        "replicas' log directories, give one report over all of them",
    )
    p.add_argument(
        "--checkpoint-dir",
        type=input_dir,
        default=None,
        metavar="DIR",
        help="the server's checkpoint directory: each variant's policy is rebuilt from its newest "
        "checkpoint for the off-policy estimates",
    )
    p.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="the policy of variant NAME for the off-policy estimates (as built: a learning policy is "
        "untrained unless --checkpoint-dir gives its state), repeatable",
    )
    p.add_argument(
        "--alpha",
        type=float_range(0, 1, lo_open=True, hi_open=True),
        default=0.05,
        help="significance level of the sequential test",
    )
    p.add_argument(
        "--tau",
        type=float_range(0, lo_open=True),
        default=0.2,
        metavar="SD",
        help="width of the test's mixture, in pooled standard deviations (default 0.2)",
    )
    p.add_argument(
        "--min-n",
        type=int_range(2),
        default=10,
        metavar="N",
        help="rewards per variant before testing (at least 2; default 10)",
    )
    p.add_argument(
        "--bootstrap",
        type=int_range(10),
        default=200,
        metavar="N",
        help="bootstrap resamples of the estimates",
    )
    p.add_argument(
        "--slice-burn-in",
        type=int_range(0),
        default=0,
        metavar="K",
        help="switchback: leave each slice's first K rounds out of the estimate (rows decided in the "
        "previous slice are still finishing then; default 0)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def load_policies(checkpoint_dir: str | Path | None, specs: list[str]) -> dict[str, Any]:
    """Variant -> policy: rebuilt from the newest checkpoint of each variant, or from ``NAME=SPEC``."""
    from ..ab.variants import named_specs
    from ..control.policy_build import build_policy
    from ..control.policy_checkpoint import latest_checkpoint, load_policy, read_checkpoint
    from ..policies.spec import make_policy

    out: dict[str, Any] = {}
    given = named_specs(specs, "--policy", "B=fixed:16")
    if checkpoint_dir is not None:
        root = Path(checkpoint_dir)
        if not root.is_dir():
            raise AdaptspecError(f"--checkpoint-dir {root}: no such directory")
        found = {sub: latest_checkpoint(sub) for sub in sorted(p for p in root.iterdir() if p.is_dir())}
        if not any(found.values()):
            raise AdaptspecError(
                f"--checkpoint-dir {root}: no checkpoints (a server's checkpoint directory has one "
                "subdirectory per variant holding ckpt-* checkpoints)"
            )
        for sub, ck in found.items():
            if ck is None or sub.name in given:
                continue
            meta = read_checkpoint(ck)
            spec = meta.get("policy_spec")
            if not spec:
                continue
            pol = build_policy(make_policy, spec, tuple(meta["arms"]), meta.get("seed"))
            load_policy(ck, pol)
            out[meta.get("variant") or sub.name] = pol
    for name, spec in given.items():
        out[name] = spec
    return out


def run(args: argparse.Namespace) -> int:
    from ..analysis.ab import analyze, rows_to_arrays
    from ..fleet.logs import fleet_log_rows, log_dirs

    dirs = log_dirs(args.logs)
    path = dirs[0] if len(dirs) == 1 else Path(os.path.commonpath([str(d) for d in dirs]))
    rows = fleet_log_rows(dirs)
    if not rows:
        raise AdaptspecError(f"{path}: the decision log is empty")
    data = rows_to_arrays(rows)
    policies = load_policies(args.checkpoint_dir, args.policy)
    if any(isinstance(p, str) for p in policies.values()):
        from ..policies.spec import make_policy

        arms = sorted({a for a in data["arms"]})
        if len(arms) != 1:
            raise AdaptspecError(f"{path}: rows have different arm sets; cannot build --policy specs")
        policies = {k: make_policy(v, arms[0]) if isinstance(v, str) else v for k, v in policies.items()}
    from ..traces.slice_log import slice_rows

    slices = [r for d in dirs for r in slice_rows(d)]
    if args.slice_burn_in and not slices:
        raise AdaptspecError(f"--slice-burn-in: {path} has no switchback slice records (slices-*.jsonl)")
    report = analyze(
        data,
        policies=policies,
        alpha=args.alpha,
        tau_sd=args.tau,
        min_n=args.min_n,
        n_boot=args.bootstrap,
        slices=slices,
        slice_burn_in=args.slice_burn_in,
    )
    report.logs = [str(d) for d in dirs]
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(
            f"{path}:"
            if len(dirs) == 1
            else f"{len(dirs)} decision logs ({', '.join(d.name for d in dirs)}):"
        )
        print(report.to_text())
    return 0
