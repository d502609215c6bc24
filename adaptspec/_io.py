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
