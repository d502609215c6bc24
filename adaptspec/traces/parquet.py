"""Parquet helpers the trace-set and decision-log readers share: reading a file, checking and
casting columns against a schema, and numeric and list columns as numpy arrays.

Every error names the file (``where``), the column and the row (0-based) that is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._util.files import DATA_BYTES, open_regular
from ..errors import AdaptspecError


def _err(where: str, msg: str) -> AdaptspecError:
    return AdaptspecError(f"{where}: {msg}")


def read_parquet(
    path: str | Path, what: str = "a Parquet file", columns: Sequence[str] | None = None
) -> pa.Table:
    """The table in the Parquet file at ``path`` (only ``columns``, when given).

    Every way it can fail is one :class:`~adaptspec.errors.AdaptspecError` naming the file:
    missing, not a regular file (a FIFO would block the read forever; see
    :func:`adaptspec._util.files.open_regular`), unreadable, not Parquet, truncated or corrupted
    (any pyarrow error), or without one of ``columns``."""
    with open_regular(path, what, limit=DATA_BYTES) as f:
        # read whole into memory first: pyarrow reading a Python file object runs I/O threads that
        # call back into Python, and one still alive at interpreter exit aborts the process
        # ("terminate called without an active exception", seen after a one-line refusal)
        data = f.read()
    try:
        if columns is not None:
            names = pq.read_schema(pa.BufferReader(data)).names
            missing = [c for c in columns if c not in names]
            if missing:
                raise _err(str(path), f"missing column {missing[0]!r}")
        return pq.read_table(pa.BufferReader(data), columns=None if columns is None else list(columns))
    except (pa.ArrowException, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise _err(str(path), f"not a readable Parquet file (truncated or corrupted: {msg})") from None


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_columns(
    table: pa.Table, spec: Mapping[str, tuple[pa.DataType, bool, bool]], where: str
) -> pa.Table:
    """Cast every known column to its type and check nulls; missing required columns raise."""
    missing = [n for n, (_, req, _) in spec.items() if req and n not in table.column_names]
    if missing:
        raise _err(
            where, f"missing column {missing[0]!r} (has {', '.join(table.column_names) or 'no columns'})"
        )
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
    if (
        pa.types.is_string(src)
        or pa.types.is_large_string(src)
        or pa.types.is_binary(src)
        or pa.types.is_large_binary(src)
    ):
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
        raise _err(
            where,
            f"column {name!r}, row {bad if rows is None else int(rows[bad])}: "
            f"{lengths[bad]} values, row {0 if rows is None else int(rows[0])} has {d}",
        )
    if rows is not None:
        keep = np.isin(parents, rows)
        values = values[keep]
    x = values.astype(np.float32, copy=False).reshape(len(lengths), d)
    if not np.all(np.isfinite(x)):
        bad = _first(~np.isfinite(x).all(axis=1))
        raise _err(
            where, f"column {name!r}, row {bad if rows is None else int(rows[bad])}: NaN or infinite value"
        )
    return x


def _write_parquet(table: pa.Table, path: Path, metadata: Mapping[str, str] | None = None) -> None:
    if metadata:
        md = dict(table.schema.metadata or {})
        md.update({k.encode(): v.encode() for k, v in metadata.items()})
        table = table.replace_schema_metadata(md)
    pq.write_table(table, path, compression="zstd")
