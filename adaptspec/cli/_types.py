"""Argument types of the ``adaptspec`` command: every flag is checked when it is parsed.

Each function here is an argparse ``type=``: it turns the text into the value or raises
``argparse.ArgumentTypeError`` with what was expected, so a bad flag costs one line and exit
status 2 before any trace set or model is loaded. Nothing here imports torch.

>>> int_range(1)("3"), port("8000"), block_sizes("8,1,4,4")
(3, 8000, [1, 4, 8])
>>> int_range(1)("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected an integer >= 1, got '0'
>>> float_range(0, 1, lo_open=True, hi_open=True)("1")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected a number in (0, 1), got '1'
"""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path
from typing import Callable

__all__ = [
    "MAX_BLOCK_SIZE",
    "arms",
    "block_sizes",
    "device",
    "float_range",
    "input_dir",
    "input_file",
    "int_range",
    "png_output",
    "port",
    "seed",
    "state_dir",
    "threads",
]

#: the largest block size a flag accepts (DFlash drafts at most 16; BlockPilot's sets reach 32)
MAX_BLOCK_SIZE = 64
#: the largest integer a flag without its own upper bound accepts (a C int: counts, steps, sizes)
INT_CEILING = 2**31 - 1
#: the largest number a flag without its own upper bound accepts (seconds: within threading.TIMEOUT_MAX)
FLOAT_CEILING = 1e9


