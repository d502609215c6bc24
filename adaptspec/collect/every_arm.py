"""Trace collection: run a speculator at every candidate block size on every prompt.

The result is a full-information :class:`~adaptspec.traces.TraceSet`: features from the real
prefill, and per block size the tokens, the per-round tau and the measured draft and verify
times. Each prompt is prefilled once and decoded at every block size (in a rotating order,
so slow drift of the machine's speed does not favour one block size). Progress is appended
to ``OUT.partial.jsonl`` after every prompt, so an interrupted collection resumes where it
stopped; the trace set is written (atomically) when all prompts are done.

Several processes can share a collection: each runs with ``part=(i, n)`` on the prompts
``i, i+n, i+2n, ...`` and writes only its own ``OUT.partial-i-of-n.jsonl``; a last run
without ``part`` finds every prompt done and writes the trace set.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from .._util.jsonlines import read_jsonl
from .._util.outputs import check_output
from ..errors import AdaptspecError
from ..speculator import BlockSpeculator, check_block_sizes
from ..traces import TraceSet
from .checked import checked_decode, checked_features, checked_prefill


def collect_traces(
    speculator: BlockSpeculator,
    prompts: Sequence[tuple[str, str, Sequence[int]]],
    arms: Sequence[int],
    out: str | os.PathLike,
    max_new_tokens: int = 96,
    temperature: float = 0.0,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    on_prompt: Callable[[int], None] | None = None,
    part: tuple[int, int] | None = None,
) -> TraceSet | None:
    """Run ``speculator`` (any :class:`~adaptspec.speculator.BlockSpeculator`) at every block
    size of ``arms`` on every prompt and write the trace set at ``out``.

    ``prompts`` are ``(request_id, domain, token_ids)`` triples (``domain`` groups requests in
    reports; any string). Each prompt is prefilled once (its ``Prefill.features`` become the
    trace set's features) and decoded at every block size, ``max_new_tokens`` at
    ``temperature`` (``seed`` at T > 0). ``out``'s missing parent directories are created;
    ``out`` itself must be new, empty, or (with ``overwrite``) a trace set. A progress bar
    counts the prompts unless ``progress=False``; ``on_prompt(i)`` is called after the i-th
    prompt of this run is saved. ``meta`` is stored in the trace set's metadata.

    Returns the trace set, or None for a ``part`` run (see the module docstring). Train a head
    on it with ``adaptspec train-head OUT``.
    """
    arms = list(
        check_block_sizes(
            arms, speculator.max_block_size, trees=bool(getattr(speculator, "draft_trees", False))
        )
    )
    out = Path(out)
    check_request(out, temperature, max_new_tokens, overwrite)
    if part is not None and not 0 <= part[0] < part[1]:
        raise AdaptspecError(f"part {part[0]} of {part[1]}: needs 0 <= i < n")
    partial = out.with_name(
        out.name + (".partial.jsonl" if part is None else f".partial-{part[0]}-of-{part[1]}.jsonl")
    )
    rows = read_partials(out, arms)
    mine = prompts if part is None else prompts[part[0] :: part[1]]
    todo = [p for p in mine if p[0] not in rows]
    f = None
    try:
        prompt_rows = collect_rows(
            speculator, todo, arms, max_new_tokens, temperature, seed, offset=len(rows)
        )
        for i, row in enumerate(
            tqdm(prompt_rows, total=len(todo), desc="collect", unit="prompt", disable=not progress)
        ):
            if f is None:  # at the first row: a run refused before it leaves nothing behind
                out.parent.mkdir(parents=True, exist_ok=True)
                f = open_partial(partial)
            append_row(f, row)
            rows[row["request_id"]] = row
            if on_prompt is not None:
                on_prompt(i)
    finally:
        if f is not None:
            f.close()
    if part is not None:
        return None
    return finish(out, prompts, arms, rows, max_new_tokens, temperature, meta, overwrite)


def check_request(out: Path, temperature: float, max_new_tokens: int, overwrite: bool) -> None:
    """The checks of a collection that need no speculator (before any prompt is decoded)."""
    check_output(out, "traceset", overwrite)  # now, not after decoding every prompt
    if not (isinstance(temperature, (int, float)) and np.isfinite(temperature) and temperature >= 0):
        raise AdaptspecError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise AdaptspecError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")


def read_partials(out: Path, arms: list[int]) -> dict[str, dict]:
    """The rows of every ``OUT.partial*.jsonl`` (any part), by request id."""
    partials = sorted(out.parent.glob(out.name + ".partial*.jsonl"))
    return {r["request_id"]: r for path in partials for r in _read_partial(path, arms)}


def collect_rows(
    speculator: BlockSpeculator,
    prompts,
    arms: list[int],
    max_new_tokens: int,
    temperature: float,
    seed: int,
    offset: int = 0,
    positions: Sequence[int] | None = None,
) -> Iterator[dict]:
    """One partial-file row per prompt (``(request_id, domain, token_ids)``), as it is decoded. The
    block sizes are decoded in an order rotated by the prompt's position (``offset + i``, or
    ``offset + positions[i]``), so slow drift of the machine's speed favours none of them. Every
    prefill and decode is checked as the controller checks them (:mod:`adaptspec.collect.checked`):
    a fault is one line naming the request and the block size."""
    width = getattr(speculator, "feature_dim", None)  # the protocol's optional declaration
    whose = f"speculator {type(speculator).__name__} declares feature_dim"
    for i, (rid, domain, ids) in enumerate(prompts):
        where = f"request {rid}"
        pre = checked_prefill(speculator, ids, temperature, seed, where)
        features = checked_features(pre.features, width, where, whose)
        if width is None:  # undeclared: the first request's features fix the length, as in the controller
            width, whose = features.size, f"request {rid}'s had"
        k = (offset + (i if positions is None else positions[i])) % len(arms)
        per_arm = {}
        for b in arms[k:] + arms[:k]:
            o = checked_decode(speculator, pre, b, max_new_tokens, where, temperature=temperature, seed=seed)
            per_arm[b] = {
                "new_tokens": o.new_tokens,
                "tau": [r.tau for r in o.rounds],
                "draft_ms": [r.draft_s * 1e3 for r in o.rounds],
                "verify_ms": [r.verify_s * 1e3 for r in o.rounds],
                "decode_ms": o.decode_s * 1e3,
            }
        yield {
            "request_id": rid,
            "domain": domain,
            "prompt_tokens": len(ids),
            "features": features.tolist(),
            "arms": arms,
            "outcomes": {str(b): v for b, v in per_arm.items()},
        }


def append_row(f, row: dict) -> None:
    """Append one row to an open partial file, durably (a crash loses at most a torn last line)."""
    f.write(json.dumps(row) + "\n")
    f.flush()
    os.fsync(f.fileno())


def finish(
    out: Path,
    prompts,
    arms: list[int],
    rows: dict[str, dict],
    max_new_tokens: int,
    temperature: float,
    meta: dict | None,
    overwrite: bool,
) -> TraceSet:
    """Write the trace set of ``prompts`` (every one in ``rows``) at ``out``, in prompt order, and
    remove the partial files."""
    partials = sorted(out.parent.glob(out.name + ".partial*.jsonl"))
    ordered = [rows[p[0]] for p in prompts]
    traces = _to_traceset(
        ordered,
        arms,
        {
            "source": "adaptspec collect",
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "hardware": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "processes": max(1, sum(1 for p in partials if "-of-" in p.name)),
            **(meta or {}),
        },
    )
    traces.write(out, overwrite=overwrite)
    for path in out.parent.glob(out.name + ".partial*.jsonl"):
        path.unlink()
    return traces


def _read_partial(path: Path, arms: list[int]) -> list[dict]:
    rows = read_jsonl(
        path, "a collection's partial file", missing_ok=True
    ).records  # a torn last line: a crash
    for r in rows:
        if r.get("arms") != arms:
            raise AdaptspecError(
                f"{path}: collected with arms {r.get('arms')}, now asked for {arms}; remove it to restart"
            )
    return rows


def open_partial(path: Path) -> Any:
    """``path`` opened for :func:`append_row`, after cutting off a torn last line (a crash
    mid-row): a row appended after it would share its line, and the file could not be read."""
    end = read_jsonl(path, "a collection's partial file", missing_ok=True).end
    if path.exists() and path.stat().st_size > end:
        os.truncate(path, end)
    return open(path, "a")


def _to_traceset(rows: list[dict], arms: list[int], meta: dict) -> TraceSet:
    def per(key: str) -> list:
        return [r["outcomes"][str(b)][key] for r in rows for b in arms]

    widths = {len(r["features"]) for r in rows}
    if len(widths) > 1:  # a resumed collection whose speculator changed its features' length
        first = rows[0]
        other = next(r for r in rows if len(r["features"]) != len(first["features"]))
        raise AdaptspecError(
            f"request {other['request_id']}'s features have {len(other['features'])} values, "
            f"request {first['request_id']}'s {len(first['features'])}: one trace set holds one width"
        )
    taus = per("tau")
    n, k = len(rows), len(arms)
    mean_tau = np.array([np.mean(t) if t else 1.0 for t in taus]).reshape(n, k)
    return TraceSet.from_arrays(
        [r["request_id"] for r in rows],
        [r["domain"] for r in rows],
        arms,
        mean_tau,
        prompt_tokens=[r["prompt_tokens"] for r in rows],
        features=np.asarray([r["features"] for r in rows], dtype=np.float32),
        new_tokens=np.asarray(per("new_tokens")).reshape(n, k),
        rounds=np.asarray([len(t) for t in taus]).reshape(n, k),
        decode_ms=np.asarray(per("decode_ms")).reshape(n, k),
        tau=taus,
        draft_ms=per("draft_ms"),
        verify_ms=per("verify_ms"),
        meta={"arms": arms, **meta},
    )
