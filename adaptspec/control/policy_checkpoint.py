"""Atomic checkpoints of a learning policy (and the featurizer its contexts come from).

A checkpoint is a directory ``ckpt-<updates>`` (zero-padded) inside the checkpoint
directory, holding ``policy.npz`` (``Policy.save_state``), the featurizer's two files when
there is one, and ``checkpoint.json`` (what the controller needs to resume: how many updates
the policy had learnt from, the decision id of the last one, the policy's spec, label and
arms). It is written to a hidden temporary directory, every file fsync'd, then renamed into
place and the parent fsync'd, so a crash leaves either the new checkpoint complete or none
of it; readers only ever see complete ones. Older checkpoints beyond ``keep`` are deleted,
except one holding a file a checkpoint does not write (a user's), which is kept whole.

>>> import tempfile
>>> from adaptspec.policies import UCB
>>> d = tempfile.mkdtemp()
>>> pol = UCB([1, 4, 8], seed=0); pol.update(None, 4, 2.0)
>>> path = write_checkpoint(d, pol, {"updates": 1, "last_decision_id": "x"})
>>> path.name, read_checkpoint(latest_checkpoint(d))["updates"]
('ckpt-000000000001', 1)
>>> fresh = UCB([1, 4, 8], seed=0); load_policy(path, fresh); state_digest(fresh) == state_digest(pol)
True
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .._util.atomic import fsync_path, json_default, read_descriptor
from .._util.checks import int_list, integer
from .._util.outputs import swap_into_place
from ..errors import AdaptspecError
from ..speculator import MAX_TREE_NODES

__all__ = [
    "CHECKPOINT_FORMAT",
    "latest_checkpoint",
    "load_policy",
    "read_checkpoint",
    "state_digest",
    "write_checkpoint",
]

CHECKPOINT_FORMAT = 1
_CKPT = re.compile(r"^ckpt-(\d{12})$")
#: Every file a checkpoint directory holds; one holding anything else is a user's, never deleted.
_FILES = frozenset({"policy.npz", "checkpoint.json", "featurizer.json", "featurizer.safetensors"})


def _only_ours(path: Path) -> bool:
    """True when ``path`` holds nothing but files a checkpoint writes."""
    return all(f.name in _FILES and f.is_file() and not f.is_symlink() for f in path.iterdir())


def write_checkpoint(
    directory: str | os.PathLike, policy: Any, meta: Mapping[str, Any], featurizer: Any = None, keep: int = 2
) -> Path:
    """Write a checkpoint of ``policy`` (and ``featurizer``); ``meta["updates"]`` names it."""
    if not hasattr(policy, "save_state"):
        raise AdaptspecError(
            f"{type(policy).__name__} has no save_state(path): checkpoints need an adaptspec Policy"
        )
    fault = policy.state_fault() if hasattr(policy, "state_fault") else None
    if fault is not None:  # never written: a resume would learn from it
        raise AdaptspecError(f"not writing a checkpoint of policy {getattr(policy, 'label', '?')}: {fault}")
    root = Path(directory)
    updates = int(meta.get("updates", 0))
    final = root / f"ckpt-{updates:012d}"
    info = {
        "format": CHECKPOINT_FORMAT,
        "kind": "adaptspec-checkpoint",
        "time": time.time(),
        "featurizer": None if featurizer is None else featurizer.fingerprint,
        **dict(meta),
    }
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".ckpt-", suffix=".tmp", dir=root))
    except OSError as e:
        raise AdaptspecError(f"{root}: cannot write a checkpoint here ({e.strerror or e})") from None
    try:
        policy.save_state(tmp / "policy.npz")
        if featurizer is not None:
            featurizer.save(tmp)
        (tmp / "checkpoint.json").write_text(json.dumps(info, indent=2, default=json_default) + "\n")
        for f in tmp.iterdir():
            fsync_path(f)
        if final.exists() and not _only_ours(final):
            raise OSError(f"{final.name} holds files adaptspec did not write; not replacing it")
        swap_into_place(tmp, final)  # the same update count again (e.g. at shutdown) replaces it
        fsync_path(root)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AdaptspecError(f"{root}: cannot write a checkpoint ({e.strerror or e})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in checkpoints(root)[: -max(1, int(keep))]:
        if _only_ours(old):  # a checkpoint someone put a file into is kept, and the file with it
            shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Complete checkpoints in ``directory``, oldest first."""
    root = Path(directory)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _CKPT.match(p.name) and (p / "checkpoint.json").is_file())


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint, or None."""
    c = checkpoints(directory)
    return c[-1] if c else None


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The ``checkpoint.json`` of a checkpoint directory, its fields checked (one line naming a bad one)."""
    where = Path(path) / "checkpoint.json"
    info = read_descriptor(where, "adaptspec-checkpoint", CHECKPOINT_FORMAT, "checkpoint")
    integer(info.get("updates"), str(where), "updates", 0)
    if "arms" in info:
        arms = int_list(info["arms"], str(where), "arms", -MAX_TREE_NODES)  # a negative arm: a draft tree
        if 0 in arms:
            raise AdaptspecError(
                f"{where}: arms={arms} holds 0: an arm is a block size >= 1 or a tree arm < 0"
            )
    for key in ("last_decision_id", "variant", "featurizer"):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise AdaptspecError(f"{where}: {key}={info[key]!r} must be a string")
    if info.get("machine_speed") is not None and not isinstance(info["machine_speed"], dict):
        raise AdaptspecError(f"{where}: machine_speed={info['machine_speed']!r} must be an object")
    return info


def load_policy(path: str | os.PathLike, policy: Any) -> None:
    """Load a checkpoint's policy state into ``policy`` (built with the same hyper-parameters)."""
    f = Path(path) / "policy.npz"
    if not f.is_file():
        raise AdaptspecError(f"{path}: checkpoint has no policy.npz")
    policy.load_state(f)


def state_digest(policy: Any) -> str:
    """Hash of everything a policy has learnt (its ``state_dict`` without the random generator)."""
    h = hashlib.sha256()

    def feed(obj: Any) -> None:
        if isinstance(obj, np.ndarray):
            h.update(str(obj.dtype).encode() + str(obj.shape).encode())
            h.update(np.ascontiguousarray(obj).tobytes())
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                h.update(str(k).encode())
                feed(obj[k])
        elif isinstance(obj, (list, tuple)):
            h.update(b"[")
            for v in obj:
                feed(v)
            h.update(b"]")
        else:
            h.update(repr(json_default(obj) if isinstance(obj, np.generic) else obj).encode())

    state = dict(policy.state_dict())
    state.pop("rng", None)
    feed(state)
    return h.hexdigest()[:16]
