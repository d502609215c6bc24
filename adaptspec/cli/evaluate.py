"""``adaptspec evaluate``: regenerate ``docs/evaluation.md``, its figures and the README's headline table.

Examples::

    adaptspec evaluate                                   # sections 1-5 on the bundled benchmark trace set
    adaptspec evaluate --blockpilot ../shared/data/blockpilot_qwen3-8b_dflash-b16/gsm8k_0T0.0
    adaptspec evaluate --e2e 50                          # also section 6, on the real decoder
    adaptspec evaluate --sections e2e --e2e 3 --e2e-max-new-tokens 32 --drafter runs/drafter
    adaptspec evaluate --quick --docs /tmp/eval          # a fast, rough pass somewhere else
    adaptspec evaluate --force                           # replace the checkout's docs/evaluation.md

An earlier report is replaced only with ``--force``, and only files an earlier run wrote (the
markdown files carry a generated-by line; the figures folder holds only results.json and the
figures): anything else is refused with one line before any section runs.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from ..errors import AdaptspecError
from ._types import MAX_BLOCK_SIZE, int_range, threads

QUICK = {
    "splits": 1,
    "orders": 2,
    "passes": 3,
    "blockpilot_passes": 10,
    "drift_phase_steps": 300,
    "drift_synthetic_requests": 800,
    "coldstart_repeats": 1,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    _add_input_options(p)
    _add_e2e_options(p)
    _add_run_options(p)
    _add_output_options(p)


def _add_input_options(p: argparse.ArgumentParser) -> None:
    """What is evaluated: the trace set, a BlockPilot result folder and the sections."""
    p.add_argument(
        "--traces",
        default=None,
        metavar="DIR",
        help="trace set to evaluate (default: the bundled public "
        "benchmark set, adaptspec/data/traces/benchmarks)",
    )
    p.add_argument(
        "--blockpilot",
        default=None,
        metavar="DIR",
        help="BlockPilot per-prompt result folder for section 3 (e.g. .../gsm8k_0T0.0); without it an "
        "earlier section 3 is kept, or the section says how to run it",
    )
    p.add_argument(
        "--sections",
        default=None,
        metavar="LIST",
        help="comma-separated sections to regenerate: replay, hardware, blockpilot, drift, coldstart, e2e, rounds, load, full_info "
        "(default: all but e2e; e2e is added by --e2e)",
    )


def _add_e2e_options(p: argparse.ArgumentParser) -> None:
    """Section 6 on the real decoder: its prompts, tokens, fixed block size and models."""
    p.add_argument(
        "--e2e",
        type=int_range(1),
        default=None,
        metavar="N_PROMPTS",
        help="also run section 6: N held-out prompts through the real decoder (slow: minutes per prompt "
        "set on a CPU)",
    )
    p.add_argument(
        "--e2e-max-new-tokens",
        type=int_range(1),
        default=64,
        metavar="N",
        help="new tokens per prompt in section 6",
    )
    p.add_argument(
        "--e2e-fixed",
        type=int_range(1, MAX_BLOCK_SIZE),
        default=None,
        metavar="B",
        help="fixed block size for section 6 (default: the best on the trace set's training split)",
    )
    p.add_argument(
        "--drafter", default=None, metavar="DIR", help="drafter for section 6 (default: the bundled one)"
    )
    p.add_argument(
        "--target", default=None, metavar="DIR", help="target for section 6 (default: the bundled SmolLM2)"
    )
    p.add_argument("--threads", type=threads, default=None, metavar="N", help="torch threads for section 6")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """The replay's splits, orders and passes."""
    p.add_argument(
        "--splits",
        type=int_range(1),
        default=None,
        metavar="N",
        help="training/evaluation splits (default 3)",
    )
    p.add_argument(
        "--orders", type=int_range(1), default=None, metavar="N", help="stream orders per split (default 3)"
    )
    p.add_argument(
        "--passes",
        type=int_range(1),
        default=None,
        metavar="N",
        help="passes over the evaluation requests per stream (default 10)",
    )


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """What is written: the docs, replacing them, JSON, progress."""
    p.add_argument(
        "--render-only",
        action="store_true",
        help="recompute nothing: rewrite the report and the headline from evaluation/results.json",
    )
    p.add_argument(
        "--quick", action="store_true", help="far fewer runs and shorter streams (rough figures, seconds)"
    )
    p.add_argument(
        "--docs",
        default=None,
        metavar="DIR",
        help="write evaluation.md, evaluation_headline.md and evaluation/ here (default: the checkout's "
        "docs/; needed when adaptspec is installed, not run from a checkout)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier report in --docs (only files adaptspec evaluate wrote: anything else "
        "is refused)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the results (every section's data) as one JSON object"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--command-line", default=None, help=argparse.SUPPRESS
    )  # how benchmarks/evaluate.py was called


