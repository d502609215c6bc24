"""Decision logs: partial feedback, one row per decision (written by the controller).

A **decision log** is a directory of ``part-*.parquet`` files, each appended atomically;
readers read them all (or one Parquet file). :func:`decision_row` makes a row from a
:class:`~adaptspec.speculator.Decision`; :func:`_validate_decisions` is the check every
reader and writer of a log runs (types, probabilities, propensities, the chosen block size
among the row's arms, duplicate ids). The durable, journalled writer the controller uses is
:class:`adaptspec.traces.log_writer.DecisionLogWriter`. See ``docs/data.md``.
"""

from __future__ import annotations

import os
import tempfile
import time as _time
import uuid
from datetime import datetime, timezone
from itertools import count
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import AdaptspecError
from ..speculator import REWARD_LIMIT, drafted_positions
from .parquet import _check_columns, _err, _first, _list_parts, _matrix, _np, _write_parquet, read_parquet
from .schema import (
    DECISION_COLUMNS,
    DECISION_COUNTS,
    DECISION_FLOATS,
    DECISION_PER_ARM,
    DECISION_PER_ARM_FLOATS,
    MAX_TOKENS,
    SCHEMA_VERSION,
)

_part_counter = count()
_PART = "a decision-log part"


def read_part(path: str | os.PathLike, feature_dim: int | None = None) -> pa.Table:
    """One part of a decision log, read and validated as every reader of a log validates a part
    (types, probabilities, propensities, ids unique within it; ``features`` of length
    ``feature_dim`` when given). Every fault is one :class:`~adaptspec.errors.AdaptspecError`
    naming the file: one that is not a readable Parquet file (a FIFO, a directory, a truncated
    part, any other file named ``part-*.parquet``: any pyarrow error;
    :func:`~adaptspec.traces.parquet.read_parquet`), an empty part, a newer schema, a bad row."""
    t = read_parquet(path, _PART)
    if t.num_rows == 0:
        raise _err(str(path), "part has no rows (adaptspec never writes an empty part; remove it)")
    v = (t.schema.metadata or {}).get(b"adaptspec.schema_version")
    if v is not None:
        try:
            version = int(v)
        except ValueError:
            raise _err(str(path), f"schema_version {v!r} in the file's metadata is not an integer") from None
        if version > SCHEMA_VERSION:
            raise _err(
                str(path), f"schema_version {version} is newer than this adaptspec reads ({SCHEMA_VERSION})"
            )
    return _validate_decisions(t, str(path), feature_dim)


def part_ids(path: str | os.PathLike) -> list[str]:
    """The ``decision_id`` column of one part (see :func:`read_part`); a part without one, or with
    ids that are not strings, is refused naming it."""
    t = read_parquet(path, _PART, columns=["decision_id"])
    col = t.column("decision_id")
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)) or col.null_count:
        raise _err(
            str(path),
            f"column 'decision_id' must hold strings (has type {col.type}"
            f"{', and missing values' if col.null_count else ''})",
        )
    return col.to_pylist()


