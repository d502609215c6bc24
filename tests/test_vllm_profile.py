"""The vLLM plug-in's default cost profile (``vllm-cpu-smollm2``) against the steps it was fitted to:
the shipped file is what ``benchmarks/fit_vllm_profile.py`` makes of the committed steps, and it
prices each (requests, block size) measured often within 20% of those steps' median seconds (read
straight from the log, no fit)."""

from __future__ import annotations

import importlib.util
import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from adaptspec.reward.latency import get_profile
from adaptspec.vllm.config import PLUGIN_PROFILE

ROOT = Path(__file__).resolve().parent.parent
STEPS = ROOT / "benchmarks" / "results" / "vllm-steps.steps" / "dflash.jsonl"
SUMMARY = ROOT / "benchmarks" / "results" / "vllm-steps.json"


def fit_module():
    spec = importlib.util.spec_from_file_location("fit_vllm_profile", ROOT / "benchmarks" / "fit_vllm_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_shipped_profile_is_the_fit_of_the_committed_steps():
    mod = fit_module()
    shipped = get_profile(PLUGIN_PROFILE)
    again = mod.fit(mod.decode_steps(STEPS), json.loads(SUMMARY.read_text())["summary"], shipped.source)
    assert (again.verify, again.draft, again.name) == (shipped.verify, shipped.draft, PLUGIN_PROFILE)


def measured_medians(min_steps: int = 8) -> dict[tuple[int, int], float]:
    """(requests, block size) -> the median seconds of the decode steps logged there."""
    seen: dict[tuple[int, int], list[float]] = defaultdict(list)
    for line in STEPS.read_text().splitlines():
        s = json.loads(line)
        if s["prefill_tokens"] == 0 and s["rows"] in (1, 8):
            seen[(s["rows"], s["tokens"] // s["rows"])].append(s["step_s"])
    return {k: statistics.median(v) for k, v in seen.items() if len(v) >= min_steps}


def test_the_profile_prices_every_measured_step_within_a_fifth_of_its_median():
    profile = get_profile(PLUGIN_PROFILE)
    medians = measured_medians()
    assert {(1, b) for b in (1, 2, 4, 5, 6, 9)} | {(8, b) for b in (1, 2, 4, 6, 8)} <= set(medians)
    for (rows, block), median in medians.items():
        assert float(profile.verify_s(block, None, rows)) == pytest.approx(median, rel=0.2), (rows, block)
