"""The command line of docs/vllm.md: vLLM's OpenAI server with ``--scheduler-cls`` and
``--additional-config``, a request choosing its variant with ``vllm_xargs``; its decision in the log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _redis import free_port  # noqa: E402 - a free loopback port (tests/_redis.py)


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def test_the_openai_server_routes_vllm_xargs_to_the_variant(models, tmp_path):
    from adaptspec.traces.log_writer import log_rows

    port = free_port()
    log = tmp_path / "log"
    entry = {"variants": {"A": "fixed:2", "B": "fixed:3"}, "log_dir": str(log), "load_rule": "none"}
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(models["target"]),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--skip-tokenizer-init",
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.05",
        "--speculative-config",
        json.dumps({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}),
        "--scheduler-cls",
        "adaptspec.vllm.AdaptiveScheduler",
        "--additional-config",
        json.dumps({"adaptspec": entry}),
    ]
    env = {
        k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"
    }  # the server's own engine process
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
            out = _post(
                base,
                {
                    "model": str(models["target"]),
                    "prompt": list(range(3, 30)),
                    "max_tokens": 8,
                    "temperature": 0,
                    "vllm_xargs": {"adaptspec_variant": variant},
                },
            )
            assert out["choices"][0]["finish_reason"] == "length"
    finally:
        server.terminate()
        server.wait(timeout=120)
    rows = sorted(
        log_rows(log), key=lambda r: r["time"]
    )  # each variant writes its own journal: in time order
    assert [r["variant"] for r in rows] == ["B", "A", "B"]
    assert [r["block_size"] for r in rows] == [3, 2, 3] and all(r["reward"] is not None for r in rows)
