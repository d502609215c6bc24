"""Which context predicts the best block size better, on trace sets collected from vLLM (issue 45 item 2).

The requests: ``adaptspec collect-vllm`` sets of the same prompts at several concurrencies (every
block size run in vLLM through the plug-in, each request's decode time measured there), pooled
as the plug-in sees them with ``load_features`` (:mod:`adaptspec.vllm.pool`). For every prompt
two contexts are compared, each followed by the same load features:

- ``prompt+load``: the plug-in's own context, statistics of the prompt's tokens
  (:mod:`adaptspec.vllm.features`; what vLLM's scheduler can see);
- ``hidden+load``: the target's prefill representation, the context adaptspec's own decoder gives
  its policies (:mod:`adaptspec.decoding.features`: the last layer's last position, the middle
  layer's mean, log length; 1,153 values), computed offline by adaptspec's ``TargetModel`` on the
  same target weights (float32, as vLLM ran them) and the same token ids, reduced as ``train-head``
  reduces it (standardised, whitened PCA to 32 components fitted on the training prompts, the
  log length kept). vLLM cannot bring these to its scheduler (docs/vllm.md, "Features");

and as references ``load`` (the load features alone: one block size per load, what a
per-batch-size table can do), ``none`` (the best fixed block size of the training requests) and
``hidden+prompt+load``.

The same learner for every context: adaptspec's offline head (``train_head``, regression of every
block size's reward, the ``train-head`` defaults), its choice the block size of the highest
predicted reward. Splits: ``--splits`` random splits of the prompts (``--test-fraction`` held out;
every load of a prompt on the same side), the same splits for every context. Per split, on the
held-out requests: % of the per-request oracle's speed and of the best fixed block size's (the
best on those requests in hindsight), as the replay reports them (``pct_of`` of the summed
``token_latency`` rewards), and the aggregate tokens a second against the best fixed's. Across
splits: means and 95% t-intervals, and each context's paired difference from ``prompt+load``.
The splits share prompts, so the intervals are narrower than independent samples would give.

Each prompt's token ids are rebuilt from its request id (``domain-NNNN``: the public benchmark
prompts' order) in the target's chat template, and checked: their count and the plug-in features
they give equal what the trace set stored.

    python benchmarks/bench_vllm_features.py --traces runs/c1 runs/c4 runs/c8 --target /work/vx/target
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
CONTEXTS = ("none", "load", "prompt+load", "hidden+load", "hidden+prompt+load")


def prompt_ids_of(request_ids, target):
    """Token ids of each base request id (``domain-NNNN``), in the target's chat template."""
    from adaptspec.models.prompts import benchmark_prompts

    prompts = benchmark_prompts()
    out = {}
    for rid in request_ids:
        i = int(rid.rsplit("-", 1)[1])
        if prompts[i].domain != rid.rsplit("-", 1)[0]:
            raise SystemExit(
                f"request {rid}: prompt {i} of the benchmark set is {prompts[i].domain}, not its domain"
            )
        out[rid] = target.encode_chat(prompts[i].prompt)
    return out


def hidden_features(ids_by_prompt, target):
    """The target's prefill features of every prompt (adaptspec.decoding.features' default spec)."""
    return {
        rid: np.asarray(target.prefill(ids).features, dtype=np.float64) for rid, ids in ids_by_prompt.items()
    }


def contexts(name, train, test, P, H, L, Xp):
    """(train X, test X) of context ``name``; ``P`` prompt index of each request, ``H`` hidden
    features by prompt index, ``L`` load features, ``Xp`` prompt features, per request."""
    from adaptspec.policies.featurizer import Featurizer

    parts_tr, parts_te = [], []
    if "hidden" in name:
        f = Featurizer.fit(H[np.unique(P[train])], dim=32, keep=[-1])  # on the training prompts, each once
        parts_tr.append(f.transform(H[P[train]]))
        parts_te.append(f.transform(H[P[test]]))
    if "prompt" in name:
        parts_tr.append(Xp[train])
        parts_te.append(Xp[test])
    if "load" in name:
        parts_tr.append(L[train])
        parts_te.append(L[test])
    return np.concatenate(parts_tr, axis=1), np.concatenate(parts_te, axis=1)


