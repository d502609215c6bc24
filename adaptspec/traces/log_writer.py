"""Durable decision-log writer: a fsync'd journal, rolled into Parquet parts.

Parquet files cannot be appended to row by row, and a part per decision would leave
thousands of tiny files. So :class:`DecisionLogWriter` appends each row as one JSON line to
a journal segment and ``fsync``\\ s it before :meth:`~DecisionLogWriter.append` returns: from
then on the decision survives a crash (that is what "acknowledged" means). Every
``roll_rows`` rows or ``roll_interval_s`` seconds the segment is closed and written as one
Parquet part of the :class:`~adaptspec.traces.DecisionLog` (validated, atomic, fsync'd), and
only then deleted. A writer that starts on a directory holding segments of a dead writer of
the same name turns them into parts first, skipping rows a part already holds (a crash
between writing a part and deleting its segment), and ignoring a torn last line (a row
whose ``append`` never returned).

Journal segments are hidden files (``.journal-NAME-SEQ.jsonl``), so readers of the log see
complete parts only; :func:`journal_rows` reads the segments too. One writer per name and
directory: a second one (another process, or the same one) is refused with a clear error.

Rows are checked where they enter the writer: a caller's row when it is appended (the
decision's fields by :func:`~adaptspec.traces.decision_check.decision_fault`, the values, the
columns), a journal row when it is read back from disk. The controller's rows come from a
decision checked where it entered the controller, so it appends them with ``checked=True``
and their decision fields are not checked a second time.

>>> import tempfile
>>> from adaptspec.traces import DecisionLog
>>> d = tempfile.mkdtemp()
>>> w = DecisionLogWriter(d, name="A", roll_rows=2)
>>> for i in range(3):
...     w.append({"decision_id": f"d{i}", "time": 0.0, "policy": "fixed:4", "variant": "A", "block_size": 4,
...               "propensity": 1.0, "probs": [0.0, 1.0], "arms": [1, 4], "reward": float(i)})
>>> len(DecisionLog.read(d)), len(w.pending_rows())     # two rolled into a part, one in the journal
(2, 1)
>>> w.close(); len(DecisionLog.read(d))
3
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .._util.append import LineAppender
from .._util.atomic import fsync_path
from .._util.jsonlines import read_jsonl
from ..errors import AdaptspecError
from ..speculator import REWARD_LIMIT, arm_label, drafted_positions
from .decision_check import decision_fault

__all__ = ["DecisionLogWriter", "journal_rows", "log_rows"]

log = logging.getLogger("adaptspec.traces.log_writer")

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SEGMENT = re.compile(r"^\.journal-(?P<name>[A-Za-z0-9_.-]+)-(?P<seq>\d{8})\.jsonl$")
_PART_TIME = re.compile(r"^part-(\d+)-")


class DecisionLogWriter:
    """Append decision rows durably to the decision log at ``path`` (see the module docstring).

    Parameters
    ----------
    path
        The decision log directory (created if needed).
    name
        This writer's name (the A/B variant, say): letters, digits, ``_.-``.
    roll_rows, roll_interval_s
        Roll the journal into a Parquet part after this many rows, or when its oldest row is
        this old (checked by :meth:`maybe_roll`, which the controller calls periodically).
    fsync
        ``fsync`` every row (default). Without it rows survive a process crash but not a
        machine crash.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        name: str = "default",
        roll_rows: int = 1000,
        roll_interval_s: float | None = 60.0,
        fsync: bool = True,
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise AdaptspecError(
                f"log writer name must be 1-64 letters, digits or _.- characters, got {name!r}"
            )
        if int(roll_rows) != roll_rows or roll_rows < 1:
            raise AdaptspecError(f"roll_rows must be a positive integer, got {roll_rows!r}")
        if roll_interval_s is not None and not roll_interval_s > 0:
            raise AdaptspecError(f"roll_interval_s must be > 0 or None, got {roll_interval_s!r}")
        self.path = Path(path)
        self.name = name
        self.roll_rows = int(roll_rows)
        self.roll_interval_s = roll_interval_s
        self.fsync = bool(fsync)
        self._lock = threading.Lock()
        self._file: Any = None
        self._rows: list[dict[str, Any]] = []
        self._opened = 0.0
        self._dim: int | None = None
        self.roll_errors = 0
        self.last_error: tuple[float, str] | None = None  # (time, message) of the newest failed roll
        self.rows_written = 0
        self.parts_written = 0
        self._parts: Any = None  # the DecisionLog parts are appended to (it remembers the ids logged)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if (self.path / "meta.json").exists():
                raise AdaptspecError(f"{self.path}: this is a trace set (meta.json), not a decision log")
            self._lock_file = _open_lock(self.path / f".writer-{name}.lock")
        except OSError as e:
            raise AdaptspecError(
                f"{self.path}: cannot write the decision log here ({e.strerror or e})"
            ) from None
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise AdaptspecError(
                f"{self.path}: another writer named {name!r} is using this decision log"
            ) from None
        try:
            self._dim = _check_parts(self.path)
            self.recovered = self._recover()
            self._seq = max([s for s, _ in self._segments()] + [0]) + 1
        except BaseException:
            self._release()
            raise

    @property
    def feature_dim(self) -> int | None:
        """Length of the ``features`` this log holds (None until a row has some)."""
        return self._dim

    # ------------------------------------------------------------------ writing
    def append(self, row: Mapping[str, Any], *, checked: bool = False) -> None:
        """Write one row durably (validated first: bad rows raise and nothing is written).

        ``checked=True``: the row was made from a decision already checked where it entered
        (the controller's :func:`~adaptspec.control.block_sizes.check_decision`), so its
        decision fields (block size, arms, probabilities, propensity) are not checked again;
        its values still go through the encoding (JSON, no NaN)."""
        clean, line = _encode(row, check_decision=not checked)
        f = clean.get("features")
        with self._lock:
            if self._lock_file is None:
                raise AdaptspecError(f"{self.path}: decision log writer {self.name!r} is closed")
            if f is not None:
                if self._dim is None:
                    self._dim = len(f)
                elif len(f) != self._dim:
                    raise AdaptspecError(
                        f"decision row has {len(f)} features, earlier rows of this log have {self._dim}"
                    )
            if self._file is None:
                self._open_segment()
            try:
                self._file.append(line)  # whole or not at all: a failed write leaves no torn line behind
            except OSError as e:
                raise AdaptspecError(
                    f"{self.path}: cannot append to the decision log ({e.strerror or e})"
                ) from None
            self._rows.append(clean)
            self.rows_written += 1
            if len(self._rows) >= self.roll_rows:
                self._roll()

    def maybe_roll(self) -> bool:
        """Roll the journal if its oldest row is older than ``roll_interval_s``; True if it rolled."""
        with self._lock:
            if (
                self._rows
                and self.roll_interval_s is not None
                and time.monotonic() - self._opened >= self.roll_interval_s
            ):
                self._roll()
                return True
        return False

    def roll(self) -> None:
        """Write the journal's rows as a Parquet part now (nothing happens if it is empty)."""
        with self._lock:
            self._roll()

    def pending_rows(self) -> list[dict[str, Any]]:
        """Rows appended but not yet rolled into a part (copies, in order)."""
        with self._lock:
            return [dict(r) for r in self._rows]

    def close(self) -> None:
        """Roll what is left and release the directory. Idempotent."""
        with self._lock:
            if self._lock_file is None:
                return
            try:
                self._roll()
                if self._file is not None:
                    self._file.close()
                    os.unlink(self._segment)
                    self._file = None
            finally:
                self._release()

    def __enter__(self) -> "DecisionLogWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _release(self) -> None:
        if self._lock_file is not None:
            try:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            finally:
                self._lock_file.close()
                self._lock_file = None

    def _segments(self) -> list[tuple[int, Path]]:
        out = []
        for p in self.path.iterdir():
            m = _SEGMENT.match(p.name)
            if m and m.group("name") == self.name:
                out.append((int(m.group("seq")), p))
        return sorted(out)

    def _open_segment(self) -> None:
        p = self.path / f".journal-{self.name}-{self._seq:08d}.jsonl"
        self._seq += 1
        f = None
        try:
            f = LineAppender(p, fsync=self.fsync, exclusive=True)
            f.append(json.dumps({"__journal__": 1, "writer": self.name, "created_ns": time.time_ns()}) + "\n")
            if self.fsync:
                fsync_path(self.path)
        except OSError as e:
            if f is not None:
                f.close()
            raise AdaptspecError(
                f"{self.path}: cannot create a journal segment ({e.strerror or e})"
            ) from None
        self._file = f
        self._segment = p  # what a roll deletes: this writer's own segment, never whatever _file names
        self._opened = time.monotonic()

    def _roll(self) -> None:
        if not self._rows:
            return
        try:
            self._write_part(self._rows)
        except (
            AdaptspecError
        ) as e:  # e.g. a full disk: the rows stay in the journal; retried at the next roll
            self.roll_errors += 1
            self.last_error = (time.time(), f"decision log roll: {e}")
            log.error(
                "%s: could not roll the journal of writer %r into a part (%s); will retry",
                self.path,
                self.name,
                e,
            )
            return
        f, self._file = self._file, None
        f.close()
        os.unlink(self._segment)
        self._rows = []

    def _write_part(self, rows: Sequence[Mapping[str, Any]]) -> None:
        from . import DecisionLog

        if self._parts is None:
            self._parts = DecisionLog(self.path)
        part = self._parts.append(rows)
        if self.fsync:
            fsync_path(part)
            fsync_path(self.path)
        self.parts_written += 1

    def _recover(self) -> int:
        """Turn a dead writer's journal segments into parts; returns the number of rows recovered."""
        n = 0
        for _, seg in self._segments():
            rows, created_ns = _read_segment(seg)
            if rows:
                have = _ids_in_parts(self.path, created_ns)
                rows = [r for r in rows if r["decision_id"] not in have]
            if rows:
                self._write_part(rows)
                n += len(rows)
                log.warning(
                    "%s: recovered %d decision(s) of writer %r from %s",
                    self.path,
                    len(rows),
                    self.name,
                    seg.name,
                )
            seg.unlink()
        return n


