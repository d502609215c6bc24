"""``adaptspec synth --out DIR``: write a synthetic trace set with a known optimum.

Examples::

    adaptspec synth --out runs/cpu --scenario cpu-small --requests 2000 --seed 1
    adaptspec synth --out runs/gpu --scenario dflash-gpu --drift --summary-only
"""

from __future__ import annotations

import argparse
import json

from ._types import block_sizes, int_range, seed


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..simulators.synthetic import SCENARIOS

    p.add_argument("--out", required=True, metavar="DIR", help="trace set directory to write")
    p.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="cpu-small",
        help="cpu-small: this CPU's small target (tau 1.2-3.5); dflash-gpu: DFlash-like on an H100",
    )
    p.add_argument(
        "--requests",
        type=int_range(1, 10_000_000),
        default=1000,
        metavar="N",
        help="number of requests (default: 1000)",
    )
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument(
        "--dim",
        type=int_range(2, 65536),
        default=None,
        help="feature dimension (default: the scenario's, 32)",
    )
    p.add_argument(
        "--arms",
        type=block_sizes,
        default=None,
        metavar="B,B,...",
        help="block sizes (default: the scenario's)",
    )
    p.add_argument("--drift", action="store_true", help="shift the domain mix over the stored order")
    p.add_argument("--batch-size", type=int_range(1), default=1, help="batch size the latencies are taken at")
    p.add_argument(
        "--latency", default=None, metavar="PROFILE", help="latency profile (default: the scenario's)"
    )
    p.add_argument(
        "--summary-only", action="store_true", help="leave out the per-round lists (smaller files)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing trace set at --out (only a trace set: anything else is refused)",
    )
    p.add_argument("--json", action="store_true", help="print the new trace set's summary as JSON")


def run(args: argparse.Namespace) -> int:
    from .._util.outputs import check_output
    from ..simulators.synthetic import generate

    check_output(args.out, "traceset", args.force)
    ts = generate(
        args.scenario,
        args.requests,
        seed=args.seed,
        arms=args.arms,
        dim=args.dim,
        drift=args.drift,
        per_round=not args.summary_only,
        batch_size=args.batch_size,
        latency=args.latency,
    )
    path = ts.write(args.out, overwrite=args.force)
    from ..traces import TraceSet

    info = TraceSet.read(path).info()
    if args.json:
        print(json.dumps(info))
    else:
        print(f"wrote {path}: {info['requests']} requests, arms {info['arms']}, domains {info['domains']}")
    return 0