def score(choice, R, tokens, secs):
    """% of the per-request oracle and of the best fixed (hindsight), and aggregate tok/s over the
    best fixed's, of ``choice`` (arm index per request) on rewards ``R`` (token_latency)."""
    from adaptspec.reward.functions import pct_of

    rows = np.arange(len(R))
    r = R[rows, choice].sum()
    fixed = int(np.argmax(R.sum(axis=0)))
    rate = tokens[rows, choice].sum() / secs[rows, choice].sum()
    best_rate = (tokens.sum(axis=0) / secs.sum(axis=0)).max()
    return {
        "pct_oracle": float(pct_of(r, R.max(axis=1).sum())),
        "pct_best_fixed": float(pct_of(r, R[:, fixed].sum())),
        "throughput_vs_best_fixed": float(rate / best_rate),
    }


def split(n_prompts, s, test_fraction):
    """Split ``s``'s held-out prompts (indices, sorted): a seeded ``test_fraction`` of them, at least one
    and never all."""
    rng = np.random.default_rng(1000 + s)
    k = min(max(1, round(test_fraction * n_prompts)), n_prompts - 1)
    return np.sort(rng.permutation(n_prompts)[:k])


def interval(values):
    from adaptspec.analysis.statistics import mean_interval

    x = np.asarray(values, dtype=np.float64)
    ci = mean_interval(x, 0.95)
    return {"mean": float(x.mean()), "ci95": None if ci is None else [round(ci[0], 3), round(ci[1], 3)]}


