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
half; every other row is on the held-out half too.

The per-request oracle over fixed sizes and the rules bounds a per-request bandit that picks a
rule, or a rule's parameter, for each request. Two more rows say where the per-round oracle's
headroom is. The **first-draft oracle** drafts
B = 4 every round except where the first draft would be rejected, where it takes a plain step
(clairvoyant: it reads the dense trace). The **learned pre-draft skip** is the realistic
version of it: a logistic model of "the first draft will be accepted" from what is known
before drafting (the rounds so far and the last drafted block's confidences past the point
where it was rejected), fitted on the B = 4 rounds of the training half. It takes a plain step
when the predicted probability is below a threshold chosen on the training half for each
profile. Results: benchmarks/results/rounds.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from adaptspec.costs.latency import get_profile
from adaptspec.schedules import AcceptanceHistory, ConfidenceThreshold
from adaptspec.simulators.rounds import evaluate_rounds
from adaptspec.traces.dense import DenseTraceSet, replay_rounds

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


class FirstDraftOracle:
    """B = ``block_size`` every round, a plain step where the first draft would be rejected (clairvoyant)."""

    uses_confidence = False

    def __init__(self, request, block_size: int = 4) -> None:
        self.accept, self.b = request.accept, block_size

    def draft_size(self, rounds) -> int:
        m = 1 + sum(r.tau for r in rounds)
        return 1 if self.accept[m - 1, 0] == 0 else self.b

    def verify_size(self, confidence, rounds) -> int:
        return len(confidence) + 1


def predraft_features(request, rounds) -> np.ndarray:
    """What is known before drafting the next round: the rounds so far, and the drafter's top-1
    probabilities of the last drafted block past the draft that was rejected (stored for the
    largest block of the dense set)."""
    drafted = [i for i, r in enumerate(rounds) if r.draft_size > 1]
    if not drafted:
        return np.array([1.0, 0.0, 0.0, 0.35, 0.5, 0.5, 0.0, np.log1p(len(rounds))])
    i = drafted[-1]
    last, start = rounds[i], 1 + sum(r.tau for r in rounds[:i])
    j, width = last.tau - 1, request.top1.shape[1]
    rejected = request.top1[start - 1, j] if j < width else 0.5
    further = request.top1[start - 1, j + 1] if j + 1 < width else 0.5
    acc = np.mean([rounds[k].tau - 1 for k in drafted[-4:]])
    return np.array(
        [
            1.0,
            j,
            float(j == last.block_size - 1),
            acc,
            further,
            rejected,
            np.log1p(len(rounds) - 1 - i),
            np.log1p(len(rounds)),
        ]
    )


class PreDraftSkip:
    """B = ``block_size``, or a plain step when the predicted chance that the first draft is
    accepted is below ``threshold``; ``collect`` (a list) records (features, accepted) instead."""

    uses_confidence = False

    def __init__(self, request, w=None, threshold: float = 0.0, block_size: int = 4, collect=None) -> None:
        self.req, self.w, self.t, self.b, self.collect = request, w, threshold, block_size, collect

    def draft_size(self, rounds) -> int:
        f = predraft_features(self.req, rounds)
        if self.collect is not None:
            m = 1 + sum(r.tau for r in rounds)
            self.collect.append((f, float(self.req.accept[m - 1, 0] >= 1)))
            return self.b
        return 1 if 1.0 / (1.0 + np.exp(-f @ self.w)) < self.t else self.b

    def verify_size(self, confidence, rounds) -> int:
        return len(confidence) + 1


def fit_predraft(train, max_new_tokens: int, ridge: float = 1e-3) -> tuple[np.ndarray, dict]:
    """Logistic weights for "the first draft is accepted", their in-sample AUC and the range of
    their predicted probabilities."""
    from scipy.optimize import minimize
    from scipy.stats import rankdata

    data: list = []
    for _, _, req in train:
        replay_rounds(req, PreDraftSkip(req, collect=data), max_new_tokens)
    x, y = np.array([d[0] for d in data]), np.array([d[1] for d in data])

    def loss(w):
        z = x @ w
        return np.sum(np.logaddexp(0.0, z) - y * z) + ridge * w @ w, x.T @ (
            1 / (1 + np.exp(-z)) - y
        ) + 2 * ridge * w

    w = minimize(loss, np.zeros(x.shape[1]), jac=True, method="L-BFGS-B").x
    ranks, pos = rankdata(x @ w), int(y.sum())
    p = 1 / (1 + np.exp(-x @ w))
    return w, {
        "auc": float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos))),
        "rounds": len(y),
        "accepted": float(y.mean()),
        "p_min": float(p.min()),
        "p_max": float(p.max()),
    }


