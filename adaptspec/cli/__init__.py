"""The ``adaptspec`` command.

Each subcommand lives in its own module under ``adaptspec.cli`` with two functions,
``add_arguments(parser)`` and ``run(args) -> int``; only the module of the command being
run is imported, so ``adaptspec simulate`` never pays for loading torch.
User errors print one line, ``adaptspec COMMAND: error: ...``, and exit 2, without a
traceback: a flag that does not parse (every flag is checked as it is parsed, by the types
in :mod:`adaptspec.cli._types`, before anything is loaded), an
:class:`~adaptspec.errors.AdaptspecError`, or an ``OSError`` (a file that cannot be read or
written).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys

from .._util import threads
from ..errors import AdaptspecError

#: name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("adaptspec.cli.demo", "run the bundled target and drafter through AdaptiveController"),
    "simulate": ("adaptspec.cli.simulate", "replay a trace set through one or more policies"),
    "ope": ("adaptspec.cli.ope", "off-policy evaluation of a policy on decision logs"),
    "synth": ("adaptspec.cli.synth", "write a synthetic trace set with a known optimum"),
    "import-blockpilot": ("adaptspec.cli.import_blockpilot", "import a BlockPilot per-prompt result folder"),
    "traces": ("adaptspec.cli.traces", "inspect trace sets and decision logs"),
    "train-head": ("adaptspec.cli.train_head", "train the BlockPilot-style offline head on a trace set"),
    "train-drafter": ("adaptspec.cli.train_drafter", "generate distillation data and train a drafter"),
    "distill": (
        "adaptspec.cli.distill",
        "grow a drafter's distillation corpus (the target's own answers, token ids)",
    ),
    "collect": (
        "adaptspec.cli.collect",
        "run a speculator (the bundled one, or yours with --speculator) at every block size to collect a trace set",
    ),
    "profile-latency": ("adaptspec.cli.profile_latency", "measure draft/verify latency on this machine"),
    "serve": ("adaptspec.cli.serve", "HTTP server with A/B testing, decision logs and metrics"),
    "ab-report": ("adaptspec.cli.ab_report", "A/B analysis of decision logs"),
    "evaluate": ("adaptspec.cli.evaluate", "regenerate docs/evaluation.md and its plots"),
    "export-vllm": (
        "adaptspec.cli.export_vllm",
        "write the bundled target and its DFlash drafter as vLLM's dflash method loads them",
    ),
    "collect-vllm": (
        "adaptspec.cli.collect_vllm",
        "collect a trace set from vLLM: every block size run on every prompt through the plug-in",
    ),
    "export-vllm-table": (
        "adaptspec.cli.export_vllm_table",
        "tune vLLM's per-batch-size table (num_speculative_tokens_per_batch_size) from trace sets",
    ),
    "pool-vllm-traces": (
        "adaptspec.cli.pool_vllm_traces",
        "pool collect-vllm's trace sets at several loads, the plug-in's load features in each context",
    ),
}


def _available() -> dict[str, tuple[str, str]]:
    return {n: v for n, v in COMMANDS.items() if importlib.util.find_spec(v[0]) is not None}


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line on stderr (exit 2), naming the command."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported to add its arguments."""
    parser = OneLineParser(
        prog="adaptspec",
        description="Adaptive block sizes for block-diffusion speculative decoding.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == command:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(run=mod.run)
    return parser


def _one_line(e: object) -> str:
    return " ".join(str(e).split())


def main(argv: list[str] | None = None) -> int:
    threads.apply()  # OpenMP's spin, before any command loads torch (adaptspec._util.threads)
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(command)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a flag that does not parse (its one line is printed)
        return e.code if isinstance(e.code, int) else 2
    try:
        return int(args.run(args) or 0)
    except AdaptspecError as e:
        print(f"adaptspec {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (| head): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # a file the command could not read or write: the user's to fix
        where = f"{e.filename}: " if e.filename else ""
        print(f"adaptspec {args.command}: error: {where}{_one_line(e.strerror or e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"adaptspec {args.command}: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """The ``adaptspec`` command: :func:`main`, and its exit status. A refusal (status 2: one line
    said, nothing changed) leaves at once, past the interpreter's teardown: a native thread pool
    (pyarrow's) torn down while a worker is still alive aborts the process there now and then
    ("terminate called without an active exception", status -6; apache/arrow#34314), which would
    turn the one-line refusal into a crash."""
    code = main()
    if code == 2:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