def print_summary(summary: dict, names, width: int) -> None:
    """One line a context or policy: its % of the per-request oracle and of the best fixed size, with intervals."""
    for name in names:
        s_ = summary[name]
        print(
            f"{name:{width}s} {s_['pct_oracle']['mean']:.1f}% of oracle {s_['pct_oracle']['ci95']}, "
            f"{s_['pct_best_fixed']['mean']:.1f}% of best fixed {s_['pct_best_fixed']['ci95']}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", nargs="+", required=True, help="collect-vllm trace sets, one per concurrency")
    ap.add_argument("--target", required=True, help="the target vLLM ran (a Hugging Face directory)")
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--test-fraction", type=float, default=0.3)
    ap.add_argument("--epochs", type=int, default=300)
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm-features.json")
    args = ap.parse_args()
    t_start = time.time()

    import torch

    from adaptspec.decoding.target import TargetModel
    from adaptspec.policies.offline_head import train_head
    from adaptspec.reward.functions import trace_rewards
    from adaptspec.traces import load_traces
    from adaptspec.vllm.features import prompt_features
    from adaptspec.vllm.pool import with_load

    torch.set_num_threads(1)
    sets = [load_traces(t) for t in args.traces]
    pooled = with_load(sets)
    base = np.array([rid.rsplit("@c", 1)[0] for rid in pooled.request_ids])
    prompts = sorted(set(base))
    P = np.array([prompts.index(b) for b in base])
    target = TargetModel(args.target, dtype="float32")
    ids = prompt_ids_of(prompts, target)
    for j, rid in enumerate(pooled.request_ids):  # the rebuilt ids are the ones vLLM ran
        b = base[j]
        if len(ids[b]) != pooled.prompt_tokens[j] or not np.allclose(
            prompt_features(ids[b]), pooled.features[j, :6]
        ):
            raise SystemExit(f"request {rid}: the rebuilt prompt is not the one collected")
    H = np.stack(
        [v for _, v in sorted(hidden_features(ids, target).items(), key=lambda kv: prompts.index(kv[0]))]
    )
    Xp, L = pooled.features[:, :6].astype(np.float64), pooled.features[:, 6:].astype(np.float64)
    R = trace_rewards(pooled, "token_latency")
    tokens = np.clip(pooled.new_tokens_matrix() - 1, 0, None)
    secs = pooled.decode_s_matrix()
    conc = pooled.column("concurrency")
    arms = list(pooled.arms)

    runs = {c: [] for c in CONTEXTS}
    refs = {"oracle_over_best_fixed": [], "table_over_best_fixed_pct": []}
    for s in range(args.splits):
        held = split(len(prompts), s, args.test_fraction)
        test = np.flatnonzero(np.isin(P, held))
        train = np.flatnonzero(~np.isin(P, held))
        for name in CONTEXTS:
            if name == "none":
                choice = np.full(len(test), int(np.argmax(R[train].sum(axis=0))))
            else:
                Xtr, Xte = contexts(name, train, test, P, H, L, Xp)
                head = train_head(Xtr, R[train], arms, max_epochs=args.epochs, seed=s)
                choice = head.scores(Xte).argmax(axis=1)
            m = score(choice, R[test], tokens[test], secs[test])
            m["accuracy"] = float(np.mean(choice == R[test].argmax(axis=1)))
            m["chosen"] = {str(arms[a]): int(n) for a, n in zip(*np.unique(choice, return_counts=True))}
            runs[name].append(m)
        # the per-load best fixed of the training requests (a per-batch-size table), on the held-out ones
        table = np.array([int(np.argmax(R[train][conc[train] == c].sum(axis=0))) for c in conc[test]])
        refs["table_over_best_fixed_pct"].append(
            score(table, R[test], tokens[test], secs[test])["pct_best_fixed"]
        )
        refs["oracle_over_best_fixed"].append(
            score(R[test].argmax(axis=1), R[test], tokens[test], secs[test])["pct_best_fixed"]
        )
        print(
            f"split {s}: " + ", ".join(f"{n} {runs[n][-1]['pct_oracle']:.1f}" for n in CONTEXTS), flush=True
        )

    summary = {}
    for name in CONTEXTS:
        summary[name] = {
            k: interval([r[k] for r in runs[name]])
            for k in ("pct_oracle", "pct_best_fixed", "throughput_vs_best_fixed", "accuracy")
        }
        summary[name]["minus_prompt_load_pct_oracle"] = interval(
            [a["pct_oracle"] - b["pct_oracle"] for a, b in zip(runs[name], runs["prompt+load"])]
        )
    summary["per_request_oracle_pct_best_fixed"] = interval(refs["oracle_over_best_fixed"])
    summary["per_load_table_pct_best_fixed"] = interval(refs["table_over_best_fixed_pct"])
    per_level = {}
    for c in sorted(set(conc.tolist())):
        rows = conc == c
        per_level[str(c)] = {
            "requests": int(rows.sum()),
            "best_fixed": int(arms[int(np.argmax(R[rows].sum(axis=0)))]),
            "tokens_per_s_by_block_size": dict(
                zip(map(str, arms), (tokens[rows].sum(0) / secs[rows].sum(0)).round(3).tolist())
            ),
            "oracle_pct_best_fixed": score(R[rows].argmax(axis=1), R[rows], tokens[rows], secs[rows])[
                "pct_best_fixed"
            ],
        }
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "traces": [str(t) for t in args.traces],
        "target": args.target,
        "requests": int(pooled.n_requests),
        "prompts": len(prompts),
        "arms": arms,
        "concurrency": pooled.meta["concurrency"],
        "splits": args.splits,
        "test_fraction": args.test_fraction,
        "reward": "token_latency",
        "learner": "adaptspec.policies.offline_head.train_head (regression, hidden 64,32, the train-head defaults)",
        "hidden_features": f"{target.feature_spec} ({H.shape[1]} values) -> standardise + whitened PCA 32, log length kept",
        "per_level": per_level,
        "summary": summary,
        "runs": runs,
        "references": refs,
        "wall_s": round(time.time() - t_start, 1),
        "load_average_at_end": list(os.getloadavg()),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print_summary(summary, CONTEXTS, 20)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
