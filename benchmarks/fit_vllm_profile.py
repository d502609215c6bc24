"""The latency profile of vLLM's steps on this CPU, fitted from ``bench_vllm_steps.py``'s logged steps.

The vLLM plug-in's load rules start from a cost profile before the engine has measured its own
steps (:mod:`adaptspec.vllm.step_costs`): the learned rule's warm prior is the goodput model's
reward of every block size at every load level on it. adaptspec's own profiles are its own
engine's, whose wide verifies cost more the wider they are even at one row (``cpu-smollm2-bf16``:
a 4-token verify 1.35x a 1-token one); in vLLM on this CPU a step verifying 4-6 tokens at one
request costs no more than one verifying 1, and at 8 requests every token verified adds ~3 ms.
From a prior shaped like adaptspec's engine, the rule starts believing that long blocks are slow
at one request, and a block size longer than the one it plays learns only when played (a row that
accepted every draft shows nothing of a longer block): with that prior a cold server at one client
could play B = 4 for its whole life where B = 5 ran ~5% faster (BENCHMARKS.md, "Paired runs").

This fits one verify curve over the tokens a step verifies (rows x block size), from the decode
steps (no prompt token in them) of the ``dflash`` engine of ``bench_vllm_steps.py``, the drafter's
pass included: a step there drafted a random number of tokens, so each step's seconds are first
moved to what the step would have cost drafting as many queries as it verified (the plug-in's
steady state: a row verifying B tokens next drafts B - 1 and the drafter reads B), with the
per-query cost of that engine's least-squares fit at the step's rows. The draft curve is zero
(vLLM's drafter runs inside the step, as :class:`~adaptspec.vllm.step_costs.StepCosts` counts it).

    python benchmarks/fit_vllm_profile.py benchmarks/results/vllm-steps.steps/dflash.jsonl \\
        --summary benchmarks/results/vllm-steps.json --out adaptspec/data/latency/vllm-cpu-smollm2.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adaptspec.reward.latency import CostCurve, LatencyProfile, fit_curve  # noqa: E402

NAME = "vllm-cpu-smollm2"


def decode_steps(path: Path) -> list[dict]:
    """The logged steps with rows and no prompt token (decode steps)."""
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [s for s in steps if s["prefill_tokens"] == 0 and s["rows"] >= 1 and s["step_s"] > 0]


def per_query_s(summary: dict, rows: int) -> float:
    """The ``dflash`` engine's fitted seconds a drafter query at the measured rows nearest ``rows``."""
    fits = {int(r): v["fit"]["per_drafter_query_s"] for r, v in summary["dflash"].items()
            if "fit" in v and v["fit"]["steps"] >= 50}
    return fits[min(fits, key=lambda r: abs(r - rows))]


def fit(steps: list[dict], summary: dict, source: str) -> LatencyProfile:
    rows = np.array([s["rows"] for s in steps], dtype=np.float64)
    tokens = np.array([s["tokens"] for s in steps], dtype=np.float64)
    queries = rows * (1 + np.array([s["k"] for s in steps], dtype=np.float64))
    per_rows = {int(r): per_query_s(summary, int(r)) for r in np.unique(rows)}
    c = np.array([per_rows[int(r)] for r in rows])
    seconds = np.array([s["step_s"] for s in steps]) + c * (tokens - queries)  # as if it drafted for what it verified
    verify = fit_curve(tokens / rows, seconds, 0, rows, per_context_s=0.0, per_pair_s=0.0)
    draft = CostCurve(knots=(1.0,), values_s=(0.0,))
    return LatencyProfile(NAME, draft=draft, verify=verify, context_tokens=128, source=source)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("steps", type=Path, help="bench_vllm_steps.py's dflash.jsonl")
    ap.add_argument("--summary", type=Path, required=True, help="bench_vllm_steps.py's result JSON (its fits)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    summary = json.loads(args.summary.read_text())["summary"]
    steps = decode_steps(args.steps)
    source = (f"benchmarks/fit_vllm_profile.py over {len(steps)} decode steps of bench_vllm_steps.py's dflash engine "
              f"({args.steps.as_posix().split('benchmarks/')[-1]}: vLLM 0.32 CPU, float32, eager, the bundled target and "
              "its DFlash drafter, 1 and 8 requests, random drafts a step; AMD EPYC, 2 cores), each step moved to as many "
              "drafter queries as tokens verified; one verify curve over rows x block size, the drafter's pass in it")
    profile = fit(steps, summary, source)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(args.out)
    for r in (1, 2, 4, 8):
        ms = [round(1000 * float(profile.verify_s(b, None, r)), 1) for b in (1, 2, 3, 4, 5, 6, 9)]
        print(f"{r} rows, B = 1, 2, 3, 4, 5, 6, 9: {ms} ms a step")


if __name__ == "__main__":
    main()
