"""Block-size rules under load, in simulation: the dense benchmark traces through a
continuous-batching model (adaptspec/simulators/load_sim.py) on a latency profile with a batch axis.

    python benchmarks/bench_load_sim.py                       # CPU and GPU profiles, misjudged costs too: ~2 min
    python benchmarks/bench_load_sim.py --wrong ""            # benchmarks/results/load-sim.json: ~1.5 min on 2 cores
    python benchmarks/bench_load_sim.py --profiles h100-qwen3-8b --levels 1,8,64 --requests 24 --wrong ""

The 336 public benchmark prompts' dense traces (datasets/dense/benchmarks-fast) are split in
two: even-numbered requests tune (the static table: the best fixed block size per load level
there, as an engine user would tune it from a trial run; the goodput rule's and the warm learned
rule's prior acceptance; the cold learned rule's warm-up run), odd-numbered ones are measured.
Per load level (closed-loop clients) and over a *day* whose client count changes: plain decoding
and every fixed block size, the static table, the goodput rule (SmartSpec-style), the learned
rule cold (LinTS on the load level, after a warm-up run) and warm (started from the goodput
model's prediction, from its first round), and the per-level oracle. ``--wrong``: per-token
factors of a misjudged verify cost given to the goodput and warm learned rules (and once more
with the engine's attribution misjudged too). The comparison is
adaptspec.evaluation.under_load.compare_under_load, the same code as the evaluation report's section 8.
Writes benchmarks/results/load-sim.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from adaptspec.evaluation.under_load import ARMS, LEVELS, compare_under_load, render_load
from adaptspec.traces.dense import DenseTraceSet

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dense", default=str(ROOT / "datasets/dense/benchmarks-fast"))
    ap.add_argument("--profiles", default=",".join(LEVELS))
    ap.add_argument(
        "--levels", default=None, help="client counts (default: 1-16 on the CPU profile, 1-64 on the GPU one)"
    )
    ap.add_argument("--arms", default=",".join(str(a) for a in ARMS))
    ap.add_argument(
        "--requests",
        type=int,
        default=48,
        help="requests per run at one client; 4 per client at higher loads",
    )
    ap.add_argument(
        "--seeds", type=int, default=5, help="seeds of each learned rule (each cold one warms up per seed)"
    )
    ap.add_argument(
        "--wrong", default="2,0.25", help="per-token factors of misjudged verify costs ('' for none)"
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/load-sim.json"))
    args = ap.parse_args()
    arms = [int(a) for a in args.arms.split(",")]
    wrong = [float(f) for f in args.wrong.split(",") if f.strip()]
    reqs = [r for _, _, r in DenseTraceSet.open(args.dense).requests()]
    t0 = time.time()
    say = lambda s: print(f"[{time.time() - t0:.0f}s] {s}", flush=True)  # noqa: E731
    profiles = []
    for name in args.profiles.split(","):
        levels = (
            [int(x) for x in args.levels.split(",")] if args.levels else LEVELS.get(name, (1, 2, 4, 8, 16))
        )
        profiles.append(
            compare_under_load(
                reqs[0::2], reqs[1::2], name, levels, args.requests, arms, wrong, say=say, seeds=args.seeds
            )
        )
    results = {
        "status": "ok",
        "dense": args.dense,
        "requests": len(reqs),
        "arms": arms,
        "load_requests": args.requests,
        "seeds": args.seeds,
        "profiles": profiles,
        "seconds": round(time.time() - t0, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1, default=float))
    print(render_load(results))


if __name__ == "__main__":
    main()
