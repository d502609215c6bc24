"""Run the evaluation's sections and (re)write the report, its figures and ``results.json``.

``run_evaluation`` regenerates the sections it is asked for and keeps every other section as
the last run that produced it left it (``results.json`` records which run that was, when,
on which commit and which trace set), so the expensive end-to-end section can be refreshed on
its own and the report always says which run each section comes from.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import AdaptspecError
from .core import Settings, provenance
from .report import SECTIONS, render_headline, render_report
from .._util.atomic import json_default

#: sections a plain run regenerates (the end-to-end one needs ``e2e_prompts``)
REPLAY_SECTIONS = ("replay", "hardware", "blockpilot", "drift", "coldstart", "rounds")
RESULTS_FORMAT = 1


def repo_root() -> Path:
    """The checkout this package lives in (its ``docs/`` is the default output), else the working directory."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "pyproject.toml").is_file() and (here / "adaptspec").is_dir() else Path.cwd()


@dataclass
class Outputs:
    """Where the report goes: the markdown, the headline table, and the folder for figures and results.json."""

    report: Path
    headline: Path
    folder: Path

    @classmethod
    def default(cls, docs: Path | None = None) -> "Outputs":
        d = Path(docs) if docs is not None else repo_root() / "docs"
        return cls(d / "evaluation.md", d / "evaluation_headline.md", d / "evaluation")


@dataclass
class E2EOptions:
    """The end-to-end section's options (``--e2e N`` and friends)."""

    prompts: int
    max_new_tokens: int = 64
    drafter: str | None = None
    target: str | None = None
    fixed_block: int | None = None
    threads: int | None = None


@dataclass
class Request:
    """One evaluation run: which sections, on which data, with which settings."""

    traces: str | None = None
    sections: tuple[str, ...] = REPLAY_SECTIONS
    blockpilot: str | None = None
    e2e: E2EOptions | None = None
    settings: Settings = field(default_factory=Settings)
    command: str = ""


def plan_sections(req: Request) -> list[str]:
    """The sections this run regenerates, in report order.

    Section 3 needs ``--blockpilot`` to be regenerated unless it was never run (then it is
    written as "not run" with instructions); section 6 runs only with ``--e2e``.
    """
    unknown = [s for s in req.sections if s not in SECTIONS]
    if unknown:
        raise AdaptspecError(f"unknown section {unknown[0]!r}: choose from {', '.join(SECTIONS)}")
    out = [s for s in SECTIONS if s in req.sections or (s == "e2e" and req.e2e is not None)]
    if "e2e" in out and req.e2e is None:
        raise AdaptspecError("section e2e needs --e2e N_PROMPTS")
    return out


def load_results(path: Path) -> dict[str, Any]:
    """The stored results, or an empty structure when there are none yet."""
    if not path.exists():
        return {"format": RESULTS_FORMAT, "runs": {}, "sections": {}}
    try:
        res = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise AdaptspecError(f"{path}: not readable JSON ({e}); delete it to start afresh") from None
    if not isinstance(res, dict) or res.get("format") != RESULTS_FORMAT:
        raise AdaptspecError(f"{path}: not an evaluation results file of format {RESULTS_FORMAT}; delete it to start afresh")
    res.setdefault("runs", {})
    res.setdefault("sections", {})
    return res


def _git() -> str:
    try:
        root = repo_root()
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return f"{sha}{' (uncommitted changes)' if dirty else ''}" if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        raise AdaptspecError(f"cannot write {path}: {e.strerror or e}") from None


def _rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def run_section(key: str, traces: Any, req: Request, out: Outputs) -> tuple[dict[str, Any], list[Path]]:
    """Compute one section and draw its figures; returns its data and the figure files."""
    from . import plots

    st = req.settings
    folder = out.folder
    if key == "replay":
        from .replay_sections import section_replay

        data, res = section_replay(traces, st)
        return data, [plots.plot_replay(data, res, folder / "replay.png")]
    if key == "hardware":
        from .replay_sections import section_hardware

        data, p = section_hardware(traces, st)
        return data, [plots.plot_hardware(p, folder / "hardware.png")]
    if key == "blockpilot":
        from .replay_sections import section_blockpilot

        data, p = section_blockpilot(req.blockpilot, st)
        return data, ([plots.plot_blockpilot(p, folder / "blockpilot.png")] if p else [])
    if key == "drift":
        from .drift import section_drift

        data, p = section_drift(traces, st)
        return data, [plots.plot_drift(p, folder / "drift.png")]
    if key == "coldstart":
        from .coldstart import section_coldstart

        data, p = section_coldstart(traces, st)
        return data, ([plots.plot_coldstart(p, folder / "coldstart.png")] if p else [])
    if key == "e2e":
        from .e2e import section_e2e

        e = req.e2e
        assert e is not None
        return section_e2e(traces, st, e.prompts, max_new_tokens=e.max_new_tokens, drafter=e.drafter,
                           target=e.target, fixed_block=e.fixed_block, threads=e.threads), []
    if key == "rounds":
        from .rounds import section_rounds

        return section_rounds(traces, st), []
    raise AdaptspecError(f"unknown section {key!r}")


def run_evaluation(req: Request, out: Outputs | None = None, log: Any = None) -> dict[str, Any]:
    """Regenerate the requested sections and rewrite the report, the headline and ``results.json``.

    ``log(line)`` receives one line per finished section (default: stderr). Returns the results.
    """
    from ..traces import load_traces

    out = out or Outputs.default()
    say = log or (lambda s: print(s, file=sys.stderr, flush=True))
    todo = plan_sections(req)
    if "blockpilot" in todo and req.blockpilot is None:
        prev = load_results(out.folder / "results.json")["sections"].get("blockpilot")
        if prev and prev["data"].get("status") == "ok":
            todo.remove("blockpilot")  # keep the earlier result rather than overwrite it with "not run"
            say(f"evaluate: section blockpilot kept from run {prev['run']} (pass --blockpilot DIR to regenerate it)")
    traces = load_traces(req.traces)
    current = provenance(traces)
    if current["synthetic"]:
        say(f"evaluate: warning: the trace set {current['path']} is SYNTHETIC (meta.json source kind "
            f"{current['source_kind']!r}); the report says so")
    results = load_results(out.folder / "results.json")
    run_id = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    while run_id in results["runs"]:  # two runs within a second: keep ids unique and ordered
        run_id += "+"
    t_run = time.perf_counter()
    run = {"started": _now(), "command": req.command or "run_evaluation", "git": _git(),
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
           "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(req.settings).items()
                        if k != "progress"},
           "sections": todo, "traces": current}
    for key in todo:
        t = time.perf_counter()
        data, figs = run_section(key, traces, req, out)
        secs = time.perf_counter() - t
        results["sections"][key] = {
            "run": run_id, "seconds": round(secs, 1), "data": data,
            "trace_fingerprint": None if key == "blockpilot" else current["fingerprint"],
            "figures": [_rel(f, out.report.parent) for f in figs],
        }
        say(f"evaluate: section {key} done in {secs:.0f} s")
    run.update(finished=_now(), seconds=round(time.perf_counter() - t_run, 1))
    if todo:
        results["runs"][run_id] = run
    used = {s["run"] for s in results["sections"].values() if s}
    results["runs"] = {k: v for k, v in results["runs"].items() if k in used}
    _write(out.folder / "results.json", json.dumps(results, indent=1, default=json_default) + "\n")
    _write(out.report, render_report(results, current, _rel(out.headline, out.report.parent)))
    _write(out.headline, render_headline(results, _rel(out.report, out.headline.parent)))
    return results
