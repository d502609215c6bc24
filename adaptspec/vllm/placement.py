"""The engine core off the CPUs vLLM bound its workers to (vLLM's CPU backend).

vLLM 0.32's CPU backend binds each worker's OpenMP threads to CPUs of their own and holds the
rest back for "the scheduler process" (``vllm/utils/ompmultiprocessing.py``: on a 2-CPU host the
worker runs the model on CPU 0 and CPU 1 is held back), but it never binds that process: the engine
core, which runs the scheduler and waits on the worker by spinning, keeps every CPU and is at times
run on the worker's. Measured on a 2-CPU Intel Xeon (BENCHMARKS.md, "The engine core off the
worker's CPU"): a speculative server whose requests all verify nothing ran 0.96x a server without
speculation at 4 clients, and 1.023x [1.003, 1.042] its own speed with its engine core moved to
CPU 1 (10 interleaved pairs, paired with a server without speculation: 0.982x it).

The plug-in runs in the engine core, after vLLM has started the workers (the engine core's child
processes) and bound them, so it reads their CPUs from the operating system and moves every thread
of its own process to the others (setting ``pin_engine_core``, on by default). Nothing moves when no
child is bound to fewer CPUs than the engine core may use (a GPU, ``VLLM_CPU_OMP_THREADS_BIND=nobind``,
one process for both) or when the workers hold them all.
"""

from __future__ import annotations

import os

__all__ = ["bound_child_cpus", "move_off_workers"]


def bound_child_cpus(pid: int | None = None) -> set[int]:
    """The CPUs this process's (``pid``'s) child processes are bound to, of those bound to fewer CPUs
    than this process may use (vLLM's workers; not a helper process that kept every CPU)."""
    import psutil  # vLLM's own dependency: installed wherever the plug-in runs

    allowed = os.sched_getaffinity(pid or 0)
    bound: set[int] = set()
    for child in psutil.Process(pid).children():
        try:
            cpus = os.sched_getaffinity(child.pid)
        except OSError:  # gone since listed
            continue
        if cpus < allowed:
            bound |= cpus
    return bound


def move_off_workers() -> list[int] | None:
    """Bind every thread of this process to the CPUs its bound children (vLLM's workers) do not use.

    Returns those CPUs, or None when nothing moved (no child bound to a part of this process's CPUs,
    or none left over).
    """
    if not hasattr(os, "sched_getaffinity"):  # not Linux: vLLM binds no CPU there either
        return None
    rest = os.sched_getaffinity(0) - bound_child_cpus()
    if rest == os.sched_getaffinity(0) or not rest:
        return None
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), rest)
        except OSError:  # a thread that ended since listed
            pass
    return sorted(rest)