def decision_row(
    decision: Any,
    *,
    features: Sequence[float] | np.ndarray | None = None,
    outcome: Any = None,
    reward: float | None = None,
    request_id: str | None = None,
    variant: str | None = None,
    time: float | datetime | None = None,
    speed_ratio: float | None = None,
    load: Any = None,
    shared: Any = None,
    counterfactual: Any = None,
) -> dict[str, Any]:
    """One decision-log row from a :class:`~adaptspec.speculator.Decision` and what followed.

    ``outcome`` (an :class:`~adaptspec.speculator.Outcome`, or None when feedback never came)
    fills ``new_tokens``, ``decode_ms``, ``mean_tau`` and ``rounds``. ``speed_ratio`` is the
    decode time over the speed reference's (:class:`~adaptspec.costs.machine_speed.MachineSpeed`)
    when the policy learnt from a calibrated reward; ``reward`` is always the measured one.
    ``load`` (a :class:`~adaptspec.speculator.LoadState`) fills the load columns
    (``rows_in_flight``, ``queue_length``, ``context_tokens``, ``temperature``, ``max_tokens``),
    ``shared`` (a :class:`~adaptspec.speculator.SharedRounds`) the attribution columns
    (``attributed_ms``, ``wall_decode_ms``, ``row_rounds``, ``mean_rows``); ``counterfactual``
    (a :class:`~adaptspec.control.full_feedback.FullFeedback`: ``rewards``, ``tokens``,
    ``censored``, ``approximate``, over the decision's arms) the columns ``cf_rewards``,
    ``cf_tokens``, ``cf_censored``, ``cf_approximate``; without them those columns are left out.

    >>> from adaptspec.speculator import Decision, LoadState, SharedRounds
    >>> d = Decision(4, 1.0, [0.0, 1.0], (1, 4), "fixed:4", decision_id="d1")
    >>> r = decision_row(d, load=LoadState(rows=2, queue=5, context_tokens=9, temperature=0.0, max_tokens=32),
    ...                  shared=SharedRounds(attributed_s=0.012, wall_decode_s=0.03, rounds=4, row_rounds=6))
    >>> r["rows_in_flight"], r["queue_length"], r["attributed_ms"], r["wall_decode_ms"], r["mean_rows"]
    (2, 5, 12.0, 30.0, 1.5)
    """
    row: dict[str, Any] = {
        "decision_id": decision.decision_id or uuid.uuid4().hex,
        "time": _time.time() if time is None else time,
        "request_id": request_id,
        "policy": decision.policy,
        "version": int(decision.version),
        "variant": variant,
        "features": None if features is None else np.asarray(features, dtype=np.float32),
        "block_size": int(decision.block_size),
        "propensity": float(decision.propensity),
        "probs": np.asarray(decision.probs, dtype=np.float64),
        "arms": list(decision.arms),
        "reward": None if reward is None else float(reward),
    }
    if speed_ratio is not None:
        row["speed_ratio"] = float(speed_ratio)
    if load is not None:
        row.update(_load_columns(load))
    if shared is not None:
        row.update(_shared_columns(shared))
    if counterfactual is not None:
        row.update(_counterfactual_columns(counterfactual))
    if outcome is not None:
        row.update(_outcome_columns(outcome))
    return row


def _load_columns(load: Any) -> dict[str, Any]:
    """The load the decision was made under (a LoadState)."""
    return dict(
        rows_in_flight=load.rows,
        queue_length=load.queue,
        context_tokens=load.context_tokens,
        temperature=load.temperature,
        max_tokens=load.max_tokens,
    )


def _shared_columns(shared: Any) -> dict[str, Any]:
    """The request's share of the batched rounds it ran in (a SharedRounds)."""
    return dict(
        attributed_ms=1000.0 * shared.attributed_s,
        wall_decode_ms=1000.0 * shared.wall_decode_s,
        row_rounds=shared.row_rounds,
        mean_rows=shared.mean_rows,
    )


def _counterfactual_columns(counterfactual: Any) -> dict[str, Any]:
    """Every arm's counterfactual reward and tokens, and which are censored or approximate."""
    return dict(
        cf_rewards=np.asarray(counterfactual.rewards, dtype=np.float64),
        cf_tokens=np.asarray(counterfactual.tokens, dtype=np.float64),
        cf_censored=[bool(c) for c in counterfactual.censored],
        cf_approximate=[bool(c) for c in counterfactual.approximate],
    )


def _outcome_columns(outcome: Any) -> dict[str, Any]:
    """What the decision's decoding gave (an Outcome)."""
    return dict(
        new_tokens=int(outcome.new_tokens),
        decode_ms=1000.0 * float(outcome.decode_s),
        mean_tau=float(outcome.mean_tau) if outcome.rounds else None,
        rounds=len(outcome.rounds),
    )


