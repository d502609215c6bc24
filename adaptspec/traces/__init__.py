"""Trace sets and decision logs: Parquet on disk, validated, with numpy views for hot paths.

Where things are:

- :mod:`adaptspec.traces.traceset`: trace sets (full information: every block size ran on
  every request): :class:`TraceSet`, :func:`load_traces`, :data:`DEFAULT_TRACES` (the bundled
  public benchmark set), :data:`TEMPLATE_TRACES` (the bundled in-distribution set), :func:`path_label`;
- :mod:`adaptspec.traces.decision_log`: decision logs (partial feedback, one row per
  decision): :class:`DecisionLog`, :func:`decision_row` and the validation of log rows;
- :mod:`adaptspec.traces.blockpilot`: :func:`import_blockpilot`;
- :mod:`adaptspec.traces.schema`: the columns of each table and :data:`SCHEMA_VERSION`;
- :mod:`adaptspec.traces.parquet`: the Parquet helpers the readers share.

Everything public is importable from ``adaptspec.traces``. Validation errors name the file,
the column and the row (0-based) that is wrong. Writes go to a temporary file or directory
that is renamed into place, so a crash never leaves a half-written trace set or log part.
See ``docs/data.md``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .blockpilot import import_blockpilot
from .decision_log import DecisionLog, decision_row
from .parquet import _err
from .schema import DECISION_COLUMNS, OUTCOME_COLUMNS, REQUEST_COLUMNS, SCHEMA_VERSION
from .traceset import DEFAULT_TRACES, TEMPLATE_TRACES, TraceSet, load_traces, moved_hint, path_label

__all__ = [
    "TraceSet",
    "DecisionLog",
    "load_traces",
    "import_blockpilot",
    "open_any",
    "decision_row",
    "path_label",
    "DEFAULT_TRACES",
    "TEMPLATE_TRACES",
    "SCHEMA_VERSION",
    "REQUEST_COLUMNS",
    "OUTCOME_COLUMNS",
    "DECISION_COLUMNS",
]


def open_any(path: str | os.PathLike) -> TraceSet | DecisionLog:
    """A trace set (directory with meta.json) or a decision log (Parquet parts), whichever ``path`` is."""
    p = Path(path)
    if not p.exists():
        raise _err(str(p), "no such file or directory" + moved_hint(p))
    if p.is_dir() and (p / "meta.json").exists():
        return TraceSet.read(p)
    if p.is_dir() and ((p / "requests.parquet").exists() or (p / "outcomes.parquet").exists()):
        raise _err(
            str(p / "meta.json"),
            "no such file: the trace set's requests.parquet/outcomes.parquet are "
            "here, but a trace set also needs meta.json with a schema_version",
        )
    if p.is_file() and p.suffix == ".parquet" or p.is_dir() and any(p.glob("*.parquet")):
        return DecisionLog.read(p)
    raise _err(str(p), "neither a trace set (meta.json) nor a decision log (*.parquet parts)")
