"""Appending a line to a file whole or not at all.

The append-only logs (the decision log's journal segments, the switchback slice log) write a
record and its newline, then ``fsync``. A write can fail half-way (a full disk, a file size
limit). Written through a buffered file object, the bytes that made it stay in the file and
the rest stay in the buffer: written later, after the caller was told the record failed (a
retry then writes it twice), or never, when the process dies or the file is closed while the
disk is still full, and then the next record lands on the torn one's line and the file no
longer reads (:func:`~adaptspec._util.jsonlines.read_jsonl` names the bad line). :class:`LineAppender`
writes with ``os.write`` and, when a write or its ``fsync`` fails, cuts the file back to where
the record began before raising: the file then holds whole records only, and the next append
starts on a fresh line. (If even the cut fails, the next append makes it first.)

>>> import os, tempfile
>>> p = os.path.join(tempfile.mkdtemp(), "log.jsonl")
>>> with LineAppender(p, fsync=False) as f:
...     f.append('{"a": 1}\\n'); f.append('{"a": 2}\\n')
>>> open(p).read()
'{"a": 1}\\n{"a": 2}\\n'
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["LineAppender"]


def _sync(fd: int) -> None:
    """Flush a file's data to disk (fdatasync where there is one: the size is data, times are not)."""
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


class LineAppender:
    """Appends text records to ``path`` (created; ``exclusive``: it must not exist yet), each
    whole or not at all (see the module docstring); ``fsync`` after each."""

    def __init__(self, path: str | os.PathLike, fsync: bool = True, exclusive: bool = False) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_EXCL if exclusive else 0)
        self.path = path
        self.fsync = fsync
        self._fd: int | None = os.open(path, flags, 0o644)
        self._cut_to: int | None = None  # a failed append's start, when cutting back failed too

    def append(self, text: str) -> None:
        """Write ``text`` (a record and its newline); raises OSError, the file as it was before."""
        fd = self._fd
        if fd is None:
            raise ValueError("append to a closed LineAppender")
        if self._cut_to is not None:
            os.ftruncate(fd, self._cut_to)
            self._cut_to = None
        start = os.fstat(fd).st_size
        data = memoryview(text.encode("utf-8"))
        try:
            while data:
                data = data[os.write(fd, data) :]
            if self.fsync:
                _sync(fd)
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError:
                self._cut_to = start
            raise

    def close(self) -> None:
        """Close the file. Idempotent."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> "LineAppender":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
