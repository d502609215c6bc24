"""Per-request cost of the policies: one ``decide`` + one ``update`` through the public API.

The headline comparison is LinUCB (d = 64 features, 9 arms) against river's
``bandit.LinUCBDisjoint`` on the same stream, timed step by step in the same run and
interleaved (request t: adaptspec's decide + update, then river's pull + update), so both
see the same machine conditions. River gets its contexts as dicts built outside the timer
(the conversion it would need from a numpy feature vector is reported separately).

Every other policy is timed on the same stream afterwards (NeuralLinear / SquareCB-head use a
small head trained on a separate stream of the same model).

The full-information policies (``fi-ucb``, ``fi-linucb``) are timed as ``decide`` +
``update_full`` with every arm observed (their most expensive request), on this stream and on
the cold default's shape (16 block sizes, no context); beside them, the counterfactual outcomes
of one request (``reward.counterfactual.counterfactuals``: 40 rounds, 16 arms), which the
feedback path computes once per request before the update.

    python benchmarks/bench_policy_speed.py [--steps 3000] [--json out.json]
    python benchmarks/bench_policy_speed.py --only-full-info --json benchmarks/results/policy_speed_full_info.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

D, K = 64, 9
ARMS = tuple(range(1, K + 1))


def stream(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Contexts (n, D) and rewards (n, K) of a linear model with noise."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    W = rng.normal(0.0, 0.3, size=(K, D))
    return X, X @ W.T + rng.normal(0.0, 1.0, size=(n, K)) + 10.0


def time_policy(pol, X: np.ndarray, R: np.ndarray, warm: int) -> np.ndarray:
    out = np.empty(len(X) - warm)
    for t in range(len(X)):
        x = X[t] if pol.contextual else None
        t0 = time.perf_counter()
        d = pol.decide(x)
        pol.update(x, d.block_size, R[t, d.block_size - 1])
        dt = time.perf_counter() - t0
        if t >= warm:
            out[t - warm] = dt
    return out * 1e6


def linucb_vs_river(X: np.ndarray, R: np.ndarray, warm: int) -> dict:
    from river import bandit

    from adaptspec.policies import LinUCB

    ours = LinUCB(ARMS, seed=0)
    theirs = bandit.LinUCBDisjoint(seed=0)
    keys = [f"x{i}" for i in range(D)]
    arm_ids = list(ARMS)
    t_ours, t_river, t_dict = [], [], []
    agree = 0
    for t in range(len(X)):
        x = X[t]
        t0 = time.perf_counter()
        d = ours.decide(x)
        ours.update(x, d.block_size, R[t, d.block_size - 1])
        t1 = time.perf_counter()
        ctx = dict(zip(keys, x.tolist()))
        t2 = time.perf_counter()
        a = theirs.pull(arm_ids, ctx)
        theirs.update(a, ctx, R[t, a - 1])
        t3 = time.perf_counter()
        if t >= warm:
            t_ours.append(t1 - t0)
            t_dict.append(t2 - t1)
            t_river.append(t3 - t2)
            agree += a == d.block_size
    t_ours, t_river, t_dict = (np.array(v) * 1e6 for v in (t_ours, t_river, t_dict))
    return {
        "adaptspec_linucb_median_us": float(np.median(t_ours)),
        "adaptspec_linucb_p90_us": float(np.percentile(t_ours, 90)),
        "river_linucb_median_us": float(np.median(t_river)),
        "river_linucb_p90_us": float(np.percentile(t_river, 90)),
        "river_dict_conversion_median_us": float(np.median(t_dict)),
        "ratio_median": float(np.median(t_river) / np.median(t_ours)),
        "ratio_median_with_conversion": float((np.median(t_river) + np.median(t_dict)) / np.median(t_ours)),
        "steps_timed": int(len(t_ours)),
        "same_choice_share": float(agree / len(t_ours)),
    }


def hot_path(X: np.ndarray, R: np.ndarray, warm: int) -> float:
    """LinUCB through the replay simulator's inner loop (inputs validated once up front)."""
    from adaptspec.policies import LinUCB

    pol = LinUCB(ARMS, seed=0)
    pol.check_contexts(X)
    out = []
    for t in range(len(X)):
        t0 = time.perf_counter()
        a, _ = pol._choose(X[t])
        pol._update(X[t], a, R[t, a])
        pol.version += 1
        if t >= warm:
            out.append(time.perf_counter() - t0)
    return float(np.median(out) * 1e6)


