"""The vLLM plug-in's hooks driven as vLLM's scheduler calls them, closed-loop clients, no engine.

Each client sends its next request when its last one ends; the request arrives after the step's
``cut`` (so the load rule chose for the others without it) and its prompt goes into the next step
beside the other requests' decode rows, as in vLLM, or, with probability ``--late`` (an HTTP round
trip longer than a step), into the step after it. Step times: the shipped profile
``vllm-cpu-smollm2`` (the logged medians of vLLM's steps on this CPU) at the step's widest block and
request count, plus 1 ms a prompt token, +-5% noise; acceptance per draft position as vLLM measured
it for the bundled pair (``vllm-tau.json``: 31% / 8.7% / 2.5% of drafts at positions 1-3 accepted),
then 30% a position. Prints, per run, the modelled tokens per second and the decode steps by request
count and widest block (steps with a prompt in them left out, as the rule leaves them).

What it is for: checking what the load rule learns from the turnover steps (a prompt beside decode
rows), which no offline simulator of adaptspec's own engine has. At 2 clients (seeds 0-2, the
defaults): at 94c0ad7, where the rule learnt those steps, it drew B = 7-9 on 14, 0 and 7 of the
10-22 level-1 decode steps of a run (vLLM's paired runs at 94246db: B = 8-9 on 3-25 steps a run); at
ff8f124, where they are left out, B = 4-6 on all but one (plain).

    python benchmarks/sim_vllm_turnover.py --clients 2 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import collections
import random
import tempfile

from adaptspec.costs.latency import get_profile
from adaptspec.vllm.config import plugin_settings
from adaptspec.vllm.plugin import AdaptspecPlugin

#: P(draft d accepted | drafts before it accepted), positions 1, 2, 3, then 0.3
ACCEPT = (0.31, 0.087 / 0.31, 0.025 / 0.087) + (0.3,) * 6


def run(
    clients: int,
    seed: int,
    requests_per_client: int,
    late: float,
    prompt: int = 150,
    tokens: int = 64,
    k: int = 8,
) -> tuple[collections.Counter, float]:
    """One run: decode steps by (requests, widest block), and modelled tokens a second."""
    profile = get_profile("vllm-cpu-smollm2")
    rng = random.Random(seed)
    p = AdaptspecPlugin(
        plugin_settings({"adaptspec": {"log_dir": tempfile.mkdtemp(), "seed": seed}}), k, "dflash"
    )
    left = dict.fromkeys(range(clients), requests_per_client)
    live: dict[str, list[int]] = {}  # request -> [client, tokens out, context]
    arriving: list[tuple[str, int]] = []
    later: list[int] = []  # clients whose next request arrives a step late
    sent = 0

    def arrive(c: int) -> None:
        nonlocal sent
        rid = f"r{sent}"
        sent += 1
        left[c] -= 1
        p.admit(rid, list(range(prompt)), None)
        arriving.append((rid, c))

    for c in range(clients):
        arrive(c)
    cut: dict[str, list[int]] = {}
    steps: collections.Counter = collections.Counter()
    seconds = 0.0
    try:
        while live or arriving or later:
            new, arriving[:] = list(arriving), []
            for c in later:
                arrive(c)
            later = []
            rows = [(rid, prompt, 0, 0, 0) for rid, _ in new]
            commits = {}
            for rid, (_, out, ctx) in live.items():
                d = len(cut.get(rid, []))
                accepted = 0
                while accepted < d and rng.random() < ACCEPT[accepted]:
                    accepted += 1
                commits[rid] = min(accepted + 1, tokens - out)
                rows.append((rid, 1 + d, ctx, d, commits[rid]))
            widest = max([1] + [1 + len(cut.get(r, [])) for r in live])
            step_s = (float(profile.verify(widest, 100, len(live))) if live else 0.0) + 0.001 * prompt * len(
                new
            )
            step_s *= rng.uniform(0.95, 1.05)
            seconds += step_s
            p.observe(rows, step_s)
            if live and not new:
                steps[(len(live), widest)] += 1
            for rid, c in new:
                live[rid] = [c, 1, prompt]
                p.decide(rid, 1, len(live), 0, tokens, 0.0)
            for rid, n in commits.items():
                live[rid][1] += n
                live[rid][2] += n
            for rid in [r for r, v in live.items() if v[1] >= tokens]:
                c = live.pop(rid)[0]
                p.finish(rid, list(range(tokens)), "length")
                if left[c] > 0 and rng.random() < late:
                    later.append(c)
                elif left[c] > 0:
                    arrive(c)
            cut = p.cut({rid: [7] * k for rid in live}, rows=len(live), queue=0)
    finally:
        p.close()
    return steps, sent * tokens / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[2])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--requests-per-client", type=int, default=12)
    ap.add_argument(
        "--late", type=float, default=0.5, help="how often a client's next request misses the next step"
    )
    args = ap.parse_args()
    for clients in args.clients:
        for seed in args.seeds:
            steps, speed = run(clients, seed, args.requests_per_client, args.late)
            by_rows: dict[int, dict[int, int]] = collections.defaultdict(dict)
            for (rows, block), n in sorted(steps.items()):
                by_rows[rows][block] = n
            print(
                f"{clients} clients, seed {seed}: {speed:.1f} tok/s modelled; decode steps by requests "
                f"-> {{widest block: steps}}: {dict(by_rows)}"
            )


if __name__ == "__main__":
    main()
