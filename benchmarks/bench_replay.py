"""Replay throughput: decisions per second, vectorised replay against a plain per-request loop.

The baseline is what one would write without the simulator: for each request, call the
policy's public ``decide``, look the chosen arm's reward up, and (for a learning policy)
call ``update``. Both run in the same process on the synthetic cpu-small trace set (32 features).

    python benchmarks/bench_replay.py            # 1M vectorised decisions, 50k looped
    python benchmarks/bench_replay.py --steps 200000 --loop-steps 20000
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from adaptspec.policies import make_policy
from adaptspec.policies.spec import REGISTRY
from adaptspec.reward.functions import trace_rewards
from adaptspec.simulators.replay import replay, stream_order
from adaptspec.simulators.synthetic import generate


def plain_loop(traces, spec: str, R: np.ndarray, idx: np.ndarray) -> float:
    """Seconds for the per-request public-API loop over ``idx``."""
    pol = make_policy(spec, traces.arms, seed=0)
    X = traces.features.astype(np.float64)
    learning = getattr(pol, "learning", True)
    total = 0.0
    t = time.perf_counter()
    for i in idx:
        x = X[i] if pol.contextual else None
        if pol.full_information:
            d = pol.decide(x, rewards=R[i])
        else:
            d = pol.decide(x)
        r = R[i, pol.arm_index(d.block_size)]
        total += r
        if learning:
            pol.update(x, d.block_size, r)
    return time.perf_counter() - t


def timed_replay(traces, spec: str, steps: int) -> float:
    t = time.perf_counter()
    replay(traces, [spec], reward="throughput", n_steps=steps, progress=False)
    return time.perf_counter() - t


def best_of(n: int, fn, *args) -> float:
    """Fastest of ``n`` runs: the machine is shared, the minimum is the least disturbed."""
    return min(fn(*args) for _ in range(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000, help="vectorised replay steps")
    ap.add_argument("--loop-steps", type=int, default=50_000, help="steps of the plain loop baseline")
    ap.add_argument("--learning-steps", type=int, default=50_000, help="steps for learning policies")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs per figure")
    args = ap.parse_args()
    ts = generate("cpu-small", n_requests=300, seed=0, per_round=False, progress=False)  # 32 features
    R = trace_rewards(ts, "throughput")
    print(
        f"{platform.processor() or platform.machine()}, numpy {np.__version__}; synthetic cpu-small trace set "
        f"({len(ts)} requests, {len(ts.arms)} arms); reward: measured throughput"
    )
    # replay() also scores the oracle and the best fixed arm on the same stream; their time is included.
    timed_replay(ts, "fixed:4", args.steps)  # warm-up (imports, first-touch memory)
    print(f"{'policy':<10} {'path':<11} {'decisions/s':>13} {'plain loop/s':>13} {'ratio':>7}")
    for spec in ("fixed:4", "random", "oracle"):
        sec = best_of(args.repeats, timed_replay, ts, spec, args.steps)
        loop = best_of(args.repeats, plain_loop, ts, spec, R, stream_order(ts, "logged", 0, args.loop_steps))
        v, lp = args.steps / sec, args.loop_steps / loop
        print(f"{spec:<10} {'vectorised':<11} {v:>13,.0f} {lp:>13,.0f} {v / lp:>6.0f}x")
    for spec in ("ucb", "linucb"):
        if spec not in REGISTRY:
            continue
        sec = best_of(args.repeats, timed_replay, ts, spec, args.learning_steps)
        loop = best_of(
            args.repeats, plain_loop, ts, spec, R, stream_order(ts, "logged", 0, args.learning_steps)
        )
        v, lp = args.learning_steps / sec, args.learning_steps / loop
        print(f"{spec:<10} {'loop':<11} {v:>13,.0f} {lp:>13,.0f} {v / lp:>6.1f}x")


if __name__ == "__main__":
    main()
