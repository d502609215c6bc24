"""``adaptspec export-vllm-table``: vLLM's per-batch-size table, tuned from trace sets.

Writes (or prints) the ``speculative_config`` keys of a static configuration, for operators who
want one instead of the plug-in: ``num_speculative_tokens`` and
``num_speculative_tokens_per_batch_size`` (:mod:`adaptspec.vllm.table`). Measured: one trace set
per batch size, collected at that concurrency (``collect-vllm --concurrency C``); modelled
(``--latency``): one trace set's acceptance re-timed at ``--batch-sizes`` by a latency profile.

Examples::

    adaptspec export-vllm-table runs/traces-c1 runs/traces-c4 runs/traces-c8 --out table.json
    adaptspec export-vllm-table runs/traces-c1 --latency cpu-smollm2-batched --out table.json
    python -m vllm.entrypoints.openai.api_server --model TARGET --speculative-config \\
        "$(python -c 'import json,sys; print(json.dumps({"method": "dflash", "model": "DRAFTER", **json.load(open("table.json"))}))')"
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..errors import AdaptspecError
from ._types import input_dir, int_range


def _batch_sizes(text: str) -> list[int]:
    """Comma-separated batch sizes >= 1, sorted, duplicates dropped."""
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected batch sizes like 1,2,4,8, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"expected batch sizes >= 1 like 1,2,4,8, got {text!r}")
    return sizes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "traces",
        nargs="+",
        type=input_dir,
        metavar="TRACES",
        help="trace sets: one per batch size (its meta.json concurrency, 1 when absent), or one with --latency",
    )
    p.add_argument(
        "--latency",
        metavar="PROFILE",
        default=None,
        help="re-time one trace set's acceptance at --batch-sizes with this latency profile (a name such "
        "as cpu-smollm2-batched, or a JSON file) instead of the trace sets' own measured times",
    )
    p.add_argument(
        "--batch-sizes",
        type=_batch_sizes,
        default=[1, 2, 4, 8, 16, 32, 64],
        metavar="N,N,...",
        help="with --latency: the batch sizes where the table may change (default 1,2,4,8,16,32,64)",
    )
    p.add_argument(
        "--max-batch",
        type=int_range(1),
        default=256,
        help="the table's last batch size (vLLM's max_num_seqs; default 256)",
    )
    p.add_argument("--out", type=Path, default=None, help="write the JSON here (default: print it)")
    p.add_argument("--force", action="store_true", help="replace --out")


def run(args: argparse.Namespace) -> int:
    import sys

    from ..traces import load_traces
    from ..vllm.table import measured_levels, modelled_levels, speculative_entry, table_ranges

    if args.out is not None:
        _check_out(args.out, args.force)
    if args.latency is not None and len(args.traces) > 1:
        raise AdaptspecError("--latency re-times one trace set: give one TRACES")
    sets = [load_traces(t) for t in args.traces]
    if args.latency is not None:
        from ..costs.latency import get_profile

        levels = modelled_levels(
            sets[0], get_profile(args.latency), [b for b in args.batch_sizes if b <= args.max_batch]
        )
        how = f"modelled: {args.traces[0]}'s acceptance timed by {args.latency}"
    else:
        levels = measured_levels(sets)
        how = "measured: " + ", ".join(
            f"{t} at batch size {ts.meta.get('concurrency', 1)}" for t, ts in zip(args.traces, sets)
        )
    ranges = table_ranges(levels, args.max_batch)
    entry = speculative_entry(ranges)
    text = json.dumps(entry)
    for rows, b, rate, arms in levels:
        shown = ", ".join(f"B={a} {r:.3g}" for a, r in zip(arms, rate))
        print(f"batch size {rows}: K = {b - 1} (tokens/s {shown})", file=sys.stderr)
    if args.out is None:
        print(text)
        return 0
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    try:
        tmp.write_text(text + "\n")
        os.replace(tmp, args.out)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"wrote {args.out} ({how}): {text}")
    return 0


def _check_out(out: Path, force: bool) -> None:
    """``out`` may be written: new, or (with ``--force``) a table this command wrote."""
    if out.is_symlink() or (out.exists() and not out.is_file()):
        raise AdaptspecError(f"--out {out}: not a regular file: refusing to replace it")
    if not out.exists():
        if not out.parent.is_dir():
            raise AdaptspecError(f"--out {out}: directory {out.parent} does not exist")
        return
    if not force:
        raise AdaptspecError(f"--out {out}: exists (add --force to replace it)")
    try:
        ours = "num_speculative_tokens_per_batch_size" in json.loads(out.read_text())
    except (ValueError, TypeError, UnicodeDecodeError):
        ours = False
    if not ours:
        raise AdaptspecError(
            f"--out {out}: exists and is not a table this command wrote: refusing to replace it"
        )
