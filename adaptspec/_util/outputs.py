"""The one rule every writer follows: what may be replaced, and how.

An output path is written when it does not exist or is an empty directory. It is replaced
only when the caller asked for that (``--force`` / ``--overwrite``) *and* it holds exactly
what adaptspec wrote there as an artefact of the same kind (a trace set over a trace set, a
head over a head, ...) and nothing else: every directory :func:`write_dir` creates carries a
marker, ``.adaptspec-output.json``, naming its kind and listing the files written, and a
folder holding any other file (a user's ``important.csv`` next to a ``meta.json``) is refused.
Artefacts written before the marker existed (the bundled trace sets and heads) are accepted
only when every file in them is one adaptspec writes for that kind and their own metadata
says what they are. A decision log is appended to by long-running writers, so it is known by
its file names (parts, journals, lock files) instead of a list. Anything else (a user's
directory, a regular file, another kind of artefact, a symbolic link, the command's own
input) is refused with one line naming it, and nothing is touched. Callers check with
:func:`check_output` before doing any work, then write with :func:`write_dir` or
:func:`write_file`: into a hidden temporary sibling that is renamed into place, so a crash
leaves the old artefact or the new one, never half of one.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> (d / "notes").mkdir(); (d / "notes" / "todo.txt").write_text("mine")
4
>>> check_output(d / "notes", "traceset", replace=True)
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: ... exists and is not an adaptspec trace set: refusing to replace it
>>> write_dir(d / "new", "traceset", False, lambda tmp: (tmp / "meta.json").write_text("{}")).name
'new'
>>> sorted(p.name for p in (d / "new").iterdir())
['.adaptspec-output.json', 'meta.json']
>>> check_output(d / "new", "traceset", replace=False)
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: ... already exists (pass --force to replace the trace set)
>>> check_output(d / "new", "traceset", replace=True)  # ours, and nothing else in it
>>> (d / "new" / "important.csv").write_text("x")
1
>>> check_output(d / "new", "traceset", replace=True)
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: ... holds important.csv, which adaptspec did not write: refusing to replace it
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import AdaptspecError
from .files import open_regular, read_json

__all__ = ["KINDS", "MARKER", "check_output", "foreign_files", "is_kind", "write_dir", "write_file"]

#: the file :func:`write_dir` leaves in every directory it writes
MARKER = ".adaptspec-output.json"

_PNG = b"\x89PNG\r\n\x1a\n"
#: what a decision log's writers leave: parts, a part being written, journal segments, lock files,
#: switchback slice records (traces.slice_log)
_LOG_NAMES = re.compile(
    r"^(part-[^/]*\.parquet|\.part-[^/]*\.parquet\.tmp|\.journal-[A-Za-z0-9_.-]+-\d+\.jsonl"
    r"|\.writer-[A-Za-z0-9_.-]+\.lock|slices-[A-Za-z0-9_.-]+\.jsonl)$"
)


def _json(path: Path) -> Any:
    """The JSON in ``path``, or None when it is missing or not a readable JSON file."""
    try:
        return read_json(path, "a JSON file") if path.is_file() else None
    except AdaptspecError:
        return None


def _entries(p: Path) -> list[str]:
    """Every file and directory under ``p``, as relative POSIX paths (directories end in ``/``)."""
    out = []
    for root, dirs, files in os.walk(p):
        rel = Path(root).relative_to(p)
        out += [(rel / d).as_posix() + "/" for d in dirs] + [(rel / f).as_posix() for f in files]
    return sorted(out)


def _traceset_legacy(p: Path) -> bool:
    meta = _json(p / "meta.json")
    return isinstance(meta, dict) and "schema_version" in meta and meta.get("format") is None


def _head_legacy(p: Path) -> bool:
    cfg = _json(p / "config.json")
    return isinstance(cfg, dict) and cfg.get("kind") == "adaptspec-offline-head"


def _drafter_legacy(p: Path) -> bool:
    """A drafter ``train-drafter --export`` wrote (in place, so without a marker): its card, ``training.json``."""
    return isinstance(_json(p / "training.json"), dict)


def _is_png(p: Path) -> bool:
    """A PNG adaptspec wrote: the signature, then a ``Software`` text chunk saying ``adaptspec``
    before the image data (``_util.atomic.save_figure`` writes it)."""
    if not p.is_file():
        return False
    try:
        with open_regular(p, "a PNG file") as f:
            head = f.read(1 << 16)
    except (AdaptspecError, OSError):
        return False
    if head[:8] != _PNG:
        return False
    i = 8
    while i + 8 <= len(head):
        n, kind = int.from_bytes(head[i : i + 4], "big"), head[i + 4 : i + 8]
        if kind == b"tEXt" and head[i + 8 : i + 8 + n] == b"Software\x00adaptspec":
            return True
        if kind == b"IDAT":
            return False
        i += 12 + n
    return False


def _is_latency_profile(p: Path) -> bool:
    d = _json(p) if p.is_file() else None
    return isinstance(d, dict) and {"name", "draft", "verify"} <= set(d)


#: directory kinds -> (what it is called, the files a legacy one (no marker) may hold, its test)
_DIRS: dict[str, tuple[str, frozenset[str], Callable[[Path], bool]]] = {
    "traceset": (
        "trace set",
        frozenset({"meta.json", "requests.parquet", "outcomes.parquet"}),
        _traceset_legacy,
    ),
    "head": (
        "offline head",
        frozenset({"config.json", "model.safetensors", "featurizer.json", "featurizer.safetensors"}),
        _head_legacy,
    ),
    "decision-log": ("decision log", frozenset(), lambda p: True),
    "drafter": (
        "exported drafter",
        frozenset(
            {
                "training.json",
                "drafter_config.json",
                "drafter.safetensors",
                "config.json",
                "model.safetensors",
            }
        ),
        _drafter_legacy,
    ),
    # a Hugging Face model directory adaptspec exported (adaptspec.models.vllm_export): known by its marker only
    "model": ("exported model directory", frozenset(), lambda p: False),
}
#: file kinds -> (what it is called, its test)
_FILES: dict[str, tuple[str, Callable[[Path], bool]]] = {
    "png": ("plot (PNG file)", _is_png),
    "latency-profile": ("latency profile", _is_latency_profile),
}
#: kind -> (what it is called, is a directory)
KINDS: dict[str, tuple[str, bool]] = {
    **{k: (v[0], True) for k, v in _DIRS.items()},
    **{k: (v[0], False) for k, v in _FILES.items()},
}


def foreign_files(path: str | os.PathLike, kind: str) -> list[str] | None:
    """What in directory ``path`` adaptspec did not write as a ``kind``: ``None`` when it is not
    a ``kind`` at all, else the foreign entries (an empty list: all of it is ours)."""
    p = Path(path)
    if not p.is_dir() or p.is_symlink():
        return None
    entries = _entries(p)
    if kind == "decision-log":  # appended to as it goes: known by its writers' file names
        names = [e for e in entries if e != MARKER]
        ours = [n for n in names if _LOG_NAMES.match(n)]
        if not ours or "meta.json" in names:
            return None
        return [n for n in names if n not in ours]
    marker = _json(p / MARKER)
    if MARKER in entries:
        if not (
            isinstance(marker, dict)
            and marker.get("written_by") == "adaptspec"
            and marker.get("kind") == kind
            and isinstance(marker.get("files"), list)
        ):
            return None
        ours = {str(f) for f in marker["files"]} | {MARKER}
        ours |= {"/".join(f.split("/")[:i]) + "/" for f in ours for i in range(1, f.count("/") + 1)}
        return [e for e in entries if e not in ours]
    _, legacy, test = _DIRS[kind]
    if not test(p):
        return None
    return [e for e in entries if e not in legacy]


def is_kind(path: str | os.PathLike, kind: str) -> bool:
    """Whether ``path`` holds an adaptspec artefact of ``kind`` (see :data:`KINDS`) and nothing else."""
    if kind in _FILES:
        return _FILES[kind][1](Path(path))
    return foreign_files(path, kind) == []


def _same_or_nested(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def check_output(
    path: str | os.PathLike,
    kind: str,
    replace: bool,
    flag: str = "--force",
    parents: bool = True,
    reads: Iterable[str | os.PathLike | None] = (),
) -> None:
    """Raise :class:`AdaptspecError` unless ``path`` may be written as a ``kind``.

    Fine: ``path`` does not exist, or is an empty directory (directory kinds), or holds a
    ``kind`` adaptspec wrote and nothing else, and ``replace`` is true. Missing parent
    directories are fine with ``parents`` (they are created when writing) as long as the
    nearest existing one is a writable directory; without ``parents`` the parent directory
    must exist. ``reads``: the command's inputs; the output may not be one of them, lie inside
    one or hold one.
    """
    p = Path(path)
    what, is_dir = KINDS[kind]
    for r in reads:
        if r is not None and _same_or_nested(p.resolve(), Path(r).resolve()):
            raise AdaptspecError(
                f"{p}: the output overlaps this command's own input {r} (the same path, inside "
                "it or holding it); choose another path"
            )
    if p.is_symlink():
        raise AdaptspecError(f"{p} is a symbolic link: refusing to replace it")
    if not p.exists():
        parent = p.parent
        if not parent.exists() and not parents:
            raise AdaptspecError(f"{p}: directory {parent} does not exist")
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise AdaptspecError(f"{p}: {parent} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise AdaptspecError(f"{p}: cannot write in {parent} (permission denied)")
        return
    if is_dir:
        if p.is_dir() and not any(p.iterdir()):
            return
        foreign = foreign_files(p, kind)
        if foreign is None:
            raise AdaptspecError(f"{p} exists and is not an adaptspec {what}: refusing to replace it")
        if foreign:
            more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
            raise AdaptspecError(
                f"{p} holds {foreign[0].rstrip('/')}{more}, which adaptspec did not write: "
                "refusing to replace it"
            )
    elif not _FILES[kind][1](p):
        raise AdaptspecError(f"{p} exists and is not an adaptspec {what}: refusing to replace it")
    if not replace:
        raise AdaptspecError(f"{p} already exists (pass {flag} to replace the {what})")


def mark(tmp: Path, kind: str) -> None:
    """Write the marker of a finished ``kind`` directory ``tmp``: its kind and every file in it."""
    files = [e for e in _entries(tmp) if not e.endswith("/") and e != MARKER]
    (tmp / MARKER).write_text(
        json.dumps({"written_by": "adaptspec", "kind": kind, "files": files}, indent=1) + "\n"
    )


def swap_into_place(tmp: Path, path: Path) -> None:
    """Rename the finished directory ``tmp`` to ``path``, replacing what is there (renames only)."""
    os.chmod(tmp, 0o755)
    if path.exists():
        old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)


def write_dir(
    path: str | os.PathLike,
    kind: str,
    replace: bool,
    write: Callable[[Path], Any],
    flag: str = "--force",
    reads: Iterable[str | os.PathLike | None] = (),
) -> Path:
    """Check ``path`` (:func:`check_output`), run ``write(tmpdir)``, mark ``tmpdir`` as a ``kind``
    (:data:`MARKER`), check ``path`` again (it may have changed meanwhile) and rename ``tmpdir``
    to ``path``."""
    path = Path(path)
    reads = list(reads)
    check_output(path, kind, replace, flag, reads=reads)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    except OSError as e:
        raise AdaptspecError(f"{path}: cannot write here ({e.strerror or e})") from None
    try:
        write(tmp)
        mark(tmp, kind)
        check_output(path, kind, replace, flag, reads=reads)
        swap_into_place(tmp, path)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AdaptspecError(f"{path}: cannot write ({e.strerror or e}); nothing was changed") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def write_file(
    path: str | os.PathLike,
    kind: str,
    replace: bool,
    write: Callable[[Path], Any],
    flag: str = "--force",
    parents: bool = True,
) -> Path:
    """Check ``path`` (:func:`check_output`), run ``write(tmpfile)``, rename it to ``path``."""
    path = Path(path)
    check_output(path, kind, replace, flag, parents)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AdaptspecError(f"{path}: cannot write here ({e.strerror or e})") from None
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise AdaptspecError(f"{path}: cannot write ({e.strerror or e}); nothing was changed") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path