def all_policies(X: np.ndarray, R: np.ndarray, warm: int) -> list[dict]:
    from river import bandit

    from adaptspec.policies import (
        EXP3,
        UCB,
        EpsilonGreedy,
        LinTS,
        LinUCB,
        NeuralLinear,
        OfflineHead,
        RiverPolicy,
        SquareCB,
        ThompsonSampling,
        train_head,
    )
    from adaptspec.policies.river_adapter import river_policy

    Xh, Rh = stream(2000, seed=11)
    head = train_head(Xh, Rh, ARMS, hidden=(64, 32), seed=0)
    cands = [
        ("eps-greedy", EpsilonGreedy(ARMS, seed=0)),
        ("ucb", UCB(ARMS, seed=0)),
        ("ucb (discount 0.99)", UCB(ARMS, discount=0.99, seed=0)),
        ("ts (512 MC draws)", ThompsonSampling(ARMS, seed=0)),
        ("exp3", EXP3(ARMS, seed=0)),
        ("linucb", LinUCB(ARMS, seed=0)),
        ("linucb (discount 0.999)", LinUCB(ARMS, discount=0.999, seed=0)),
        ("lints (512 MC draws)", LinTS(ARMS, seed=0)),
        ("squarecb", SquareCB(ARMS, seed=0)),
        ("head (greedy, 64-32 MLP)", OfflineHead(head)),
        ("neural-linear (ucb, 5 head weights)", NeuralLinear(head, seed=0)),
        ("neural-linear (ts, 5 head weights)", NeuralLinear(head, exploration="ts", seed=0)),
        ("neural-linear (ucb, prior_n=64)", NeuralLinear(head, prior_n=64.0, seed=0)),
        ("squarecb-head", SquareCB(head=head, seed=0)),
        ("river:linear (adapter)", river_policy(ARMS, seed=0)),
        ("river:ts (adapter, 32 probes)", river_policy(ARMS, model="ts", seed=0)),
        ("river LinUCBDisjoint (adapter)", RiverPolicy(ARMS, policy=bandit.LinUCBDisjoint(), seed=0)),
    ]
    rows = []
    for name, pol in cands:
        n = len(X) if not name.startswith("river") else min(len(X), warm + 400)
        t = time_policy(pol, X[:n], R[:n], warm)
        rows.append(
            {
                "policy": name,
                "median_us": float(np.median(t)),
                "p90_us": float(np.percentile(t, 90)),
                "steps_timed": int(len(t)),
            }
        )
        print(
            f"  {name:40s} {rows[-1]['median_us']:9.1f} us median   {rows[-1]['p90_us']:9.1f} us p90",
            flush=True,
        )
    return rows


def time_full(pol, X: np.ndarray | None, R: np.ndarray, warm: int) -> np.ndarray:
    """decide + update_full (every arm observed) per step, microseconds."""
    out = np.empty(len(R) - warm)
    seen = np.ones(R.shape[1], dtype=bool)
    for t in range(len(R)):
        x = X[t] if pol.contextual else None
        t0 = time.perf_counter()
        pol.decide(x)
        pol.update_full(x, R[t], seen)
        dt = time.perf_counter() - t0
        if t >= warm:
            out[t - warm] = dt
    return out * 1e6


