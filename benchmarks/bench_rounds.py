"""Per-round schedules against fixed block sizes and both oracles, replayed on dense traces.

    python benchmarks/bench_rounds.py [--dense datasets/dense/benchmarks-fast]

For each latency profile (the measured CPU one, and the H100 roofline at batch 1, 8 and 32)
it replays, on every request of the dense set of the public benchmark prompts: plain decoding,
every fixed block size, the confidence-threshold and acceptance-history schedules, a learned
per-round rule, and the per-request and per-round oracles. The learned rule is lever (c) of
issue 16 measured offline: a ridge regression per block size predicting the accepted drafts
of the next round from in-request history only (the last drafted round's acceptance, the run
of plain steps, the round index), fitted on rounds of a random schedule over one half of the
requests (split by seed) and used greedily (fastest predicted tokens per second) on the other
half; every other row is on the held-out half too. Results: benchmarks/results/rounds.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from adaptspec.dense import DenseTraceSet, replay_rounds
from adaptspec.latency import get_profile
from adaptspec.schedules import AcceptanceHistory, ConfidenceThreshold
from adaptspec.simulators.rounds import evaluate_rounds

RESULTS = Path(__file__).resolve().parent / "results"
PROFILES = [("cpu-smollm2-fast", 1), ("h100-qwen3-8b", 1), ("h100-qwen3-8b", 8), ("h100-qwen3-8b", 32)]
LEARNED_ARMS = (1, 2, 3, 4, 6, 8)


def history_features(rounds) -> np.ndarray:
    drafted = [r for r in rounds if r.draft_size > 1]
    f = [1.0]
    if drafted:
        last = drafted[-1]
        acc = np.array([r.tau - 1 for r in drafted[-4:]], dtype=float)
        f += [last.tau - 1, float(last.tau == last.block_size), acc.mean(), float((acc > 0).mean())]
    else:
        f += [0.0, 0.0, 0.3, 0.3]
    plain = 0
    for r in reversed(rounds):
        if r.draft_size != 1:
            break
        plain += 1
    return np.array(f + [float(plain > 0), np.log1p(plain), np.log1p(len(rounds))])


class _Random:
    uses_confidence = False

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def draft_size(self, rounds) -> int:
        return int(self.rng.choice(LEARNED_ARMS))

    def verify_size(self, confidence, rounds) -> int:
        return len(confidence) + 1


class LearnedRounds:
    """Greedy on predicted tokens per second: ridge predictions of accepted drafts per block size."""

    uses_confidence = False

    def __init__(self, weights: dict[int, np.ndarray], profile, batch: int = 1, context: int = 300) -> None:
        self.w, self.p, self.batch, self.ctx = weights, profile, batch, context

    def draft_size(self, rounds) -> int:
        f = history_features(rounds)
        p, c, n = self.p, self.ctx, self.batch
        speed = {1: 1.0 / float(p.verify_s(1, c, n))}
        for b, w in self.w.items():
            speed[b] = (1.0 + max(0.0, float(f @ w))) / float(p.draft_s(b, c, n) + p.verify_s(b, c, n))
        return max(speed, key=speed.get)

    def verify_size(self, confidence, rounds) -> int:
        return len(confidence) + 1


def fit_learned(train, max_new_tokens: int, ridge: float = 0.1) -> dict[int, np.ndarray]:
    xs = {b: [] for b in LEARNED_ARMS[1:]}
    ys = {b: [] for b in LEARNED_ARMS[1:]}
    for k, (_, _, req) in enumerate(train):
        for rep in range(3):
            rounds = replay_rounds(req, _Random(10 * k + rep), max_new_tokens)
            for i, r in enumerate(rounds):
                if r.draft_size in xs:  # (blocks shortened at the end are left out)
                    xs[r.draft_size].append(history_features(rounds[:i]))
                    ys[r.draft_size].append(r.tau - 1)
    out = {}
    for b in xs:
        x, y = np.array(xs[b]), np.array(ys[b], dtype=float)
        out[b] = np.linalg.solve(x.T @ x + ridge * np.eye(x.shape[1]), x.T @ y)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dense", default="datasets/dense/benchmarks-fast")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "rounds.json"))
    args = ap.parse_args()
    ds = DenseTraceSet.open(args.dense)
    items = [(rid, dom.split("/")[0], r) for rid, dom, r in ds.requests()]
    order = np.random.default_rng(args.seed).permutation(len(items))
    train = [items[i] for i in order[: len(items) // 2]]
    test = [items[i] for i in order[len(items) // 2:]]
    weights = fit_learned(train, ds.max_new_tokens)
    results = {"dense": args.dense, "requests": len(items), "held_out": len(test), "seed": args.seed, "profiles": []}
    t0 = time.perf_counter()
    for name, batch in PROFILES:
        prof = get_profile(name)
        schedules = {
            "confidence:0.3": ConfidenceThreshold(0.3), "confidence:0.4": ConfidenceThreshold(0.4),
            "confidence:0.5": ConfidenceThreshold(0.5), "history": AcceptanceHistory(4, 16),
            "history,probe_after=4": AcceptanceHistory(4, 16, probe_after=4),
            "learned per-round (ridge, history features)": LearnedRounds(weights, prof, batch),
        }
        rep = evaluate_rounds(test, schedules, prof, batch=batch, max_new_tokens=ds.max_new_tokens)
        best = rep.best_fixed()
        names = ["plain", best, *schedules, "per-request oracle", "per-round oracle"]
        rows = rep.table(names)
        for row in rows:
            row["headroom_captured"] = rep.headroom_captured(row["schedule"]) if row["schedule"] != "plain" else None
        results["profiles"].append({"profile": name, "batch": batch, "best_fixed": best, "rows": rows})
        print(f"\n{name}, batch {batch}: held-out {len(test)} of {len(items)} requests; tok/s over plain")
        doms = rep.domain_names()
        print(f"| schedule | all | {' | '.join(doms)} | share of the per-round headroom |")
        print("|---|---:|" + "---:|" * len(doms) + "---:|")
        for row in rows:
            h = row["headroom_captured"]
            print(f"| {row['schedule']} | {row['all']:.3f} | " + " | ".join(f"{row[d]:.3f}" for d in doms)
                  + f" | {'' if h is None else f'{100 * h:+.0f}%'} |")
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
