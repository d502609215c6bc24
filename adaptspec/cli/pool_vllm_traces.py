"""``adaptspec pool-vllm-traces``: collect-vllm's trace sets at several loads, pooled with the load in each context.

Each set (``collect-vllm --concurrency C``) becomes requests ``ID@cC`` whose features are the
plug-in's prompt features followed by its load features at ``C`` rows (:mod:`adaptspec.vllm.pool`):
the context the plug-in decides on with ``"load_features": true``. ``train-head``, ``simulate``
and ``evaluate`` read the result; a head trained on it is a variant's spec for a plug-in run
with ``"load_features": true``.

Example::

    adaptspec pool-vllm-traces runs/c1 runs/c4 runs/c8 --out runs/pooled
    adaptspec train-head runs/pooled --out runs/vllm-head
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._types import input_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "traces",
        nargs="+",
        type=input_dir,
        metavar="TRACES",
        help="collect-vllm trace sets, one per concurrency (their meta.json concurrency, 1 when absent)",
    )
    p.add_argument(
        "--out", type=Path, required=True, help="trace set directory to write (new, empty, or with --force)"
    )
    p.add_argument("--force", action="store_true", help="replace the trace set at OUT (only a trace set)")


def run(args: argparse.Namespace) -> int:
    from .._util.outputs import check_output
    from ..traces import load_traces
    from ..vllm.pool import with_load

    check_output(args.out, "traceset", args.force, reads=args.traces)
    pooled = with_load([load_traces(t) for t in args.traces])
    pooled.write(args.out, overwrite=args.force)
    levels = ", ".join(f"{c} ({pooled.meta['pooled_from'][str(c)]})" for c in pooled.meta["concurrency"])
    print(
        f"wrote {args.out}: {pooled.n_requests} requests x {len(pooled.arms)} block sizes at concurrency {levels}; "
        f"features: {len(pooled.meta['feature_names'])} (the plug-in's with load_features)"
    )
    return 0
