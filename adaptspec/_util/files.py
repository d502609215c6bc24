"""Reading a file a user named: regular files only, no more bytes than its kind holds, and every
decode failure as one line.

A path that should name a file can name a FIFO (opening one for reading blocks until something
writes to it: a reader would hang forever), a device, a socket or a directory. :func:`open_regular`
refuses them: it checks the path's type with ``os.stat`` before opening (a clear message), opens
with ``O_NONBLOCK`` (a FIFO swapped in after the check then opens at once instead of blocking)
and checks the opened file's type again with ``fstat``. Every reader of a file from a user's
folder goes through it: :func:`read_bytes`; :func:`read_json` and :func:`read_json_object`,
which also turn the whole class of decode failures into one line (not UTF-8, not JSON, a number
too long to convert, nesting too deep for the parser); and the readers of binary containers
(Parquet, ``.npz``, safetensors), which hand its file object (or its bytes) to their library.

A file is read whole into memory, so each kind of file has a cap on its size (:data:`JSON_BYTES`
for a JSON document, :data:`JSON_LINES_BYTES` for a JSON-lines file, :data:`DATA_BYTES` for a
binary container of tensors or tables): a larger file (a 2 GB file given as a latency profile)
is refused from its size before a byte is read, in one line naming the limit, and no read takes
more than the cap (a file that grows while it is read is refused too).

Every failure is an :class:`~adaptspec.errors.AdaptspecError` naming the file and what was
expected there (``what``, e.g. "a trace set's meta.json"):

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> p = os.path.join(d, "meta.json")
>>> _ = open(p, "wb").write(b'{"a": "\\xff"}')
>>> read_json(p, "a trace set's meta.json")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: .../meta.json: not valid JSON (a trace set's meta.json expected; not UTF-8 text: byte 0xff at offset 7)
>>> _ = open(p, "w").write("[" * 100000)
>>> read_json(p, "a trace set's meta.json")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: .../meta.json: not readable JSON (a trace set's meta.json expected; nested too deeply)
>>> os.remove(p); os.mkfifo(p)
>>> read_json(p, "a trace set's meta.json")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: .../meta.json: not a regular file (a trace set's meta.json expected, found a FIFO (named pipe))
>>> os.remove(p)
>>> with open(p, "wb") as f: _ = f.truncate(JSON_BYTES + 1)  # sparse: nothing written
>>> read_json(p, "a JSON latency profile")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: .../meta.json: 67108865 bytes, more than a JSON latency profile may hold (a JSON document: at most 67108864 bytes, 64 MiB)
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import AdaptspecError

__all__ = [
    "DATA_BYTES",
    "JSON_BYTES",
    "JSON_LINES_BYTES",
    "SizeLimit",
    "open_regular",
    "parse_json",
    "read_bytes",
    "read_json",
    "read_json_object",
    "regular_file",
]


class SizeLimit(int):
    """The most bytes a kind of file may hold (an ``int``), with the kind's name for the refusal."""

    kind: str

    def __new__(cls, n: int, kind: str) -> "SizeLimit":
        limit = super().__new__(cls, n)
        limit.kind = kind
        return limit

    def shown(self) -> str:
        """``"a JSON document: at most 67108864 bytes, 64 MiB"``."""
        return f"{self.kind}: at most {int(self)} bytes, {int(self) >> 20} MiB"


#: a JSON document (a description, a config, a latency profile, a results file): read whole and parsed
JSON_BYTES = SizeLimit(64 << 20, "a JSON document")
#: a JSON-lines file (a decision log's journal, a collection's progress, a prompts file)
JSON_LINES_BYTES = SizeLimit(4 << 30, "a JSON-lines file")
#: a binary container of tensors or tables (safetensors, .npz, Parquet), read whole by its library
DATA_BYTES = SizeLimit(64 << 30, "a data file")

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_regular(path: str | os.PathLike, what: str, mode: int) -> AdaptspecError:
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    return AdaptspecError(f"{path}: not a regular file ({what} expected, found {kind})")