# ============================================================================ reading
def _open_lock(path: Path) -> Any:
    """The writer's lock file, opened without following a symbolic link (a link planted there
    would make the writer create or lock a file outside the log's directory) and refused unless
    it is a regular file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise AdaptspecError(
                f"{path}: the writer's lock file is a symbolic link; not following it (remove it)"
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise AdaptspecError(f"{path}: the writer's lock file is not a regular file (remove it)")
    return os.fdopen(fd, "r+b", buffering=0)


def journal_rows(path: str | os.PathLike, name: str | None = None) -> list[dict[str, Any]]:
    """Rows in the journal segments of ``path`` (every writer, or writer ``name``), not yet in parts."""
    out: list[dict[str, Any]] = []
    p = Path(path)
    if not p.is_dir():
        return out
    segs = []
    for f in p.iterdir():
        m = _SEGMENT.match(f.name)
        if m and (name is None or m.group("name") == name):
            segs.append((m.group("name"), int(m.group("seq")), f))
    for _, _, f in sorted(segs):
        rows, _ = _read_segment(f, missing_ok=True)  # missing: rolled meanwhile, its rows are in a part now
        out.extend(rows)
    return out


def log_rows(
    path: str | os.PathLike, columns: Sequence[str] | None = None, *, journals: bool = True
) -> list[dict[str, Any]]:
    """Every row of a decision log directory as dicts, in order: parts, then unrolled journal rows.

    Everything is validated as :class:`~adaptspec.traces.DecisionLog` validates a log (each
    part, and across parts: a decision id appears once); journal rows are checked as when
    they were appended. ``columns`` limits what is returned. Rows a part and a journal both
    hold (a writer died between writing the part and deleting the journal) appear once.
    """
    from . import DecisionLog

    p = Path(path)
    if (p / "meta.json").exists():
        raise AdaptspecError(f"{p}: this is a trace set (meta.json), not a decision log")
    log = DecisionLog(p)
    keep = None if columns is None else list(dict.fromkeys(["decision_id", *columns]))
    rows: list[dict[str, Any]] = []
    if log.parts():
        t = log.table
        if keep is not None:
            t = t.select([c for c in keep if c in t.column_names])
        rows = t.to_pylist()
    seen = {r["decision_id"] for r in rows}
    if journals:
        for r in journal_rows(p):
            if r.get("decision_id") in seen:
                continue
            try:
                clean, _ = _encode(r)
            except AdaptspecError as e:
                raise AdaptspecError(f"{p}: journal row {r.get('decision_id')!r}: {e}") from None
            seen.add(clean["decision_id"])
            rows.append(clean if keep is None else {k: clean.get(k) for k in keep})
    return rows


# ============================================================================ helpers
def _encode(row: Mapping[str, Any], check_decision: bool = True) -> tuple[dict[str, Any], str]:
    """The row with plain values, and its JSON line, after the checks that make it a valid decision-log row.

    ``check_decision=False`` skips the decision's own fields (a row made from a checked decision)."""
    from .schema import (
        DECISION_COLUMNS,
        DECISION_COUNTS,
        DECISION_FLOATS,
        DECISION_PER_ARM,
        DECISION_PER_ARM_FLOATS,
        MAX_TOKENS,
    )

    unknown = sorted(set(row) - set(DECISION_COLUMNS))
    if unknown:
        raise AdaptspecError(f"unknown decision-log column {unknown[0]!r}")
    for req in ("decision_id", "policy", "block_size", "propensity", "probs", "arms"):
        if row.get(req) is None:
            raise AdaptspecError(f"decision row lacks {req!r}")
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, np.ndarray):
            v = v.tolist()
        elif isinstance(v, np.generic):
            v = v.item()
        elif isinstance(v, (list, tuple)):
            v = [x.item() if isinstance(x, np.generic) else x for x in v]
        out[k] = v
    t = out.get("time")
    if t is None:
        out["time"] = time.time()
    elif isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise AdaptspecError(f"decision row time must be seconds since the epoch, got {t!r}")
    for k in ("decision_id", "request_id", "policy", "variant"):
        if out.get(k) is not None and not isinstance(out[k], str):
            raise AdaptspecError(f"decision row {k} must be a string, got {out[k]!r}")
    if check_decision:
        fault = decision_fault(out["block_size"], out["propensity"], out["probs"], out["arms"])
        if fault is not None:
            raise AdaptspecError(f"decision row {fault}")
        mt, b = out.get("mean_tau"), out["block_size"]
        most = drafted_positions(b)  # a round commits at most what it drafted (a tree arm -N: its depth + 1)
        if mt is not None and math.isfinite(float(mt)) and not 1 - 1e-9 <= float(mt) <= most + 1e-9:
            raise AdaptspecError(
                f"decision row mean_tau {mt} outside 1..{most} (its block size {arm_label(b)})"
            )
    for k in DECISION_FLOATS:
        v = out.get(k)
        if v is not None and not math.isfinite(float(v)):
            raise AdaptspecError(f"decision row {k} is {v} (use None for a missing value)")
    for k in DECISION_COUNTS:
        v = out.get(k)
        if v is not None and (isinstance(v, bool) or int(v) != v or not 0 <= v <= MAX_TOKENS):
            raise AdaptspecError(f"decision row {k} must be an integer in 0..{MAX_TOKENS}, got {v!r}")
    for k in DECISION_PER_ARM:
        v = out.get(k)
        if v is None:
            continue
        if not isinstance(v, list) or len(v) != len(out["arms"]):
            raise AdaptspecError(
                f"decision row {k} must be a list of one value per arm ({len(out['arms'])}), got {v!r}"
            )
        if k in DECISION_PER_ARM_FLOATS:
            if not all(
                not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) for x in v
            ):
                raise AdaptspecError(f"decision row {k} must hold finite numbers, got {v!r}")
        elif not all(isinstance(x, bool) for x in v):
            raise AdaptspecError(f"decision row {k} must hold true/false values, got {v!r}")
    fault = _reward_fault(out)
    if fault is not None:
        raise AdaptspecError(f"decision row {fault}")
    f = out.get("features")
    if f is not None and not all(math.isfinite(x) for x in f):
        raise AdaptspecError("decision row features have NaN or infinite values")
    try:
        return out, json.dumps(out, allow_nan=False, separators=(",", ":")) + "\n"
    except (TypeError, ValueError) as e:
        raise AdaptspecError(f"decision row cannot be written: {e}") from None


