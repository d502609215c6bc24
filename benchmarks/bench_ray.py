"""Ray (``simulate --ray``, ``collect --ray``) against the single-process run, on this machine.

1. A simulate sweep: 4 policies x 5 seeds on the benchmark prompts' trace set (shuffled order,
   the CLI's featurizer), one pass and a longer stream, in one process against a local Ray with
   2 CPUs (its start timed apart). The reports must be equal.
2. ``collect --dense`` of 8 benchmark prompts with the bundled pair, as the command a user
   runs (a fresh process each, model loading included): one process with 2 torch threads
   against ``--ray --ray-tasks 2`` (2 tasks of 1 thread each, Ray's start included). Whether
   the dense tables are equal is recorded (they must be with ``--verification exact``; the
   default fast kernels can round a near-tie differently with another thread count).

    python benchmarks/bench_ray.py            # writes benchmarks/results/ray.json
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ["ucb", "ts", "linucb", "lints"]


def sweep(steps_list=(None, 20000), seeds=5) -> dict:
    import ray

    from adaptspec.policies.featurizer import featurizer_for
    from adaptspec.simulators.replay import replay
    from adaptspec.traces import load_traces

    traces = load_traces(ROOT / "adaptspec/data/traces/benchmarks")
    feat = featurizer_for(POLICIES, traces.features.shape[1], "auto")
    traces = feat.transform_traces(traces)
    kw = dict(reward="token_latency", seeds=range(seeds), order="shuffled", progress=False)
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    start = time.perf_counter() - t0
    out = {
        "policies": POLICIES,
        "seeds": seeds,
        "requests": traces.n_requests,
        "ray_start_s": round(start, 2),
        "runs": [],
    }
    try:
        replay(traces, POLICIES[:1], ray=True, **{**kw, "seeds": [0]})  # warm the workers' imports
        for steps in steps_list:
            t0 = time.perf_counter()
            one = replay(traces, POLICIES, n_steps=steps, **kw)
            t_one = time.perf_counter() - t0
            t0 = time.perf_counter()
            par = replay(traces, POLICIES, n_steps=steps, ray=True, **kw)
            t_ray = time.perf_counter() - t0
            out["runs"].append(
                {
                    "steps": one.n_steps,
                    "single_s": round(t_one, 2),
                    "ray_s": round(t_ray, 2),
                    "speedup": round(t_one / t_ray, 2),
                    "speedup_with_ray_start": round(t_one / (t_ray + start), 2),
                    "identical": one.table() == par.table() and one.to_json() == par.to_json(),
                }
            )
            print(out["runs"][-1], flush=True)
    finally:
        ray.shutdown()
    return out


def collect_dense(n: int = 8, verification: str = "fast") -> dict:
    import pyarrow  # noqa: F401

    from adaptspec.traces.dense import DenseTraceSet

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [
        sys.executable,
        "-m",
        "adaptspec",
        "collect",
        "--prompts",
        "benchmarks",
        "--limit",
        str(n),
        "--dense",
        "--verification",
        verification,
    ]
    out: dict = {"prompts": n, "verification": verification, "max_new_tokens": 96, "max_block_size": 16}
    with tempfile.TemporaryDirectory() as d:
        runs = {
            "single (1 process, 2 threads)": ["--threads", "2", "--out", f"{d}/one"],
            "ray (2 tasks x 1 thread)": ["--ray", "--ray-tasks", "2", "--out", f"{d}/ray"],
        }
        for name, extra in runs.items():
            t0, c0 = time.perf_counter(), os.times()
            p = subprocess.run([*base, *extra], env=env, capture_output=True, text=True)
            if p.returncode:
                raise RuntimeError(p.stderr[-2000:])
            out[name] = round(time.perf_counter() - t0, 1)
            c1 = os.times()  # the Ray workers are not children of the command: only its own CPU
            out[name + " command cpu_s"] = round(
                c1.children_user + c1.children_system - c0.children_user - c0.children_system, 1
            )
            print(name, out[name], flush=True)
        a, b = DenseTraceSet.open(f"{d}/one"), DenseTraceSet.open(f"{d}/ray")
        out["identical_tables"] = a.table().equals(b.table())
    single, par = out["single (1 process, 2 threads)"], out["ray (2 tasks x 1 thread)"]
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    out["speedup"] = round(single / par, 2)
    return out


def main() -> None:
    import ray

    path = ROOT / "benchmarks/results/ray.json"
    res = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "ray": ray.__version__,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }

    def save() -> None:
        res["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        path.write_text(json.dumps(res, indent=2) + "\n")

    res["simulate_sweep"] = sweep()
    save()
    res["collect_dense"] = collect_dense(8, "fast")
    save()
    if "--exact" in sys.argv:
        res["collect_dense_exact"] = collect_dense(8, "exact")
        save()
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
