"""Trace sets: every block size ran on every request (full information), Parquet on disk.

A **trace set** is a directory::

    meta.json          {"schema_version": 1, "arms": [...], "target": ..., ...}
    requests.parquet   request_id, domain, prompt_tokens, [features]
    outcomes.parquet   request_id, block_size, new_tokens, rounds, mean_tau,
                       [tau, draft_ms, verify_ms (per-round lists)], [decode_ms]

Validation errors name the file, the column and the row (0-based) that is wrong. Writes go
to a temporary directory that is renamed into place, so a crash never leaves a half-written
trace set. See ``docs/data.md``.

>>> import numpy as np
>>> ts = TraceSet.from_arrays(["a", "b"], ["math", "chat"], arms=[1, 4],
...                           mean_tau=np.array([[1.0, 3.5], [1.0, 1.5]]))
>>> ts.arms, ts.tau_matrix().tolist(), ts.domains.tolist()
((1, 4), [[1.0, 3.5], [1.0, 1.5]], ['math', 'chat'])
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._util.atomic import json_default
from .._util.checks import int_list
from .._util.files import read_json, regular_file
from ..errors import AdaptspecError
from ..speculator import MAX_TREE_NODES, drafted_positions, output_bounds
from .parquet import _check_columns, _err, _first, _list_parts, _matrix, _np, _write_parquet, read_parquet
from .schema import _F32_LIST, MAX_TOKENS, OUTCOME_COLUMNS, REQUEST_COLUMNS, SCHEMA_VERSION

_BUNDLED = Path(__file__).resolve().parent.parent / "data" / "traces"
#: The bundled default trace set: the bundled speculator on 336 public benchmark prompts
#: (GSM8K, MT-Bench, HumanEval), derived from dense traces in fast verification (docs/data.md).
DEFAULT_TRACES = _BUNDLED / "benchmarks"
#: The bundled in-distribution trace set: 200 held-out template prompts, made by the same
#: templates as the previous bundled drafter's training prompts and collected with that drafter
#: (not independent evidence; docs/data.md).
TEMPLATE_TRACES = _BUNDLED / "templates"


class TraceSet:
    """A validated trace set: every request decoded at every block size.

    Build one with :meth:`read`, :meth:`from_arrays`, the synthetic generator or an
    importer; all of them validate. Requests keep their stored order (the "logged" order);
    arms are sorted ascending; matrices are ``(n_requests, n_arms)`` in those orders.
    """

    def __init__(
        self,
        requests: pa.Table,
        outcomes: pa.Table,
        meta: Mapping[str, Any] | None = None,
        *,
        path: str | os.PathLike | None = None,
    ) -> None:
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
        """Check the tables as read (a refusal names the file, the column and the row) and index the
        outcomes by request and arm."""
        ids, req_ids = self._check_requests()
        bs = self._index_outcomes(ids, req_ids)
        mt, most = self._check_mean_tau(bs)
        self._check_token_counts()
        if "tau" in self.outcomes.column_names:
            self._check_round_lists(mt, most)
        else:
            for name in ("draft_ms", "verify_ms"):
                if name in self.outcomes.column_names:
                    raise _err(self._where_out, f"column {name!r} needs the per-round column 'tau'")
        self._check_decode_ms()
        self._check_meta_arms()

    def _check_requests(self) -> tuple[np.ndarray, pa.ChunkedArray]:
        """``(request ids, their column)``: ids present and unique, prompt lengths in range; the
        features read (None without the column)."""
        wr = self._where_req
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
        if np.any(pt > MAX_TOKENS):
            raise _err(
                wr,
                f"column 'prompt_tokens', row {_first(pt > MAX_TOKENS)}: {pt[pt > MAX_TOKENS][0]:.6g} is more "
                f"than {MAX_TOKENS} (no prompt is that long)",
            )
        if "features" in self.requests.column_names:
            self._features = _matrix(self.requests.column("features"), wr, "features")
        else:
            self._features = None
        return ids, req_ids

    def _index_outcomes(self, ids: np.ndarray, req_ids: pa.ChunkedArray) -> np.ndarray:
        """Each outcome row's request and arm (``arms``, ``_ridx``, ``_aidx``, ``_cell``), refused
        unless every request has exactly one row per arm; returns the rows' block sizes."""
        wo, out = self._where_out, self.outcomes
        ridx = _np(pc.index_in(out.column("request_id"), value_set=req_ids), np.float64)
        if np.any(np.isnan(ridx)):
            bad = _first(np.isnan(ridx))
            rid = out.column("request_id")[bad].as_py()
            raise _err(wo, f"column 'request_id', row {bad}: request {rid!r} is not in requests.parquet")
        ridx = ridx.astype(np.int64)
        bs = _np(out.column("block_size"), np.int64)
        not_an_arm = (bs == 0) | (
            bs < -MAX_TREE_NODES
        )  # a negative block size is a tree arm (speculator.tree_arm)
        if np.any(not_an_arm):
            bad = _first(not_an_arm)
            raise _err(
                wo,
                f"column 'block_size', row {bad}: block size {bs[bad]} is neither >= 1 nor a tree arm "
                f"(-1 .. -{MAX_TREE_NODES})",
            )
        arms, aidx = np.unique(bs, return_inverse=True)
        self.arms: tuple[int, ...] = tuple(int(a) for a in arms)
        n, k = len(ids), len(arms)
        cell = ridx * k + aidx
        counts = np.bincount(cell, minlength=n * k)
        if np.any(counts > 1):
            c = _first(counts > 1)
            rows = np.flatnonzero(cell == c)[:2]
            raise _err(
                wo, f"rows {rows[0]} and {rows[1]} repeat (request {ids[c // k]!r}, block_size {arms[c % k]})"
            )
        if np.any(counts == 0):
            c = _first(counts == 0)
            has = [int(a) for a, m in zip(arms, counts.reshape(n, k)[c // k]) if m]
            if not has:
                raise _err(wo, f"request {ids[c // k]!r} has no outcome rows")
            raise _err(
                wo,
                f"request {ids[c // k]!r} has block sizes {has}, others have {list(self.arms)} "
                f"(every request needs every arm; missing {int(arms[c % k])})",
            )
        self._ridx, self._aidx, self._cell = ridx, aidx, cell
        return bs

    def _check_mean_tau(self, bs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mean tau, most a round commits)`` of each outcome row: 1 up to what its block size drafts
        (a tree arm: its depth + 1)."""
        mt = _np(self.outcomes.column("mean_tau"), np.float64)
        most = drafted_positions(bs)  # a round commits at most what it drafted (a tree arm: its depth + 1)
        bad = ~np.isfinite(mt) | (mt < 1 - 1e-9) | (mt > most + 1e-9)
        if bad.any():
            r = _first(bad)
            raise _err(
                self._where_out,
                f"column 'mean_tau', row {r}: {mt[r]} outside 1..{most[r]} (block_size {bs[r]})",
            )
        return mt, most

    def _check_token_counts(self) -> None:
        """New tokens (>= 0) and rounds (>= 1) in range."""
        wo = self._where_out
        for name, lo in (("new_tokens", 0), ("rounds", 1)):
            v = _np(self.outcomes.column(name), np.float64)
            neg = v < lo
            if neg.any():
                raise _err(wo, f"column {name!r}, row {_first(neg)}: {v[neg][0]:g} < {lo}")
            big = v > MAX_TOKENS
            if big.any():
                raise _err(
                    wo,
                    f"column {name!r}, row {_first(big)}: {v[big][0]:.6g} is more than {MAX_TOKENS} "
                    "(no request decodes that many tokens)",
                )

    def _check_round_lists(self, mt: np.ndarray, most: np.ndarray) -> None:
        """The per-round tau lists: as many rounds as ``rounds`` says, none empty, each tau in range,
        averaging ``mean_tau``; the round times listed alike."""
        wo, out = self._where_out, self.outcomes
        rounds = _np(out.column("rounds"), np.float64)
        lengths, vals, parents = _list_parts(out.column("tau"))
        known = ~np.isnan(rounds)
        if np.any(known & (lengths != rounds)):
            r = _first(known & (lengths != rounds))
            raise _err(
                wo,
                f"column 'tau', row {r}: {lengths[r]} rounds listed, column 'rounds' says {int(rounds[r])}",
            )
        if np.any(lengths == 0):
            raise _err(wo, f"column 'tau', row {_first(lengths == 0)}: empty list")
        badv = (vals < 1) | (vals > most[parents])
        if badv.any():
            r = int(parents[_first(badv)])
            raise _err(wo, f"column 'tau', row {r}: tau {vals[_first(badv)]} outside 1..{most[r]}")
        means = np.bincount(parents, weights=vals, minlength=out.num_rows) / np.maximum(lengths, 1)
        off = np.abs(means - mt) > 1e-6 * np.maximum(1.0, mt)
        if off.any():
            r = _first(off)
            raise _err(
                wo,
                f"column 'mean_tau', row {r}: {mt[r]} but the per-round tau list averages {means[r]:.6g}",
            )
        self._check_round_times(lengths)

    def _check_round_times(self, lengths: np.ndarray) -> None:
        """The per-round draft and verify times: one per round, a draft time >= 0 (a draft pass at
        block size 1 takes none), a verify time > 0."""
        wo, out = self._where_out, self.outcomes
        for name in ("draft_ms", "verify_ms"):
            if name not in out.column_names:
                continue
            ln, v, p = _list_parts(out.column(name))
            if np.any(ln != lengths):
                r = _first(ln != lengths)
                raise _err(
                    wo, f"column {name!r}, row {r}: {ln[r]} values, column 'tau' has {lengths[r]} rounds"
                )
            lo = (
                0.0 if name == "draft_ms" else None
            )  # a target pass takes time; a draft pass at block size 1 none
            badv = ~np.isfinite(v) | ((v < 0) if lo is not None else (v <= 0))
            if badv.any():
                what = "a time >= 0" if lo is not None else "a time > 0"
                raise _err(
                    wo, f"column {name!r}, row {int(p[_first(badv)])}: {v[_first(badv)]} is not {what}"
                )

    def _check_decode_ms(self) -> None:
        """Each request's decode time, where known, > 0."""
        if "decode_ms" in self.outcomes.column_names:
            d = _np(self.outcomes.column("decode_ms"), np.float64)
            badd = ~np.isnan(d) & ~(np.isfinite(d) & (d > 0))
            if badd.any():
                raise _err(
                    self._where_out, f"column 'decode_ms', row {_first(badd)}: {d[badd][0]} is not a time > 0"
                )

    def _check_meta_arms(self) -> None:
        """The arms meta.json names, if any, are the outcomes' block sizes."""
        meta_arms = self.meta.get("arms")
        if meta_arms is not None and sorted(int(a) for a in meta_arms) != list(self.arms):
            raise AdaptspecError(
                f"{str(self.path) + '/' if self.path else ''}meta.json: arms {list(meta_arms)} "
                f"but outcomes.parquet has block sizes {list(self.arms)}"
            )

    # ------------------------------------------------------------------ reading and writing

    @classmethod
    def read(cls, path: str | os.PathLike) -> "TraceSet":
        """Read and validate the trace set in directory ``path``."""
        p = Path(path)
        if not p.exists():
            raise _err(str(p), "no such trace set directory" + moved_hint(p))
        if not p.is_dir():
            raise _err(str(p), "a trace set is a directory (meta.json, requests.parquet, outcomes.parquet)")
        for name in (
            "meta.json",
            "requests.parquet",
            "outcomes.parquet",
        ):  # a FIFO or a device would hang the read
            regular_file(p / name, f"a trace set's {name}")
        meta = _read_meta(p / "meta.json")
        ts = cls(read_parquet(p / "requests.parquet"), read_parquet(p / "outcomes.parquet"), meta, path=p)
        _check_new_tokens(ts.outcomes, ts._where_out)
        return ts

    def write(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write to directory ``path`` atomically (temporary directory, then rename)."""
        meta = {
            "schema_version": SCHEMA_VERSION,
            **{k: v for k, v in self.meta.items() if k != "schema_version"},
        }
        meta["arms"] = list(self.arms)

        def write(tmp: Path) -> None:
            _write_parquet(self.requests, tmp / "requests.parquet")
            _write_parquet(self.outcomes, tmp / "outcomes.parquet")
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=json_default) + "\n")

        from .._util.outputs import write_dir

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
        req = _request_columns(request_ids, domains, prompt_tokens, features, request_columns)

        def mat(x: Any, dtype: Any) -> pa.Array:
            a = np.asarray(x)
            if a.ndim == 1:
                a = np.repeat(a[:, None], k, axis=1)
            if a.shape != (n, k):
                raise AdaptspecError(f"expected shape ({n}, {k}), got {a.shape}")
            return pa.array(a.ravel().astype(dtype))

        out: dict[str, Any] = {
            "request_id": pa.array(
                np.repeat(np.asarray([str(r) for r in request_ids], dtype=object), k), pa.string()
            ),
            "block_size": pa.array(np.tile(np.asarray(arms, dtype=np.int64), n)),
            "new_tokens": mat(new_tokens, np.int64)
            if new_tokens is not None
            else pa.nulls(n * k, pa.int64()),
            "rounds": mat(rounds, np.int64) if rounds is not None else pa.nulls(n * k, pa.int64()),
            "mean_tau": pa.array(mt.ravel()),
        }
        for name, lists, typ in (
            ("tau", tau, pa.list_(pa.int32())),
            ("draft_ms", draft_ms, _F32_LIST),
            ("verify_ms", verify_ms, _F32_LIST),
        ):
            if lists is not None:
                out[name] = _list_column(name, lists, typ, n * k)
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
        return self._cached(
            "ids", lambda: np.asarray(self.requests.column("request_id").to_pylist(), dtype=object)
        )

    @property
    def domains(self) -> np.ndarray:
        """Domain of each request (object array of str)."""
        return self._cached(
            "domains", lambda: np.asarray(self.requests.column("domain").to_pylist(), dtype=object)
        )

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
            "best_arm_share_by_tau": {
                int(a): round(float(v) / self.n_requests, 4) for a, v in zip(self.arms, best)
            },
            "oracle_mean_tau": round(float(tau.max(axis=1).mean()), 4),
        }
        for k in ("source", "target", "drafter", "hardware", "temperature", "scenario", "latency_profile"):
            if k in self.meta:
                d[k] = self.meta[k]
        return d

    def __repr__(self) -> str:
        f = "no features" if self.features is None else f"{self.features.shape[1]} features"
        return f"TraceSet({self.n_requests} requests, arms {list(self.arms)}, {f})"


def _check_new_tokens(out: pa.Table, where: str) -> None:
    """A stored set's ``new_tokens`` against the tokens its rounds produced (the sum of their tau;
    ``rounds x mean_tau`` without the per-round list), by the outcome rule's
    :func:`~adaptspec.speculator.output_bounds`: the prefill gives one token more, and a stop (EOS,
    ``max_new_tokens``) may cut the last round's tokens, all of them included (up to the block size
    without the list). Rows where either is unknown (null) are not checked. Checked where a set is
    read from files: a count no decode produced (a corrupted ``2**62``) would otherwise become the
    throughput of every report."""
    new = _np(out.column("new_tokens"), np.float64)
    if "tau" in out.column_names:
        lengths, vals, parents = _list_parts(out.column("tau"))
        produced = np.bincount(parents, weights=vals, minlength=out.num_rows)
        last = vals[np.cumsum(lengths) - 1].astype(np.float64)  # every list has a round (checked when built)
    else:
        produced = _np(out.column("rounds"), np.float64) * _np(out.column("mean_tau"), np.float64)
        last = _np(out.column("block_size"), np.float64)
    tol = 1e-6 * np.maximum(1.0, produced)
    least, most = output_bounds(produced, last)
    bad = ~np.isnan(new) & ~np.isnan(produced) & ((new > most + tol) | (new < least - tol))
    if bad.any():
        r = _first(bad)
        raise _err(
            where,
            f"column 'new_tokens', row {r}: {new[r]:.6g} tokens, but its rounds produced "
            f"{produced[r]:.6g} (the sum of their tau; new_tokens is that, +1 for the prefill's "
            "token, less what a stop cut from the last round: only the last round's tokens can be cut)",
        )


def _read_meta(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise _err(str(path), "no such file (a trace set needs meta.json with a schema_version)")
    meta = read_json(path, "a trace set's meta.json")
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
        raise _err(
            where,
            f"schema_version {v} is newer than this adaptspec reads ({SCHEMA_VERSION}); upgrade adaptspec",
        )
    if meta.get("arms") is not None:
        arms = int_list(meta["arms"], where, "arms", -MAX_TREE_NODES)
        if 0 in arms:
            raise AdaptspecError(
                f"{where}: arms={arms} holds 0: an arm is a block size >= 1 or a tree arm < 0"
            )
    meta.setdefault("kind", kind)
    return meta


def load_traces(path: str | os.PathLike | None = None) -> TraceSet:
    """Read a trace set; ``None`` reads the bundled default (:data:`DEFAULT_TRACES`, the public
    benchmark prompts'; :data:`TEMPLATE_TRACES` is the in-distribution one)."""
    return TraceSet.read(DEFAULT_TRACES if path is None else path)


def moved_hint(path: str | os.PathLike) -> str:
    """For a missing ``path`` that names the old bundled default, where the bundled sets are now.

    >>> moved_hint("adaptspec/data/traces/default")[:48]
    ' (the bundled template set moved to adaptspec/da'
    >>> moved_hint("runs/traces")
    ''
    """
    if Path(path).as_posix().rstrip("/").endswith("data/traces/default"):
        return (
            f" (the bundled template set moved to {path_label(TEMPLATE_TRACES)}; the default is now "
            f"{path_label(DEFAULT_TRACES)})"
        )
    return ""


def path_label(path: str | os.PathLike | None) -> str | None:
    """How saved artefacts name the trace set they came from: bundled sets relative to the
    package (the same on every machine), others as given.

    >>> path_label(DEFAULT_TRACES), path_label(TEMPLATE_TRACES)
    ('adaptspec/data/traces/benchmarks', 'adaptspec/data/traces/templates')
    """
    if path is None:
        return None
    p = Path(path).resolve()
    package = _BUNDLED.parents[1]
    return str(Path("adaptspec") / p.relative_to(package)) if p.is_relative_to(package) else str(path)


def _request_columns(
    request_ids: Sequence[str],
    domains: Sequence[str],
    prompt_tokens: Sequence[int] | None,
    features: np.ndarray | None,
    request_columns: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The requests table's columns (TraceSet.from_arrays): ids, domains, prompt lengths (null when
    not given), features (n, d) as float32 lists, and the extra columns."""
    n = len(request_ids)
    req: dict[str, Any] = {
        "request_id": pa.array([str(r) for r in request_ids], pa.string()),
        "domain": pa.array([str(d) for d in domains], pa.string()),
        "prompt_tokens": (
            pa.nulls(n, pa.int64())
            if prompt_tokens is None
            else pa.array(np.asarray(prompt_tokens, dtype=np.int64))
        ),
    }
    if features is not None:
        f = np.ascontiguousarray(features, dtype=np.float32)
        if f.ndim != 2 or f.shape[0] != n:
            raise AdaptspecError(f"features has shape {f.shape}, expected ({n}, d)")
        req["features"] = pa.FixedSizeListArray.from_arrays(pa.array(f.ravel()), f.shape[1]).cast(_F32_LIST)
    for name, values in (request_columns or {}).items():
        req[name] = pa.array(values)
    return req


def _list_column(name: str, lists: Sequence[Sequence[Any]], typ: Any, count: int) -> pa.Array:
    """A per-round column: count lists (one per outcome, row-major) as one list array of type typ."""
    if len(lists) != count:
        raise AdaptspecError(f"{name}: {len(lists)} lists, expected {count}")
    lengths = np.fromiter((len(x) for x in lists), np.int32, count)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    flat = np.concatenate([np.asarray(x) for x in lists]) if count else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat).cast(typ.value_type))
