"""The decision logs of every replica of a fleet, read as one log (for ``ab-report`` and the sequential test).

Each path is a decision log directory (Parquet parts and journals, as ``adaptspec serve
--log-dir`` writes), one Parquet part, or a *parent* directory whose subdirectories are the
replicas' log directories (``runs/fleet/r0``, ``runs/fleet/r1``, ...). Every log is validated as
any reader of decision logs does; a decision id found in two logs (the same log given twice, or
a replica that copied another's log) is refused with one line naming both. Rows keep their
timestamps, so the A/B analysis orders the fleet's decisions by time, whichever replica made them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ..errors import AdaptspecError

__all__ = ["log_dirs", "fleet_log_rows"]


def _is_log(p: Path) -> bool:
    if p.is_file():
        return p.suffix == ".parquet"
    return any(p.glob("*.parquet")) or any(p.glob(".journal-*.jsonl"))


def log_dirs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The decision logs ``paths`` name: each a log itself, or a parent of per-replica log directories."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise AdaptspecError(f"{p}: no such decision log")
        if (p / "meta.json").exists():
            raise AdaptspecError(f"{p}: this is a trace set (meta.json), not a decision log")
        if _is_log(p):
            out.append(p)
            continue
        subs = (
            sorted(s for s in p.iterdir() if s.is_dir() and not s.name.startswith(".") and _is_log(s))
            if p.is_dir()
            else []
        )
        if not subs:
            raise AdaptspecError(f"{p}: neither a decision log nor a directory of replicas' decision logs")
        out.extend(subs)
    if len(set(map(os.path.realpath, out))) != len(out):
        raise AdaptspecError(f"the same decision log is given twice: {', '.join(map(str, out))}")
    return out


def fleet_log_rows(paths: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """Every row of every replica's log, each with its ``replica`` (the log's directory name)."""
    from ..traces import DecisionLog
    from ..traces.log_writer import log_rows

    rows: list[dict[str, Any]] = []
    where: dict[str, Path] = {}
    for d in log_dirs(paths):
        part = log_rows(d) if d.is_dir() else DecisionLog.read(d).table.to_pylist()
        for r in part:
            did = r["decision_id"]
            if did in where:
                raise AdaptspecError(
                    f"decision {did} is in both {where[did]} and {d}: a log given twice, or copied"
                )
            where[did] = d
            r["replica"] = d.stem if d.is_file() else d.name
            rows.append(r)
    return rows