def full_information(X: np.ndarray, R: np.ndarray, warm: int) -> list[dict]:
    from adaptspec.costs.latency import get_profile
    from adaptspec.policies import FullInfoLinUCB, FullInfoUCB
    from adaptspec.reward.counterfactual import counterfactuals

    rng = np.random.default_rng(5)
    R16 = rng.normal(-35.0, 5.0, size=(len(R), 16))
    cands = [
        (f"fi-ucb ({K} arms)", FullInfoUCB(ARMS, seed=0), X, R),
        (f"fi-linucb (d={D}, {K} arms)", FullInfoLinUCB(ARMS, seed=0), X, R),
        ("fi-ucb (16 arms, the cold default's shape)", FullInfoUCB(range(1, 17), seed=0), None, R16),
    ]
    rows = []
    for name, pol, Xs, Rs in cands:
        t = time_full(pol, Xs, Rs, warm)
        rows.append(
            {
                "policy": name,
                "median_us": float(np.median(t)),
                "p90_us": float(np.percentile(t, 90)),
                "steps_timed": int(len(t)),
            }
        )
        print(
            f"  {name:46s} {rows[-1]['median_us']:9.1f} us median   {rows[-1]['p90_us']:9.1f} us p90",
            flush=True,
        )
    from adaptspec.policies import UCB

    t = time_policy(
        UCB(range(1, 17), seed=0), np.zeros((len(R16), 1)), R16, warm
    )  # decide + update, same run
    rows.append(
        {
            "policy": "ucb (16 arms, bandit feedback: decide + update, for comparison)",
            "median_us": float(np.median(t)),
            "p90_us": float(np.percentile(t, 90)),
            "steps_timed": int(len(t)),
        }
    )
    print(
        f"  {rows[-1]['policy']:46s} {rows[-1]['median_us']:9.1f} us median   {rows[-1]['p90_us']:9.1f} us p90"
    )
    prof = get_profile("cpu-smollm2-fast")
    taus = rng.integers(1, 5, size=40)
    ts = []
    for i in range(len(R)):
        t0 = time.perf_counter()
        counterfactuals(
            taus, np.full(40, 4), arms=range(1, 17), decided=4, context_tokens=100, profile=prof, decode_s=1.5
        ).rewards("token_latency")
        if i >= warm:
            ts.append(time.perf_counter() - t0)
    t = np.array(ts) * 1e6
    rows.append(
        {
            "policy": "counterfactual outcomes of one request (40 rounds, 16 arms)",
            "median_us": float(np.median(t)),
            "p90_us": float(np.percentile(t, 90)),
            "steps_timed": int(len(t)),
        }
    )
    print(
        f"  {rows[-1]['policy']:46s} {rows[-1]['median_us']:9.1f} us median   {rows[-1]['p90_us']:9.1f} us p90"
    )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--warm", type=int, default=300, help="untimed first steps (LinUCB's warm-up is 90)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip-others", action="store_true")
    ap.add_argument("--only-full-info", action="store_true", help="time the full-information policies only")
    args = ap.parse_args()
    X, R = stream(args.steps, seed=0)
    machine = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
    if args.only_full_info:
        print(
            f"full-information policies, decide + update_full (every arm observed), {args.steps - args.warm} timed steps"
        )
        out = {"machine": machine, "d": D, "arms": K, "full_information": full_information(X, R, args.warm)}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
        return 0
    print(
        f"LinUCB vs river LinUCBDisjoint, d={D}, {K} arms, {args.steps - args.warm} timed steps, interleaved"
    )
    head = linucb_vs_river(X, R, args.warm)
    for k, v in head.items():
        print(f"  {k:36s} {v:.3f}" if isinstance(v, float) else f"  {k:36s} {v}")
    head["adaptspec_linucb_hot_path_median_us"] = hot_path(X, R, args.warm)
    print(f"  {'adaptspec_linucb_hot_path_median_us':36s} {head['adaptspec_linucb_hot_path_median_us']:.3f}")
    out = {"machine": machine, "d": D, "arms": K, "linucb_vs_river": head}
    if not args.skip_others:
        print("every policy, decide + update, same stream:")
        out["policies"] = all_policies(X, R, args.warm)
        print("full-information policies, decide + update_full (every arm observed):")
        out["full_information"] = full_information(X, R, args.warm)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
