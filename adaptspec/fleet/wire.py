"""One replica's published statistics as bytes: an ``.npz`` of the sums plus a JSON header.

The header says who published (``replica``), for which variant and policy (``fingerprint``:
replicas of one variant must run the same policy, arms, feature map and prior), how many updates
the sums hold, and when. Nothing is pickled. A blob that cannot be read, whatever is wrong with
it (not a stored, uncompressed npz; a header that is not a JSON object with the four fields of
the right types; an array of a non-numeric dtype or holding NaN), is refused with one
:class:`AdaptspecError` naming the entry, never merged. What the sums must hold beyond that
(which keys, shapes, where infinities may be) is the policy family's check
(:meth:`adaptspec.fleet.stats.Family.check`).

>>> blob = encode(Published("r1", "f00d", 2, {"count": np.array([1, 1])}, time=0.0))
>>> decode(blob, "replica 'r1' of variant 'A'").updates
2
>>> decode(blob[:40], "replica 'r1' of variant 'A'")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: shared statistics of replica 'r1' of variant 'A': not readable (...)
"""

from __future__ import annotations

import io
import json
import math
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import AdaptspecError

__all__ = ["Published", "encode", "decode"]

FORMAT = 1
_HEAD = "__head__"


@dataclass
class Published:
    """What one replica published: its own cumulative sums and where they come from."""

    replica: str
    fingerprint: str
    updates: int
    sums: dict[str, np.ndarray]
    time: float = field(default_factory=time.time)


def encode(p: Published) -> bytes:
    head = {
        "format": FORMAT,
        "replica": p.replica,
        "fingerprint": p.fingerprint,
        "updates": int(p.updates),
        "time": p.time,
    }
    buf = io.BytesIO()
    np.savez(
        buf,
        **{_HEAD: np.frombuffer(json.dumps(head).encode(), dtype=np.uint8)},
        **{k: np.asarray(v) for k, v in p.sums.items()},
    )
    return buf.getvalue()


def decode(blob: bytes, entry: str = "an entry") -> Published:
    """The statistics in ``blob``; anything malformed is one :class:`AdaptspecError` naming ``entry``."""
    where = f"shared statistics of {entry}"
    try:
        arrays = _arrays(blob)
        head = json.loads(arrays.pop(_HEAD).tobytes().decode())
    except AdaptspecError as e:
        raise AdaptspecError(f"{where}: {e}") from None
    except Exception as e:  # noqa: BLE001 - whatever a bad blob raises is the same refusal
        raise AdaptspecError(f"{where}: not readable ({type(e).__name__}: {_short(e)})") from None
    if not isinstance(head, dict):
        raise AdaptspecError(f"{where}: the header is a JSON {type(head).__name__}, not an object")
    if head.get("format") != FORMAT:
        raise AdaptspecError(f"{where}: format {head.get('format')!r}, this adaptspec reads {FORMAT}")
    for key, kind in (("replica", str), ("fingerprint", str), ("updates", int), ("time", (int, float))):
        v = head.get(key)
        if not isinstance(v, kind) or isinstance(v, bool):
            raise AdaptspecError(f"{where}: header field {key!r} is {v!r}, expected {_kind(kind)}")
    if not head["replica"] or head["updates"] < 0 or not math.isfinite(head["time"]):
        bad = "replica" if not head["replica"] else "updates" if head["updates"] < 0 else "time"
        raise AdaptspecError(f"{where}: header field {bad!r} is {head[bad]!r}")
    for k, v in arrays.items():
        if v.dtype.kind not in "iuf":
            raise AdaptspecError(f"{where}: array {k!r} has dtype {v.dtype}, expected numbers")
        if v.dtype.kind == "f" and np.isnan(v).any():
            raise AdaptspecError(f"{where}: array {k!r} holds NaN")
    return Published(head["replica"], head["fingerprint"], head["updates"], arrays, float(head["time"]))


def _arrays(blob: bytes) -> dict[str, np.ndarray]:
    """Every array of a stored (uncompressed) npz: its size is the blob's, a small blob never inflates."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise AdaptspecError(f"a {type(blob).__name__}, not bytes")
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        packed = [i.filename for i in z.infolist() if i.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise AdaptspecError(f"member {packed[0]!r} is compressed (this adaptspec writes them stored)")
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    if _HEAD not in arrays:
        raise AdaptspecError(f"no {_HEAD} array")
    return arrays


def _kind(kind: Any) -> str:
    return {str: "a string", int: "an integer"}.get(kind, "a number")


def _short(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]
