"""Atomic checkpoints of a learning policy (and the featurizer its contexts come from).

A checkpoint is a directory ``ckpt-<updates>`` (zero-padded) inside the checkpoint
directory, holding ``policy.npz`` (``Policy.save_state``), the featurizer's two files when
there is one, and ``checkpoint.json`` (what the controller needs to resume: how many updates
the policy had learnt from, the decision id of the last one, the policy's spec, label and
arms). It is written to a hidden temporary directory, every file fsync'd, then renamed into
place and the parent fsync'd, so a crash leaves either the new checkpoint complete or none
of it; readers only ever see complete ones. Older checkpoints beyond ``keep`` are deleted.

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

from .._util.outputs import swap_into_place
from ..errors import AdaptspecError
from .._util.atomic import fsync_path, json_default, read_descriptor

__all__ = ["CHECKPOINT_FORMAT", "latest_checkpoint", "load_policy", "read_checkpoint", "state_digest",
           "write_checkpoint"]

CHECKPOINT_FORMAT = 1
_CKPT = re.compile(r"^ckpt-(\d{12})$")


def write_checkpoint(directory: str | os.PathLike, policy: Any, meta: Mapping[str, Any],
                     featurizer: Any = None, keep: int = 2) -> Path:
    """Write a checkpoint of ``policy`` (and ``featurizer``); ``meta["updates"]`` names it."""
    if not hasattr(policy, "save_state"):
        raise AdaptspecError(f"{type(policy).__name__} has no save_state(path): checkpoints need an adaptspec Policy")
    root = Path(directory)
    updates = int(meta.get("updates", 0))
    final = root / f"ckpt-{updates:012d}"
    info = {"format": CHECKPOINT_FORMAT, "kind": "adaptspec-checkpoint", "time": time.time(),
            "featurizer": None if featurizer is None else featurizer.fingerprint, **dict(meta)}
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
        swap_into_place(tmp, final)  # the same update count again (e.g. at shutdown) replaces it
        fsync_path(root)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AdaptspecError(f"{root}: cannot write a checkpoint ({e.strerror or e})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in checkpoints(root)[:-max(1, int(keep))]:
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
    """The ``checkpoint.json`` of a checkpoint directory."""
    return read_descriptor(Path(path) / "checkpoint.json", "adaptspec-checkpoint", CHECKPOINT_FORMAT, "checkpoint")


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
