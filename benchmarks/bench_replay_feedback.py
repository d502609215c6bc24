"""The cold default replayed as the controller feeds it (issue 46, item 10).

For every shipped trace set with per-round taus, the cold default ``fi-ucb`` over shuffled
streams (one seed per order), as a share of the best fixed block size (the best on the whole
set, on the same requests) over the first 48 and the first 240 requests:

- ``simulate, bandit feedback``: ``replay(..., feedback="bandit")``, what ``adaptspec simulate``
  reported before (every policy fed the chosen arm's reward only);
- ``simulate``: ``replay(...)`` as it runs now (full feedback, priced by the controller's pricer on
  the costs measured from the rounds as they are served, the controller's default);
- ``simulate --latency (same profile)``: the same priced on the trace set's latency profile (else
  the controller's default profile), as ``simulate --latency PROFILE``;
- ``controller, same profile``: a real :class:`~adaptspec.control.AdaptiveController` (policy
  ``fi-ucb``, ``latency=`` that profile) serving the trace rows in the same order, each update
  applied before the next decision (a speculator that returns the trace row of the block size
  asked, read here from the Parquet files);
- ``controller, default``: the same with no ``latency`` (the controller's default: counterfactual
  rounds priced on the costs measured from the rounds' own draft and verify times).

    python benchmarks/bench_replay_feedback.py                      # 10 seeds, every shipped set
    python benchmarks/bench_replay_feedback.py --seeds 5 --out benchmarks/results/replay-feedback.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from adaptspec.analysis.statistics import mean_interval
from adaptspec.control import AdaptiveController
from adaptspec.reward.functions import pct_of
from adaptspec.reward.pricing import DEFAULT_PROFILE
from adaptspec.simulators.replay import finite_rewards, replay, stream_order
from adaptspec.speculator import Outcome, Prefill, Round
from adaptspec.traces import load_traces

SETS = Path(__file__).resolve().parents[1] / "adaptspec" / "data" / "traces"
HORIZONS = (48, 240)


class TraceSpeculator:
    """Decodes request ``prompt_ids[0]`` as its trace row at the block size asked went."""

    def __init__(self, path: Path, ids: list[str], limit: int) -> None:
        rows = pq.read_table(path / "outcomes.parquet").to_pylist()
        self.rows = {(r["request_id"], r["block_size"]): r for r in rows}
        req = pq.read_table(path / "requests.parquet")
        self.prompt = dict(zip(req.column("request_id").to_pylist(), req.column("prompt_tokens").to_pylist()))
        self.ids, self.limit = ids, limit
        self.max_block_size = max(b for _, b in self.rows)

    def prefill(self, prompt_ids, temperature=0.0, seed=None):
        rid = self.ids[prompt_ids[0]]
        return Prefill(0, int(self.prompt[rid]), np.zeros(1, np.float32), state=rid)

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        row = self.rows[(prefill.state, int(block_size))]
        rounds, made = [], 1
        for tau, d_ms, v_ms in zip(row["tau"], row["draft_ms"], row["verify_ms"]):
            rounds.append(Round(min(int(block_size), self.limit - made), tau, d_ms / 1000, v_ms / 1000))
            made += tau
        return Outcome(
            [0] * row["new_tokens"],
            rounds,
            row["decode_ms"] / 1000,
            "length" if row["new_tokens"] == self.limit else "eos",
        )


def controller_rewards(path: Path, ts, idx: np.ndarray, latency: str | None, seed: int) -> np.ndarray:
    """The rewards an AdaptiveController running fi-ucb earns serving ``idx`` in order."""
    limit = int(ts.meta["max_new_tokens"])
    spec = TraceSpeculator(path, ts.request_ids.tolist(), limit)
    out = np.empty(len(idx))
    with AdaptiveController(
        spec,
        "fi-ucb",
        arms=ts.arms,
        reward="token_latency",
        latency=latency,
        seed=seed,
        decide_on_caller=True,
        decide_timeout_s=60.0,
    ) as c:
        for t, i in enumerate(idx.tolist()):
            out[t] = c.generate([i], max_new_tokens=limit).reward
            c.sync()
    return out


def ci(values: list[float]) -> dict[str, float]:
    v = np.asarray(values)
    lo, hi = mean_interval(v, 0.95) or (float(v.mean()), float(v.mean()))
    return {
        "mean": round(float(v.mean()), 3),
        "lo": round(float(lo), 3),
        "hi": round(float(hi), 3),
        "values": [round(float(x), 3) for x in v],
    }


def run_set(path: Path, seeds: list[int]) -> dict:
    ts = load_traces(path)
    R = finite_rewards(ts, "token_latency")
    fixed = int(np.argmax(R.mean(axis=0)))
    profile = ts.meta.get("latency_profile") or DEFAULT_PROFILE
    T = max(HORIZONS)
    got: dict[str, dict[int, list[float]]] = {}

    def add(name: str, idx: np.ndarray, r: np.ndarray) -> None:
        for h in HORIZONS:
            got.setdefault(name, {}).setdefault(h, []).append(
                float(pct_of(r[:h].sum(), R[idx[:h], fixed].sum()))
            )

    t0 = time.perf_counter()
    for seed in seeds:
        idx = stream_order(ts, "shuffled", seed, T)
        for name, mode, lat in (
            ("simulate, bandit feedback", "bandit", None),
            ("simulate", "auto", None),
            ("simulate --latency (same profile)", "auto", profile),
        ):
            rep = replay(
                ts,
                ["fi-ucb"],
                reward="token_latency",
                latency=lat,
                seeds=[seed],
                order="shuffled",
                n_steps=T,
                progress=False,
                feedback=mode,
            )
            a = rep.policies[0].chosen.astype(np.int64)
            add(name, idx, R[idx, a])
        add("controller, same profile", idx, controller_rewards(path, ts, idx, profile, seed))
        add("controller, default (measured costs)", idx, controller_rewards(path, ts, idx, None, seed))
    return {
        "traces": str(path.relative_to(SETS.parents[2])),
        "requests": ts.n_requests,
        "arms": list(ts.arms),
        "best_fixed": int(ts.arms[fixed]),
        "profile": profile,
        "seconds": round(time.perf_counter() - t0, 1),
        "pct_best_fixed": {name: {str(h): ci(v) for h, v in by_h.items()} for name, by_h in got.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--sets", default="benchmarks,templates,sampled-t1")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?"
    )
    flags = next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo") if ln.startswith("flags")), [])
    res = {
        "host": {"cpu": cpu, "avx512_bf16": "avx512_bf16" in flags, "python": platform.python_version()},
        "reward": "token_latency",
        "order": "shuffled",
        "seeds": args.seeds,
        "horizons": list(HORIZONS),
        "sets": [run_set(SETS / s, list(range(args.seeds))) for s in args.sets.split(",")],
    }
    for s in res["sets"]:
        print(
            f"{s['traces']} ({s['requests']} requests, best fixed B={s['best_fixed']}, priced on {s['profile']}, "
            f"{s['seconds']} s):"
        )
        for name, by_h in s["pct_best_fixed"].items():
            print(
                f"  {name:38s} "
                + "  ".join(f"{h}: {v['mean']:.2f} [{v['lo']:.2f}, {v['hi']:.2f}]" for h, v in by_h.items())
            )
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
