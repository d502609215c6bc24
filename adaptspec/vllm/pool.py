"""Trace sets from vLLM at several loads pooled into one, each request's context the plug-in's with the load.

``adaptspec collect-vllm --concurrency C`` writes one trace set per load: every request's
features are the plug-in's prompt features (:mod:`adaptspec.vllm.features`), and ``C``, the
requests run at once, is in its ``meta.json``. The plug-in with ``"load_features": true`` decides
on those features followed by the load's (:data:`adaptspec.control.context.LOAD_FEATURES`, made
by :func:`adaptspec.control.context.load_vector`). :func:`with_load` makes that context for every
request of every set and pools the sets into one, so a head trained on the result
(``adaptspec train-head``) reads what the plug-in gives it and learns how the best block size
moves with the load.

A request of the set at concurrency ``C`` becomes ``ID@cC``, its load the one the plug-in sees
when a request of a full batch of ``C`` is decided: ``C`` rows running (itself included), none
queued, its prompt's tokens, its temperature (the set's), its ``max_tokens`` (the set's
``max_new_tokens``). Its ``concurrency`` is a request column.

>>> from adaptspec.control.context import LOAD_FEATURES
>>> len(POOLED_FEATURE_NAMES) == len(FEATURE_NAMES) + len(LOAD_FEATURES)
True
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from ..control.context import LOAD_FEATURES, load_vector
from ..errors import AdaptspecError
from ..speculator import LoadState
from ..traces import SCHEMA_VERSION, TraceSet
from .features import FEATURE_DIM, FEATURE_NAMES

__all__ = ["POOLED_FEATURES", "POOLED_FEATURE_NAMES", "with_load", "request_id_at"]

#: ``meta.json``'s ``features`` of a pooled set (a collect-vllm set's is ``vllm-prompt-tokens``)
POOLED_FEATURES = "vllm-prompt-tokens+load"
POOLED_FEATURE_NAMES = (*FEATURE_NAMES, *LOAD_FEATURES)
#: meta keys every pooled set must agree on (what makes their requests comparable)
_SAME = (
    "target",
    "drafter",
    "method",
    "engine",
    "num_speculative_tokens",
    "temperature",
    "max_new_tokens",
    "dtype",
)


def request_id_at(request_id: str, concurrency: int) -> str:
    """The pooled set's id of ``request_id`` from the set at ``concurrency``.

    >>> request_id_at("gsm8k-0000", 8)
    'gsm8k-0000@c8'
    """
    return f"{request_id}@c{concurrency}"


def with_load(trace_sets: Sequence[TraceSet]) -> TraceSet:
    """One trace set of ``trace_sets`` (collect-vllm sets, one per concurrency), every request's
    features the plug-in's prompt features followed by its load's (see the module docstring).

    Refused, in one line naming the set: no set, a set that is not collect-vllm's (its
    ``features`` not ``vllm-prompt-tokens``, or of another width), two sets at one concurrency,
    sets with other block sizes, or disagreeing on what was run (target, drafter, method, vLLM,
    K, temperature, ``max_new_tokens``, dtype)."""
    if not trace_sets:
        raise AdaptspecError("pooling needs at least one trace set")
    first = trace_sets[0]
    seen: dict[int, str] = {}
    requests, outcomes = [], []
    for ts in trace_sets:
        where = str(ts.path or "a trace set")
        c = _concurrency(ts, where)
        if c in seen:
            raise AdaptspecError(f"{where}: a second trace set at concurrency {c} ({seen[c]} is the first)")
        seen[c] = where
        if (
            ts.meta.get("features") != "vllm-prompt-tokens"
            or ts.features is None
            or ts.features.shape[1] != FEATURE_DIM
        ):
            raise AdaptspecError(
                f"{where}: not a collect-vllm trace set (meta.json features "
                f"{ts.meta.get('features')!r}, {0 if ts.features is None else ts.features.shape[1]} "
                f"values a request; the plug-in's prompt features are {FEATURE_DIM})"
            )
        if ts.arms != first.arms:
            raise AdaptspecError(
                f"{where}: block sizes {list(ts.arms)}, {first.path or 'the first set'} has "
                f"{list(first.arms)}"
            )
        for key in _SAME:
            if ts.meta.get(key) != first.meta.get(key):
                raise AdaptspecError(
                    f"{where}: meta.json {key} {ts.meta.get(key)!r}, {first.path or 'the first set'} "
                    f"has {first.meta.get(key)!r}: pooled requests must run the same thing"
                )
        requests.append(_requests_at(ts, c))
        outcomes.append(_outcomes_at(ts, c))
    meta = {k: first.meta[k] for k in (*_SAME, "source", "times", "hardware") if k in first.meta}
    meta.update(
        {
            "schema_version": SCHEMA_VERSION,
            "features": POOLED_FEATURES,
            "feature_names": list(POOLED_FEATURE_NAMES),
            "concurrency": sorted(seen),
            "pooled_from": {str(c): seen[c] for c in sorted(seen)},
            "load": "the plug-in's load_features at rows = the set's concurrency, queue 0 (adaptspec.vllm.pool)",
        }
    )
    return TraceSet(
        pa.concat_tables(requests, promote_options="permissive"),
        pa.concat_tables(outcomes, promote_options="permissive"),
        meta,
    )


def _concurrency(ts: TraceSet, where: str) -> int:
    c = ts.meta.get("concurrency", 1)
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        raise AdaptspecError(f"{where}: meta.json concurrency {c!r} is not an integer >= 1")
    return c


def _requests_at(ts: TraceSet, c: int) -> pa.Table:
    temperature = float(ts.meta.get("temperature", 0.0))
    max_tokens = ts.meta.get("max_new_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise AdaptspecError(
            f"{ts.path or 'a trace set'}: meta.json max_new_tokens {max_tokens!r} is not an integer "
            ">= 1 (the load's max_tokens)"
        )
    loads = np.stack(
        [
            load_vector(
                LoadState(
                    rows=c,
                    queue=0,
                    context_tokens=max(int(n), 1),
                    temperature=temperature,
                    max_tokens=max_tokens,
                )
            )
            for n in ts.prompt_tokens
        ]
    )
    features = np.concatenate([ts.features.astype(np.float64), loads], axis=1).astype(np.float32)
    req = ts.requests
    req = req.set_column(
        req.schema.get_field_index("request_id"), "request_id", _ids_at(req.column("request_id"), c)
    )
    req = req.set_column(
        req.schema.get_field_index("features"),
        "features",
        pa.array(list(features), type=pa.list_(pa.float32())),
    )
    return req.append_column("concurrency", pa.array(np.full(len(req), c, dtype=np.int64)))


def _outcomes_at(ts: TraceSet, c: int) -> pa.Table:
    out = ts.outcomes
    return out.set_column(
        out.schema.get_field_index("request_id"), "request_id", _ids_at(out.column("request_id"), c)
    )


def _ids_at(column: Any, c: int) -> pa.Array:
    return pa.array([request_id_at(str(r), c) for r in column.to_pylist()], type=pa.string())
