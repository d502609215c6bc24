"""``adaptspec traces info PATH`` / ``adaptspec traces validate PATH``: trace sets and decision logs.

Examples::

    adaptspec traces info                   # the bundled default (public benchmark) trace set
    adaptspec traces info runs/log --json   # a decision log
    adaptspec traces validate runs/bp
"""

from __future__ import annotations

import argparse
import json

from ._types import int_range


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_ in (
        ("info", "summarise a trace set or decision log"),
        ("validate", "check a trace set or decision log; exit 2 naming the first problem"),
    ):
        s = sub.add_parser(name, help=help_, description=help_)
        s.add_argument(
            "path",
            nargs="?",
            default=None,
            metavar="PATH",
            help="trace set directory or decision log (default: the bundled public "
            "benchmark set, adaptspec/data/traces/benchmarks)",
        )
        s.add_argument("--json", action="store_true", help="print one JSON object")
    d = sub.add_parser(
        "derive",
        help="per-request trace set implied by a dense one (fixed block sizes, a latency profile)",
        description="per-request trace set implied by a dense one: every round replayed exactly, "
        "its time from a latency profile",
    )
    d.add_argument("path", metavar="DENSE", help="dense trace set directory (adaptspec collect --dense)")
    d.add_argument("--out", required=True, metavar="TRACES", help="trace set directory to write")
    d.add_argument("--arms", default="1,2,4,6,8,10,12,16", help="block sizes (default 1,2,4,6,8,10,12,16)")
    d.add_argument(
        "--latency", default="cpu-smollm2-bf16", metavar="PROFILE", help="latency profile name or JSON file"
    )
    d.add_argument(
        "--force",
        action="store_true",
        help="replace TRACES if it is a trace set adaptspec wrote (and nothing else)",
    )
    r = sub.add_parser(
        "rounds",
        help="per-round schedules, fixed block sizes and both oracles replayed on a dense set",
        description="replay per-round schedules and every fixed block size on a dense trace set, "
        "with the per-request and per-round oracles; aggregate tok/s over plain decoding",
    )
    r.add_argument("path", metavar="DENSE", help="dense trace set directory (adaptspec collect --dense)")
    r.add_argument(
        "--schedules",
        default="confidence:0.4;history",
        metavar="SPECS",
        help="round schedules, ';'-separated (fixed:B, confidence[:T[,nobackoff]], history; "
        "default confidence:0.4;history)",
    )
    r.add_argument(
        "--latency", default="cpu-smollm2-fast", metavar="PROFILE", help="latency profile name or JSON file"
    )
    r.add_argument("--batch", type=int_range(1), default=1, help="batch size the profile times (default 1)")
    r.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from ..traces import DEFAULT_TRACES, open_any

    if args.action == "derive":
        from .._util.outputs import check_output
        from ..costs.latency import get_profile
        from ..errors import AdaptspecError
        from ..traces.dense import DenseTraceSet, to_traceset

        check_output(args.out, "traceset", args.force, reads=[args.path])  # never the dense set itself

        try:
            arms = [int(a) for a in args.arms.split(",") if a.strip()]
        except ValueError:
            raise AdaptspecError(f"--arms takes comma-separated block sizes, got {args.arms!r}") from None
        traces = to_traceset(DenseTraceSet.open(args.path), arms, get_profile(args.latency))
        traces.write(args.out, overwrite=args.force)
        print(
            f"wrote {args.out}: {len(traces)} requests x {len(arms)} block sizes (times from {args.latency})"
        )
        return 0

    if args.action == "rounds":
        return _rounds(args)
    obj = open_any(DEFAULT_TRACES if args.path is None else args.path)
    info = obj.info()
    if args.action == "validate":
        if args.json:
            print(json.dumps({"ok": True, "kind": info["kind"], "path": info["path"]}))
        else:
            n = info.get("requests", info.get("decisions"))
            print(
                f"ok: {info['kind']} {info['path']} ({n} {'requests' if info['kind'] == 'traceset' else 'decisions'})"
            )
        return 0
    if args.json:
        print(json.dumps(info, default=str))
        return 0
    width = max(len(k) for k in info)
    for k, v in info.items():
        if isinstance(v, dict) and v and not any(isinstance(x, dict) for x in v.values()):
            v = ", ".join(f"{a}: {b}" for a, b in v.items())
        print(f"{k.ljust(width)}  {v}")
    return 0


def _rounds(args: argparse.Namespace) -> int:
    from ..schedules import parse_schedule
    from ..simulators.rounds import evaluate_rounds
    from ..traces.dense import DenseTraceSet

    ds = DenseTraceSet.open(args.path)
    specs = [x.strip() for x in args.schedules.replace(";", "|").split("|") if x.strip()]
    schedules = {spec: parse_schedule(spec, ds.max_block_size) for spec in specs}
    items = [(rid, dom.split("/")[0], r) for rid, dom, r in ds.requests()]  # by benchmark
    rep = evaluate_rounds(items, schedules, args.latency, batch=args.batch, max_new_tokens=ds.max_new_tokens)
    best = rep.best_fixed()
    names = ["plain", best, *schedules, "per-request oracle", "per-round oracle"]
    rows = rep.table(names)
    if args.json:
        print(
            json.dumps(
                {
                    "dense": str(ds.path),
                    "requests": len(items),
                    "profile": rep.profile,
                    "batch": rep.batch,
                    "best_fixed": best,
                    "rows": rows,
                }
            )
        )
        return 0
    doms = rep.domain_names()
    print(
        f"{ds.path}: {len(items)} requests, profile {rep.profile}, batch {rep.batch}; tok/s over plain decoding "
        f"(best fixed block size overall: {best.split(':')[1]})"
    )
    print(f"{'schedule':24s} {'all':>7s} " + " ".join(f"{d:>10s}" for d in doms))
    for row in rows:
        print(f"{row['schedule']:24s} {row['all']:7.3f} " + " ".join(f"{row[d]:10.3f}" for d in doms))
    return 0
