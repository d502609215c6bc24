"""Checks where a file enters: every failure is one :class:`~adaptspec.errors.AdaptspecError`
line naming the file, the field and the value.

Readers of JSON descriptors take their scalars through :func:`integer`, :func:`number` and
:func:`int_list`; binary containers (``.npz``, safetensors) are opened
through :func:`read_npz` and :func:`read_safetensors`, which turn a truncated or corrupted
file into one line instead of the library's own exception. A path that should be a file goes
through :func:`regular_file` before any work starts, and is read through
:mod:`adaptspec._util.files` (regular files only: a FIFO there would block the read forever).

>>> integer(4, "meta.json", "max_block_size", lo=2)
4
>>> integer("4", "meta.json", "max_block_size", lo=2)
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: meta.json: max_block_size='4' must be an integer >= 2
>>> number(-1, "config.json", "rms_norm_eps", lo=0, lo_open=True)
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: config.json: rms_norm_eps=-1 must be a number > 0
>>> int_list({"a": 1}, "meta.json", "arms", lo=1)
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: meta.json: arms={'a': 1} must be a non-empty list of integers >= 1
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from ..errors import AdaptspecError
from . import files
from .files import regular_file

__all__ = [
    "integer",
    "int_list",
    "number",
    "read_json_object",
    "read_npz",
    "read_safetensors",
    "regular_file",
]

_MISSING = object()


def _bounds(kind: str, lo, hi, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"{kind} in {'(' if lo_open else ''}{lo}..{hi}"
    if lo is not None:
        return f"{kind} {'>' if lo_open else '>='} {lo}"
    return kind if hi is None else f"{kind} <= {hi}"


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def integer(value: Any, where: str, field: str, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an int in ``lo..hi`` (a JSON integer: not a string, a float or a boolean)."""
    if not _is_int(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        raise AdaptspecError(f"{where}: {field}={value!r} must be {_bounds('an integer', lo, hi)}")
    return int(value)


def number(
    value: Any,
    where: str,
    field: str,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
) -> float:
    """``value`` as a finite float between ``lo`` and ``hi`` (a JSON number: not a string)."""
    ok = (_is_int(value) or isinstance(value, (float, np.floating))) and math.isfinite(float(value))
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        raise AdaptspecError(f"{where}: {field}={value!r} must be {_bounds('a number', lo, hi, lo_open)}")
    return float(value)


def int_list(value: Any, where: str, field: str, lo: int | None = None, hi: int | None = None) -> list[int]:
    """``value`` as a non-empty list of ints in ``lo..hi``."""
    if (
        not isinstance(value, (list, tuple))
        or not value
        or not all(_is_int(v) and (lo is None or v >= lo) and (hi is None or v <= hi) for v in value)
    ):
        raise AdaptspecError(
            f"{where}: {field}={value!r} must be a non-empty list of {_bounds('integers', lo, hi)}"
        )
    return [int(v) for v in value]


def read_json_object(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """A JSON file whose top level is an object (:func:`adaptspec._util.files.read_json_object`:
    a FIFO, an unreadable, truncated or undecodable file or other JSON is one line)."""
    return files.read_json_object(path, f"a {what}")


def read_npz(path: str | os.PathLike, what: str, keys: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file, read now (a corrupted member fails here, not later), without
    pickles; ``keys`` must all be present."""
    import zipfile
    import zlib

    with files.open_regular(path, f"a {what}", limit=files.DATA_BYTES) as f:
        try:
            z = np.load(f, allow_pickle=False)
            if not isinstance(z, np.lib.npyio.NpzFile):  # a bare .npy array
                raise ValueError("an .npy array, not an .npz archive")
            with z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as e:
            raise AdaptspecError(
                f"{path}: not a readable {what} (truncated or corrupted: {e or type(e).__name__})"
            ) from None
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise AdaptspecError(f"{path}: {what} has no array {missing[0]!r}")
    return arrays


def read_safetensors(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """A safetensors file as torch tensors; a truncated or corrupted file is one line."""
    from safetensors.torch import load

    data = files.read_bytes(path, f"a {what}", limit=files.DATA_BYTES)
    try:
        return load(data)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own (Rust) error types
        raise AdaptspecError(f"{path}: not a readable {what} (truncated or corrupted: {e})") from None