def pick_threshold(train, w, prof, batch: int, max_new_tokens: int) -> float:
    """The skip threshold that is fastest on the training half."""

    def speed(t):
        rep = evaluate_rounds(
            train,
            {},
            prof,
            fixed=[4],
            batch=batch,
            max_new_tokens=max_new_tokens,
            choose={"skip": lambda rid, req: PreDraftSkip(req, w, t)},
        )
        return rep.speedup("skip")

    return max((0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35), key=speed)


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
    test = [items[i] for i in order[len(items) // 2 :]]
    weights = fit_learned(train, ds.max_new_tokens)
    w_skip, fit = fit_predraft(train, ds.max_new_tokens)
    print(
        f"pre-draft model of first-draft acceptance ({fit['rounds']} rounds of B = 4, {100 * fit['accepted']:.0f}% "
        f"accepted): in-sample AUC {fit['auc']:.3f}, predictions {fit['p_min']:.2f}-{fit['p_max']:.2f}"
    )
    results = {
        "dense": args.dense,
        "requests": len(items),
        "held_out": len(test),
        "seed": args.seed,
        "predraft_model": fit,
        "profiles": [],
    }
    t0 = time.perf_counter()
    for name, batch in PROFILES:
        prof = get_profile(name)
        schedules = {
            "confidence:0.3": ConfidenceThreshold(0.3),
            "confidence:0.4": ConfidenceThreshold(0.4),
            "confidence:0.5": ConfidenceThreshold(0.5),
            "history": AcceptanceHistory(4, 16),
            "history,probe_after=4": AcceptanceHistory(4, 16, probe_after=4),
            "learned per-round (ridge, history features)": LearnedRounds(weights, prof, batch),
        }
        t_skip = pick_threshold(train, w_skip, prof, batch, ds.max_new_tokens)
        skip = f"learned pre-draft skip (logistic, threshold {t_skip})"
        choose = {
            "first-draft oracle (B = 4, plain where the first draft fails)": lambda rid, req: (
                FirstDraftOracle(req)
            ),
            skip: lambda rid, req: PreDraftSkip(req, w_skip, t_skip),
        }
        rep = evaluate_rounds(
            test, schedules, prof, batch=batch, max_new_tokens=ds.max_new_tokens, choose=choose
        )
        best = rep.best_fixed()
        # the bound of a per-request bandit that picks a rule (and its parameter) for each request
        both = "per-request oracle over fixed sizes and the rules"
        pool = [k for k in rep.seconds if k == "plain" or k.startswith("fixed:")] + list(schedules)
        rep.seconds[both] = np.min(np.stack([rep.seconds[k] for k in pool]), axis=0)
        names = [
            "plain",
            best,
            *schedules,
            skip,
            "per-request oracle",
            both,
            *list(choose)[:1],
            "per-round oracle",
        ]
        rows = rep.table(names)
        for row in rows:
            row["headroom_captured"] = (
                rep.headroom_captured(row["schedule"]) if row["schedule"] != "plain" else None
            )
        results["profiles"].append({"profile": name, "batch": batch, "best_fixed": best, "rows": rows})
        print(f"\n{name}, batch {batch}: held-out {len(test)} of {len(items)} requests; tok/s over plain")
        doms = rep.domain_names()
        print(f"| schedule | all | {' | '.join(doms)} | share of the per-round headroom |")
        print("|---|---:|" + "---:|" * len(doms) + "---:|")
        for row in rows:
            h = row["headroom_captured"]
            print(
                f"| {row['schedule']} | {row['all']:.3f} | "
                + " | ".join(f"{row[d]:.3f}" for d in doms)
                + f" | {'' if h is None else f'{100 * h:+.0f}%'} |"
            )
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
