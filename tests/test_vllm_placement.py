"""adaptspec.vllm.placement with real processes: a process whose child (as vLLM's worker) is bound to
a part of its CPUs moves every thread of its own to the rest, and moves nothing otherwise.

Each case runs in a process of its own (the move binds the process that makes it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

CASE = textwrap.dedent("""
    import json, os, subprocess, sys, threading, time
    from adaptspec.vllm.placement import move_off_workers

    bind = json.loads(sys.argv[1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        if bind is not None:
            os.sched_setaffinity(child.pid, bind)
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()  # a thread from before the move
        moved = move_off_workers()
        after = [sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")]
    finally:
        child.kill()
    print(json.dumps({"moved": moved, "threads": after}))
""")

ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _run(bind: list[int] | None) -> dict:
    out = subprocess.run([sys.executable, "-c", CASE, json.dumps(bind)], capture_output=True, text=True, timeout=60,
                         check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CPU affinity is Linux's (vLLM's CPU backend binds there)")
@pytest.mark.parametrize("bind, rest", [
    # a child on the first CPU: this process and its threads on the others (none left on one CPU: nothing moves)
    (ALLOWED[:1], ALLOWED[1:] or None),
    (None, None),              # a child that kept every CPU (a helper process, or vLLM told not to bind)
    (ALLOWED, None),           # a child on every CPU: none left over
])
def test_a_process_moves_off_the_cpus_its_bound_child_uses(bind, rest):
    got = _run(bind)
    assert got["moved"] == rest
    assert len(got["threads"]) >= 2 and all(t == (rest or ALLOWED) for t in got["threads"])