def _reward_fault(row: Mapping[str, Any]) -> str | None:
    """What breaks a row's reward invariants (the reader's, ``decision_log._check_rewards``, for
    one row, so that a row written is a row that reads): a reward beyond
    :data:`~adaptspec.speculator.REWARD_LIMIT`, the ``cf_`` columns not null together,
    counterfactuals without a reward, or ``cf_rewards`` at the arm that ran other than ``reward``."""
    from .schema import DECISION_PER_ARM

    reward = row.get("reward")
    if reward is not None and abs(float(reward)) > REWARD_LIMIT:
        return f"reward {float(reward):g} is beyond any reward (|reward| <= {REWARD_LIMIT:g})"
    given = [k for k in DECISION_PER_ARM if row.get(k) is not None]
    if not given:
        return None
    if len(given) < len(DECISION_PER_ARM):
        missing = [k for k in DECISION_PER_ARM if k not in given]
        return f"has {given[0]} but not {missing[0]} (the four cf_ columns are null together)"
    if reward is None:
        return "has cf_rewards without a reward"
    cf = row["cf_rewards"]
    if any(abs(float(x)) > REWARD_LIMIT for x in cf):
        return f"cf_rewards {cf} hold a value beyond any reward (|reward| <= {REWARD_LIMIT:g})"
    arms = list(row["arms"])
    if row["block_size"] in arms and not math.isclose(
        cf[arms.index(row["block_size"])], reward, rel_tol=1e-9, abs_tol=0.0
    ):
        return (
            f"cf_rewards at block size {row['block_size']} (the arm that ran) is {cf[arms.index(row['block_size'])]}, "
            f"its reward {reward} (they are the same number)"
        )
    return None


