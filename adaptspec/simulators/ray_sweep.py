"""Replay sweeps as Ray tasks (``simulate --ray``).

:func:`replay_jobs` runs the (policy, seed) replays of :func:`~adaptspec.simulators.replay.replay`
as one task each; the report is assembled in the single-process order, so it is the same
report (every (policy, seed) replay is deterministic given its seed).
"""

from __future__ import annotations

from typing import Any, Sequence

from .._util.ray import connect, get


def replay_jobs(
    job,
    ctx: dict,
    jobs: Sequence[tuple[Any, int, Any]],
    address: str | None = "local",
    progress: Any = None,
    steps: int = 0,
) -> list:
    """``[job(ctx, spec, seed, idx) for spec, seed, idx in jobs]``, as Ray tasks (``job``: :func:`~adaptspec.simulators.replay.replay_job`)."""
    ray, _ = connect(address)
    task = ray.remote(num_cpus=1)(job)
    data = ray.put(ctx)
    refs = [task.remote(data, spec, seed, idx) for spec, seed, idx in jobs]
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        get(ray, done)  # an error surfaces now, not after every other task
        if progress is not None:
            progress.update(steps)
    return get(ray, refs)