def run(args: argparse.Namespace) -> int:
    from ..evaluation import E2EOptions, Outputs, Request, Settings, run_evaluation
    from ..evaluation.runner import REPLAY_SECTIONS, checkout

    opts = dict(QUICK) if args.quick else {}
    for name in ("splits", "orders", "passes"):
        v = getattr(args, name)
        if v is not None:
            if v < 1:
                raise AdaptspecError(f"--{name} must be >= 1, got {v}")
            opts[name] = v
    settings = Settings(progress=not args.no_progress, **opts)
    if args.render_only:
        if args.sections is not None or args.e2e is not None:
            raise AdaptspecError("--render-only recomputes nothing: it does not take --sections or --e2e")
        sections: tuple[str, ...] = ()
    elif args.sections is not None:
        sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
        if not sections:
            raise AdaptspecError("--sections is empty")
    else:
        sections = REPLAY_SECTIONS
    if args.e2e is not None and args.e2e < 1:
        raise AdaptspecError(f"--e2e must be >= 1 prompt, got {args.e2e}")
    if args.threads is not None and args.threads < 1:
        raise AdaptspecError(f"--threads must be >= 1, got {args.threads}")
    e2e = (
        None
        if args.e2e is None
        else E2EOptions(
            args.e2e, args.e2e_max_new_tokens, args.drafter, args.target, args.e2e_fixed, args.threads
        )
    )
    if args.blockpilot is not None and not Path(args.blockpilot).is_dir():
        print(
            f"adaptspec evaluate: warning: --blockpilot {args.blockpilot} does not exist; section 3 will say so",
            file=sys.stderr,
        )
    command = args.command_line or (
        "adaptspec evaluate" + "".join(" " + shlex.quote(a) for a in sys.argv[2:])
        if sys.argv[1:2] == ["evaluate"]
        else "adaptspec evaluate"
    )
    req = Request(
        traces=args.traces,
        sections=sections,
        blockpilot=args.blockpilot,
        e2e=e2e,
        settings=settings,
        command=command,
    )
    if args.docs is None and checkout() is None:
        raise AdaptspecError(
            "--docs DIR is needed: adaptspec is installed, not run from a checkout with a docs/ "
            "folder to regenerate"
        )
    out = Outputs.default(Path(args.docs) if args.docs else None)
    out.check(args.force)  # before any section runs
    if args.render_only and not (out.folder / "results.json").is_file():
        raise AdaptspecError(
            f"--render-only rewrites the report from an earlier run's {out.folder / 'results.json'}, "
            "which does not exist"
        )
    results = run_evaluation(req, out)
    if args.json:
        print(json.dumps({"report": str(out.report), "headline": str(out.headline), **results}))
    else:
        latest = max(results["runs"], default=None)
        ran = (
            [k for k, s in results["sections"].items() if s["run"] == latest] if not args.render_only else []
        )
        print(
            f"wrote {out.report}, {out.headline} and {out.folder}/ (regenerated: {', '.join(ran) or 'nothing'})"
        )
    return 0
