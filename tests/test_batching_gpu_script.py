"""The prepared GPU check (benchmarks/gpu_check_batching.py) runs end to end on CPU with --tiny."""

from __future__ import annotations

import json

import pytest

from _scripts import load_script
from _threads import torch_threads


@pytest.mark.slow
def test_gpu_check_runs_tiny_on_cpu(tmp_path):
    mod = load_script("gpu_check_batching")
    with torch_threads(1):
        rc = mod.main(["--tiny", "--device", "cpu", "--dtype", "float32", "--out", str(tmp_path / "r.json")])
    report = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and report["exact_mismatches"] == [] and report["exact_rows"] == 12
    cells = {(r["batch_size"], r["block_size"], r["context_tokens"]) for r in report["surface"]}
    assert cells == {(m, b, 16) for m in (1, 3) for b in (1, 4)}
    assert all(r["verify_s"] > 0 for r in report["surface"])