def int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An integer in ``lo..hi``; without ``hi``, at most :data:`INT_CEILING` (the message says so).

    >>> int_range(1)(str(10**12))
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected an integer >= 1 (at most 2147483647), got '1000000000000'
    """
    if lo is not None and hi is not None:
        want = f"an integer in {lo}..{hi}"
    elif lo is not None:
        want = f"an integer >= {lo}"
    else:
        want = "an integer" if hi is None else f"an integer <= {hi}"

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        if hi is None and abs(v) > INT_CEILING:
            raise argparse.ArgumentTypeError(f"expected {want} (at most {INT_CEILING}), got {text!r}")
        return v

    parse.__name__ = "integer"
    return parse


def float_range(
    lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False
) -> Callable[[str], float]:
    """A finite number between ``lo`` and ``hi`` (ends closed unless ``*_open``); without ``hi``, at
    most :data:`FLOAT_CEILING`."""
    if lo is not None and hi is not None:
        want = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    elif lo is not None:
        want = f"a number {'>' if lo_open else '>='} {lo:g}"
    elif hi is not None:
        want = f"a number {'<' if hi_open else '<='} {hi:g}"
    else:
        want = "a finite number"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        bad = not math.isfinite(v)
        if lo is not None:
            bad |= v <= lo if lo_open else v < lo
        if hi is not None:
            bad |= v >= hi if hi_open else v > hi
        if bad:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        if hi is None and abs(v) > FLOAT_CEILING:
            raise argparse.ArgumentTypeError(f"expected {want} (at most {FLOAT_CEILING:g}), got {text!r}")
        return v

    parse.__name__ = "number"
    return parse


#: a TCP port (0: any free port)
port = int_range(0, 65535)
#: torch CPU threads
threads = int_range(1, 4096)
#: a random seed (numpy and torch take 0 .. 2**63 - 1)
seed = int_range(0, 2**63 - 1)


def arms(text: str) -> list[int]:
    """Comma-separated arms, sorted, duplicates dropped: block sizes in ``1..MAX_BLOCK_SIZE`` and draft
    trees ``tree:N`` (the arm ``-N``, :func:`adaptspec.speculator.tree_arm`; at most
    :data:`~adaptspec.speculator.MAX_TREE_NODES` nodes).

    >>> arms("8,tree:16,1,tree:4")
    [-16, -4, 1, 8]
    """
    from ..errors import AdaptspecError
    from ..speculator import MAX_TREE_NODES, parse_arm

    try:
        out = sorted({parse_arm(x) for x in text.split(",") if x.strip()})
    except AdaptspecError:
        raise argparse.ArgumentTypeError(
            f"expected block sizes and trees like 1,2,4,tree:8, got {text!r}"
        ) from None
    if not out:
        raise argparse.ArgumentTypeError("expected block sizes and trees like 1,2,4,tree:8, got none")
    if out[0] < -MAX_TREE_NODES or out[-1] > MAX_BLOCK_SIZE:
        raise argparse.ArgumentTypeError(
            f"block sizes must be in 1..{MAX_BLOCK_SIZE} and trees have at most "
            f"{MAX_TREE_NODES} nodes, got {text!r}"
        )
    return out


def block_sizes(text: str) -> list[int]:
    """Comma-separated block sizes in ``1..MAX_BLOCK_SIZE``, sorted, duplicates dropped."""
    try:
        arms = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected block sizes like 1,2,4,8, got {text!r}") from None
    if not arms:
        raise argparse.ArgumentTypeError("expected block sizes like 1,2,4,8, got none")
    if arms[0] < 1 or arms[-1] > MAX_BLOCK_SIZE:
        raise argparse.ArgumentTypeError(f"block sizes must be in 1..{MAX_BLOCK_SIZE}, got {text!r}")
    return arms


def device(text: str) -> str:
    """A torch device this machine has: ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (torch is imported
    only to check a non-CPU device, before any model loads).

    >>> device("cpu"), device("CPU")
    ('cpu', 'cpu')
    >>> device("tpu9")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected cpu, cuda, cuda:N or mps, got 'tpu9'
    """
    m = re.fullmatch(r"(cpu|cuda|mps)(?::(\d+))?", text.strip().lower())
    if m is None:
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N or mps, got {text!r}")
    kind, index = m.group(1), m.group(2)
    if kind == "cpu":
        return "cpu"
    import torch

    if kind == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise argparse.ArgumentTypeError(
                f"{text}: this machine has no CUDA device (torch.cuda.is_available() is False)"
            )
        if index is not None and int(index) >= n:
            raise argparse.ArgumentTypeError(
                f"{text}: this machine has {n} CUDA device(s), cuda:0..cuda:{n - 1}"
            )
    elif not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text}: this machine has no MPS device")
    return m.group(0)


def input_file(text: str) -> Path:
    """An existing, readable regular file."""
    p = Path(text)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    if not p.is_file():
        raise argparse.ArgumentTypeError(f"{text}: not a regular file")
    if not os.access(p, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: not readable (permission denied)")
    return p


def input_dir(text: str) -> Path:
    """An existing directory."""
    p = Path(text)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such directory")
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: not a directory")
    return p


def state_dir(text: str) -> Path:
    """A directory a long-running command keeps state in (decision logs, checkpoints): an
    existing writable directory, or a path whose nearest existing parent is one."""
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    q = p
    while not q.exists():
        q = q.parent
    if not q.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {q} is not a directory")
    if not os.access(q, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot write in {q} (permission denied)")
    return p


def log_dir(text: str) -> Path:
    """A decision log directory a server appends to: new, empty, or holding only what decision
    log writers write (parts, journals, lock files); a folder of other files is refused."""
    from .._util.outputs import foreign_files

    p = state_dir(text)
    if p.is_dir() and any(p.iterdir()):
        foreign = foreign_files(p, "decision-log")
        if foreign is None:
            raise argparse.ArgumentTypeError(
                f"{text} exists and is not a decision log: refusing to log into it"
            )
        if foreign:
            raise argparse.ArgumentTypeError(
                f"{text} holds {foreign[0].rstrip('/')}, which is not part of a decision "
                "log: refusing to log into it"
            )
    return p


def png_output(text: str) -> Path:
    """Where to write a plot: a ``.png`` name in an existing directory, replacing only a PNG."""
    from .._util.outputs import check_output
    from ..errors import AdaptspecError

    p = Path(text)
    if p.suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"expected a .png file name, got {text!r}")
    try:
        check_output(p, "png", replace=True, parents=False)
    except AdaptspecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return p
