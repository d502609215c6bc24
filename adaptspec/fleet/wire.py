"""One replica's published statistics as bytes: an ``.npz`` of the sums plus a JSON header.

The header says who published (``replica``), for which variant and policy (``fingerprint``:
replicas of one variant must run the same policy, arms, feature map and prior), how many updates
the sums hold, and when. Nothing is pickled; a blob that cannot be read is refused, not merged.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import AdaptspecError

__all__ = ["Published", "encode", "decode"]

FORMAT = 1


@dataclass
class Published:
    """What one replica published: its own cumulative sums and where they come from."""

    replica: str
    fingerprint: str
    updates: int
    sums: dict[str, np.ndarray]
    time: float = field(default_factory=time.time)


def encode(p: Published) -> bytes:
    head = {"format": FORMAT, "replica": p.replica, "fingerprint": p.fingerprint, "updates": int(p.updates),
            "time": p.time}
    buf = io.BytesIO()
    np.savez(buf, __head__=np.frombuffer(json.dumps(head).encode(), dtype=np.uint8),
             **{k: np.asarray(v) for k, v in p.sums.items()})
    return buf.getvalue()


def decode(blob: bytes) -> Published:
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        head: dict[str, Any] = json.loads(arrays.pop("__head__").tobytes().decode())
    except Exception as e:  # noqa: BLE001 - anything unreadable is refused the same way
        raise AdaptspecError(f"unreadable shared statistics ({type(e).__name__}: {e})") from None
    if head.get("format") != FORMAT:
        raise AdaptspecError(f"shared statistics of format {head.get('format')!r}, this adaptspec reads {FORMAT}")
    return Published(str(head["replica"]), str(head["fingerprint"]), int(head["updates"]), arrays, float(head["time"]))
