"""Why the learned load rule's first cold and full-information versions chose short blocks: the
evidence, on the load simulator (the dense benchmark traces' odd half, the CPU batched profile).

    python benchmarks/bench_load_rule_diagnosis.py       # benchmarks/results/load-rule-diagnosis.json: ~10 s

For every fixed block size at 1 and 2 clients, each row's reward as the learned rule computes it
(its tokens over its attributed share, against its share of the modelled plain round):

- ``mean`` / ``sd``: over the whole run (the truth the rule should find; plain's sd is 0: a
  noise level pooled over the arms falls with every plain round);
- ``longer``: for the longer block sizes, the mean reward a full-information rule would learn
  from this run's rows that rejected a draft (tau < B: the longer block commits the same tau in
  a longer round), dropping the rows that accepted all of B (censored), against that size's own
  ``mean``: what learning longer sizes from the uncensored rows alone converges to.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from adaptspec.costs.latency import get_profile
from adaptspec.load_rules import Fixed
from adaptspec.reward.attribution import batch_round_s
from adaptspec.simulators.load_sim import simulate
from adaptspec.traces.dense import DenseTraceSet

ROOT = Path(__file__).resolve().parents[1]
ARMS = (1, 2, 3, 4, 6, 8)


class Probe(Fixed):
    """A fixed block size that records each row's reward as the learned rule computes it, and
    what each longer block size's round would have given the rows that rejected a draft."""

    def __init__(self, block_size: int, profile) -> None:
        super().__init__(block_size)
        self.profile, self.rewards, self.longer = profile, [], {a: [] for a in ARMS}

    def feedback(self, rows, block_sizes, taus, shares, load) -> None:
        n = len(rows)
        contexts = [r.context for r in rows]
        plain = float(self.profile.verify(1, 8 * (int(sum(contexts) / n) // 8) + 4, n))
        r = [t * plain / n / s for t, s in zip(taus, shares)]
        self.rewards += r
        b = self.block_size
        ran = batch_round_s(self.profile, [b] * n, contexts)
        for a in ARMS:
            if a > b:  # the rows that rejected a draft commit the same tau in a round at a
                ratio = batch_round_s(self.profile, [a] * n, contexts) / ran
                self.longer[a] += [t * plain / n / (s * ratio) for t, s in zip(taus, shares) if t < b]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dense", default=str(ROOT / "datasets/dense/benchmarks-fast"))
    ap.add_argument("--profile", default="cpu-smollm2-batched")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/load-rule-diagnosis.json"))
    args = ap.parse_args()
    prof = get_profile(args.profile)
    test = [r for _, _, r in DenseTraceSet.open(args.dense).requests()][1::2]
    out = {"profile": args.profile, "dense": args.dense, "levels": []}
    for clients in (1, 2):
        arms = {}
        for b in ARMS:
            p = Probe(b, prof)
            run = simulate(p, test, prof, clients=clients, requests=48, max_new_tokens=128)
            arms[b] = {
                "tokens_per_s": run.tokens_per_s,
                "mean": float(np.mean(p.rewards)),
                "sd": float(np.std(p.rewards)),
                "longer": {str(a): float(np.mean(v)) for a, v in p.longer.items() if v},
            }
        best = max(x["tokens_per_s"] for x in arms.values())
        for x in arms.values():
            x["over_best_fixed"] = x["tokens_per_s"] / best
        out["levels"].append({"clients": clients, "arms": {str(b): x for b, x in arms.items()}})
        print(
            f"{clients} client(s): B, tok/s over the best fixed size, mean reward (sd); learnt for B' > B "
            "from the rows that rejected (against B' own mean)"
        )
        for b, x in arms.items():
            longer = ", ".join(
                f"B'={a}: {v:.3f} ({arms[int(a)]['mean']:.3f})" for a, v in x["longer"].items()
            )
            print(f"  B={b}: {x['over_best_fixed']:.3f}, {x['mean']:.3f} ({x['sd']:.3f}); {longer}")
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
