"""Reading an append-only JSON-lines file whose writer may have crashed mid-line.

The writers of such files (the decision log's journal segments, the switchback slice log,
the trace collection's partial files) append one JSON object and its newline per record and
``fsync`` it. A crash can therefore leave at most one unfinished record: a *torn* last line,
with no newline after it. :func:`read_jsonl` skips that line (whatever it holds) and returns
where it starts (:attr:`JsonLines.end`), so a writer that resumes the file can cut it off
before appending; any other line that is not a JSON object is an error naming the file and
the line.

>>> import os, tempfile
>>> p = os.path.join(tempfile.mkdtemp(), "log.jsonl")
>>> with open(p, "w") as f: _ = f.write('{"a": 1}\\n\\n{"a": 2}\\n{"a": 3, "b')   # a torn last line
>>> read_jsonl(p)
JsonLines(records=[{'a': 1}, {'a': 2}], end=19, lines=[1, 3])
>>> with open(p, "a") as f: _ = f.write('\\n')      # now the bad line is a finished one
>>> read_jsonl(p)
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: .../log.jsonl: line 4 is not valid JSON
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

from ..errors import AdaptspecError
from .files import JSON_LINES_BYTES, read_bytes

__all__ = ["JsonLines", "read_jsonl"]


class JsonLines(NamedTuple):
    """What :func:`read_jsonl` read."""

    #: each complete line's object, in file order (blank lines hold none)
    records: list[dict[str, Any]]
    #: bytes up to and including the last complete line's newline: where a torn last line
    #: starts (the file's size when there is none; 0 for a missing file)
    end: int
    #: the line each record was on (counted from 1), for messages naming a bad record
    lines: list[int] = []


def read_jsonl(
    path: str | os.PathLike, what: str = "a JSON-lines file", *, missing_ok: bool = False
) -> JsonLines:
    """The JSON objects of the file at ``path``, one a line, skipping a torn last line.

    A last line with no newline after it is torn (its write never finished) and is skipped,
    whatever it holds: even a valid object there was never acknowledged, and a writer that
    resumes the file cuts it off at :attr:`JsonLines.end`. Blank lines are skipped. Any
    other line that is not valid UTF-8 JSON, or not a JSON object, raises
    :class:`~adaptspec.errors.AdaptspecError` naming the file and the line (counted from 1).
    A missing file raises too, or reads as no records if ``missing_ok``. ``what`` names
    the file in the message when it cannot be read at all (a FIFO, no permission).
    """
    data = read_bytes(
        path, what, limit=JSON_LINES_BYTES, missing_ok=missing_ok
    )  # a regular file: a FIFO would block
    if data is None:
        return JsonLines([], 0, [])
    lines = data.split(b"\n")
    end = len(data) - len(lines[-1])  # what follows the last newline is a torn line (or nothing)
    records: list[dict[str, Any]] = []
    numbers: list[int] = []
    for i, line in enumerate(lines[:-1]):
        if not line.strip():
            continue
        try:
            r = json.loads(line.decode("utf-8"))
        except (
            UnicodeDecodeError,
            ValueError,
            RecursionError,
        ):  # ValueError: a number too long to convert too
            raise AdaptspecError(f"{path}: line {i + 1} is not valid JSON") from None
        if not isinstance(r, dict):
            raise AdaptspecError(f"{path}: line {i + 1} is not a JSON object")
        records.append(r)
        numbers.append(i + 1)
    return JsonLines(records, end, numbers)
