"""Trace collection and replay sweeps as Ray tasks (the ``ray`` extra): ``collect --ray`` and
``simulate --ray``.

Nothing here changes what is computed, only where:

- :func:`replay_jobs` runs the (policy, seed) replays of :func:`~adaptspec.simulators.replay.replay`
  as one task each; the report is assembled in the single-process order, so it is the same
  report (every (policy, seed) replay is deterministic given its seed).
- :func:`collect_traces_ray` splits the prompts still to collect into N parts (prompts
  ``i, i + N, ...`` of them, as ``collect --part``) and runs each part as a task that loads the
  speculator itself (``make_speculator()``, one CPU, one torch thread) and streams back one row
  per prompt. The driver appends each row to ``OUT.partial-i-of-N.jsonl``, the file a
  ``--part i/N`` run writes, so an interrupted run resumes with or without Ray, and writes the
  trace set as the single-process run does.
- :func:`collect_dense_ray` does the same for a dense trace set: the driver writes the dense
  set's Parquet parts (``rows_per_part`` requests, in prompt order) as soon as their requests are
  back, so the parts, and the set, are those of :func:`~adaptspec.dense.collect_dense`.

The driver needs no model: the tasks encode text prompts themselves. On a cluster every node
needs adaptspec installed (and any ``--target``/``--drafter`` path present); tasks ask for one
GPU each when the speculator runs on ``cuda``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .errors import AdaptspecError

#: what ``--ray`` accepts: nothing (a local Ray with this machine's CPUs), ``local``, ``auto`` (the
#: cluster this machine is part of), ``ray://HOST:PORT`` (Ray Client) or ``HOST:PORT`` (a head's GCS)
ADDRESS_HELP = ("run as Ray tasks: no ADDRESS (or 'local') starts a local Ray with this machine's CPUs; "
                "'auto' joins the cluster this machine belongs to; ray://HOST:PORT or HOST:PORT a remote one")
_HOSTPORT = re.compile(r"^(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


def parse_address(text: str) -> str:
    """An argparse type for ``--ray``: ``local``, ``auto``, ``ray://HOST:PORT`` or ``HOST:PORT``.

    >>> parse_address("auto"), parse_address("ray://head:10001"), parse_address("10.0.0.2:6379")
    ('auto', 'ray://head:10001', '10.0.0.2:6379')
    >>> parse_address("traces/mine")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected local, auto, ray://HOST:PORT or HOST:PORT, got 'traces/mine' (a positional argument goes before --ray)
    """
    import argparse

    if text in ("local", "auto") or _HOSTPORT.match(text):
        return text
    raise argparse.ArgumentTypeError(f"expected local, auto, ray://HOST:PORT or HOST:PORT, got {text!r} "
                                     "(a positional argument goes before --ray)")


def import_ray():
    try:
        import ray
    except ImportError:
        raise AdaptspecError("--ray needs Ray, which is not installed: pip install 'adaptspec[ray]'") from None
    return ray


def connect(address: str | None = "local"):
    """``ray``, initialised: the running Ray when there is one, else a new local one (``address``
    None or ``local``: this machine's CPUs) or the cluster at ``address``. Returns
    ``(ray, started)``; ``started`` says this call started it (see :func:`session`)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    kw: dict[str, Any] = dict(log_to_driver=False, logging_level=logging.ERROR)
    try:
        if address in (None, "local"):
            ray.init(address="local", include_dashboard=False, **kw)
        else:
            if address != "auto":
                _reachable(address)
            with _quiet_stderr():  # Ray's C++ client logs a line per retry to fd 2
                ray.init(address=address, **kw)
    except AdaptspecError:
        raise
    except Exception as e:  # noqa: BLE001  (Ray raises ConnectionError, ValueError, RuntimeError, ...)
        msg = " ".join(str(e).split())[:300] or type(e).__name__
        raise AdaptspecError(f"cannot start or join Ray at {address or 'local'}: {msg}") from None
    return ray, True


@contextlib.contextmanager
def _quiet_stderr():
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse an address nothing answers at, at once (Ray itself retries for minutes)."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise AdaptspecError(f"cannot start or join Ray at {address}: nothing answers there "
                             f"({e.strerror or type(e).__name__})") from None