def _rows_to_table(rows: Iterable[Mapping[str, Any]] | pa.Table) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    rows = list(rows)
    if not rows:
        raise AdaptspecError("no decision rows to append")
    unknown = sorted({k for r in rows for k in r} - set(DECISION_COLUMNS))
    if unknown:
        raise AdaptspecError(
            f"unknown decision-log column {unknown[0]!r} (known: {', '.join(DECISION_COLUMNS)})"
        )
    cols: dict[str, pa.Array] = {}
    for name, (typ, _, _) in DECISION_COLUMNS.items():
        if not any(name in r for r in rows):
            continue
        vals = [r.get(name) for r in rows]
        if name == "time":
            vals = [_to_datetime(v, i) for i, v in enumerate(vals)]
        elif pa.types.is_list(typ):
            vals = [None if v is None else np.asarray(v).tolist() for v in vals]
        try:
            cols[name] = pa.array(vals, typ)
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise AdaptspecError(f"decision rows: column {name!r} does not convert to {typ} ({e})") from None
    return pa.table(cols)


def _to_datetime(v: Any, row: int) -> datetime | None:
    if v is None or isinstance(v, datetime):
        return v
    if isinstance(v, np.datetime64):
        return datetime.fromtimestamp(v.astype("datetime64[us]").astype(np.int64) / 1e6, tz=timezone.utc)
    try:
        return datetime.fromtimestamp(float(v), tz=timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        raise AdaptspecError(f"decision rows: column 'time', row {row}: {v!r} is not a time") from None


def _validate_decisions(table: pa.Table, where: str, feature_dim: int | None = None) -> pa.Table:
    """Check a decision-log table; returns it with canonical column types."""
    table = _check_columns(table, DECISION_COLUMNS, where)
    if table.num_rows == 0:
        return table
    prop = _np(table.column("propensity"), np.float64)
    bad = ~np.isfinite(prop) | (prop <= 0) | (prop > 1 + 1e-9)
    if bad.any():
        r = _first(bad)
        raise _err(where, f"column 'propensity', row {r}: {prop[r]} outside (0, 1]")
    arm_sets = _checked_arm_sets(table, where)
    bs, hit = _checked_choices(table, where, arm_sets, prop)
    _check_decision_floats(table, where)
    _check_decision_counts(table, where)
    _check_per_arm_lists(table, where, arm_sets.lengths)
    _check_rewards(table, where, hit, arm_sets.parents, arm_sets.lengths, bs)
    _check_decision_mean_tau(table, where, bs)
    _check_decision_features(table, where, feature_dim)
    _check_decision_ids(table, where)
    return table


class _ArmSets(NamedTuple):
    """Each row's arm set and probabilities, flattened: the sets' lengths, every arm, the row
    each belongs to and its probability."""

    lengths: np.ndarray
    arms: np.ndarray
    parents: np.ndarray
    probs: np.ndarray


def _checked_arm_sets(table: pa.Table, where: str) -> _ArmSets:
    """The rows' arm sets, each non-empty with one finite probability >= 0 per arm, summing to 1."""
    n = table.num_rows
    la, arms_flat, ap = _list_parts(table.column("arms"))
    lp, probs_flat, pp = _list_parts(table.column("probs"))
    if np.any(la == 0):
        raise _err(where, f"column 'arms', row {_first(la == 0)}: empty arm set")
    if np.any(lp != la):
        r = _first(lp != la)
        raise _err(where, f"column 'probs', row {r}: {lp[r]} probabilities for {la[r]} arms")
    if not np.all(np.isfinite(probs_flat)) or np.any(probs_flat < -1e-12):
        r = int(pp[_first(~np.isfinite(probs_flat) | (probs_flat < -1e-12))])
        raise _err(where, f"column 'probs', row {r}: probabilities must be finite and >= 0")
    sums = np.bincount(pp, weights=probs_flat, minlength=n)
    off = np.abs(sums - 1) > 1e-6
    if off.any():
        r = _first(off)
        raise _err(where, f"column 'probs', row {r}: probabilities sum to {sums[r]:.6g}, not 1")
    return _ArmSets(la, arms_flat, ap, probs_flat)


def _checked_choices(
    table: pa.Table, where: str, arm_sets: _ArmSets, prop: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(block sizes chosen, which flattened arm each row chose)``: each row's block size one of
    its arms, its propensity the probability the row gives it."""
    n = table.num_rows
    bs = _np(table.column("block_size"), np.int64)
    hit = arm_sets.arms == bs[arm_sets.parents]
    chosen = np.bincount(arm_sets.parents, weights=hit, minlength=n)
    if np.any(chosen != 1):
        r = _first(chosen != 1)
        arms_r = table.column("arms")[r].as_py()
        raise _err(where, f"column 'block_size', row {r}: {bs[r]} is not one of the row's arms {arms_r}")
    p_chosen = np.zeros(n)
    p_chosen[arm_sets.parents[hit]] = arm_sets.probs[hit]
    off = np.abs(p_chosen - prop) > 1e-6
    if off.any():
        r = _first(off)
        raise _err(
            where,
            f"column 'propensity', row {r}: {prop[r]} but probs gives {p_chosen[r]:.6g} to block size {bs[r]}",
        )
    return bs, hit


def _check_decision_floats(table: pa.Table, where: str) -> None:
    """The float columns finite where present (null for a missing value)."""
    for name in DECISION_FLOATS:
        if name in table.column_names:
            col = table.column(name).combine_chunks()
            bad = ~np.asarray(pc.is_finite(col).fill_null(True))
            if bad.any():
                r = _first(bad)
                raise _err(
                    where, f"column {name!r}, row {r}: {col[r].as_py()} (use null for a missing value)"
                )


def _check_decision_counts(table: pa.Table, where: str) -> None:
    """The token counts between 0 and MAX_TOKENS where present."""
    for name in DECISION_COUNTS:
        if name in table.column_names:
            col = table.column(name).combine_chunks()
            bad = np.asarray(pc.less(col, 0).fill_null(False))
            if bad.any():
                r = _first(bad)
                raise _err(where, f"column {name!r}, row {r}: {col[r].as_py()} is negative")
            bad = np.asarray(pc.greater(col, MAX_TOKENS).fill_null(False))
            if bad.any():
                r = _first(bad)
                raise _err(where, f"column {name!r}, row {r}: {col[r].as_py()} is more than {MAX_TOKENS}")


def _check_per_arm_lists(table: pa.Table, where: str, arm_counts: np.ndarray) -> None:
    """The per-arm list columns: a whole row null or one value per arm, finite where a float."""
    n = table.num_rows
    for name in DECISION_PER_ARM:
        if name in table.column_names:
            col = table.column(name).combine_chunks()
            lc, flat, _ = _list_parts(col)
            if col.flatten().null_count:
                raise _err(
                    where,
                    f"column {name!r}: a missing value inside a row's list (null the whole row instead)",
                )
            present = ~np.asarray(pc.is_null(col))
            bad = present & (lc != arm_counts)
            if bad.any():
                r = _first(bad)
                raise _err(where, f"column {name!r}, row {r}: {lc[r]} values for {arm_counts[r]} arms")
            if name in DECISION_PER_ARM_FLOATS and not np.all(np.isfinite(flat.astype(np.float64))):
                r = int(np.repeat(np.arange(n), lc)[_first(~np.isfinite(flat.astype(np.float64)))])
                raise _err(where, f"column {name!r}, row {r}: NaN or infinite value")


def _check_decision_mean_tau(table: pa.Table, where: str, bs: np.ndarray) -> None:
    """Mean tau, where known, between 1 and what the chosen block size drafts."""
    if "mean_tau" in table.column_names:
        mt = _np(table.column("mean_tau"), np.float64)
        most = drafted_positions(bs)  # a round commits at most what it drafted (a tree arm -N: its depth + 1)
        bad = ~np.isnan(mt) & ((mt < 1 - 1e-9) | (mt > most + 1e-9))
        if bad.any():
            r = _first(bad)
            raise _err(
                where, f"column 'mean_tau', row {r}: {mt[r]} outside 1..{most[r]} (block size {bs[r]})"
            )


def _check_decision_features(table: pa.Table, where: str, feature_dim: int | None) -> None:
    """The features present readable, as wide as the earlier parts' (``feature_dim``)."""
    if "features" in table.column_names:
        col = table.column("features")
        present = ~np.asarray(pc.is_null(col.combine_chunks()))
        if present.any():
            rows = np.flatnonzero(present)
            X = _matrix(col, where, "features", rows)
            if feature_dim is not None and X.shape[1] != feature_dim:
                raise _err(
                    where,
                    f"column 'features', row {int(rows[0])}: {X.shape[1]} values, "
                    f"earlier parts of this log have {feature_dim}",
                )


def _check_decision_ids(table: pa.Table, where: str) -> None:
    """Every decision id once."""
    ids = np.asarray(table.column("decision_id").to_pylist(), dtype=object)
    _, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    if len(first) != table.num_rows:
        r = _first(np.bincount(inv)[inv] > 1)
        raise _err(where, f"column 'decision_id', row {r}: duplicate decision_id {ids[r]!r}")


def _check_rewards(
    table: pa.Table, where: str, hit: np.ndarray, ap: np.ndarray, la: np.ndarray, bs: np.ndarray
) -> None:
    """The rewards of a decision-log table (finite already): of plausible size
    (:data:`~adaptspec.speculator.REWARD_LIMIT`), and the counterfactual columns' own
    invariants (docs/data.md): the four ``cf_`` columns null together, only in rows with a
    reward, and ``cf_rewards`` at the arm that ran is the row's ``reward``. ``hit`` marks the
    chosen arm among the flattened ``arms`` (``ap``: their rows, ``la``: the rows' lengths)."""
    n = table.num_rows
    names = table.column_names
    reward = _np(table.column("reward"), np.float64) if "reward" in names else np.full(n, np.nan)
    big = np.abs(reward) > REWARD_LIMIT
    if big.any():
        r = _first(big)
        raise _err(
            where,
            f"column 'reward', row {r}: {reward[r]:g} is beyond any reward (|reward| <= {REWARD_LIMIT:g}: "
            "a reward is tokens/s, -ms/token or tau)",
        )
    present = {
        c: (~np.asarray(pc.is_null(table.column(c).combine_chunks())) if c in names else np.zeros(n, bool))
        for c in DECISION_PER_ARM
    }
    has = present["cf_rewards"]
    for c in DECISION_PER_ARM[1:]:
        odd = present[c] != has
        if odd.any():
            r = _first(odd)
            null, other = (c, "cf_rewards") if has[r] else ("cf_rewards", c)
            raise _err(
                where,
                f"column {null!r}, row {r}: null while {other!r} is not (the four cf_ columns are null "
                "together)",
            )
    if not has.any():
        return
    orphan = has & np.isnan(reward)
    if orphan.any():
        raise _err(
            where,
            f"column 'cf_rewards', row {_first(orphan)}: set in a row without a reward (the controller "
            "prices counterfactuals only for a reward it computed)",
        )
    lc, flat, _ = _list_parts(table.column("cf_rewards"))
    flat = flat.astype(np.float64)
    big = np.abs(flat) > REWARD_LIMIT
    if big.any():
        r = int(np.repeat(np.arange(n), lc)[_first(big)])
        raise _err(
            where, f"column 'cf_rewards', row {r}: a value beyond any reward (|reward| <= {REWARD_LIMIT:g})"
        )
    chosen = np.zeros(n, np.int64)  # the position of the arm that ran in its row's arms
    h = np.flatnonzero(hit)
    chosen[ap[h]] = h - (np.cumsum(la) - la)[ap[h]]
    rows = np.flatnonzero(has)
    at = flat[(np.cumsum(lc) - lc)[rows] + chosen[rows]]
    off = ~np.isclose(at, reward[rows], rtol=1e-9, atol=0.0)
    if off.any():
        r = int(rows[_first(off)])
        raise _err(
            where,
            f"column 'cf_rewards', row {r}: {at[_first(off)]:g} at block size {bs[r]} (the arm that "
            f"ran), but the row's reward is {reward[r]:g} (they are the same number)",
        )


class DecisionLog:
    """A decision log: a directory of ``part-*.parquet`` files (or one Parquet file).

    Writers append parts; each :meth:`append` validates its rows and writes one new part
    atomically. Readers see every complete part (temporary files start with ``.``).

    >>> import tempfile, numpy as np
    >>> d = tempfile.mkdtemp()
    >>> log = DecisionLog(d)
    >>> _ = log.append([{"decision_id": "d1", "time": 0.0, "policy": "fixed:4", "block_size": 4,
    ...                  "propensity": 1.0, "probs": [0.0, 1.0], "arms": [1, 4], "reward": 2.5}])
    >>> r = DecisionLog.read(d)
    >>> len(r), r.arms, r.actions.tolist(), r.rewards.tolist()
    (1, (1, 4), [1], [2.5])
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._table: pa.Table | None = None
        self._dim: int | None = None
        self._ids: set[str] = set()  # decision ids of the parts in _id_parts
        self._id_parts: set[str] = set()
        self._of_rows = False  # a view of rows read elsewhere (of_rows): not appended to

    # ------------------------------------------------------------------ writing
    def append(self, rows: Iterable[Mapping[str, Any]] | pa.Table) -> Path:
        """Validate ``rows`` (dicts, e.g. from :func:`decision_row`, or a table) and write them as
        one new part; returns its path. Invalid rows raise and nothing is written."""
        if self.path.exists() and not self.path.is_dir():
            raise _err(str(self.path), "cannot append: a single-file log is read-only; use a directory")
        if self._of_rows:
            raise _err(
                str(self.path),
                "cannot append: these rows were read (DecisionLog.of_rows); open the log itself",
            )
        table = _rows_to_table(rows)
        if self._dim is None and self.path.exists():
            parts = self.parts()
            if parts:
                last = read_part(parts[-1])
                if "features" in last.column_names:
                    f = last.column("features").drop_null()
                    if len(f):
                        self._dim = len(f[0])
        table = _validate_decisions(table, "decision rows", self._dim)
        if table.num_rows == 0:
            raise AdaptspecError("no decision rows to append")
        new_ids = table.column("decision_id").to_pylist()
        dup = next((i for i in new_ids if i in self._logged_ids()), None)
        if dup is not None:
            raise _err(str(self.path), f"decision_id {dup!r} is already in this log; nothing was written")
        if "features" in table.column_names:
            f = table.column("features").drop_null()
            if len(f):
                self._dim = len(f[0])
        name = f"part-{_time.time_ns():020d}-{os.getpid()}-{next(_part_counter):06d}.parquet"
        tmp: Path | None = None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(
                prefix=f".{name}.", suffix=".tmp", dir=self.path
            )  # O_EXCL: never a link
            tmp = Path(tmp_name)
            os.fchmod(fd, 0o644)  # as the journal's files (mkstemp makes them 0600)
            with os.fdopen(fd, "wb") as f:
                _write_parquet(table, f, {"adaptspec.schema_version": str(SCHEMA_VERSION)})
            os.replace(tmp, self.path / name)
        except OSError as e:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            raise _err(str(self.path), f"cannot append ({e.strerror or e}); nothing was written") from None
        except BaseException:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            raise
        self._table = None
        self._ids.update(new_ids)
        self._id_parts.add(name)
        return self.path / name

    def _logged_ids(self) -> set[str]:
        """Decision ids of every part (each part read once per instance: parts never change)."""
        for part in self.parts():
            if part.name not in self._id_parts:
                ids = part_ids(part)
                self._ids.update(ids)
                self._id_parts.add(part.name)
        return self._ids

    # ------------------------------------------------------------------ reading
    def parts(self) -> list[Path]:
        """The complete part files, oldest first."""
        if self.path.is_file():
            return [self.path]
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.glob("*.parquet") if not p.name.startswith("."))

    @classmethod
    def read(cls, path: str | os.PathLike) -> "DecisionLog":
        """Open and validate every part of the log at ``path`` (directory or one file)."""
        log = cls(path)
        if not log.path.exists():
            raise _err(str(log.path), "no such decision log")
        if (log.path / "meta.json").exists():
            raise _err(str(log.path), "this is a trace set (meta.json), not a decision log")
        _ = log.table
        return log

    @classmethod
    def of_rows(cls, path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> "DecisionLog":
        """The decision rows ``rows`` as a log to read (not to append to), validated as a log's parts
        are; ``path`` says where they came from. For a served log read with its journals
        (:func:`~adaptspec.traces.log_writer.log_rows`: the parts, then the rows not yet rolled
        into a part), as ``ab-report`` and ``ope`` read it."""
        log = cls(path)
        table = _validate_decisions(_rows_to_table(rows), str(log.path), None)
        f = table.column("features").drop_null() if "features" in table.column_names else []
        log._table, log._dim, log._of_rows = table, (len(f[len(f) - 1]) if len(f) else None), True
        return log

    @property
    def table(self) -> pa.Table:
        """All rows of all parts, validated, in part order."""
        if self._table is None:
            parts = self.parts()
            if not parts:
                raise _err(str(self.path), "no part-*.parquet files: not a decision log")
            if {p.name for p in parts} & {"requests.parquet", "outcomes.parquet"}:
                raise _err(
                    str(self.path),
                    "holds a trace set's requests.parquet/outcomes.parquet (without its "
                    "meta.json), not a decision log",
                )
            tables, dim = [], None
            for p in parts:
                t = read_part(p, dim)
                if "features" in t.column_names:
                    f = t.column("features").drop_null()
                    if len(f):
                        dim = len(f[0])
                tables.append(
                    t.select([c for c in t.column_names if c in DECISION_COLUMNS]).replace_schema_metadata(
                        None
                    )
                )
            try:
                table = pa.concat_tables(tables, promote_options="default")
            except pa.ArrowException as e:
                raise _err(str(self.path), f"parts do not share a schema ({e})") from None
            if len(tables) > 1:
                table = _validate_decisions(table, str(self.path), None)
            self._table = table
            self._dim = dim
        return self._table

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def feature_dim(self) -> int | None:
        """Length of the features in the newest part that has any (what a new part must match)."""
        _ = self.table
        return self._dim

    # ------------------------------------------------------------------ array views
    @property
    def arms(self) -> tuple[int, ...]:
        """The arm set shared by every row; rows with different arm sets raise."""
        col = self.table.column("arms").combine_chunks()
        first = col[0].as_py()
        la, flat, _ = _list_parts(col)
        k = len(first)
        same = la == k
        if same.all():
            same = (flat.reshape(-1, k) == np.asarray(first)).all(axis=1)
        if not same.all():
            r = _first(~same)
            raise _err(
                str(self.path), f"column 'arms', row {r}: arms {col[r].as_py()} differ from row 0's {first}"
            )
        return tuple(int(a) for a in first)

    @property
    def block_sizes(self) -> np.ndarray:
        return _np(self.table.column("block_size"), np.int64)

    @property
    def actions(self) -> np.ndarray:
        """Index of the chosen block size in :attr:`arms`, per row."""
        return (
            np.searchsorted(np.asarray(self.arms), self.block_sizes)
            if _sorted(self.arms)
            else np.asarray([self.arms.index(b) for b in self.block_sizes], dtype=np.int64)
        )

    @property
    def propensities(self) -> np.ndarray:
        return _np(self.table.column("propensity"), np.float64)

    @property
    def rewards(self) -> np.ndarray:
        """Reward per row, NaN where feedback never arrived."""
        if "reward" not in self.table.column_names:
            return np.full(len(self), np.nan)
        return _np(self.table.column("reward"), np.float64)

    @property
    def probs(self) -> np.ndarray:
        """``(n, K)`` logging probabilities over :attr:`arms`."""
        k = len(self.arms)
        _, flat, _ = _list_parts(self.table.column("probs"))
        return flat.astype(np.float64).reshape(-1, k)

    @property
    def contexts(self) -> np.ndarray | None:
        """``(n, d)`` float32 features; None if no row has features; rows without raise."""
        if "features" not in self.table.column_names:
            return None
        col = self.table.column("features")
        if col.null_count == len(col):
            return None
        if col.null_count:
            r = _first(np.asarray(pc.is_null(col.combine_chunks())))
            raise _err(str(self.path), f"column 'features', row {r}: missing (other rows have features)")
        return _matrix(col, str(self.path), "features")

    # ------------------------------------------------------------------ counterfactual outcomes
    def _per_arm(self, name: str, fill: Any, dtype: Any) -> np.ndarray:
        """``(n, K)`` values of per-arm column ``name`` over :attr:`arms`; ``fill`` in rows without."""
        k = len(self.arms)
        out = np.full((len(self), k), fill, dtype=dtype)
        if name not in self.table.column_names:
            return out
        col = self.table.column(name).combine_chunks()
        present = ~np.asarray(pc.is_null(col))
        if present.any():
            _, flat, _ = _list_parts(col)
            out[present] = flat.astype(dtype).reshape(-1, k)
        return out

    @property
    def cf_rewards(self) -> np.ndarray:
        """``(n, K)`` every arm's counterfactual reward from the rounds that ran (``cf_rewards``; the
        arm that ran: its ``reward``; a lower bound where :attr:`cf_censored`); NaN in rows without
        (no round ran, no feedback, a custom reward, a log written before the column)."""
        return self._per_arm("cf_rewards", np.nan, np.float64)

    @property
    def cf_tokens(self) -> np.ndarray:
        """``(n, K)`` tokens the rounds would have committed at each arm; NaN in rows without."""
        return self._per_arm("cf_tokens", np.nan, np.float64)

    @property
    def cf_censored(self) -> np.ndarray:
        """``(n, K)`` where an arm's counterfactual is only a lower bound; True in rows without."""
        return self._per_arm("cf_censored", True, bool)

    @property
    def cf_approximate(self) -> np.ndarray:
        """``(n, K)`` where an arm's counterfactual assumes it would have drafted what the arm that ran
        drafted (another block drafts on its own); False in rows without."""
        return self._per_arm("cf_approximate", False, bool)

    @property
    def cf_observed(self) -> np.ndarray:
        """``(n, K)`` where an arm's counterfactual reward is known (the row has them, not censored)."""
        return ~self.cf_censored

    def info(self) -> dict[str, Any]:
        t = self.table
        r = self.rewards
        pol = np.asarray(t.column("policy").to_pylist(), dtype=object)
        per_policy = {}
        for name in sorted(set(pol)):
            m = pol == name
            rr = r[m]
            per_policy[str(name)] = {
                "decisions": int(m.sum()),
                "with_reward": int(np.isfinite(rr).sum()),
                "mean_reward": None if not np.isfinite(rr).any() else round(float(np.nanmean(rr)), 4),
            }
        times = t.column("time")
        d: dict[str, Any] = {
            "kind": "decision_log",
            "path": str(self.path),
            "parts": len(self.parts()),
            "decisions": t.num_rows,
            "with_reward": int(np.isfinite(r).sum()),
            "policies": per_policy,
            "time": [str(pc.min(times).as_py()), str(pc.max(times).as_py())],
        }
        try:
            d["arms"] = list(self.arms)
        except AdaptspecError:
            d["arms"] = "differ between rows"
        ctx = None
        if "features" in t.column_names and t.column("features").null_count < t.num_rows:
            f = t.column("features").drop_null()
            ctx = len(f[0])
        d["features"] = ctx
        if "variant" in t.column_names:
            d["variants"] = sorted({str(v) for v in t.column("variant").drop_null().to_pylist()})
        return d

    def __repr__(self) -> str:
        return f"DecisionLog({str(self.path)!r})"


def _sorted(a: Sequence[int]) -> bool:
    return all(x < y for x, y in zip(a, a[1:]))
