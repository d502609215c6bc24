"""The command line of docs/vllm.md: vLLM's OpenAI server with ``--scheduler-cls`` and
``--additional-config``, a request choosing its variant with ``vllm_xargs``; its decision in the log;
the engine core (where the plug-in runs) moved off the CPUs vLLM bound its worker to, or left where
vLLM put it with ``pin_engine_core`` false."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _redis import free_port  # noqa: E402 - a free loopback port (tests/_redis.py)


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def _placement(server_pid: int) -> dict[str, set[int]]:
    """The CPUs the server's processes may run on, read from the operating system: vLLM's engine core
    (the server's child, where the scheduler runs) and its worker (the engine core's child)."""
    import psutil

    core = next(p for p in psutil.Process(server_pid).children() if p.name().startswith("VLLM::EngineCor"))
    workers = [p for p in core.children() if p.name().startswith("VLLM::Worker")]
    return {"server": os.sched_getaffinity(server_pid), "core": os.sched_getaffinity(core.pid),
            "worker": set().union(*(os.sched_getaffinity(w.pid) for w in workers))}


@pytest.mark.parametrize("pin", [None, False], ids=["default", "pin_engine_core-false"])
def test_the_openai_server_routes_vllm_xargs_to_the_variant(models, tmp_path, pin):
    from adaptspec.traces.log_writer import log_rows

    port = free_port()
    log = tmp_path / "log"
    entry = {"variants": {"A": "fixed:2", "B": "fixed:3"}, "log_dir": str(log), "load_rule": "none"}
    if pin is not None:
        entry["pin_engine_core"] = pin
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(models["target"]),
           "--port", str(port), "--host", "127.0.0.1", "--skip-tokenizer-init", "--dtype", "float32",
           "--max-model-len", "512", "--enforce-eager", "--gpu-memory-utilization", "0.05",
           "--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}),
           "--scheduler-cls", "adaptspec.vllm.AdaptiveScheduler", "--additional-config", json.dumps({"adaptspec": entry})]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}  # the server's own engine process
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, server.stderr.read()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(1)
        base = f"http://127.0.0.1:{port}/v1/completions"
        for variant in ("B", "A", "B"):
            out = _post(base, {"model": str(models["target"]), "prompt": list(range(3, 30)), "max_tokens": 8,
                               "temperature": 0, "vllm_xargs": {"adaptspec_variant": variant}})
            assert out["choices"][0]["finish_reason"] == "length"
        cpus = _placement(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=120)
    rows = sorted(log_rows(log), key=lambda r: r["time"])   # each variant writes its own journal: in time order
    assert [r["variant"] for r in rows] == ["B", "A", "B"]
    assert [r["block_size"] for r in rows] == [3, 2, 3] and all(r["reward"] is not None for r in rows)
    # vLLM's CPU backend binds the worker to a part of the CPUs (CPU 0 of 2) and leaves the rest to
    # the other processes; the engine core moves there unless told not to
    assert cpus["worker"] and cpus["worker"] < cpus["server"]
    assert cpus["core"] == (cpus["server"] if pin is False else cpus["server"] - cpus["worker"])
