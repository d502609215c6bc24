"""Block-size rules under load, in simulation: the dense benchmark traces through a
continuous-batching model (adaptspec/simulators/load.py) on a latency profile with a batch axis.

    python benchmarks/bench_load_sim.py                       # CPU and GPU profiles, ~10 min on 2 cores
    python benchmarks/bench_load_sim.py --profiles h100-qwen3-8b --levels 1,8,64 --requests 60

The 336 public benchmark prompts' dense traces (datasets/dense/benchmarks-fast) are split in
two: the static table is tuned on the even-numbered requests (the best fixed block size per
load level there, as an engine user would tune it from a trial run), and everything is measured
on the odd-numbered ones. Per load level (closed-loop clients): plain decoding and every fixed
block size, the static table, the goodput rule (SmartSpec-style), the learned rule (a LinUCB
bandit per round with the load in its context, warmed up on the tuning requests at that level
and still learning while measured) and the per-level oracle (the best fixed size at that level,
chosen knowing the outcome). Then a *day*: the client count changes during the run; the
per-level oracle there is the table of each level's best fixed size on the measured requests.
Writes benchmarks/results/load-sim.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from adaptspec.reward.latency import get_profile
from adaptspec.simulators.load import simulate
from adaptspec.load.rules import Fixed, Goodput, Learned, Table
from adaptspec.traces.dense import DenseTraceSet

ROOT = Path(__file__).resolve().parents[1]
LEVELS = {"cpu-smollm2-bf16": [1, 2, 4, 8, 16], "h100-qwen3-8b": [1, 2, 4, 8, 16, 32, 64]}


def run_level(profile, pool, clients, requests, rule, seed=0):
    return simulate(rule, pool, profile, clients=clients, requests=requests, max_rows=64, seed=seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dense", default=str(ROOT / "datasets/dense/benchmarks-fast"))
    ap.add_argument("--profiles", default="cpu-smollm2-bf16,h100-qwen3-8b")
    ap.add_argument("--levels", default=None, help="client counts (default: 1-16 on the CPU profile, 1-64 on the GPU one)")
    ap.add_argument("--arms", default="1,2,3,4,6,8")
    ap.add_argument("--requests", type=int, default=48, help="requests per run at one client; more at higher loads")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/load-sim.json"))
    args = ap.parse_args()
    arms = [int(a) for a in args.arms.split(",")]
    reqs = [r for _, _, r in DenseTraceSet.open(args.dense).requests()]
    tune, test = reqs[0::2], reqs[1::2]
    results = {"dense": args.dense, "requests": len(reqs), "arms": arms, "profiles": {}}
    t0 = time.time()
    for name in args.profiles.split(","):
        prof = get_profile(name)
        levels = [int(x) for x in args.levels.split(",")] if args.levels else LEVELS.get(name, [1, 2, 4, 8, 16])
        n_req = {c: max(args.requests, 4 * c) for c in levels}
        tuned, oracle_table, rows = {}, {}, []
        for c in levels:
            tuning = {b: run_level(prof, tune, c, n_req[c], Fixed(b)).tokens_per_s for b in arms}
            tuned[c] = max(tuning, key=tuning.get)
            fixed = {b: run_level(prof, test, c, n_req[c], Fixed(b)) for b in arms}
            oracle_table[c] = max(fixed, key=lambda b: fixed[b].tokens_per_s)
            learned = Learned(arms, prof, seed=0)
            run_level(prof, tune, c, n_req[c], learned)  # warm-up on the tuning requests
            row = {"clients": c, "fixed": {b: r.summary() for b, r in fixed.items()},
                   "table": run_level(prof, test, c, n_req[c], Table({c: tuned[c]})).summary(),
                   "goodput": run_level(prof, test, c, n_req[c], Goodput(arms, prof)).summary(),
                   "learned": run_level(prof, test, c, n_req[c], learned).summary(),
                   "best_fixed": oracle_table[c], "tuned_fixed": tuned[c]}
            rows.append(row)
            print(f"[{time.time() - t0:.0f}s] {name} {c} clients: best fixed B={oracle_table[c]}", flush=True)
        # the day: the client count changes during the run
        phase_s = _phase_seconds(prof, levels)
        day = [(phase_s, c) for c in _day_order(levels)]
        total = 10_000
        learned = Learned(arms, prof, seed=0)
        simulate(learned, tune, prof, day=day, requests=total)  # warm-up: one day on the tuning requests
        day_runs = {f"fixed:{b}" if b > 1 else "plain": simulate(Fixed(b), test, prof, day=day, requests=total).summary()
                    for b in arms}
        day_runs["table (tuned on the other half)"] = simulate(Table(tuned), test, prof, day=day, requests=total).summary()
        day_runs["goodput"] = simulate(Goodput(arms, prof), test, prof, day=day, requests=total).summary()
        day_runs["learned"] = simulate(learned, test, prof, day=day, requests=total).summary()
        day_runs["per-level oracle"] = simulate(Table(oracle_table), test, prof, day=day, requests=total).summary()
        results["profiles"][name] = {"levels": rows, "day": {"phases": day, "runs": day_runs}}
        print(f"[{time.time() - t0:.0f}s] {name} day done", flush=True)
    results["seconds"] = round(time.time() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1, default=float))
    print(render(results))


def _day_order(levels: list[int]) -> list[int]:
    """Low, high, middle, highest, lowest again: every level, visited out of order."""
    lv = sorted(levels)
    return [lv[0], lv[len(lv) // 2], lv[-1], lv[1], lv[-2] if len(lv) > 2 else lv[-1], lv[0]]


def _phase_seconds(prof, levels) -> float:
    """Long enough for ~12 requests of 128 tokens at the lowest load."""
    return 12 * 128 * float(prof.verify_s(1, 300, 1))


def render(results: dict) -> str:
    out = []
    for name, res in results["profiles"].items():
        arms = results["arms"]
        head = ["clients"] + [("plain" if b == 1 else f"B={b}") for b in arms] + ["table", "goodput", "learned",
                                                                               "learned / best fixed"]
        out += [f"\n#### {name}: aggregate tok/s over plain decoding, per load level\n",
                "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
        for row in res["levels"]:
            plain = row["fixed"][1]["tokens_per_s"] if 1 in row["fixed"] else row["fixed"]["1"]["tokens_per_s"]
            fx = {int(k): v for k, v in row["fixed"].items()}
            best = max(v["tokens_per_s"] for v in fx.values())
            cells = [str(row["clients"])] + [f"{fx[b]['tokens_per_s'] / plain:.3f}" for b in arms]
            cells += [f"{row[k]['tokens_per_s'] / plain:.3f}" for k in ("table", "goodput", "learned")]
            cells.append(f"{row['learned']['tokens_per_s'] / best:.3f}")
            out.append("| " + " | ".join(cells) + " |")
        runs = res["day"]["runs"]
        plain = runs["plain"]["tokens_per_s"]
        best_fixed = max((k for k in runs if k.startswith(("fixed", "plain"))), key=lambda k: runs[k]["tokens_per_s"])
        out += [f"\nDay ({', '.join(f'{c} clients' for _, c in res['day']['phases'])}, "
                f"{res['day']['phases'][0][0]:.1f} s each): tok/s over plain, p50 / p95 latency (s)\n",
                "| rule | tok/s | over plain | over best fixed | p50 | p95 |", "|---|---:|---:|---:|---:|---:|"]
        for k, v in runs.items():
            out.append(f"| {k} | {v['tokens_per_s']:.1f} | {v['tokens_per_s'] / plain:.3f} | "
                       f"{v['tokens_per_s'] / runs[best_fixed]['tokens_per_s']:.3f} | {v['p50_s']:.2f} | {v['p95_s']:.2f} |")
        gain = runs["per-level oracle"]["tokens_per_s"] - runs[best_fixed]["tokens_per_s"]
        got = runs["learned"]["tokens_per_s"] - runs[best_fixed]["tokens_per_s"]
        out.append(f"\nBest single fixed size: {best_fixed}; the learned rule captures "
                   f"{100 * got / gain:.0f}% of the per-level oracle's gain over it." if gain > 0 else
                   f"\nBest single fixed size: {best_fixed}; the per-level oracle gains nothing over it.")
    return "\n".join(out)


if __name__ == "__main__":
    main()
