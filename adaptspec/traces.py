"""Trace sets and decision logs: Parquet on disk, validated, with numpy views for hot paths.

A **trace set** (full information: every block size ran on every request) is a directory::

    meta.json          {"schema_version": 1, "arms": [...], "target": ..., ...}
    requests.parquet   request_id, domain, prompt_tokens, [features]
    outcomes.parquet   request_id, block_size, new_tokens, rounds, mean_tau,
                       [tau, draft_ms, verify_ms (per-round lists)], [decode_ms]

A **decision log** (partial feedback, one row per decision, written by the controller) is a
directory of ``part-*.parquet`` files, each appended atomically; readers read them all.

Validation errors name the file, the column and the row (0-based) that is wrong. Writes go
to a temporary file or directory that is renamed into place, so a crash never leaves a
half-written trace set or log part. See ``docs/data.md``.

>>> import numpy as np
>>> ts = TraceSet.from_arrays(["a", "b"], ["math", "chat"], arms=[1, 4],
...                           mean_tau=np.array([[1.0, 3.5], [1.0, 1.5]]))
>>> ts.arms, ts.tau_matrix().tolist(), ts.domains.tolist()
((1, 4), [[1.0, 3.5], [1.0, 1.5]], ['math', 'chat'])
"""

from __future__ import annotations

import json
import math
import os
import re
import time as _time
import uuid
from datetime import datetime, timezone
from itertools import count
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import AdaptspecError
from ._io import json_default

#: Version of the on-disk formats this code writes; it reads this version and older.
SCHEMA_VERSION = 1

#: The bundled trace set: the bundled speculator on 200 held-out prompts (docs/data.md).
DEFAULT_TRACES = Path(__file__).resolve().parent / "data" / "traces" / "default"

_F32_LIST = pa.list_(pa.float32())
_F64_LIST = pa.list_(pa.float64())

# name -> (type, required, nullable)
REQUEST_COLUMNS: dict[str, tuple[pa.DataType, bool, bool]] = {
    "request_id": (pa.string(), True, False),
    "domain": (pa.string(), True, False),
    "prompt_tokens": (pa.int64(), True, True),
    "features": (_F32_LIST, False, False),
}
OUTCOME_COLUMNS: dict[str, tuple[pa.DataType, bool, bool]] = {
    "request_id": (pa.string(), True, False),
    "block_size": (pa.int64(), True, False),
    "new_tokens": (pa.int64(), True, True),
    "rounds": (pa.int64(), True, True),
    "mean_tau": (pa.float64(), True, False),
    "tau": (pa.list_(pa.int32()), False, False),
    "draft_ms": (_F32_LIST, False, False),
    "verify_ms": (_F32_LIST, False, False),
    "decode_ms": (pa.float64(), False, True),
}
DECISION_COLUMNS: dict[str, tuple[pa.DataType, bool, bool]] = {
    "decision_id": (pa.string(), True, False),
    "time": (pa.timestamp("us", tz="UTC"), True, False),
    "request_id": (pa.string(), False, True),
    "policy": (pa.string(), True, False),
    "version": (pa.int64(), False, True),
    "variant": (pa.string(), False, True),
    "features": (_F32_LIST, False, True),
    "block_size": (pa.int64(), True, False),
    "propensity": (pa.float64(), True, False),
    "probs": (_F64_LIST, True, False),
    "arms": (pa.list_(pa.int64()), True, False),
    "reward": (pa.float64(), False, True),
    "new_tokens": (pa.int64(), False, True),
    "decode_ms": (pa.float64(), False, True),
    "mean_tau": (pa.float64(), False, True),
    "rounds": (pa.int64(), False, True),
}


# ============================================================================ shared helpers
def _err(where: str, msg: str) -> AdaptspecError:
    return AdaptspecError(f"{where}: {msg}")


def _read_parquet(path: Path) -> pa.Table:
    if not path.exists():
        raise _err(str(path), "no such file")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise _err(str(path), f"not a readable Parquet file ({str(e).splitlines()[0]})") from None


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_columns(table: pa.Table, spec: Mapping[str, tuple[pa.DataType, bool, bool]], where: str) -> pa.Table:
    """Cast every known column to its type and check nulls; missing required columns raise."""
    missing = [n for n, (_, req, _) in spec.items() if req and n not in table.column_names]
    if missing:
        raise _err(where, f"missing column {missing[0]!r} (has {', '.join(table.column_names) or 'no columns'})")
    for name, (typ, _, nullable) in spec.items():
        if name not in table.column_names:
            continue
        col = table.column(name)
        if not col.type.equals(typ):
            if pa.types.is_null(col.type):
                col = pa.nulls(len(col), typ)
            else:
                try:
                    if not _castable(col.type, typ):
                        raise ValueError
                    col = col.cast(typ, safe=True)
                except (pa.ArrowException, ValueError):
                    raise _err(where, f"column {name!r} has type {col.type}, expected {typ}") from None
            table = table.set_column(table.column_names.index(name), name, col)
        if not nullable and col.null_count:
            row = _first(np.asarray(pc.is_null(col)))
            raise _err(where, f"column {name!r}, row {row}: missing value")
    return table


