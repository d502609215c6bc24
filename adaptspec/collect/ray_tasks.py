"""Trace collection as Ray tasks (the ``ray`` extra): ``collect --ray``.

Nothing here changes what is computed, only where:

- :func:`collect_traces_ray` splits the prompts still to collect into N parts (prompts
  ``i, i + N, ...`` of them, as ``collect --part``) and runs each part as a task that loads the
  speculator itself (``make_speculator()``, one CPU, one torch thread) and streams back one row
  per prompt. The driver appends each row to ``OUT.partial-i-of-N.jsonl``, the file a
  ``--part i/N`` run writes, so an interrupted run resumes with or without Ray, and writes the
  trace set as the single-process run does.
- :func:`collect_dense_ray` does the same for a dense trace set: the driver writes the dense
  set's Parquet parts (``rows_per_part`` requests, in prompt order) as soon as their requests are
  back, so the parts, and the set, are those of :func:`~adaptspec.collect.dense.collect_dense`.

The driver needs no model: the tasks encode text prompts themselves. On a cluster every node
needs adaptspec installed (and any ``--target``/``--drafter`` path present); tasks ask for one
GPU each when the speculator runs on ``cuda``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .._util.ray import cluster_slots, connect, get
from ..errors import AdaptspecError


# ============================================================================ collection
def _speculator(make_speculator: Callable[[], Any]):
    import torch

    torch.set_num_threads(1)
    spec = make_speculator()
    torch.set_num_threads(1)
    return spec


def _encode(spec, prompts) -> list:
    return [
        (rid, dom, spec.target.encode_chat(ids) if isinstance(ids, str) else list(ids))
        for rid, dom, ids in prompts
    ]


def _header(spec) -> dict:
    return {
        "max_block_size": int(spec.max_block_size),
        "verification": getattr(spec, "verification", None),
        "features": getattr(spec.target, "feature_spec", None),
    }


def _every_arm_part(
    make_speculator, prompts, positions, arms, max_new_tokens, temperature, seed, offset
) -> Iterator:
    """A task: a header, then one partial-file row per prompt."""
    from ..speculator import check_block_sizes
    from .every_arm import collect_rows

    spec = _speculator(make_speculator)
    check_block_sizes(arms, spec.max_block_size)
    yield _header(spec)
    yield from collect_rows(
        spec, _encode(spec, prompts), arms, max_new_tokens, temperature, seed, offset, positions
    )


def _dense_part(make_speculator, prompts, max_new_tokens, max_block_size) -> Iterator:
    """A task: a header, then ``(request_id, domain, DenseRequest)`` per prompt."""
    from .dense import dense_request

    spec = _speculator(make_speculator)
    if not 2 <= max_block_size <= spec.max_block_size:
        raise AdaptspecError(f"max block size {max_block_size} outside 2..{spec.max_block_size}")
    yield _header(spec)
    for rid, dom, ids in _encode(spec, prompts):
        yield rid, dom, dense_request(spec, ids, max_new_tokens, max_block_size)


def _stream(ray, task, parts: list[tuple], gpu: bool) -> Iterator[tuple[int, Any]]:
    """Run ``task(*args)`` for each part as a streaming Ray task; yield ``(part, item)`` as items
    come back from any of them."""
    remote = ray.remote(num_cpus=1, num_gpus=1 if gpu else 0, num_returns="streaming", max_retries=0)(task)
    gens = {remote.remote(*args): i for i, args in enumerate(parts)}
    pending = list(gens)
    try:
        while pending:
            ready, _ = ray.wait(pending, num_returns=1)
            g = ready[0]
            try:
                ref = next(g)
            except StopIteration:
                pending.remove(g)
                continue
            yield gens[g], get(ray, ref)
    finally:
        for g in pending:
            with contextlib.suppress(Exception):
                ray.cancel(g, force=True)


def _split(todo: list, tasks: int | None, ray, gpu: bool) -> int:
    n = tasks or cluster_slots(ray, gpu)
    return max(1, min(int(n), len(todo)))


def collect_traces_ray(
    make_speculator: Callable[[], Any],
    prompts: Sequence[tuple[str, str, Any]],
    arms: Sequence[int],
    out: str | os.PathLike,
    max_new_tokens: int = 96,
    temperature: float = 0.0,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    tasks: int | None = None,
    gpu: bool = False,
    address: str | None = "local",
):
    """:func:`~adaptspec.collect.every_arm.collect_traces` as ``tasks`` Ray tasks (default: one per CPU
    of the cluster, or per GPU with ``gpu``). ``make_speculator`` is a picklable callable
    that returns the speculator (called once in every task); a prompt's third element is its
    token ids or its text (then encoded in the task with the target's chat template). A
    ``features`` of None in ``meta`` is filled in with the target's feature spec."""
    from tqdm import tqdm

    from .every_arm import append_row, check_request, finish, open_partial, read_partials

    out = Path(out)
    arms = sorted(int(a) for a in arms)
    check_request(out, temperature, max_new_tokens, overwrite)
    ray, _ = connect(address)
    rows = read_partials(out, arms)
    todo = [(i, p) for i, p in enumerate(p for p in prompts if p[0] not in rows)]
    header: dict = {}
    if todo:
        n = _split(todo, tasks, ray, gpu)
        parts = [
            (
                make_speculator,
                [p for _, p in todo[i::n]],
                [j for j, _ in todo[i::n]],
                arms,
                max_new_tokens,
                temperature,
                seed,
                len(rows),
            )
            for i in range(n)
        ]
        files: dict[int, Any] = {}
        bar = tqdm(total=len(todo), desc=f"collect ({n} Ray tasks)", unit="prompt", disable=not progress)
        try:
            for i, item in _stream(ray, _every_arm_part, parts, gpu):
                if "request_id" not in item:
                    header = item
                    continue
                if i not in files:
                    files[i] = open_partial(out.with_name(f"{out.name}.partial-{i}-of-{n}.jsonl"))
                append_row(files[i], item)
                rows[item["request_id"]] = item
                bar.update(1)
        finally:
            bar.close()
            for f in files.values():
                f.close()
    meta = {"threads": 1, "ray": address or "local", **(meta or {})}
    if "features" in meta and meta["features"] is None:
        meta["features"] = header.get("features")
        if meta["features"] is None:  # nothing was left to collect: no task reported it
            del meta["features"]
    return finish(out, prompts, arms, rows, max_new_tokens, temperature, meta, overwrite)


def collect_dense_ray(
    make_speculator: Callable[[], Any],
    prompts: Sequence[tuple[str, str, Any]],
    out: str | os.PathLike,
    max_new_tokens: int = 128,
    max_block_size: int = 16,
    rows_per_part: int = 8,
    meta: dict | None = None,
    progress: bool = True,
    tasks: int | None = None,
    gpu: bool = False,
    address: str | None = "local",
):
    """:func:`~adaptspec.collect.dense.collect_dense` as Ray tasks (see :func:`collect_traces_ray`):
    resumes the dense set at ``out`` (its meta must match: the tasks report the speculator's
    verification), and writes the same parts in the same order."""
    from tqdm import tqdm

    from .dense import DenseTraceSet

    ray, _ = connect(address)
    out = Path(out)
    done: set = set()
    if (out / "meta.json").exists():
        done = DenseTraceSet.open(out).request_ids()
    elif out.exists() and (not out.is_dir() or any(out.iterdir())):  # before any task loads a model
        raise AdaptspecError(f"{out}: exists and is not a dense trace set; refusing to write into it")
    todo = [p for p in prompts if p[0] not in done]
    ds = None

    def create(header: dict) -> DenseTraceSet:
        m = {
            "max_new_tokens": max_new_tokens,
            "max_block_size": max_block_size,
            "verification": header["verification"],
            **(meta or {}),
        }
        if "features" in m and m["features"] is None:
            m["features"] = header["features"]
        return DenseTraceSet.create(out, m)

    if not todo:
        if (out / "meta.json").exists():
            return DenseTraceSet.open(out)
        raise AdaptspecError("no prompts to collect")
    n = _split(todo, tasks, ray, gpu)
    parts = [(make_speculator, todo[i::n], max_new_tokens, max_block_size) for i in range(n)]
    back: dict[str, tuple] = {}
    written = 0
    bar = tqdm(total=len(todo), desc=f"collect --dense ({n} Ray tasks)", unit="prompt", disable=not progress)
    try:
        for _, item in _stream(ray, _dense_part, parts, gpu):
            if isinstance(item, dict):
                if ds is None:
                    ds = create(item)
                continue
            back[item[0]] = item
            bar.update(1)
            while written < len(todo) and all(p[0] in back for p in todo[written : written + rows_per_part]):
                chunk = todo[written : written + rows_per_part]
                ds.write_part([back.pop(p[0]) for p in chunk])
                written += len(chunk)
    finally:
        bar.close()
    return ds
