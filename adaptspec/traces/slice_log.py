"""Switchback slice records: one JSON line per finished slice, next to the decision log.

A switchback A/B test (``serve --batched --ab-design switchback``) runs every round of a
*slice* on one variant; :class:`SliceLogWriter` appends each finished slice's record as one
JSON line to ``slices-RUN.jsonl`` in the decision log directory and ``fsync``\\ s it before
:meth:`~SliceLogWriter.append` returns. A crash therefore loses at most the slice in
progress, plus at worst a torn last line, which :func:`slice_rows` skips. One file per run
(server start): two servers never share a file, and a restart never rewrites an old one.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> w = SliceLogWriter(d, run="r1")
>>> w.append({"slice": 0, "variant": "A", "rounds": 2}); w.append({"slice": 1, "variant": "B", "rounds": 2})
>>> w.close()
>>> with open(w.file, "a") as f: _ = f.write('{"slice": 2, "vari')      # a torn line: the crash case
>>> [(r["run"], r["slice"], r["variant"]) for r in slice_rows(d)]
[('r1', 0, 'A'), ('r1', 1, 'B')]
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from .._util.append import LineAppender
from .._util.atomic import fsync_path
from .._util.jsonlines import read_jsonl
from ..errors import AdaptspecError

__all__ = ["SliceLogWriter", "slice_rows", "SLICE_FILE"]

#: the name of a run's slice file in a decision log directory
SLICE_FILE = re.compile(r"^slices-(?P<run>[A-Za-z0-9_.-]{1,64})\.jsonl$")


class SliceLogWriter:
    """Append slice records durably to ``path/slices-RUN.jsonl`` (see the module docstring).

    ``run`` names this run (default: start time in ns and process id); ``fsync=False`` keeps
    records across a crash of the process but not of the machine.
    """

    def __init__(self, path: str | os.PathLike, run: str | None = None, fsync: bool = True) -> None:
        run = f"{time.time_ns()}-{os.getpid()}" if run is None else run
        self.path = Path(path)
        self.file = self.path / f"slices-{run}.jsonl"
        if not SLICE_FILE.match(self.file.name):
            raise AdaptspecError(
                f"slice log run name must be 1-64 letters, digits or _.- characters, got {run!r}"
            )
        self.run = run
        self.fsync = bool(fsync)
        self._lock = threading.Lock()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._f: Any = LineAppender(self.file, fsync=self.fsync, exclusive=True)
            if self.fsync:
                fsync_path(self.path)  # the new file's name survives a machine crash too
        except FileExistsError:
            raise AdaptspecError(f"{self.file}: a slice log of run {run!r} already exists") from None
        except OSError as e:
            raise AdaptspecError(
                f"{self.path}: cannot write the slice log here ({e.strerror or e})"
            ) from None

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one slice record (with this writer's ``run``) durably; raises AdaptspecError if it cannot."""
        try:
            line = json.dumps({"run": self.run, **record}, allow_nan=False, separators=(",", ":")) + "\n"
        except (TypeError, ValueError) as e:
            raise AdaptspecError(f"slice record cannot be written: {e}") from None
        with self._lock:
            if self._f is None:
                raise AdaptspecError(f"{self.file}: the slice log is closed")
            try:
                self._f.append(line)  # whole or not at all: a failed write leaves no torn line behind
            except OSError as e:
                raise AdaptspecError(
                    f"{self.file}: cannot append a slice record ({e.strerror or e})"
                ) from None

    def close(self) -> None:
        """Close the file. Idempotent."""
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None


def slice_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every slice record in decision log directory ``path`` (every run's file, by name), in
    file order, as :func:`~adaptspec._util.jsonlines.read_jsonl` reads them: a torn last line
    of a file (a crash mid-write) is skipped, a bad line elsewhere is an error naming the file
    and line. A directory without slice files gives ``[]``."""
    p = Path(path)
    if not p.is_dir():
        return []
    out: list[dict[str, Any]] = []
    for f in sorted(x for x in p.iterdir() if SLICE_FILE.match(x.name)):
        run = SLICE_FILE.match(f.name).group("run")
        for r in read_jsonl(f, "a slice log").records:
            r.setdefault("run", run)
            out.append(r)
    return out