def _castable(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether a column of type ``src`` may be read as ``dst``: numbers as other numbers (the cast
    itself refuses lossy ones), never text or booleans as numbers."""
    nested = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    if any(f(src) for f in nested) and any(f(dst) for f in nested):
        return _castable(src.value_type, dst.value_type)
    if pa.types.is_string(src) or pa.types.is_large_string(src) or pa.types.is_binary(src) \
            or pa.types.is_large_binary(src):
        return pa.types.is_string(dst) or pa.types.is_large_string(dst)
    if pa.types.is_boolean(src):
        return pa.types.is_boolean(dst)
    return True


def _np(col: pa.ChunkedArray | pa.Array, dtype: Any = None, fill: float = np.nan) -> np.ndarray:
    """A numeric column as numpy; nulls become ``fill`` (float output)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if col.null_count:
        col = col.cast(pa.float64()).fill_null(fill)
    out = col.to_numpy(zero_copy_only=False)
    return out if dtype is None else out.astype(dtype, copy=False)


def _list_parts(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lengths, flattened values, row of each value) of a list column (nulls as empty)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if isinstance(arr, pa.ExtensionArray):  # pragma: no cover - not produced here
        arr = arr.storage
    lengths = _np(pc.list_value_length(arr), np.int64, fill=0)
    values = arr.flatten().to_numpy(zero_copy_only=False)
    parents = np.repeat(np.arange(len(arr)), lengths)
    return lengths, values, parents


def _matrix(col: pa.ChunkedArray, where: str, name: str, rows: np.ndarray | None = None) -> np.ndarray:
    """A list column whose rows all have the same length as an (n, d) float32 matrix."""
    lengths, values, parents = _list_parts(col)
    if rows is not None:
        lengths = lengths[rows]
    if lengths.size == 0:
        return np.zeros((0, 0), dtype=np.float32)
    d = int(lengths[0])
    if np.any(lengths != d):
        bad = _first(lengths != d)
        raise _err(where, f"column {name!r}, row {bad if rows is None else int(rows[bad])}: "
                          f"{lengths[bad]} values, row {0 if rows is None else int(rows[0])} has {d}")
    if rows is not None:
        keep = np.isin(parents, rows)
        values = values[keep]
    x = values.astype(np.float32, copy=False).reshape(len(lengths), d)
    if not np.all(np.isfinite(x)):
        bad = _first(~np.isfinite(x).all(axis=1))
        raise _err(where, f"column {name!r}, row {bad if rows is None else int(rows[bad])}: NaN or infinite value")
    return x


def _write_parquet(table: pa.Table, path: Path, metadata: Mapping[str, str] | None = None) -> None:
    if metadata:
        md = dict(table.schema.metadata or {})
        md.update({k.encode(): v.encode() for k, v in metadata.items()})
        table = table.replace_schema_metadata(md)
    pq.write_table(table, path, compression="zstd")


# ============================================================================ trace sets
class TraceSet:
    """A validated trace set: every request decoded at every block size.

    Build one with :meth:`read`, :meth:`from_arrays`, the synthetic generator or an
    importer; all of them validate. Requests keep their stored order (the "logged" order);
    arms are sorted ascending; matrices are ``(n_requests, n_arms)`` in those orders.
    """

    def __init__(self, requests: pa.Table, outcomes: pa.Table, meta: Mapping[str, Any] | None = None,
                 *, path: str | os.PathLike | None = None) -> None:
        self.path = None if path is None else Path(path)
        base = str(self.path) + "/" if self.path else ""
        self._where_req = f"{base}requests.parquet"
        self._where_out = f"{base}outcomes.parquet"
        self.meta = _check_meta(dict(meta or {}), f"{base}meta.json", "traceset")
        self.requests = _check_columns(requests, REQUEST_COLUMNS, self._where_req)
        self.outcomes = _check_columns(outcomes, OUTCOME_COLUMNS, self._where_out)
        self._validate()
        self.meta["arms"] = list(self.arms)
        self._cache: dict[Any, np.ndarray] = {}

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        wr, wo = self._where_req, self._where_out
        req_ids = self.requests.column("request_id")
        ids = np.asarray(req_ids.to_numpy(zero_copy_only=False), dtype=object)
        if len(ids) == 0:
            raise _err(wr, "no requests")
        _, first, inv = np.unique(ids, return_index=True, return_inverse=True)
        if len(first) != len(ids):
            dup = _first(np.bincount(inv)[inv] > 1)
            raise _err(wr, f"column 'request_id', row {dup}: duplicate request_id {ids[dup]!r}")
        pt = _np(self.requests.column("prompt_tokens"), np.float64)
        if np.any(pt < 0):
            raise _err(wr, f"column 'prompt_tokens', row {_first(pt < 0)}: negative ({pt[pt < 0][0]:g})")
        if "features" in self.requests.column_names:
            self._features = _matrix(self.requests.column("features"), wr, "features")
        else:
            self._features = None

        out = self.outcomes
        n_out = out.num_rows
        ridx = _np(pc.index_in(out.column("request_id"), value_set=req_ids), np.float64)
        if np.any(np.isnan(ridx)):
            bad = _first(np.isnan(ridx))
            rid = out.column("request_id")[bad].as_py()
            raise _err(wo, f"column 'request_id', row {bad}: request {rid!r} is not in requests.parquet")
        ridx = ridx.astype(np.int64)
        bs = _np(out.column("block_size"), np.int64)
        if np.any(bs < 1):
            bad = _first(bs < 1)
            raise _err(wo, f"column 'block_size', row {bad}: block size {bs[bad]} < 1")
        arms, aidx = np.unique(bs, return_inverse=True)
        self.arms: tuple[int, ...] = tuple(int(a) for a in arms)
        n, k = len(ids), len(arms)
        cell = ridx * k + aidx
        counts = np.bincount(cell, minlength=n * k)
        if np.any(counts > 1):
            c = _first(counts > 1)
            rows = np.flatnonzero(cell == c)[:2]
            raise _err(wo, f"rows {rows[0]} and {rows[1]} repeat (request {ids[c // k]!r}, block_size {arms[c % k]})")
        if np.any(counts == 0):
            c = _first(counts == 0)
            has = [int(a) for a, m in zip(arms, counts.reshape(n, k)[c // k]) if m]
            if not has:
                raise _err(wo, f"request {ids[c // k]!r} has no outcome rows")
            raise _err(wo, f"request {ids[c // k]!r} has block sizes {has}, others have {list(self.arms)} "
                           f"(every request needs every arm; missing {int(arms[c % k])})")
        self._ridx, self._aidx, self._cell = ridx, aidx, cell

        mt = _np(out.column("mean_tau"), np.float64)
        bad = ~np.isfinite(mt) | (mt < 1 - 1e-9) | (mt > bs + 1e-9)
        if bad.any():
            r = _first(bad)
            raise _err(wo, f"column 'mean_tau', row {r}: {mt[r]} outside 1..{bs[r]} (block_size {bs[r]})")
        for name, lo in (("new_tokens", 0), ("rounds", 1)):
            v = _np(out.column(name), np.float64)
            neg = v < lo
            if neg.any():
                raise _err(wo, f"column {name!r}, row {_first(neg)}: {v[neg][0]:g} < {lo}")
        rounds = _np(out.column("rounds"), np.float64)
        if "tau" in out.column_names:
            lengths, vals, parents = _list_parts(out.column("tau"))
            known = ~np.isnan(rounds)
            if np.any(known & (lengths != rounds)):
                r = _first(known & (lengths != rounds))
                raise _err(wo, f"column 'tau', row {r}: {lengths[r]} rounds listed, column 'rounds' says {int(rounds[r])}")
            if np.any(lengths == 0):
                raise _err(wo, f"column 'tau', row {_first(lengths == 0)}: empty list")
            badv = (vals < 1) | (vals > bs[parents])
            if badv.any():
                r = int(parents[_first(badv)])
                raise _err(wo, f"column 'tau', row {r}: tau {vals[_first(badv)]} outside 1..{bs[r]}")
            means = np.bincount(parents, weights=vals, minlength=n_out) / np.maximum(lengths, 1)
            off = np.abs(means - mt) > 1e-6 * np.maximum(1.0, mt)
            if off.any():
                r = _first(off)
                raise _err(wo, f"column 'mean_tau', row {r}: {mt[r]} but the per-round tau list averages {means[r]:.6g}")
            for name in ("draft_ms", "verify_ms"):
                if name not in out.column_names:
                    continue
                ln, v, p = _list_parts(out.column(name))
                if np.any(ln != lengths):
                    r = _first(ln != lengths)
                    raise _err(wo, f"column {name!r}, row {r}: {ln[r]} values, column 'tau' has {lengths[r]} rounds")
                badv = ~np.isfinite(v) | (v < 0)
                if badv.any():
                    raise _err(wo, f"column {name!r}, row {int(p[_first(badv)])}: {v[_first(badv)]} is not a time >= 0")
        else:
            for name in ("draft_ms", "verify_ms"):
                if name in out.column_names:
                    raise _err(wo, f"column {name!r} needs the per-round column 'tau'")
        if "decode_ms" in out.column_names:
            d = _np(out.column("decode_ms"), np.float64)
            badd = ~np.isnan(d) & ~(np.isfinite(d) & (d > 0))
            if badd.any():
                raise _err(wo, f"column 'decode_ms', row {_first(badd)}: {d[badd][0]} is not a time > 0")
        meta_arms = self.meta.get("arms")
        if meta_arms is not None and sorted(int(a) for a in meta_arms) != list(self.arms):
            raise AdaptspecError(f"{str(self.path) + '/' if self.path else ''}meta.json: arms {list(meta_arms)} "
                                 f"but outcomes.parquet has block sizes {list(self.arms)}")

    # ------------------------------------------------------------------ reading and writing
    @classmethod
    def read(cls, path: str | os.PathLike) -> "TraceSet":
        """Read and validate the trace set in directory ``path``."""
        p = Path(path)
        if not p.exists():
            raise _err(str(p), "no such trace set directory")
        if not p.is_dir():
            raise _err(str(p), "a trace set is a directory (meta.json, requests.parquet, outcomes.parquet)")
        meta = _read_meta(p / "meta.json")
        return cls(_read_parquet(p / "requests.parquet"), _read_parquet(p / "outcomes.parquet"), meta, path=p)

    def write(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write to directory ``path`` atomically (temporary directory, then rename)."""
        meta = {"schema_version": SCHEMA_VERSION, **{k: v for k, v in self.meta.items() if k != "schema_version"}}
        meta["arms"] = list(self.arms)

        def write(tmp: Path) -> None:
            _write_parquet(self.requests, tmp / "requests.parquet")
            _write_parquet(self.outcomes, tmp / "outcomes.parquet")
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=json_default) + "\n")

        from ._outputs import write_dir

        return write_dir(path, "traceset", overwrite, write)

    @classmethod
    def from_arrays(
        cls,
        request_ids: Sequence[str],
        domains: Sequence[str],
        arms: Sequence[int],
        mean_tau: np.ndarray,
        *,
        prompt_tokens: Sequence[int] | None = None,
        features: np.ndarray | None = None,
        new_tokens: np.ndarray | None = None,
        rounds: np.ndarray | None = None,
        decode_ms: np.ndarray | None = None,
        tau: Sequence[Sequence[int]] | None = None,
        draft_ms: Sequence[Sequence[float]] | None = None,
        verify_ms: Sequence[Sequence[float]] | None = None,
        request_columns: Mapping[str, Any] | None = None,
        outcome_columns: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> "TraceSet":
        """Build from arrays: matrices are ``(n_requests, n_arms)``; per-round lists are given
        row-major (request by request, arms in the order given), ``n_requests * n_arms`` of them.
        ``new_tokens`` may be ``(n,)`` (the same for every arm). Extra columns: per request in
        ``request_columns``, per outcome (row-major, ``n * K`` values) in ``outcome_columns``."""
        n, k = len(request_ids), len(arms)
        mt = np.asarray(mean_tau, dtype=np.float64)
        if mt.shape != (n, k):
            raise AdaptspecError(f"mean_tau has shape {mt.shape}, expected ({n}, {k})")
        req: dict[str, Any] = {
            "request_id": pa.array([str(r) for r in request_ids], pa.string()),
            "domain": pa.array([str(d) for d in domains], pa.string()),
            "prompt_tokens": (pa.nulls(n, pa.int64()) if prompt_tokens is None
                              else pa.array(np.asarray(prompt_tokens, dtype=np.int64))),
        }
        if features is not None:
            f = np.ascontiguousarray(features, dtype=np.float32)
            if f.ndim != 2 or f.shape[0] != n:
                raise AdaptspecError(f"features has shape {f.shape}, expected ({n}, d)")
            req["features"] = pa.FixedSizeListArray.from_arrays(pa.array(f.ravel()), f.shape[1]).cast(_F32_LIST)
        for name, values in (request_columns or {}).items():
            req[name] = pa.array(values)

        def mat(x: Any, dtype: Any) -> pa.Array:
            a = np.asarray(x)
            if a.ndim == 1:
                a = np.repeat(a[:, None], k, axis=1)
            if a.shape != (n, k):
                raise AdaptspecError(f"expected shape ({n}, {k}), got {a.shape}")
            return pa.array(a.ravel().astype(dtype))

        out: dict[str, Any] = {
            "request_id": pa.array(np.repeat(np.asarray([str(r) for r in request_ids], dtype=object), k), pa.string()),
            "block_size": pa.array(np.tile(np.asarray(arms, dtype=np.int64), n)),
            "new_tokens": mat(new_tokens, np.int64) if new_tokens is not None else pa.nulls(n * k, pa.int64()),
            "rounds": mat(rounds, np.int64) if rounds is not None else pa.nulls(n * k, pa.int64()),
            "mean_tau": pa.array(mt.ravel()),
        }
        for name, lists, typ in (("tau", tau, pa.list_(pa.int32())), ("draft_ms", draft_ms, _F32_LIST),
                                 ("verify_ms", verify_ms, _F32_LIST)):
            if lists is not None:
                if len(lists) != n * k:
                    raise AdaptspecError(f"{name}: {len(lists)} lists, expected {n * k}")
                lengths = np.fromiter((len(x) for x in lists), np.int32, n * k)
                offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
                flat = np.concatenate([np.asarray(x) for x in lists]) if n * k else np.zeros(0)
                out[name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat).cast(typ.value_type))
        if decode_ms is not None:
            out["decode_ms"] = mat(decode_ms, np.float64)
        for name, values in (outcome_columns or {}).items():
            out[name] = pa.array(values)
        m = {"schema_version": SCHEMA_VERSION, **dict(meta or {})}
        return cls(pa.table(req), pa.table(out), m)

    # ------------------------------------------------------------------ array views
    def __len__(self) -> int:
        return self.requests.num_rows

    @property
    def n_requests(self) -> int:
        return self.requests.num_rows

    @property
    def arm_array(self) -> np.ndarray:
        return np.asarray(self.arms, dtype=np.int64)

    @property
    def request_ids(self) -> np.ndarray:
        return self._cached("ids", lambda: np.asarray(self.requests.column("request_id").to_pylist(), dtype=object))

    @property
    def domains(self) -> np.ndarray:
        """Domain of each request (object array of str)."""
        return self._cached("domains", lambda: np.asarray(self.requests.column("domain").to_pylist(), dtype=object))

    @property
    def features(self) -> np.ndarray | None:
        """``(n, d)`` float32 prefill features, or None when the trace set has none."""
        return self._features

    @property
    def prompt_tokens(self) -> np.ndarray:
        """Prompt length per request (float; NaN where unknown)."""
        return self._cached("pt", lambda: _np(self.requests.column("prompt_tokens"), np.float64))

    def column(self, name: str) -> np.ndarray:
        """Any per-request column as a numpy array (e.g. ``blockpilot_choice``)."""
        if name not in self.requests.column_names:
            raise AdaptspecError(f"{self._where_req}: no column {name!r}")
        col = self.requests.column(name)
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
            return _np(col)
        return np.asarray(col.to_pylist(), dtype=object)

    def _scatter(self, values: np.ndarray) -> np.ndarray:
        m = np.full(self.n_requests * len(self.arms), np.nan)
        m[self._cell] = values
        return m.reshape(self.n_requests, len(self.arms))

    def _cached(self, key: Any, make: Any) -> np.ndarray:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def tau_matrix(self) -> np.ndarray:
        """Mean tau per (request, arm)."""
        return self._cached("tau", lambda: self._scatter(_np(self.outcomes.column("mean_tau"), np.float64)))

    def new_tokens_matrix(self) -> np.ndarray:
        """New tokens per (request, arm), NaN where not recorded."""
        return self._cached("new", lambda: self._scatter(_np(self.outcomes.column("new_tokens"), np.float64)))

    def rounds_matrix(self) -> np.ndarray:
        """Rounds per (request, arm), NaN where not recorded."""
        return self._cached("rounds", lambda: self._scatter(_np(self.outcomes.column("rounds"), np.float64)))

    @property
    def has_timings(self) -> bool:
        """True when measured decode time is known for every outcome (``decode_ms`` or per-round lists)."""
        return self.decode_s_matrix() is not None

    def decode_s_matrix(self) -> np.ndarray | None:
        """Measured decode seconds per (request, arm): ``decode_ms`` where stored, else the sum of
        the per-round draft and verify times; None when the trace set has no timings."""
        if "decode_s" not in self._cache:
            out = self.outcomes
            secs = None
            if "draft_ms" in out.column_names and "verify_ms" in out.column_names:
                ms = np.zeros(out.num_rows)
                for name in ("draft_ms", "verify_ms"):
                    _, v, p = _list_parts(out.column(name))
                    ms += np.bincount(p, weights=v.astype(np.float64), minlength=out.num_rows)
                secs = ms / 1000.0
            if "decode_ms" in out.column_names:
                d = _np(out.column("decode_ms"), np.float64) / 1000.0
                secs = d if secs is None else np.where(np.isnan(d), secs, d)
            if secs is not None and np.any(np.isnan(secs)):
                secs = None
            self._cache["decode_s"] = None if secs is None else self._scatter(secs)
        return self._cache["decode_s"]

    def reward_matrix(self, reward: str = "tau", latency: Any = None, batch_size: int = 1) -> np.ndarray:
        """``(n_requests, n_arms)`` rewards: ``tau``, measured ``throughput`` or ``modelled``
        throughput (see :mod:`adaptspec.rewards`)."""
        from .rewards import trace_rewards

        return trace_rewards(self, reward, latency, batch_size)

    def best_arm(self, reward: str = "tau", latency: Any = None) -> np.ndarray:
        """Per request, the index of the arm with the highest reward (lowest block size on ties)."""
        return np.argmax(self.reward_matrix(reward, latency), axis=1)

    # ------------------------------------------------------------------ subsets and summaries
    def subset(self, indices: Sequence[int] | np.ndarray) -> "TraceSet":
        """A trace set of the given requests (in that order); for train/test splits.

        >>> ts = TraceSet.from_arrays(list("abc"), ["x"] * 3, [1, 2], np.ones((3, 2)))
        >>> ts.subset([2, 0]).request_ids.tolist()
        ['c', 'a']
        """
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1 or np.any(idx < 0) or np.any(idx >= self.n_requests):
            raise AdaptspecError(f"subset indices must be 0..{self.n_requests - 1}")
        req = self.requests.take(pa.array(idx))
        pos = np.full(self.n_requests, -1)
        pos[idx] = np.arange(len(idx))
        keep_rows = np.flatnonzero(pos[self._ridx] >= 0)
        order = keep_rows[np.lexsort((self._aidx[keep_rows], pos[self._ridx[keep_rows]]))]
        out = self.outcomes.take(pa.array(order))
        return TraceSet(req, out, dict(self.meta))

    def info(self) -> dict[str, Any]:
        """A summary: counts, arms, domains, features, timings, mean tau per arm."""
        tau = self.tau_matrix()
        doms, cnt = np.unique(self.domains.astype(str), return_counts=True)
        best = np.bincount(np.argmax(tau, axis=1), minlength=len(self.arms))
        d: dict[str, Any] = {
            "kind": "traceset",
            "path": str(self.path) if self.path else None,
            "schema_version": self.meta.get("schema_version", SCHEMA_VERSION),
            "requests": self.n_requests,
            "arms": list(self.arms),
            "domains": {str(a): int(b) for a, b in zip(doms, cnt)},
            "features": None if self.features is None else int(self.features.shape[1]),
            "per_round": "tau" in self.outcomes.column_names,
            "timings": self.has_timings,
            "mean_tau": {int(a): round(float(v), 4) for a, v in zip(self.arms, tau.mean(axis=0))},
            "best_arm_share_by_tau": {int(a): round(float(v) / self.n_requests, 4) for a, v in zip(self.arms, best)},
            "oracle_mean_tau": round(float(tau.max(axis=1).mean()), 4),
        }
        for k in ("source", "target", "drafter", "hardware", "temperature", "scenario", "latency_profile"):
            if k in self.meta:
                d[k] = self.meta[k]
        return d

    def __repr__(self) -> str:
        f = "no features" if self.features is None else f"{self.features.shape[1]} features"
        return f"TraceSet({self.n_requests} requests, arms {list(self.arms)}, {f})"



def _read_meta(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise _err(str(path), "no such file (a trace set needs meta.json with a schema_version)")
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _err(str(path), f"not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise _err(str(path), "top level must be a JSON object")
    return meta


def _check_meta(meta: dict[str, Any], where: str, kind: str) -> dict[str, Any]:
    v = meta.get("schema_version")
    if v is None:
        raise _err(where, "no schema_version")
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise _err(where, f"schema_version must be a positive integer, got {v!r}")
    if v > SCHEMA_VERSION:
        raise _err(where, f"schema_version {v} is newer than this adaptspec reads ({SCHEMA_VERSION}); upgrade adaptspec")
    meta.setdefault("kind", kind)
    return meta


def load_traces(path: str | os.PathLike | None = None) -> TraceSet:
    """Read a trace set; ``None`` reads the bundled default."""
    return TraceSet.read(DEFAULT_TRACES if path is None else path)


def path_label(path: str | os.PathLike | None) -> str | None:
    """How saved artefacts name the trace set they came from: bundled sets relative to the
    package (the same on every machine), others as given.

    >>> path_label(DEFAULT_TRACES)
    'adaptspec/data/traces/default'
    """
    if path is None:
        return None
    p = Path(path).resolve()
    package = DEFAULT_TRACES.parents[2]
    return str(Path("adaptspec") / p.relative_to(package)) if p.is_relative_to(package) else str(path)


# ============================================================================ decision logs
_part_counter = count()


def decision_row(
    decision: Any,
    *,
    features: Sequence[float] | np.ndarray | None = None,
    outcome: Any = None,
    reward: float | None = None,
    request_id: str | None = None,
    variant: str | None = None,
    time: float | datetime | None = None,
) -> dict[str, Any]:
    """One decision-log row from a :class:`~adaptspec.speculator.Decision` and what followed.

    ``outcome`` (an :class:`~adaptspec.speculator.Outcome`, or None when feedback never came)
    fills ``new_tokens``, ``decode_ms``, ``mean_tau`` and ``rounds``.
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
    if outcome is not None:
        row.update(new_tokens=int(outcome.new_tokens), decode_ms=1000.0 * float(outcome.decode_s),
                   mean_tau=float(outcome.mean_tau) if outcome.rounds else None, rounds=len(outcome.rounds))
    return row


def _rows_to_table(rows: Iterable[Mapping[str, Any]] | pa.Table) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    rows = list(rows)
    if not rows:
        raise AdaptspecError("no decision rows to append")
    unknown = sorted({k for r in rows for k in r} - set(DECISION_COLUMNS))
    if unknown:
        raise AdaptspecError(f"unknown decision-log column {unknown[0]!r} (known: {', '.join(DECISION_COLUMNS)})")
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
    n = table.num_rows
    if n == 0:
        return table
    prop = _np(table.column("propensity"), np.float64)
    bad = ~np.isfinite(prop) | (prop <= 0) | (prop > 1 + 1e-9)
    if bad.any():
        r = _first(bad)
        raise _err(where, f"column 'propensity', row {r}: {prop[r]} outside (0, 1]")
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
    bs = _np(table.column("block_size"), np.int64)
    hit = arms_flat == bs[ap]
    chosen = np.bincount(ap, weights=hit, minlength=n)
    if np.any(chosen != 1):
        r = _first(chosen != 1)
        arms_r = table.column("arms")[r].as_py()
        raise _err(where, f"column 'block_size', row {r}: {bs[r]} is not one of the row's arms {arms_r}")
    p_chosen = np.zeros(n)
    p_chosen[ap[hit]] = probs_flat[hit]
    off = np.abs(p_chosen - prop) > 1e-6
    if off.any():
        r = _first(off)
        raise _err(where, f"column 'propensity', row {r}: {prop[r]} but probs gives {p_chosen[r]:.6g} to block size {bs[r]}")
    for name in ("reward", "decode_ms", "mean_tau"):
        if name in table.column_names:
            col = table.column(name).combine_chunks()
            bad = ~np.asarray(pc.is_finite(col).fill_null(True))
            if bad.any():
                r = _first(bad)
                raise _err(where, f"column {name!r}, row {r}: {col[r].as_py()} (use null for a missing value)")
    if "mean_tau" in table.column_names:
        mt = _np(table.column("mean_tau"), np.float64)
        bad = ~np.isnan(mt) & ((mt < 1 - 1e-9) | (mt > bs + 1e-9))
        if bad.any():
            r = _first(bad)
            raise _err(where, f"column 'mean_tau', row {r}: {mt[r]} outside 1..{bs[r]}")
    if "features" in table.column_names:
        col = table.column("features")
        present = ~np.asarray(pc.is_null(col.combine_chunks()))
        if present.any():
            rows = np.flatnonzero(present)
            X = _matrix(col, where, "features", rows)
            if feature_dim is not None and X.shape[1] != feature_dim:
                raise _err(where, f"column 'features', row {int(rows[0])}: {X.shape[1]} values, "
                                  f"earlier parts of this log have {feature_dim}")
    ids = np.asarray(table.column("decision_id").to_pylist(), dtype=object)
    _, first, inv = np.unique(ids, return_index=True, return_inverse=True)
    if len(first) != n:
        r = _first(np.bincount(inv)[inv] > 1)
        raise _err(where, f"column 'decision_id', row {r}: duplicate decision_id {ids[r]!r}")
    return table


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
        self._ids: set[str] = set()        # decision ids of the parts in _id_parts
        self._id_parts: set[str] = set()

    # ------------------------------------------------------------------ writing
    def append(self, rows: Iterable[Mapping[str, Any]] | pa.Table) -> Path:
        """Validate ``rows`` (dicts, e.g. from :func:`decision_row`, or a table) and write them as
        one new part; returns its path. Invalid rows raise and nothing is written."""
        if self.path.exists() and not self.path.is_dir():
            raise _err(str(self.path), "cannot append: a single-file log is read-only; use a directory")
        table = _rows_to_table(rows)
        if self._dim is None and self.path.exists():
            parts = self.parts()
            if parts:
                last = _read_parquet(parts[-1])
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
        tmp = self.path / f".{name}.tmp"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            _write_parquet(table, tmp, {"adaptspec.schema_version": str(SCHEMA_VERSION)})
            os.replace(tmp, self.path / name)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise _err(str(self.path), f"cannot append ({e.strerror or e}); nothing was written") from None
        except BaseException:
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
                try:
                    ids = pq.read_table(part, columns=["decision_id"]).column("decision_id").to_pylist()
                except (pa.ArrowException, OSError, KeyError) as e:
                    raise _err(str(part), f"not a readable decision-log part ({str(e).splitlines()[0]})") from None
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

    @property
    def table(self) -> pa.Table:
        """All rows of all parts, validated, in part order."""
        if self._table is None:
            parts = self.parts()
            if not parts:
                raise _err(str(self.path), "no part-*.parquet files: not a decision log")
            tables, dim = [], None
            for p in parts:
                t = _read_parquet(p)
                if t.num_rows == 0:
                    raise _err(str(p), "part has no rows (adaptspec never writes an empty part; remove it)")
                md = t.schema.metadata or {}
                v = md.get(b"adaptspec.schema_version")
                if v is not None and int(v) > SCHEMA_VERSION:
                    raise _err(str(p), f"schema_version {int(v)} is newer than this adaptspec reads ({SCHEMA_VERSION})")
                t = _validate_decisions(t, str(p), dim)
                if "features" in t.column_names:
                    f = t.column("features").drop_null()
                    if len(f):
                        dim = len(f[0])
                tables.append(t.select([c for c in t.column_names if c in DECISION_COLUMNS]).replace_schema_metadata(None))
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
            raise _err(str(self.path), f"column 'arms', row {r}: arms {col[r].as_py()} differ from row 0's {first}")
        return tuple(int(a) for a in first)

    @property
    def block_sizes(self) -> np.ndarray:
        return _np(self.table.column("block_size"), np.int64)

    @property
    def actions(self) -> np.ndarray:
        """Index of the chosen block size in :attr:`arms`, per row."""
        return np.searchsorted(np.asarray(self.arms), self.block_sizes) if _sorted(self.arms) else \
            np.asarray([self.arms.index(b) for b in self.block_sizes], dtype=np.int64)

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

    def info(self) -> dict[str, Any]:
        t = self.table
        r = self.rewards
        pol = np.asarray(t.column("policy").to_pylist(), dtype=object)
        per_policy = {}
        for name in sorted(set(pol)):
            m = pol == name
            rr = r[m]
            per_policy[str(name)] = {"decisions": int(m.sum()), "with_reward": int(np.isfinite(rr).sum()),
                                     "mean_reward": None if not np.isfinite(rr).any() else round(float(np.nanmean(rr)), 4)}
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


# ============================================================================ BlockPilot importer
_BP_FOLDER = re.compile(r"^(?P<dataset>.+)_(?P<start>\d+)T(?P<temp>\d+(?:\.\d+)?)$")


def _load_json_map(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _err(str(path), f"not valid JSON ({e})") from None
    if not isinstance(d, dict) or not d:
        raise _err(str(path), "expected a non-empty JSON object {prompt index: value}")
    for k, v in d.items():
        if not re.fullmatch(r"\d+", str(k)):
            raise _err(str(path), f"key {k!r} is not a prompt index")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _err(str(path), f"prompt {k}: {v!r} is not a finite number")
    return d


def _read_blockpilot_folder(folder: Path) -> dict[str, Any]:
    sizes: dict[int, dict[str, Any]] = {}
    ignored = []
    for p in sorted(folder.glob("*.json")):
        if re.fullmatch(r"\d+", p.stem):
            sizes[int(p.stem)] = _load_json_map(p)
        elif p.name != "mapped_from_1.json":
            ignored.append(p.name)
    mapped_path = folder / "mapped_from_1.json"
    mapped = _load_json_map(mapped_path) if mapped_path.exists() else None
    choice = None
    if 1 in sizes:
        others = sorted(b for b in sizes if b != 1)
        vals = np.asarray(list(sizes[1].values()), dtype=np.float64)
        integral = bool(np.all(vals == np.round(vals)))
        in_range = bool(others) and integral and bool(np.all((vals >= others[0]) & (vals <= others[-1])))
        if in_range and (mapped is not None or not np.all(vals == 1)):
            choice = {k: int(v) for k, v in sizes.pop(1).items()}
        elif mapped is not None:
            raise _err(str(folder / "1.json"), "mapped_from_1.json is present, so 1.json should hold the selector's "
                                               f"block size per prompt (integers in {others[0]}..{others[-1]}), but it does not")
        elif not np.all(vals == 1):
            raise _err(str(folder / "1.json"), "values are neither tau at block size 1 (all 1.0) nor block sizes "
                                               f"among {others}")
    if not sizes:
        raise _err(str(folder), "no {block size}.json files")
    prompts = sorted(next(iter(sizes.values())), key=int)
    ref_name = f"{next(iter(sizes))}.json"
    files = {f"{b}.json": d for b, d in sizes.items()}
    if choice is not None:
        files["1.json"] = choice
    if mapped is not None:
        files["mapped_from_1.json"] = mapped
    for fname, d in files.items():
        if set(d) != set(prompts):
            extra = sorted(set(d) - set(prompts), key=int)
            miss = sorted(set(prompts) - set(d), key=int)
            what = f"prompt {miss[0]} missing" if miss else f"prompt {extra[0]} not in {ref_name}"
            raise _err(str(folder / fname), what)
    for b, d in sizes.items():
        for k, v in d.items():
            if not 1 - 1e-9 <= v <= b + 1e-9:
                raise _err(str(folder / f"{b}.json"), f"prompt {k}: tau {v} outside 1..{b}")
    arms = sorted(sizes)
    if choice is not None:
        for k, b in choice.items():
            if b not in sizes:
                raise _err(str(folder / "1.json"), f"prompt {k}: chosen block size {b} has no {b}.json")
        if mapped is not None:
            for k, v in mapped.items():
                at = sizes[choice[k]][k]
                if abs(v - at) > 1e-9 * max(1.0, abs(at)):
                    raise _err(str(mapped_path), f"prompt {k}: tau {v} but {choice[k]}.json has {at} "
                                                 f"at the chosen block size {choice[k]}")
    return {"sizes": sizes, "arms": arms, "prompts": prompts, "choice": choice, "mapped": mapped, "ignored": ignored}


def import_blockpilot(path: str | os.PathLike, *, target: str | None = None, drafter: str | None = None,
                      hardware: str | None = None) -> TraceSet:
    """Import a BlockPilot per-prompt result folder (or a folder of them) as a trace set.

    A result folder ``{dataset}_{N}T{temperature}`` holds ``{B}.json`` files mapping prompt
    index -> mean tau at block size B. In the BlockPilot release ``1.json`` is not block size
    1 but the selector's chosen block size per prompt (detected: integers within the other
    files' range, or ``mapped_from_1.json`` present); it becomes the request column
    ``blockpilot_choice``, and ``mapped_from_1.json`` (tau at that choice) is cross-checked.
    The result is summary-level: no features, no per-round lists, no timings.
    """
    root = Path(path)
    if not root.is_dir():
        raise _err(str(root), "no such directory")
    if any(root.glob("*.json")):
        folders = [root]
    else:
        folders = sorted(p for p in root.iterdir() if p.is_dir() and any(p.glob("*.json")))
        if not folders:
            raise _err(str(root), "no BlockPilot result folder here ({block size}.json files, or subfolders holding them)")
    ids, domains, pidx, choice_col, temps = [], [], [], [], []
    tau_rows = []
    arms = None
    first_folder = None
    ignored = []
    for f in folders:
        data = _read_blockpilot_folder(f)
        if arms is None:
            arms, first_folder = data["arms"], f
        elif data["arms"] != arms:
            raise _err(str(f), f"block sizes {data['arms']} differ from {first_folder.name}'s {arms}")
        m = _BP_FOLDER.match(f.name)
        dataset = m.group("dataset") if m else f.name
        temp = float(m.group("temp")) if m else None
        ignored += [f"{f.name}/{n}" for n in data["ignored"]]
        for k in data["prompts"]:
            ids.append(f"{f.name}/{k}")
            domains.append(dataset)
            pidx.append(int(k))
            choice_col.append(None if data["choice"] is None else data["choice"][k])
            temps.append(temp)
            tau_rows.append([float(data["sizes"][b][k]) for b in arms])
    uniq_t = sorted({t for t in temps if t is not None})
    meta = {
        "schema_version": SCHEMA_VERSION,
        "source": {"kind": "blockpilot", "path": str(root.resolve()), "folders": [f.name for f in folders],
                   **({"ignored": ignored} if ignored else {})},
        "target": target,
        "drafter": drafter,
        "hardware": hardware,
        "temperature": uniq_t[0] if len(uniq_t) == 1 else None,
    }
    cols: dict[str, Any] = {"prompt_index": pa.array(pidx, pa.int64()),
                            "blockpilot_choice": pa.array(choice_col, pa.int64()),
                            "temperature": pa.array(temps, pa.float64())}
    return TraceSet.from_arrays(ids, domains, arms, np.asarray(tau_rows), request_columns=cols, meta=meta)


def open_any(path: str | os.PathLike) -> TraceSet | DecisionLog:
    """A trace set (directory with meta.json) or a decision log (Parquet parts), whichever ``path`` is."""
    p = Path(path)
    if not p.exists():
        raise _err(str(p), "no such file or directory")
    if p.is_dir() and (p / "meta.json").exists():
        return TraceSet.read(p)
    if p.is_file() and p.suffix == ".parquet" or p.is_dir() and any(p.glob("*.parquet")):
        return DecisionLog.read(p)
    raise _err(str(p), "neither a trace set (meta.json) nor a decision log (*.parquet parts)")
