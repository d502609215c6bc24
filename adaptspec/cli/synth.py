"""``adaptspec synth --out DIR``: write a synthetic trace set with a known optimum.

Examples::

    adaptspec synth --out runs/cpu --scenario cpu-small --requests 2000 --seed 1
    adaptspec synth --out runs/gpu --scenario dflash-gpu --drift --summary-only
"""

from __future__ import annotations

import argparse
import json

from ..errors import AdaptspecError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..simulators.synthetic import SCENARIOS

    p.add_argument("--out", required=True, metavar="DIR", help="trace set directory to write")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="cpu-small",
                   help="cpu-small: this CPU's small target (tau 1.2-3.5); dflash-gpu: DFlash-like on an H100")
    p.add_argument("--requests", type=int, default=1000, metavar="N", help="number of requests (default: 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dim", type=int, default=None, help="feature dimension (default: the scenario's, 32)")
    p.add_argument("--arms", default=None, metavar="B,B,...", help="block sizes (default: the scenario's)")
    p.add_argument("--drift", action="store_true", help="shift the domain mix over the stored order")
    p.add_argument("--batch-size", type=int, default=1, help="batch size the latencies are taken at")
    p.add_argument("--latency", default=None, metavar="PROFILE", help="latency profile (default: the scenario's)")
    p.add_argument("--summary-only", action="store_true", help="leave out the per-round lists (smaller files)")
    p.add_argument("--force", action="store_true", help="replace an existing trace set at --out")
    p.add_argument("--json", action="store_true", help="print the new trace set's summary as JSON")


def run(args: argparse.Namespace) -> int:
    from ..simulators.synthetic import generate

    arms = None
    if args.arms:
        try:
            arms = [int(a) for a in args.arms.split(",") if a.strip()]
        except ValueError:
            raise AdaptspecError(f"--arms: expected block sizes like 1,2,4,8, got {args.arms!r}") from None
        if not arms or min(arms) < 1:
            raise AdaptspecError(f"--arms: block sizes must be >= 1, got {args.arms!r}")
    if args.requests < 1:
        raise AdaptspecError(f"--requests must be >= 1, got {args.requests}")
    if args.batch_size < 1:
        raise AdaptspecError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.dim is not None and args.dim < 2:
        raise AdaptspecError(f"--dim must be >= 2, got {args.dim}")
    ts = generate(args.scenario, args.requests, seed=args.seed, arms=arms, dim=args.dim, drift=args.drift,
                  per_round=not args.summary_only, batch_size=args.batch_size, latency=args.latency)
    path = ts.write(args.out, overwrite=args.force)
    from ..traces import TraceSet

    info = TraceSet.read(path).info()
    if args.json:
        print(json.dumps(info))
    else:
        print(f"wrote {path}: {info['requests']} requests, arms {info['arms']}, domains {info['domains']}")
    return 0
