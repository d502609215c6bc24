"""Replay a trace set through a few policies and compare them with the best they could do.

A trace set holds the outcome of every block size on every request (the bundled default: 336
public benchmark prompts, GSM8K, MT-Bench and HumanEval, decoded by the bundled SmolLM2 pair at
8 block sizes), so any policy can be replayed on it offline. This script:

1. splits the requests in two halves (stratified by domain);
2. on the first half, fits the featurizer (PCA of the prefill features) and trains an offline
   head, as ``adaptspec train-head`` does;
3. replays, over several seeds, on the other half: UCB (context-free), the frozen head
   (BlockPilot-style) and neural-linear warm-started from the head (the default policy),
   with :func:`adaptspec.simulators.replay`, which also scores the best fixed block size (in
   hindsight, on the replayed requests) and the per-request oracle;
4. prints % of the per-request oracle and the gain over the best fixed block size, with 95%
   intervals over seeds.

The reward is minus milliseconds per token, so both percentages are ratios of speed.
``--bundled-head`` replays the head shipped for this trace set on all requests instead:
`BUNDLED_HEAD` for the default set (trained and validated on 312 of its 336 requests: all but
the end-to-end prompts), `TEMPLATES_HEAD` for the in-distribution template set
(``adaptspec/data/traces/templates``, on all 200), so its figures are in-sample (optimistic).

Run it (about 10 s)::

    python examples/replay_policies.py
    python examples/replay_policies.py --seeds 10 --passes 20
    python examples/replay_policies.py --bundled-head
    python examples/replay_policies.py adaptspec/data/traces/templates --bundled-head   # in-distribution
"""

from __future__ import annotations

import argparse

from adaptspec.evaluation.core import split_requests
from adaptspec.models import TEMPLATES_HEAD  # the head trained on the template set
from adaptspec.paths import BUNDLED_HEAD  # the head trained on the default set
from adaptspec.policies import NeuralLinear, OfflineHead, train_head
from adaptspec.policies.featurizer import Featurizer
from adaptspec.reward.functions import trace_rewards
from adaptspec.simulators.replay import replay
from adaptspec.traces import TEMPLATE_TRACES, load_traces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "traces", nargs="?", default=None, help="trace set directory (default: the bundled one)"
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds (stream orders and policy randomness)")
    parser.add_argument(
        "--passes", type=int, default=10, help="shuffled passes over the evaluation requests per seed"
    )
    parser.add_argument(
        "--bundled-head",
        action="store_true",
        help="use the shipped head of this trace set (BUNDLED_HEAD; TEMPLATES_HEAD for the template "
        "set) on all requests (in-sample) instead of training one on half",
    )
    args = parser.parse_args()
    if args.seeds < 2 or args.passes < 1:
        parser.error("--seeds must be >= 2 (for an interval) and --passes >= 1")

    traces = load_traces(args.traces)  # None: adaptspec/data/traces/benchmarks
    reward = "token_latency" if traces.has_timings else "tau"
    if traces.features is None:
        parser.error(f"{traces.path}: no prefill features; the contextual policies need them")

    if args.bundled_head:
        # Each shipped head goes with the trace set it was trained on.
        templates = traces.path is not None and traces.path.resolve() == TEMPLATE_TRACES.resolve()
        head = TEMPLATES_HEAD if templates else BUNDLED_HEAD
        # The head's own featurizer maps the 1,153 raw features to its 33 inputs.
        evaluation = Featurizer.load(head).transform_traces(traces)
        policies = ["ucb", f"head:path={head}", f"neural-linear:head={head}"]  # spec strings
        print(
            f"{'template' if templates else 'bundled'} head on all {traces.n_requests} requests "
            "(in-sample: it was trained on these requests)"
        )
    else:
        train_idx, eval_idx = split_requests(traces.domains, train_fraction=0.5, seed=0)
        train, evaluation = traces.subset(train_idx), traces.subset(eval_idx)
        featurizer = Featurizer.fit_traces(train, dim=32, keep=[-1])  # 32 PCA components + log prompt length
        train, evaluation = featurizer.transform_traces(train), featurizer.transform_traces(evaluation)
        head = train_head(train.features, trace_rewards(train, reward), train.arms, seed=0)
        # Policy objects are copied for every seed, so each run starts from the same head.
        policies = ["ucb", OfflineHead(head), NeuralLinear(head)]  # or Policy objects
        print(f"head trained on {len(train_idx)} requests, policies replayed on the other {len(eval_idx)}")

    report = replay(
        evaluation,
        policies,
        reward=reward,
        seeds=range(args.seeds),
        order="shuffled",
        n_steps=args.passes * evaluation.n_requests,
        progress=False,
    )

    def interval(result, metric, shift=0.0, sign=""):
        lo, hi = result.ci(metric)  # 95% t-interval over seeds
        return f"{result.mean(metric) + shift:{sign}.1f} [{lo + shift:{sign}.1f}, {hi + shift:{sign}.1f}]"

    print(f"reward {reward}, {args.seeds} seeds x {report.n_steps} requests, 95% intervals over seeds")
    print(f"{'policy':<26} {'% of oracle':>22} {'gain over best fixed, %':>24} {'mean tau':>9}")
    labels = ["ucb (context-free)", "head (frozen)", "neural-linear (default)"]
    rows = list(zip(labels, report.policies))
    rows += [
        (f"best fixed (B={report.best_fixed_block_size})", report.best_fixed),
        ("per-request oracle", report.oracle),
    ]
    for name, result in rows:
        # pct_best_fixed is 100 for the best fixed block size itself: the gain is that minus 100.
        print(
            f"{name:<26} {interval(result, 'pct_oracle'):>22} "
            f"{interval(result, 'pct_best_fixed', -100.0, '+'):>24} {result.mean('mean_tau'):>9.2f}"
        )


if __name__ == "__main__":
    main()
