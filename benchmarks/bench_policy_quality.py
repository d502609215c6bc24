"""Quality of the learning policies on synthetic scenarios with a known optimum.

Protocol (every policy with its default parameters; the defaults were chosen on development
seed 100, the figures here use seeds 1, 2, 3):

- ``adaptspec.simulators.synthetic.generate`` writes a full-information trace set whose
  ground truth is known: the expected tau of every (request, block size). Rewards are
  modelled throughput (tok/s) from the scenario's latency profile. A policy learns from the
  realised reward of the arm it picked; it is scored on the *expected* reward of that arm
  against the expected reward of the best arm of each request (the per-request oracle of the
  known optimum, i.e. pseudo-regret), so the noise of single requests neither helps nor hurts.
  The realised-reward percentage that ``adaptspec simulate`` prints is reported alongside.
- Each trace set has ``n_train + 5000`` requests; a random ``n_train`` of them train the offline
  head (``train_head``, as ``adaptspec train-head``), the other 5,000 are streamed once, in a
  seeded random order, through ``adaptspec.simulators.replay.run_policy``.
- in-distribution: the stream is served at the batch size the head was trained for (1);
  shifted: the head was trained at batch 1, the stream runs at a larger batch (verification
  costs more, smaller blocks win): the offline model is now wrong and must be corrected online.
- drift: one stream whose domain mix changes abruptly at request 2,500 (first half math/code,
  second half prose/lists/chat), and one whose load changes at 2,500 (batch 1 -> 8), the
  latter also with log(batch size) appended to the features.

    python benchmarks/bench_policy_quality.py [--seeds 1,2,3] [--json out.json] [--plots DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from adaptspec.costs.latency import get_profile
from adaptspec.policies import (
    EXP3,
    UCB,
    EpsilonGreedy,
    LinTS,
    LinUCB,
    NeuralLinear,
    OfflineHead,
    SquareCB,
    ThompsonSampling,
    train_head,
)
from adaptspec.policies.river_adapter import river_policy
from adaptspec.reward.functions import modelled_throughput, trace_context, trace_rewards
from adaptspec.simulators.replay import run_policy
from adaptspec.simulators.synthetic import generate

STREAM = 5000
WINDOW = 250


# ---------------------------------------------------------------------------------- data
def expected_and_realised(ts, prof, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """(expected, realised) modelled-throughput matrices (n, K) at ``batch``."""
    E_tau = ts._scatter(ts.outcomes.column("expected_tau").to_numpy())
    ctx = trace_context(ts, prof)
    E = modelled_throughput(E_tau, ts.arm_array[None, :], prof, ctx, batch)
    R = trace_rewards(ts, "modelled", prof, batch)
    return E, R


def make_split(scenario: str, n_train: int, seed: int):
    ts = generate(scenario, n_requests=n_train + STREAM, seed=seed, per_round=False)
    prof = get_profile(ts.meta["latency_profile"])
    perm = np.random.default_rng([seed, 5]).permutation(ts.n_requests)
    return ts.subset(np.sort(perm[:n_train])), ts.subset(np.sort(perm[n_train:])), prof


# ---------------------------------------------------------------------------------- policies
def learning_policies(arms, head) -> dict[str, Callable[[int], Any]]:
    pols: dict[str, Callable[[int], Any]] = {
        "eps-greedy": lambda s: EpsilonGreedy(arms, seed=s),
        "ucb": lambda s: UCB(arms, seed=s),
        "ts": lambda s: ThompsonSampling(arms, seed=s),
        "exp3": lambda s: EXP3(arms, seed=s),
        "linucb": lambda s: LinUCB(arms, seed=s),
        "lints": lambda s: LinTS(arms, seed=s),
        "squarecb": lambda s: SquareCB(arms, seed=s),
        "river:linear": lambda s: river_policy(arms, seed=s),
    }
    if head is not None:
        pols.update(
            {
                "head": lambda s: OfflineHead(head, seed=s),
                "neural-linear": lambda s: NeuralLinear(head, seed=s),
                "neural-linear (ts)": lambda s: NeuralLinear(head, exploration="ts", seed=s),
                "squarecb-head": lambda s: SquareCB(head=head, seed=s),
            }
        )
    return pols


def score(chosen: np.ndarray, idx: np.ndarray, E: np.ndarray, R: np.ndarray) -> dict[str, Any]:
    e = E[idx, chosen]
    best = E[idx].max(axis=1)
    regret = np.cumsum(best - e)
    return {
        "pct_oracle": float(100 * e.sum() / best.sum()),
        "pct_oracle_last1000": float(100 * e[-1000:].sum() / best[-1000:].sum()),
        "pct_oracle_realised": float(100 * R[idx, chosen].sum() / R[idx].max(axis=1).sum()),
        "regret": regret,
    }


def regret_exponent(regret: np.ndarray) -> float:
    """Slope of log regret against log t over the second half of the stream (1 = linear)."""
    t = np.arange(1, len(regret) + 1)
    h = len(regret) // 2
    ok = regret[h:] > 0
    if ok.sum() < 10:
        return float("nan")
    return float(np.polyfit(np.log(t[h:][ok]), np.log(regret[h:][ok]), 1)[0])


def stationary(scenario: str, n_train: int, batch: int, seeds: list[int]) -> dict[str, Any]:
    rows: dict[str, list[dict]] = {}
    curves: dict[str, list[np.ndarray]] = {}
    for seed in seeds:
        A, B, prof = make_split(scenario, n_train, seed)
        head = train_head(A.features, trace_rewards(A, "modelled", prof, 1), A.arms, seed=seed)
        E, R = expected_and_realised(B, prof, batch)
        idx = np.random.default_rng([seed, 9]).permutation(B.n_requests)
        X = B.features.astype(np.float64)
        best_fixed = int(np.argmax(E.mean(axis=0)))
        fixed = score(np.full(len(idx), best_fixed), idx, E, R)
        fixed["block_size"] = int(B.arms[best_fixed])
        rows.setdefault("best fixed", []).append(fixed)
        for name, make in learning_policies(B.arms, head).items():
            pol = make(seed)
            t0 = time.perf_counter()
            chosen = run_policy(pol, R, idx, X)
            res = score(chosen, idx, E, R)
            res["seconds"] = time.perf_counter() - t0
            if isinstance(pol, NeuralLinear):
                res["head_weight"] = pol.head_weight
            rows.setdefault(name, []).append(res)
            curves.setdefault(name, []).append(res["regret"])
    out: dict[str, Any] = {
        "scenario": scenario,
        "n_train": n_train,
        "batch": batch,
        "seeds": seeds,
        "policies": {},
    }
    for name, rs in rows.items():
        summary = {
            k: float(np.mean([r[k] for r in rs]))
            for k in ("pct_oracle", "pct_oracle_last1000", "pct_oracle_realised")
        }
        summary["pct_oracle_min_seed"] = float(min(r["pct_oracle"] for r in rs))
        summary["regret_exponent"] = float(np.mean([regret_exponent(r["regret"]) for r in rs]))
        if "seconds" in rs[0]:
            summary["seconds"] = float(np.mean([r["seconds"] for r in rs]))
        if "head_weight" in rs[0]:
            summary["head_weight"] = [r["head_weight"] for r in rs]
        if "block_size" in rs[0]:
            summary["block_size"] = [r["block_size"] for r in rs]
        out["policies"][name] = summary
    out["_curves"] = {k: np.mean(v, axis=0) for k, v in curves.items()}
    out["_curves"]["best fixed"] = np.mean([r["regret"] for r in rows["best fixed"]], axis=0)
    return out


# ---------------------------------------------------------------------------------- drift
def drift_streams(seed: int):
    """Two 5,000-request streams with a change at 2,500, and the head trained before it."""
    n_train = 1000
    ts = generate("cpu-small", n_requests=n_train + 2 * STREAM, seed=seed, per_round=False)
    prof = get_profile(ts.meta["latency_profile"])
    rng = np.random.default_rng([seed, 6])
    perm = rng.permutation(ts.n_requests)
    train, pool = np.sort(perm[:n_train]), perm[n_train:]
    A = ts.subset(train)
    head = train_head(A.features, trace_rewards(A, "modelled", prof, 1), A.arms, seed=seed)
    E1, R1 = expected_and_realised(ts, prof, 1)
    E8, R8 = expected_and_realised(ts, prof, 8)
    dom = ts.domains.astype(str)
    first = pool[np.isin(dom[pool], ["math", "code"])][: STREAM // 2]
    second = pool[np.isin(dom[pool], ["prose", "lists", "chat"])][: STREAM // 2]
    mix = np.concatenate([first, second])
    load_idx = pool[:STREAM]
    # load change: rows of the second half take their rewards at batch 8
    E_load, R_load = E1.copy(), R1.copy()
    late = load_idx[STREAM // 2 :]
    E_load = np.concatenate([E1, E8[late]])
    R_load = np.concatenate([R1, R8[late]])
    load_stream = np.concatenate([load_idx[: STREAM // 2], ts.n_requests + np.arange(len(late))])
    X = ts.features.astype(np.float64)
    X_load = np.concatenate([X, X[late]])
    # the same load change, with log(batch size) appended to the features (what a controller
    # that knows the engine's batch size can do): no longer drift for a contextual policy
    batch_feature = np.concatenate([np.zeros(len(X)), np.full(len(late), np.log(8.0))])[:, None]
    return (
        {
            "domain-mix": (mix, E1, R1, X),
            "load": (load_stream, E_load, R_load, X_load),
            "load, batch size as a feature": (
                load_stream,
                E_load,
                R_load,
                np.concatenate([X_load, batch_feature], axis=1),
            ),
        },
        ts.arms,
        head,
    )


def drift_policies(arms, head) -> dict[str, Callable[[int], Any]]:
    # forgetting rates chosen on development seed 100 (memory of a few hundred requests)
    return {
        "ucb": lambda s: UCB(arms, seed=s),
        "ucb (window 600)": lambda s: UCB(arms, window=600, seed=s),
        "eps-greedy (window 600)": lambda s: EpsilonGreedy(arms, window=600, seed=s),
        "ts": lambda s: ThompsonSampling(arms, seed=s),
        "ts (window 600)": lambda s: ThompsonSampling(arms, window=600, seed=s),
        "ts (discount 0.995)": lambda s: ThompsonSampling(arms, discount=0.995, seed=s),
        "exp3": lambda s: EXP3(arms, seed=s),
        "exp3 (discount 0.995)": lambda s: EXP3(arms, discount=0.995, seed=s),
        "linucb": lambda s: LinUCB(arms, seed=s),
        "linucb (discount 0.999)": lambda s: LinUCB(arms, discount=0.999, seed=s),
        "lints (discount 0.999)": lambda s: LinTS(arms, discount=0.999, seed=s),
        "neural-linear": lambda s: NeuralLinear(head, seed=s),
        "neural-linear (discount 0.998)": lambda s: NeuralLinear(head, discount=0.998, seed=s),
    }


def rolling_ratio(num: np.ndarray, den: np.ndarray, w: int = WINDOW) -> np.ndarray:
    c1, c2 = np.concatenate([[0], np.cumsum(num)]), np.concatenate([[0], np.cumsum(den)])
    return (c1[w:] - c1[:-w]) / (c2[w:] - c2[:-w])


def drift(seeds: list[int]) -> dict[str, Any]:
    change = STREAM // 2
    out: dict[str, Any] = {}
    curves: dict[str, dict[str, list[np.ndarray]]] = {}
    for seed in seeds:
        streams, arms, head = drift_streams(seed)
        for kind, (idx, E, R, X) in streams.items():
            best = E[idx].max(axis=1)
            # the best single block size of each phase: the reference a context-free policy can reach
            phase_fixed = np.empty(len(idx))
            for lo, hi in ((0, change), (change, len(idx))):
                phase_fixed[lo:hi] = E[idx[lo:hi], int(np.argmax(E[idx[lo:hi]].mean(axis=0)))]
            for name, make in drift_policies(arms, head).items():
                pol = make(seed)
                if kind.startswith("load, batch") and (not pol.contextual or isinstance(pol, NeuralLinear)):
                    continue  # only the policies that can use the extra feature (the head was trained without it)
                chosen = run_policy(pol, R, idx, X)
                e = E[idx, chosen]
                ref = phase_fixed if not pol.contextual else best
                ratio = rolling_ratio(e, ref)
                after = ratio[change:]
                ok = np.flatnonzero(after >= 0.98)
                rec = {
                    "reference": "best fixed of the phase" if not pol.contextual else "per-request oracle",
                    "pct_ref_before": float(
                        100 * e[change - 1000 : change].sum() / ref[change - 1000 : change].sum()
                    ),
                    "pct_ref_at_1000_after": float(
                        100 * e[change + 750 : change + 1000].sum() / ref[change + 750 : change + 1000].sum()
                    ),
                    "pct_ref_first_1000_after": float(
                        100 * e[change : change + 1000].sum() / ref[change : change + 1000].sum()
                    ),
                    "pct_oracle_after": float(100 * e[change:].sum() / best[change:].sum()),
                    "recovery_requests": None if ok.size == 0 else int(ok[0]),
                }
                out.setdefault(kind, {}).setdefault(name, []).append(rec)
                curves.setdefault(kind, {}).setdefault(name, []).append(rolling_ratio(e, best))
    summary: dict[str, Any] = {}
    for kind, pols in out.items():
        summary[kind] = {}
        for name, recs in pols.items():
            rv = [r["recovery_requests"] for r in recs]
            summary[kind][name] = {
                "reference": recs[0]["reference"],
                **{
                    k: float(np.mean([r[k] for r in recs]))
                    for k in (
                        "pct_ref_before",
                        "pct_ref_at_1000_after",
                        "pct_ref_first_1000_after",
                        "pct_oracle_after",
                    )
                },
                "recovery_requests": rv,
            }
    summary["_curves"] = {k: {n: np.mean(v, axis=0) for n, v in d.items()} for k, d in curves.items()}
    return summary


# ---------------------------------------------------------------------------------- report
def plots(results: dict[str, Any], drift_res: dict[str, Any] | None, folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    keys = [k for k in results if k.startswith("cpu-small")]
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4.2), squeeze=False)
    show = ["best fixed", "head", "neural-linear", "linucb", "lints", "squarecb", "ucb", "ts"]
    for ax, key in zip(axes[0], keys):
        curves = results[key]["_curves"]
        t = np.arange(1, STREAM + 1)
        for name in show:
            if name in curves:
                ax.plot(t, curves[name], label=name, lw=1.6 if name == "neural-linear" else 1.0)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("request")
        ax.set_ylabel("cumulative pseudo-regret (tok/s summed)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = folder / "policies_regret.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(str(path))
    if drift_res is not None:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
        for ax, kind in zip(axes, ("domain-mix", "load")):
            for name, c in drift_res["_curves"][kind].items():
                if not any(s in name for s in ("linucb", "neural-linear", "ts (window")):
                    continue
                ax.plot(np.arange(WINDOW, WINDOW + len(c)), 100 * c, label=name, lw=1.0)
            ax.axvline(STREAM // 2, color="k", ls=":", lw=0.8)
            ax.set_ylim(80, 101)
            ax.set_title(f"drift: {kind} change at request {STREAM // 2}", fontsize=9)
            ax.set_xlabel(f"request (end of a {WINDOW}-request window)")
            ax.set_ylabel("% of per-request oracle (expected reward)")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        path = folder / "policies_drift.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--n-train", type=int, default=1000, help="requests in the head's training split")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plots", default=None, help="folder for the regret and drift plots")
    ap.add_argument("--no-drift", action="store_true")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, Any] = {}
    for scenario, shifted in (("cpu-small", 4), ("dflash-gpu", 16)):
        for batch in (1, shifted):
            key = f"{scenario}, batch {batch}" + (" (head trained at batch 1)" if batch != 1 else "")
            t0 = time.time()
            results[key] = stationary(scenario, args.n_train, batch, seeds)
            print(f"\n{key}  [{time.time() - t0:.0f}s]")
            print(
                f"  {'policy':24s} {'% oracle':>9s} {'min seed':>9s} {'last 1000':>10s} {'realised':>9s} {'regret exp.':>11s}"
            )
            for name, r in results[key]["policies"].items():
                print(
                    f"  {name:24s} {r['pct_oracle']:9.2f} {r['pct_oracle_min_seed']:9.2f} "
                    f"{r['pct_oracle_last1000']:10.2f} {r['pct_oracle_realised']:9.2f} {r['regret_exponent']:11.2f}"
                    + (f"   head weight {r['head_weight']}" if "head_weight" in r else "")
                    + (f"   block {r['block_size']}" if "block_size" in r else ""),
                    flush=True,
                )
    drift_res = None
    if not args.no_drift:
        t0 = time.time()
        drift_res = drift(seeds)
        for kind in ("domain-mix", "load", "load, batch size as a feature"):
            print(f"\ndrift: {kind} change at request {STREAM // 2}  [{time.time() - t0:.0f}s]")
            print(
                f"  {'policy':32s} {'reference':26s} {'before':>7s} {'1st 1000':>9s} {'750-1000':>9s} {'recovery (requests)':>20s}"
            )
            for name, r in drift_res[kind].items():
                print(
                    f"  {name:32s} {r['reference']:26s} {r['pct_ref_before']:7.2f} {r['pct_ref_first_1000_after']:9.2f} "
                    f"{r['pct_ref_at_1000_after']:9.2f} {str(r['recovery_requests']):>20s}",
                    flush=True,
                )
    if args.plots:
        for p in plots(results, drift_res, Path(args.plots)):
            print("wrote", p)
    if args.json:
        clean = {k: {kk: vv for kk, vv in v.items() if not kk.startswith("_")} for k, v in results.items()}
        if drift_res is not None:
            clean["drift"] = {k: v for k, v in drift_res.items() if not k.startswith("_")}
        Path(args.json).write_text(json.dumps(clean, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