def _read_segment(path: Path, missing_ok: bool = False) -> tuple[list[dict[str, Any]], int]:
    """Rows of a journal segment and its creation time (0 without a header), as
    :func:`~adaptspec._util.jsonlines.read_jsonl` reads them: a torn last line is dropped (its
    ``append`` never returned). Every complete row is checked as :meth:`DecisionLogWriter.append`
    checks a row; one that is not a valid decision-log row (no ``decision_id``, a field of the
    wrong type) is corruption, not a crash: an :class:`~adaptspec.errors.AdaptspecError` naming the
    file and the line, and the segment is left as it is. A missing segment (``missing_ok``:
    rolled meanwhile) has no rows."""
    rows: list[dict[str, Any]] = []
    created = 0
    read = read_jsonl(path, "a decision-log journal segment", missing_ok=missing_ok)
    for line, r in zip(read.lines, read.records):
        if "__journal__" in r:
            c = r.get("created_ns", 0)
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise AdaptspecError(
                    f"{path}: line {line}: the journal header's created_ns={c!r} must be a "
                    "non-negative integer (a corrupted journal segment)"
                )
            created = c
            continue
        try:
            clean, _ = _encode(r)
        except (
            AdaptspecError,
            TypeError,
            ValueError,
        ) as e:  # TypeError, ValueError: int() or float() of a wrong type
            raise AdaptspecError(
                f"{path}: line {line} is not a valid decision-log row ({e}); a corrupted journal "
                "segment: repair or remove the line"
            ) from None
        if not isinstance(clean["decision_id"], str):
            raise AdaptspecError(
                f"{path}: line {line} is not a valid decision-log row (decision_id="
                f"{clean['decision_id']!r} must be a string); a corrupted journal segment: "
                "repair or remove the line"
            )
        rows.append(clean)
    return rows, created


def _ids_in_parts(path: Path, since_ns: int) -> set[str]:
    """decision_ids held by the parts written at or after ``since_ns``."""
    from . import DecisionLog
    from .decision_log import part_ids

    ids: set[str] = set()
    for part in DecisionLog(path).parts():
        m = _PART_TIME.match(part.name)
        if m and int(m.group(1)) < since_ns:
            continue
        ids.update(part_ids(part))
    return ids


def _check_parts(path: Path) -> int | None:
    """Validate every part of the log at ``path`` (a writer refuses a log it could not extend
    into a valid one); returns the feature length the next part must match (None: no features yet)."""
    from . import DecisionLog

    log = DecisionLog(path)
    if not log.parts():
        return None
    return log.feature_dim  # reads and validates every part; raises naming the first problem
