"""The warm plug-in's head scored offline on held-out vLLM traces, with ``train-head`` and ``simulate``.

The requests: ``adaptspec collect-vllm`` sets at several concurrencies, pooled with the load as
the plug-in sees it with ``"load_features": true`` (``adaptspec pool-vllm-traces``). For each of
``--splits`` random splits of the prompts (``--test-fraction`` held out, every load of a prompt
on the same side), the training requests are written as a trace set and
``adaptspec train-head`` trains a head on them (its defaults); ``adaptspec simulate`` then replays
the held-out requests (``--seeds`` shuffled orders) through:

- ``neural-linear:head=HEAD``: the warm plug-in's variant (the head, learning on as it serves);
- ``head:path=HEAD``: the head alone, frozen;
- the cold default (``cold_policy_spec``: what the plug-in runs with no variants, fed every block
  size its rounds reveal, as the plug-in's controllers are);
- the best fixed block size on the held-out requests, in hindsight (simulate's reference), and the per-load best
  fixed block size of the training requests (a per-batch-size table tuned on them: computed here,
  simulate has no such policy).

Per split: each policy's % of the per-request oracle and of the best fixed block size (simulate's
``pct_oracle`` and ``pct_best_fixed``, their means over the orders). Across splits: means and 95%
t-intervals (the splits share prompts: the intervals are narrower than independent samples would
give).

    python benchmarks/bench_vllm_warm.py --traces runs/c1 runs/c4 runs/c8
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm_features import interval, print_summary, score, split  # noqa: E402  (one definition of the split's figures)

RESULTS = Path(__file__).resolve().parent / "results"


def cli(argv: list[str]) -> str:
    """``adaptspec ARGV`` in this process; its stdout (a failure exits with its message)."""
    from adaptspec.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    if rc != 0:
        raise SystemExit(f"adaptspec {' '.join(argv)}: exit {rc}: {err.getvalue().strip()}")
    return out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", nargs="+", required=True, help="collect-vllm trace sets, one per concurrency")
    ap.add_argument("--splits", type=int, default=10)
    ap.add_argument("--test-fraction", type=float, default=0.3)
    ap.add_argument("--seeds", type=int, default=5, help="shuffled orders simulate replays each split in")
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm-warm.json")
    args = ap.parse_args()
    t0 = time.time()

    from adaptspec.control.policy_build import cold_policy_spec
    from adaptspec.reward.functions import trace_rewards
    from adaptspec.traces import load_traces
    from adaptspec.vllm.pool import with_load

    pooled = with_load([load_traces(t) for t in args.traces])
    arms = list(pooled.arms)
    cold = cold_policy_spec(arms)
    base = np.array([rid.rsplit("@c", 1)[0] for rid in pooled.request_ids])
    prompts = sorted(set(base))
    P = np.array([prompts.index(b) for b in base])
    R = trace_rewards(pooled, "token_latency")
    tokens, secs = np.clip(pooled.new_tokens_matrix() - 1, 0, None), pooled.decode_s_matrix()
    conc = pooled.column("concurrency")
    names = [
        "neural-linear (warm)",
        "head (frozen)",
        f"{cold} (cold default)",
        "best fixed",
        "per-load table",
    ]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for s in range(args.splits):
            held = split(len(prompts), s, args.test_fraction)  # the same splits as bench_vllm_features.py
            test, train = np.flatnonzero(np.isin(P, held)), np.flatnonzero(~np.isin(P, held))
            root = Path(tmp) / f"split{s}"
            pooled.subset(train).write(root / "train")
            pooled.subset(test).write(root / "test")
            cli(["train-head", str(root / "train"), "--out", str(root / "head"), "--seed", str(s), "--json"])
            head = root / "head"
            report = json.loads(
                cli(
                    [
                        "simulate",
                        str(root / "test"),
                        "--policy",
                        f"neural-linear:head={head}",
                        "--policy",
                        f"head:path={head}",
                        "--policy",
                        cold,
                        "--seeds",
                        str(args.seeds),
                        "--order",
                        "shuffled",
                        "--no-progress",
                        "--json",
                    ]
                )
            )
            pols = report["policies"]  # in the order of the --policy flags
            for name, p in zip(names[:3], pols[:3]):
                runs[name].append(
                    {
                        "pct_oracle": p["pct_oracle"],
                        "pct_best_fixed": p["pct_best_fixed"],
                        "policy": p["policy"],
                    }
                )
            runs["best fixed"].append(
                {
                    "pct_oracle": report["best_fixed"]["pct_oracle"],
                    "pct_best_fixed": 100.0,
                    "block_size": report["best_fixed"]["block_size"],
                }
            )
            table = np.array([int(np.argmax(R[train][conc[train] == c].sum(axis=0))) for c in conc[test]])
            m = score(table, R[test], tokens[test], secs[test])
            runs["per-load table"].append(
                {"pct_oracle": m["pct_oracle"], "pct_best_fixed": m["pct_best_fixed"]}
            )
            print(
                f"split {s}: " + ", ".join(f"{n} {runs[n][-1]['pct_oracle']:.1f}" for n in names), flush=True
            )
    summary = {
        n: {k: interval([r[k] for r in runs[n]]) for k in ("pct_oracle", "pct_best_fixed")} for n in names
    }
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "traces": [str(t) for t in args.traces],
        "requests": int(pooled.n_requests),
        "prompts": len(prompts),
        "arms": arms,
        "concurrency": pooled.meta["concurrency"],
        "splits": args.splits,
        "test_fraction": args.test_fraction,
        "orders_per_split": args.seeds,
        "reward": "token_latency",
        "summary": summary,
        "runs": runs,
        "wall_s": round(time.time() - t0, 1),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print_summary(summary, names, 28)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
