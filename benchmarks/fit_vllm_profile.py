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

A step's cost is no one function of the tokens it verifies either, nor one that grows with them: at
1 request a step verifying 4-6 tokens took 49 ms, one verifying 2 took 65 and a plain one 56; at 2
requests a 2-token step took less than a plain one; at 4 requests 1.21x (``bench_vllm_steps.py``,
``--rows 2,4``). A curve fitted never to decrease priced 1-request steps flat at 55 ms up to 6
tokens, and the learned rule warm from it saw B = 3 as fast as B = 4-6 at one request, where k3's
and k4's servers ran ~5% faster than one playing B = 3 (BENCHMARKS.md). So for each request count
measured often (``MIN_STEPS`` decode steps, no prompt token in them), from the steps of the
``dflash`` engine of each ``bench_vllm_steps.py`` result given, the drafter's pass included, this
takes the median seconds of the steps at each block size (the steps whose tokens are that many a
request, ``MIN_BLOCK_STEPS`` of them or more) as a table of measured medians
(``CostCurve(monotone=False)``, linear between block sizes, past the last one the slope of the
last two), and the profile reads them as a :class:`~adaptspec.costs.latency.RowsCostCurve`
(linear in the requests between two measured counts). A step there drafted a random number of
tokens, so each step's seconds are first moved to what the step would have cost drafting as many
queries as it verified (the plug-in's steady state: a row verifying B tokens next drafts B - 1 and
the drafter reads B), with the per-query cost of that run's least-squares fit at the step's rows.
The draft curve is zero (vLLM's drafter runs inside the step, as
:class:`~adaptspec.vllm.step_costs.StepCosts` counts it).

    python benchmarks/fit_vllm_profile.py benchmarks/results/vllm-steps.json benchmarks/results/vllm-steps-2-4.json \\
        --out adaptspec/data/latency/vllm-cpu-smollm2.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adaptspec.costs.latency import CostCurve, LatencyProfile, RowsCostCurve  # noqa: E402

NAME = "vllm-cpu-smollm2"


MIN_STEPS = 50  # decode steps at a request count for it to get its own curve
MIN_BLOCK_STEPS = 8  # steps at a block size of it for its median to be a point of that curve


def steps_of(result: Path) -> Path:
    """The ``dflash`` engine's logged steps of a ``bench_vllm_steps.py`` result."""
    return result.with_suffix(".steps") / "dflash.jsonl"


def decode_steps(result: Path) -> list[dict]:
    """The logged steps with rows and no prompt token (decode steps), each with the seconds it would
    have taken drafting as many queries as it verified (see the module docstring)."""
    summary = json.loads(result.read_text())["summary"]
    fits = {
        int(r): v["fit"]["per_drafter_query_s"]
        for r, v in summary["dflash"].items()
        if "fit" in v and v["fit"]["steps"] >= MIN_STEPS
    }
    steps = [
        s
        for s in map(json.loads, filter(str.strip, steps_of(result).read_text().splitlines()))
        if s["prefill_tokens"] == 0 and s["rows"] >= 1 and s["step_s"] > 0
    ]
    # the fitted per-query cost at the measured request count nearest each step's, looked up once a count
    per_query = {n: fits[min(fits, key=lambda r: abs(r - n))] for n in {s["rows"] for s in steps}}
    return [
        {**s, "seconds": s["step_s"] + per_query[s["rows"]] * (s["tokens"] - s["rows"] * (1 + s["k"]))}
        for s in steps
    ]


def table(steps: list[dict], rows: int) -> CostCurve:
    """The median seconds of ``rows``-request steps at each block size measured ``MIN_BLOCK_STEPS``
    times, as a table over the tokens in the step (``rows`` x block size)."""
    by_block: dict[int, list[float]] = {}
    for s in steps:
        if s["tokens"] % rows == 0:
            by_block.setdefault(s["tokens"] // rows, []).append(s["seconds"])
    blocks = sorted(b for b, v in by_block.items() if len(v) >= MIN_BLOCK_STEPS)
    values = [float(np.median(by_block[b])) for b in blocks]
    tail = (
        max((values[-1] - values[-2]) / (rows * (blocks[-1] - blocks[-2])), 0.0) if len(blocks) > 1 else 0.0
    )
    return CostCurve(tuple(float(rows * b) for b in blocks), tuple(values), tail, monotone=False)


def fit(steps: list[dict], source: str) -> LatencyProfile:
    by_rows: dict[int, list[dict]] = {}
    for s in steps:
        by_rows.setdefault(int(s["rows"]), []).append(s)
    curves = tuple(
        (rows, table(by_rows[rows], rows))
        for rows in sorted(r for r, ss in by_rows.items() if len(ss) >= MIN_STEPS)
    )
    draft = CostCurve(knots=(1.0,), values_s=(0.0,))
    return LatencyProfile(NAME, draft=draft, verify=RowsCostCurve(curves), context_tokens=128, source=source)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "results", type=Path, nargs="+", help="bench_vllm_steps.py's result JSONs (their steps beside them)"
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    steps = [s for r in args.results for s in decode_steps(r)]
    counted = sorted({s["rows"] for s in steps})
    names = ", ".join(r.as_posix().split("benchmarks/")[-1] for r in args.results)
    source = (
        f"benchmarks/fit_vllm_profile.py over {len(steps)} decode steps of bench_vllm_steps.py's dflash engine "
        f"({names}: vLLM 0.32 CPU, float32, eager, the bundled target and its DFlash drafter, "
        f"{', '.join(map(str, counted))} requests, random drafts a step; AMD EPYC, 2 cores), each step moved to as "
        f"many drafter queries as tokens verified; for each request count with {MIN_STEPS}+ steps, the median "
        f"step at each block size with {MIN_BLOCK_STEPS}+ steps, the drafter's pass in it"
    )
    profile = fit(steps, source)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(args.out)
    for r in (1, 2, 4, 8):
        ms = [round(1000 * float(profile.verify_s(b, None, r)), 1) for b in (1, 2, 3, 4, 5, 6, 9)]
        print(f"{r} rows, B = 1, 2, 3, 4, 5, 6, 9: {ms} ms a step")


if __name__ == "__main__":
    main()
