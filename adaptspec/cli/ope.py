"""``adaptspec ope LOGS --policy SPEC``: estimate a policy's value from a decision log.

Examples::

    adaptspec simulate --policy random --order shuffled --steps 5000 --log runs/log
    adaptspec ope runs/log --policy fixed:8 --policy linucb
    adaptspec ope runs/log --policy fixed:8 --estimator dr --reward-model mean --json
    adaptspec ope runs/log --policy fixed:8 --counterfactuals   # DM/DR learn every arm a row observed
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

import numpy as np

from ..errors import AdaptspecError
from ._types import float_range, int_range, seed

if TYPE_CHECKING:
    from ..traces import DecisionLog


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..analysis.ope import ESTIMATORS

    p.add_argument(
        "logs",
        metavar="LOGS",
        help="decision log: a directory of part-*.parquet files (a running server's, "
        "its journals' rows included), one Parquet file, or a directory of "
        "replicas' logs (read as ab-report reads them)",
    )
    p.add_argument(
        "--policy",
        action="append",
        required=True,
        metavar="SPEC",
        help="target policy spec, repeatable (evaluated as it is built: learning policies are not trained)",
    )
    p.add_argument(
        "--estimator",
        action="append",
        choices=ESTIMATORS,
        metavar="NAME",
        help=f"estimator, repeatable: {', '.join(ESTIMATORS)} (default: all)",
    )
    p.add_argument(
        "--reward-model",
        choices=("ridge", "mean"),
        default="ridge",
        help="DM/DR reward model: per-arm ridge on features, or per-arm mean (default: ridge)",
    )
    p.add_argument(
        "--alpha", type=float_range(0, lo_open=True), default=1.0, help="ridge regularisation (default: 1)"
    )
    p.add_argument(
        "--folds", type=int_range(1), default=2, help="cross-fitting folds for the reward model (default: 2)"
    )
    p.add_argument(
        "--switch-tau",
        type=float_range(0, lo_open=True),
        default=10.0,
        help="switch-DR weight threshold (default: 10)",
    )
    p.add_argument(
        "--bootstrap", type=int_range(10), default=500, metavar="N", help="bootstrap resamples (default: 500)"
    )
    p.add_argument(
        "--counterfactuals",
        action="store_true",
        help="the DM/DR reward model learns every arm from the log's counterfactual rewards where a row "
        "observed it (the cf_rewards column, docs/data.md), not only the arm each row played",
    )
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def read_log(path: str) -> "DecisionLog":
    """The decision log at ``path`` as ``ab-report`` and ``/ab`` read it (one reader:
    :func:`adaptspec.fleet.logs.fleet_log_rows`): its parts and the rows a running server's
    journals hold that are not yet in a part; a parent of replicas' logs reads them all."""
    import os
    from pathlib import Path

    from ..fleet.logs import fleet_log_rows, log_dirs
    from ..traces import DecisionLog

    dirs = log_dirs([path])
    where = dirs[0] if len(dirs) == 1 else Path(os.path.commonpath([str(d) for d in dirs]))
    rows = fleet_log_rows(dirs)
    if not rows:
        raise AdaptspecError(f"{where}: the decision log is empty")
    for r in rows:
        r.pop("replica", None)  # which replica's log: not a decision-log column
    return DecisionLog.of_rows(where, rows)


def run(args: argparse.Namespace) -> int:
    from .._util.markdown import table
    from .._util.numbers import rounded
    from ..analysis.ope import ESTIMATORS, evaluate_log

    log = read_log(args.logs)
    if args.counterfactuals and not np.isfinite(log.cf_rewards).any():
        raise AdaptspecError(
            f"--counterfactuals: the log {log.path} holds no counterfactual rewards (written before "
            "the cf_rewards column, or with a custom reward)"
        )
    estimators = args.estimator or list(ESTIMATORS)
    r = log.rewards
    with_r = np.isfinite(r)
    pol = np.asarray(log.table.column("policy").to_pylist(), dtype=object)
    logged = {
        str(p): rounded(r[(pol == p) & with_r].mean()) if ((pol == p) & with_r).any() else None
        for p in sorted(set(pol))
    }
    results = []
    for spec in args.policy:
        est = evaluate_log(
            log,
            spec,
            seed=args.seed,
            estimators=estimators,
            reward_model=args.reward_model,
            alpha=args.alpha,
            folds=args.folds,
            switch_tau=args.switch_tau,
            n_boot=args.bootstrap,
            counterfactuals=args.counterfactuals,
        )
        results.append({"policy": spec, "estimates": {k: e.to_dict() for k, e in est.items()}})
    out = {
        "log": str(log.path),
        "decisions": len(log),
        "with_reward": int(with_r.sum()),
        "arms": list(log.arms),
        "logged_policies": logged,
        "policies": results,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{log.path}: {len(log)} decisions, {int(with_r.sum())} with a reward, arms {list(log.arms)}")
    for name, v in logged.items():
        print(f"  logged by {name}: mean reward {v if v is not None else '-'}")
    head = ["policy", "estimator", "value", "95% CI", "se", "ESS", "support"]
    rows, notes = [], []
    for res in results:
        for k, e in res["estimates"].items():
            ci = "-" if e["ci"][0] is None else f"[{e['ci'][0]:.4g}, {e['ci'][1]:.4g}]"
            d = e.get("diagnostics") or {}
            support = "-" if d.get("support") is None else f"{100 * d['support']:.1f}%"
            rows.append(
                [
                    res["policy"],
                    k,
                    "-" if e["value"] is None else f"{e['value']:.4g}",
                    ci,
                    "-" if e["se"] is None else f"{e['se']:.3g}",
                    "-" if not d else f"{d['ess']:.4g}",
                    support,
                ]
            )
            if e.get("note"):
                notes.append(f"  {res['policy']}, {k}: {e['note']}")
    print(table(head, rows, align="llrrrrr"))
    if notes:
        print(
            "read with care (ESS: effective sample size of the importance weights; support: the target's "
            "probability on arms the logging policy could play):"
        )
        print("\n".join(notes))
    return 0