def _unreadable(path: str | os.PathLike, what: str, e: OSError) -> AdaptspecError:
    return AdaptspecError(f"{path}: cannot read {what} ({e.strerror or e})")


def regular_file(path: str | os.PathLike, what: str = "a file") -> Path:
    """``path``, once it is known not to be a FIFO, a device, a socket or a directory.

    A missing path passes (the caller's own read says it is missing); a symbolic link is judged by
    what it points to. Readers call :func:`open_regular`, which checks this and more; this is for
    a check before any work starts.

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
        raise _unreadable(path, what, e) from None
    if not stat.S_ISREG(mode):
        raise _not_regular(path, what, mode)
    return Path(path)


def open_regular(
    path: str | os.PathLike, what: str, *, missing_ok: bool = False, limit: SizeLimit | None = None
) -> BinaryIO | None:
    """``path`` opened for reading in binary, once it is known to be a regular file (see the
    module docstring) of at most ``limit`` bytes (when given: for a library that reads the file
    object itself); a missing file is an error, or ``None`` with ``missing_ok``."""
    regular_file(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if missing_ok:
            return None
        raise AdaptspecError(f"{path}: no such file ({what} expected)") from None
    except OSError as e:
        raise _unreadable(path, what, e) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped in after the check above
            raise _not_regular(path, what, mode)
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise _too_large(path, what, limit, size)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(
    path: str | os.PathLike, what: str, *, limit: SizeLimit, missing_ok: bool = False
) -> bytes | None:
    """The whole file at ``path`` (see :func:`open_regular`), refused in one line naming ``limit``
    when it holds more (from its size, before reading; or once a read passes it)."""
    f = open_regular(path, what, missing_ok=missing_ok, limit=limit)
    if f is None:
        return None
    try:
        with f:
            size = os.fstat(f.fileno()).st_size  # at most limit (open_regular): one read of that size
            data = f.read(size + 1)
            if len(data) > size:  # it grew since: read on, no further than the cap
                parts = [data]
                while sum(map(len, parts)) <= limit:
                    more = f.read(1 << 20)
                    if not more:
                        break
                    parts.append(more)
                data = b"".join(parts)
    except OSError as e:
        raise _unreadable(path, what, e) from None
    if len(data) > limit:
        raise _too_large(path, what, limit, None)
    return data


def _too_large(path: str | os.PathLike, what: str, limit: SizeLimit, size: int | None) -> AdaptspecError:
    held = "more bytes" if size is None else f"{size} bytes"
    return AdaptspecError(f"{path}: {held}, more than {what} may hold ({limit.shown()})")


def parse_json(data: bytes | str, where: str | os.PathLike, what: str) -> Any:
    """``data`` (UTF-8 bytes or text) as JSON; every way it can fail is one line naming ``where``.

    >>> parse_json(b'{"n": 1}', "x.json", "a head's config")
    {'n': 1}
    >>> parse_json(b'{"n": ' + b'9' * 5000 + b'}', "x.json", "a head's config")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: x.json: not valid JSON (a head's config expected; Exceeds the limit ...
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise AdaptspecError(
                f"{where}: not valid JSON ({what} expected; not UTF-8 text: byte 0x{data[e.start]:02x} "
                f"at offset {e.start})"
            ) from None
    else:
        text = data
    try:
        return json.loads(text)
    except RecursionError:
        raise AdaptspecError(f"{where}: not readable JSON ({what} expected; nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, and a number too long to convert
        raise AdaptspecError(
            f"{where}: not valid JSON ({what} expected; {str(e).splitlines()[0][:200]})"
        ) from None


def read_json(path: str | os.PathLike, what: str) -> Any:
    """The JSON value in the file at ``path``, at most :data:`JSON_BYTES` (see the module docstring)."""
    return parse_json(read_bytes(path, what, limit=JSON_BYTES), path, what)


def read_json_object(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """:func:`read_json` of a file whose top level must be a JSON object."""
    data = read_json(path, what)
    if not isinstance(data, dict):
        raise AdaptspecError(f"{path}: not {what} (the top level must be a JSON object)")
    return data
