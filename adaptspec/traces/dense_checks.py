"""What a dense trace set may hold (:mod:`adaptspec.traces.dense`), checked as its files are read.

A value the collection could not have written is refused, never clipped: one
:class:`~adaptspec.errors.AdaptspecError` line naming the file, the column and the row. For a
set of largest block size ``B`` a request of ``L`` tokens holds ``(L - 1) * (B - 1)`` entries
in each of ``accept``, ``top1`` and ``entropy``; ``accept[p, b - 2]`` counts drafts of a block
of size ``b``, so it lies in ``0..b - 1``; ``top1`` is a probability; ``entropy`` is >= 0.

>>> import pyarrow as pa
>>> t = pa.table({"request_id": ["r"], "domain": ["d"], "prompt_tokens": [3], "finish_reason": ["eos"],
...               "features": [[0.5]], "tokens": [[7, 8]], "accept": [[1, 3]], "top1": [[0.9, 0.1]],
...               "entropy": [[0.2, 1.0]]})
>>> check_part(t, "part-00000.parquet", max_block_size=3)
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: part-00000.parquet: column 'accept', row 0: 3 drafts accepted at block size 3 (at most 2)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._util.checks import integer
from ..errors import AdaptspecError

#: the largest block size a dense set may be collected at (``accept`` is stored as uint8)
MAX_BLOCK_SIZE = 64
#: float32 rounding of a log-softmax: a top-1 probability of 1 + 1e-7 or an entropy of -1e-7 is exact
_ROUNDING = 1e-4

_STRINGS = ("request_id", "domain", "finish_reason")
_LISTS = {"features": "float", "tokens": "int", "accept": "int", "top1": "float", "entropy": "float"}
COLUMNS = (*_STRINGS, "prompt_tokens", *_LISTS)


def check_meta(meta: dict, where: str) -> tuple[int, int]:
    """``(max_block_size, max_new_tokens)`` of a dense set's ``meta.json``, checked."""
    b = integer(meta.get("max_block_size"), where, "max_block_size", 2, MAX_BLOCK_SIZE)
    return b, integer(meta.get("max_new_tokens"), where, "max_new_tokens", 1)


def _fail(where: str, column: str, row: int, what: str) -> AdaptspecError:
    return AdaptspecError(f"{where}: column {column!r}, row {row}: {what}")


def _column_types(table: pa.Table, where: str) -> None:
    for name in COLUMNS:
        if name not in table.column_names:
            raise AdaptspecError(
                f"{where}: missing column {name!r} (a dense trace part has {', '.join(COLUMNS)})"
            )
        t = table.schema.field(name).type
        if name in _STRINGS:
            ok = pa.types.is_string(t) or pa.types.is_large_string(t)
            want = "string"
        elif name == "prompt_tokens":
            ok, want = pa.types.is_integer(t), "integer"
        else:
            v = t.value_type if pa.types.is_list(t) or pa.types.is_large_list(t) else None
            want = f"list of {_LISTS[name]}"
            ok = v is not None and (
                pa.types.is_integer(v)
                if _LISTS[name] == "int"
                else pa.types.is_floating(v) or pa.types.is_integer(v)
            )
        if not ok:
            raise AdaptspecError(f"{where}: column {name!r} has type {t}, expected {want}")
        nulls = table.column(name).null_count
        if nulls:
            row = int(np.flatnonzero(table.column(name).is_null().to_numpy(zero_copy_only=False))[0])
            raise _fail(where, name, row, "missing value (null)")


def _flat(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values and the row of each value."""
    col = table.column(name).combine_chunks()
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.list_flatten(col).to_numpy(zero_copy_only=False)
    return values, np.repeat(np.arange(len(lengths)), lengths)


def check_part(table: pa.Table, where: str, max_block_size: int, max_new_tokens: int | None = None) -> None:
    """Refuse a part that is not what the collection writes (see the module docstring)."""
    _column_types(table, where)
    if table.num_rows == 0:
        raise AdaptspecError(f"{where}: part has no rows")
    k = max_block_size - 1
    n_tok = pc.list_value_length(table.column("tokens").combine_chunks()).to_numpy(zero_copy_only=False)
    if (n_tok < 1).any():
        raise _fail(
            where, "tokens", int(np.flatnonzero(n_tok < 1)[0]), "no tokens (the prefill's token comes first)"
        )
    if max_new_tokens is not None and (n_tok > max_new_tokens).any():
        r = int(np.flatnonzero(n_tok > max_new_tokens)[0])
        raise _fail(
            where, "tokens", r, f"{n_tok[r]} tokens, more than meta.json's max_new_tokens {max_new_tokens}"
        )
    for name in ("accept", "top1", "entropy"):
        got = pc.list_value_length(table.column(name).combine_chunks()).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(got != (n_tok - 1) * k)
        if bad.size:
            r = int(bad[0])
            raise _fail(
                where,
                name,
                r,
                f"{got[r]} values, expected {(n_tok[r] - 1) * k} "
                f"((len(tokens) - 1) * (max_block_size - 1) = ({n_tok[r]} - 1) * {k})",
            )
    n_feat = pc.list_value_length(table.column("features").combine_chunks()).to_numpy(zero_copy_only=False)
    if (n_feat != n_feat[0]).any():
        r = int(np.flatnonzero(n_feat != n_feat[0])[0])
        raise _fail(where, "features", r, f"{n_feat[r]} features, row 0 has {n_feat[0]}")

    prompt = table.column("prompt_tokens").to_numpy()
    if (prompt < 0).any():
        r = int(np.flatnonzero(prompt < 0)[0])
        raise _fail(where, "prompt_tokens", r, f"{prompt[r]} is negative")
    values, rows = _flat(table, "tokens")
    if (values < 0).any():
        i = int(np.flatnonzero(values < 0)[0])
        raise _fail(where, "tokens", int(rows[i]), f"token id {values[i]} is negative")

    values, rows = _flat(table, "accept")
    limit = np.tile(np.arange(1, k + 1), len(values) // k) if k else np.zeros(0, np.int64)
    bad = np.flatnonzero((values < 0) | (values > limit))
    if bad.size:
        i = int(bad[0])
        raise _fail(
            where,
            "accept",
            int(rows[i]),
            f"{values[i]} drafts accepted at block size {limit[i] + 1} (at most {limit[i]})",
        )
    for name, lo, hi, what in (
        ("top1", -_ROUNDING, 1.0 + _ROUNDING, "a probability in [0, 1]"),
        ("entropy", -_ROUNDING, np.inf, "an entropy >= 0"),
        ("features", -np.inf, np.inf, "a finite number"),
    ):
        values, rows = _flat(table, name)
        values = values.astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(values) | (values < lo) | (values > hi))
        if bad.size:
            i = int(bad[0])
            raise _fail(where, name, int(rows[i]), f"{values[i]} is not {what}")
