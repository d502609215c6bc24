"""The one rule every writer follows: what may be replaced, and how.

An output path is written when it does not exist or is an empty directory. It is replaced
only when the caller asked for that (``--force`` / ``--overwrite``) *and* it already holds an
adaptspec artefact of the same kind (a trace set over a trace set, a head over a head, ...);
anything else (a user's directory, a regular file, another kind of artefact) is refused with
one line naming it, and nothing is touched. Callers check with :func:`check_output` before
doing any work, then write with :func:`write_dir` or :func:`write_file`: into a hidden
temporary sibling that is renamed into place, so a crash leaves the old artefact or the new
one, never half of one.

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
>>> check_output(d / "new", "traceset", replace=False)
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: ... already exists (pass --force to replace the trace set)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable

from ..errors import AdaptspecError

__all__ = ["KINDS", "check_output", "is_kind", "write_dir", "write_file"]

_PART = re.compile(r"^part-.*\.parquet$")
_PNG = b"\x89PNG\r\n\x1a\n"


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _is_traceset(p: Path) -> bool:
    return p.is_dir() and (p / "meta.json").is_file()


def _is_head(p: Path) -> bool:
    cfg = _json(p / "config.json") if p.is_dir() else None
    return isinstance(cfg, dict) and cfg.get("kind") == "adaptspec-offline-head"


def _is_decision_log(p: Path) -> bool:
    if not p.is_dir() or (p / "meta.json").exists():
        return False
    visible = [q.name for q in p.iterdir() if not q.name.startswith(".")]
    return bool(visible) and all(_PART.match(n) for n in visible)


def _is_png(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return p.is_file() and f.read(8) == _PNG
    except OSError:
        return False


def _is_latency_profile(p: Path) -> bool:
    d = _json(p) if p.is_file() else None
    return isinstance(d, dict) and {"name", "draft", "verify"} <= set(d)


#: kind -> (what it is called, test, is a directory)
KINDS: dict[str, tuple[str, Callable[[Path], bool], bool]] = {
    "traceset": ("trace set", _is_traceset, True),
    "head": ("offline head", _is_head, True),
    "decision-log": ("decision log", _is_decision_log, True),
    "png": ("plot (PNG file)", _is_png, False),
    "latency-profile": ("latency profile", _is_latency_profile, False),
}


def is_kind(path: str | os.PathLike, kind: str) -> bool:
    """Whether ``path`` holds an adaptspec artefact of ``kind`` (see :data:`KINDS`)."""
    return KINDS[kind][1](Path(path))


def check_output(path: str | os.PathLike, kind: str, replace: bool, flag: str = "--force",
                 parents: bool = True) -> None:
    """Raise :class:`AdaptspecError` unless ``path`` may be written as a ``kind``.

    Fine: ``path`` does not exist, or is an empty directory (directory kinds), or holds a
    ``kind`` and ``replace`` is true. Missing parent directories are fine with ``parents``
    (they are created when writing) as long as the nearest existing one is a writable
    directory; without ``parents`` the parent directory must exist.
    """
    p = Path(path)
    what, test, is_dir = KINDS[kind]
    if not p.exists() and not p.is_symlink():
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
    if is_dir and p.is_dir() and not any(p.iterdir()):
        return
    if not test(p):
        raise AdaptspecError(f"{p} exists and is not an adaptspec {what}: refusing to replace it")
    if not replace:
        raise AdaptspecError(f"{p} already exists (pass {flag} to replace the {what})")


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


def write_dir(path: str | os.PathLike, kind: str, replace: bool, write: Callable[[Path], Any],
              flag: str = "--force") -> Path:
    """Check ``path`` (:func:`check_output`), run ``write(tmpdir)``, rename ``tmpdir`` to ``path``."""
    path = Path(path)
    check_output(path, kind, replace, flag)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    except OSError as e:
        raise AdaptspecError(f"{path}: cannot write here ({e.strerror or e})") from None
    try:
        write(tmp)
        swap_into_place(tmp, path)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AdaptspecError(f"{path}: cannot write ({e.strerror or e}); nothing was changed") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def write_file(path: str | os.PathLike, kind: str, replace: bool, write: Callable[[Path], Any],
               flag: str = "--force", parents: bool = True) -> Path:
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