@contextlib.contextmanager
def session(address: str | None = "local"):
    """:func:`connect` for the span of a command: shuts Ray down after it if it started it."""
    ray, started = connect(address)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def _cause(e: BaseException) -> BaseException:
    """A task's own exception (an AdaptspecError or OSError: the user's to fix) out of Ray's wrapper."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, (AdaptspecError, OSError)):
        return cause
    return e


def get(ray, refs):
    try:
        return ray.get(refs)
    except Exception as e:  # noqa: BLE001
        c = _cause(e)
        if c is e:
            raise
        raise c from None


def cluster_slots(ray, gpu: bool = False) -> int:
    """How many one-CPU (or one-GPU) tasks the cluster runs at once."""
    res = ray.cluster_resources()
    return max(1, int(res.get("GPU" if gpu else "CPU", 1)))


# ============================================================================ replay sweeps
def replay_jobs(ctx: dict, jobs: Sequence[tuple[Any, int, Any]], address: str | None = "local",
                progress: Any = None, steps: int = 0) -> list:
    """``[replay_job(ctx, spec, seed, idx) for spec, seed, idx in jobs]``, as Ray tasks."""
    from .simulators.replay import replay_job

    ray, _ = connect(address)
    task = ray.remote(num_cpus=1)(replay_job)
    data = ray.put(ctx)
    refs = [task.remote(data, spec, seed, idx) for spec, seed, idx in jobs]
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        get(ray, done)  # an error surfaces now, not after every other task
        if progress is not None:
            progress.update(steps)
    return get(ray, refs)


# ============================================================================ collection
def _speculator(make_speculator: Callable[[], Any]):
    import torch

    torch.set_num_threads(1)
    spec = make_speculator()
    torch.set_num_threads(1)
    return spec


def _encode(spec, prompts) -> list:
    return [(rid, dom, spec.target.encode_chat(ids) if isinstance(ids, str) else list(ids)) for rid, dom, ids in prompts]


def _header(spec) -> dict:
    return {"max_block_size": int(spec.max_block_size), "verification": getattr(spec, "verification", None),
            "features": getattr(spec.target, "feature_spec", None)}


def _every_arm_part(make_speculator, prompts, positions, arms, max_new_tokens, temperature, seed, offset) -> Iterator:
    """A task: a header, then one partial-file row per prompt."""
    from .collection import check_arms, collect_rows

    spec = _speculator(make_speculator)
    check_arms(arms, spec.max_block_size)
    yield _header(spec)
    yield from collect_rows(spec, _encode(spec, prompts), arms, max_new_tokens, temperature, seed, offset, positions)


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
    """:func:`~adaptspec.collection.collect_traces` as ``tasks`` Ray tasks (default: one per CPU
    of the cluster, or per GPU with ``gpu``). ``make_speculator`` is a picklable callable
    that returns the speculator (called once in every task); a prompt's third element is its
    token ids or its text (then encoded in the task with the target's chat template). A
    ``features`` of None in ``meta`` is filled in with the target's feature spec."""
    from tqdm import tqdm

    from .collection import append_row, check_request, finish, read_partials

    out = Path(out)
    arms = sorted(int(a) for a in arms)
    check_request(out, temperature, max_new_tokens, overwrite)
    ray, _ = connect(address)
    rows = read_partials(out, arms)
    todo = [(i, p) for i, p in enumerate(p for p in prompts if p[0] not in rows)]
    header: dict = {}
    if todo:
        n = _split(todo, tasks, ray, gpu)
        parts = [(make_speculator, [p for _, p in todo[i::n]], [j for j, _ in todo[i::n]], arms, max_new_tokens, temperature, seed,
                  len(rows)) for i in range(n)]
        files: dict[int, Any] = {}
        bar = tqdm(total=len(todo), desc=f"collect ({n} Ray tasks)", unit="prompt", disable=not progress)
        try:
            for i, item in _stream(ray, _every_arm_part, parts, gpu):
                if "request_id" not in item:
                    header = item
                    continue
                if i not in files:
                    files[i] = open(out.with_name(f"{out.name}.partial-{i}-of-{n}.jsonl"), "a")
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
    """:func:`~adaptspec.dense.collect_dense` as Ray tasks (see :func:`collect_traces_ray`):
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
        m = {"max_new_tokens": max_new_tokens, "max_block_size": max_block_size,
             "verification": header["verification"], **(meta or {})}
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
            while written < len(todo) and all(p[0] in back for p in todo[written:written + rows_per_part]):
                chunk = todo[written:written + rows_per_part]
                ds.write_part([back.pop(p[0]) for p in chunk])
                written += len(chunk)
    finally:
        bar.close()
    return ds
