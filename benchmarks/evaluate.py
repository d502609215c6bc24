"""Regenerate docs/evaluation.md, its figures (docs/evaluation/) and docs/evaluation_headline.md.

    python benchmarks/evaluate.py                      # sections 1-5: replay, GPU re-timing, BlockPilot, drift, cold start
    python benchmarks/evaluate.py --blockpilot DIR     # section 3 on a BlockPilot per-prompt result folder
    python benchmarks/evaluate.py --e2e 50             # + section 6: the real decoder, 50 held-out prompts
    python benchmarks/evaluate.py --help               # every option (the same as `adaptspec evaluate`)

The work lives in ``adaptspec.evaluation``; this script is ``adaptspec evaluate --force`` (it replaces the
checkout's generated report, and only files that carry the report's generated-by line).
"""

from __future__ import annotations

import shlex
import sys

from adaptspec.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if any(a in ("-h", "--help") for a in argv):
        sys.exit(main(["evaluate", "--help"]))
    force = [] if "--force" in argv else ["--force"]
    sys.exit(
        main(
            [
                "evaluate",
                "--command-line",
                "python benchmarks/evaluate.py" + "".join(" " + shlex.quote(a) for a in argv),
                *force,
                *argv,
            ]
        )
    )
