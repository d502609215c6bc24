"""Checks where a file enters: every failure is one :class:`~adaptspec.errors.AdaptspecError`
line naming the file, the field and the value.

Readers of JSON descriptors take their scalars through :func:`integer`, :func:`number` and
:func:`int_list`; binary containers (``.npz``, safetensors) are opened
through :func:`read_npz` and :func:`read_safetensors`, which turn a truncated or corrupted
file into one line instead of the library's own exception. A path that should be a file goes
through :func:`regular_file` before it is opened: a FIFO there would block the read forever.

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

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AdaptspecError

__all__ = ["integer", "int_list", "number", "read_json_object", "read_npz", "read_safetensors", "regular_file"]

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


def number(value: Any, where: str, field: str, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False) -> float:
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
    if (not isinstance(value, (list, tuple)) or not value
            or not all(_is_int(v) and (lo is None or v >= lo) and (hi is None or v <= hi) for v in value)):
        raise AdaptspecError(f"{where}: {field}={value!r} must be a non-empty list of "
                             f"{_bounds('integers', lo, hi)}")
    return [int(v) for v in value]


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def regular_file(path: str | os.PathLike, what: str = "a file") -> Path:
    """``path``, once it is known not to be a FIFO, a device, a socket or a directory; call it
    before opening a file for reading (opening a FIFO blocks until something writes to it).

    A missing path passes (the caller's own read says it is missing); a symbolic link is judged by
    what it points to.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp(); fifo = os.path.join(d, "meta.json"); os.mkfifo(fifo)
    >>> regular_file(fifo, "a trace set's meta.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: .../meta.json: not a regular file (a trace set's meta.json expected, found a FIFO (named pipe))
    >>> regular_file(os.path.join(d, "absent.json")).name
    'absent.json'
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return Path(path)
    except OSError as e:
        raise AdaptspecError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise AdaptspecError(f"{path}: not a regular file ({what} expected, found {kind})")
    return Path(path)


def read_json_object(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """A JSON file whose top level is an object; unreadable, truncated or other JSON is one line."""
    regular_file(path, f"a {what}")
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise AdaptspecError(f"{path}: not a readable {what} ({e})") from None
    if not isinstance(data, dict):
        raise AdaptspecError(f"{path}: not a {what} (the top level must be a JSON object)")
    return data


def read_npz(path: str | os.PathLike, what: str, keys: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file, read now (a corrupted member fails here, not later), without
    pickles; ``keys`` must all be present."""
    import zipfile
    import zlib

    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as e:
        raise AdaptspecError(f"{path}: not a readable {what} (truncated or corrupted: {e or type(e).__name__})") from None
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise AdaptspecError(f"{path}: {what} has no array {missing[0]!r}")
    return arrays


def read_safetensors(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """A safetensors file as torch tensors; a truncated or corrupted file is one line."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own (Rust) error types
        raise AdaptspecError(f"{path}: not a readable {what} (truncated or corrupted: {e})") from None

