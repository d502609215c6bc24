"""Small file helpers shared by the modules that write state: JSON of numpy values, fsync."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np


def json_default(o: Any) -> Any:
    """``json.dumps(..., default=json_default)``: numpy scalars and arrays, paths.

    >>> import json
    >>> json.dumps({"a": np.float32(0.5), "b": np.arange(2), "p": Path("x")}, default=json_default)
    '{"a": 0.5, "b": [0, 1], "p": "x"}'
    """
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's (or a directory's) contents to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_descriptor(path: Path, kind: str, newest_format: int, what: str) -> dict[str, Any]:
    """Read a JSON file that describes a saved object: a dict with ``kind`` and ``format``.

    Every failure is an :class:`~adaptspec.errors.AdaptspecError` naming the file: not a regular
    file, unreadable, not JSON (:func:`adaptspec._util.files.read_json`), another kind of object,
    or a format newer than ``newest_format``.
    """
    from ..errors import AdaptspecError
    from .files import read_json

    info = read_json(path, f"an adaptspec {what}'s descriptor")
    if not isinstance(info, dict) or info.get("kind") != kind:
        raise AdaptspecError(f"{path} does not describe an adaptspec {what}")
    fmt = info.get("format", 0)
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 0:
        raise AdaptspecError(f"{path}: format={fmt!r} must be a non-negative integer")
    if fmt > newest_format:
        raise AdaptspecError(
            f"{path}: {what} format {info.get('format')} is newer than this adaptspec reads ({newest_format})"
        )
    return info


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file as numpy arrays, with an :class:`~adaptspec.errors.AdaptspecError` naming it."""
    from safetensors.numpy import load

    from ..errors import AdaptspecError
    from .files import DATA_BYTES, read_bytes

    data = read_bytes(path, "a safetensors file", limit=DATA_BYTES)
    try:
        return load(data)
    except Exception as e:  # safetensors raises its own error types
        raise AdaptspecError(f"{path}: cannot read ({e})") from None


def write_tensors(tensors: dict[str, np.ndarray], path: str | os.PathLike) -> None:
    """``safetensors.numpy.save_file``, its I/O failures raised as the ``OSError`` they are (a full
    disk is ENOSPC), so every writer's ``except OSError`` turns them into one line."""
    import re

    from safetensors.numpy import save_file

    try:
        save_file(tensors, str(path))
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors wraps the OS error in its own (Rust) type
        m = re.search(r"os error (\d+)", str(e))
        code = int(m.group(1)) if m else 0
        raise OSError(code, os.strerror(code) if code else str(e), str(path)) from None


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 100) -> Path:
    """Write a matplotlib figure through a temporary file and a rename, then close it; a write
    failure is an :class:`~adaptspec.errors.AdaptspecError` naming the path. The PNG says it was
    written by adaptspec (a ``Software`` text chunk): only such a file is ever replaced by a plot
    (``adaptspec._util.outputs``)."""
    import matplotlib.pyplot as plt

    from ..errors import AdaptspecError

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(tmp, dpi=dpi, metadata={"Software": "adaptspec"})
        tmp.replace(path)
    except OSError as e:
        raise AdaptspecError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
        if tmp.exists():
            tmp.unlink()
    return path
