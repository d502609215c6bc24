"""Whether a replay scores an offline head on the requests it was trained on (in-sample figures).

A head trained on a trace set's requests and replayed on the same requests is scored on what it
fitted: its figures say nothing about unseen prompts (the bundled head on the bundled benchmark
set earns about 100% of the oracle there). What can be known, per head a replayed policy stands on:

- a head trained by ``adaptspec train-head`` records the ids of its training requests
  (``info["request_ids"]``, training and validation parts): the overlap is counted;
- a shipped head is known to be trained on its bundled trace set
  (:func:`~adaptspec.models.bundled.paired_head`), though it records no ids;
- any other head records at most where it was trained (``info["traces"]``): the replay cannot
  tell, and says so.

>>> in_sample_warnings([], None)
[]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..policies.offline_head import HeadModel, head_fingerprint


def policy_head(policy: Any) -> HeadModel | None:
    """The offline head a policy stands on (NeuralLinear, OfflineHead, ...), or None."""
    head = getattr(policy, "head", None)
    return head if isinstance(head, HeadModel) else None


def in_sample_warnings(policies: Sequence[Any], traces: Any) -> list[str]:
    """One line per head among ``policies`` that was (or may have been) trained on ``traces``'s
    requests (see the module docstring)."""
    out, seen = [], set()
    for pol in policies:
        head = policy_head(pol)
        if head is None:
            continue
        key = head_fingerprint(head)
        if key in seen:
            continue
        seen.add(key)
        line = _warning(pol.label, head, key, traces)
        if line is not None:
            out.append(line)
    return out


def _warning(label: str, head: HeadModel, key: str, traces: Any) -> str | None:
    n = traces.n_requests
    ids = head.info.get("request_ids")
    if ids is not None:
        k = int(np.isin(traces.request_ids.astype(str), np.asarray(ids, dtype=str)).sum())
        if not k:
            return None
        return (
            f"{label}: its head was trained on {k} of these {n} requests (its training metadata): their "
            "scores are in-sample, not what unseen prompts would get"
        )
    shipped = _shipped_home(key)
    trained = head.info.get("n_train", 0) + head.info.get("n_val", 0)
    if shipped is not None:
        if traces.path is None or Path(traces.path).resolve() != shipped.resolve():
            return None
        return (
            f"{label}: the shipped head was trained on requests of this trace set ({trained} of its {n}; it "
            "records no ids): its scores here are in-sample, not what unseen prompts would get"
        )
    where = head.info.get("traces")
    return (
        f"{label}: its head records no training request ids (trained on {where or 'an unnamed trace set'}, "
        f"{trained} requests): if these {n} requests were among them, its scores are in-sample"
    )


def _shipped_home(key: str) -> Path | None:
    """The bundled trace set a shipped head (by weights fingerprint) was trained on, or None."""
    from ..models.bundled import TEMPLATES_HEAD
    from ..paths import BUNDLED_HEAD
    from ..traces import DEFAULT_TRACES, TEMPLATE_TRACES

    for head, home in ((BUNDLED_HEAD, DEFAULT_TRACES), (TEMPLATES_HEAD, TEMPLATE_TRACES)):
        if (head / "config.json").is_file() and head_fingerprint(HeadModel.load(head)) == key:
            return home
    return None
