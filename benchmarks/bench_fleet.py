"""Fleet learning: how much sooner 4 sharing replicas learn, and what sharing costs the decision path.

1. Learning speed-up (replay, :mod:`adaptspec.fleet.replay`): LinUCB (``standardize=false`` on
   the bundled featurizer's 32 whitened components) on the benchmark prompts' trace set, regret
   against the best fixed block size. One replica alone (4 x N requests) against 4 replicas
   sharing (N requests each), for several consistency windows (``sync_every``); the speed-up is
   requests alone / requests per replica to reach the same regret, at 6 levels from 20% to 70%
   of the way the single curve falls, over 20 seeds.
2. Decision latency: ``AdaptiveController.decide`` with the default policy (NeuralLinear over
   the bundled head and its featurizer) on the trace set's prefill features, each decision
   followed by its feedback, without sharing, sharing through a real Redis (a local
   redis-server, sync every 8 updates or 0.2 s), and with that Redis killed after the start.

    python benchmarks/bench_fleet.py            # writes benchmarks/results/fleet.json
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the Redis test server (tests/_redis.py)


def learning(steps: int = 500, seeds: int = 20, width: int = 40) -> dict:
    from adaptspec.fleet.replay import fleet_replay, learning_curve, speedup
    from adaptspec.paths import BUNDLED_HEAD
    from adaptspec.policies.featurizer import Featurizer
    from adaptspec.policies.spec import make_policy
    from adaptspec.simulators.replay import finite_rewards
    from adaptspec.traces import load_traces

    t = load_traces(ROOT / "adaptspec/data/traces/benchmarks")
    X = Featurizer.load(BUNDLED_HEAD).transform(t.features).astype(np.float64)
    R = finite_rewards(t, "token_latency")
    spec = "linucb:standardize=false"
    make = lambda i: make_policy(spec, t.arms, seed=0)  # noqa: E731
    single = learning_curve(
        np.stack(
            [fleet_replay(make, R, X, replicas=1, steps_per_replica=4 * steps, seed=s) for s in range(seeds)]
        ),
        width,
    )
    hi, lo = single[0], single[-1]
    levels = hi - np.linspace(0.2, 0.7, 6) * (hi - lo)
    out = {
        "policy": spec,
        "traces": "benchmarks",
        "reward": "token_latency",
        "seeds": seeds,
        "requests_per_replica": steps,
        "replicas": 4,
        "levels_ms_per_token": levels.round(3).tolist(),
        "single_curve": single.round(3).tolist(),
        "fleets": {},
    }
    for k in (1, 8, 32, 10**9):
        t0 = time.perf_counter()
        fleet = learning_curve(
            np.stack(
                [
                    fleet_replay(make, R, X, replicas=4, steps_per_replica=steps, sync_every=k, seed=s)
                    for s in range(seeds)
                ]
            ),
            width // 4,
        )
        s = speedup(single, width, fleet, width // 4, levels)
        name = "no sharing" if k == 10**9 else f"sync_every={k}"
        out["fleets"][name] = {
            "speedup": [None if not np.isfinite(v) else round(float(v), 2) for v in s],
            "median_speedup": None if not np.isfinite(s).any() else round(float(np.nanmedian(s)), 2),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(
            f"  {name:>16}: speed-up {out['fleets'][name]['speedup']} (median {out['fleets'][name]['median_speedup']})",
            flush=True,
        )
    return out


class _Toy:
    """Prefill features from the trace set; decode is never called (the split form)."""

    max_block_size = 16

    def prefill(self, prompt_ids, **kw):  # pragma: no cover
        raise NotImplementedError

    def decode(self, *a, **kw):  # pragma: no cover
        raise NotImplementedError


def latency(n: int = 1500) -> dict:
    from _redis import RedisServer
    from adaptspec import AdaptiveController
    from adaptspec.fleet import SharedState
    from adaptspec.fleet.redis_backend import RedisBackend
    from adaptspec.reward.functions import trace_rewards
    from adaptspec.traces import load_traces

    t = load_traces(ROOT / "adaptspec/data/traces/benchmarks")
    F = t.features.astype(np.float32)
    R = trace_rewards(t, "token_latency")
    arms = list(t.arms)
    out = {}
    tmp = Path(tempfile.mkdtemp())
    srv = RedisServer(tmp / "redis").start()
    try:
        for mode in ("local", "redis", "redis down"):
            shared = None
            if mode != "local":
                shared = SharedState(
                    RedisBackend(f"{srv.url}/bench-{mode.replace(' ', '-')}").connect(),
                    "r0",
                    sync_every=8,
                    sync_interval_s=0.2,
                )
                if mode == "redis down" and srv.proc is None:
                    srv.start()
            ctl = AdaptiveController(_Toy(), None, feedback_timeout_s=None, shared=shared)
            if mode == "redis down":
                srv.kill()
            rng = np.random.default_rng(0)
            dts = np.empty(n)
            for j in range(n):
                i = int(rng.integers(len(F)))
                t0 = time.perf_counter()
                d = ctl.decide(F[i])
                dts[j] = time.perf_counter() - t0
                ctl.feedback(d.decision_id, reward=float(R[i, arms.index(d.block_size)]))
            st = ctl.stats()
            ctl.close()
            us = dts[100:] * 1e6
            out[mode] = {
                "decide_us_p50": round(float(np.percentile(us, 50)), 1),
                "decide_us_p90": round(float(np.percentile(us, 90)), 1),
                "decide_us_p99": round(float(np.percentile(us, 99)), 1),
                "fallbacks": int(sum(st["fallbacks"].values())),
                "updates": st["updates"],
                "shared": None
                if shared is None
                else {k: st["shared"][k] for k in ("connected", "syncs", "sync_errors", "merges")},
            }
            print(f"  {mode:>10}: {out[mode]}", flush=True)
    finally:
        srv.stop()
    return out


def main() -> None:
    print("learning speed-up (replay):", flush=True)
    res = {"machine": f"{platform.machine()}, {platform.python_version()}", "learning": learning()}
    print("decision latency:", flush=True)
    res["decision_latency"] = latency()
    path = ROOT / "benchmarks/results/fleet.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
