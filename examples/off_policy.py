"""Off-policy evaluation: estimate a policy's value from another policy's decision log.

A server logs, for every request, the block size its policy chose and the probability it
chose it with (the propensity). From such a log the value of *another* policy can be
estimated without running it: IPS and SNIPS reweight the logged rewards, DR also uses a reward
model fitted on the log (``adaptspec.analysis.ope``).

Here the log comes from replaying the bundled default trace set (336 public benchmark prompts)
through a logging policy, exactly
as ``adaptspec simulate --log DIR`` writes it: UCB that keeps exploring with probability
``--epsilon`` (a policy that never explores gives no information about the block sizes it
never plays). Because the trace set holds every block size's outcome, each target policy's
true value on the same requests is known too, and the script prints it next to the estimates.

Run it (a few seconds)::

    python examples/off_policy.py
    python examples/off_policy.py --steps 5000 --epsilon 0.1 --log runs/ope-log
    adaptspec ope runs/ope-log --policy fixed:4      # the same estimates from the command line
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from adaptspec.analysis import evaluate_log
from adaptspec.paths import BUNDLED_HEAD  # the head trained on the default (benchmark) trace set
from adaptspec.policies.featurizer import Featurizer
from adaptspec.simulators import replay_log
from adaptspec.simulators.replay import replay
from adaptspec.traces import DecisionLog, load_traces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=int, default=2000, help="requests in the log (passes over the 336 traced ones)"
    )
    parser.add_argument("--epsilon", type=float, default=0.3, help="exploration floor of the logging policy")
    parser.add_argument(
        "--log", default=None, help="a new directory for the decision log (default: a temporary one)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.steps < 10 or not 0 < args.epsilon <= 1:
        parser.error("--steps must be >= 10 and --epsilon in (0, 1]")
    if args.log and Path(args.log).exists() and any(Path(args.log).iterdir()):
        parser.error(f"--log {args.log} is not empty: a decision log keeps every row appended to it")

    # Contexts as the controller computes them: the bundled head's featurizer over the
    # prefill features, so a contextual target (the head) can be evaluated on the log.
    traces = Featurizer.load(BUNDLED_HEAD).transform_traces(load_traces())
    stream = dict(reward="token_latency", order="shuffled", n_steps=args.steps)  # minus ms per token

    # 1. The logging policy serves the stream, learning as it goes; every row keeps the
    #    probability of every block size at that moment.
    logger = f"ucb:epsilon={args.epsilon}"
    with tempfile.TemporaryDirectory() as tmp:
        DecisionLog(args.log or tmp).append(
            replay_log(traces, logger, seed=args.seed, progress=False, **stream)
        )
        log = DecisionLog.read(args.log or tmp)
        print(
            f"decision log of {logger}: {len(log)} decisions, mean reward {log.rewards.mean():.2f} (-ms/token)"
        )

        # 2. Target policies, evaluated as they are built (frozen: they do not learn from the log).
        targets = {
            "fixed:4": "fixed:4",
            "fixed:16": "fixed:16",
            "bundled head (frozen)": f"head:path={BUNDLED_HEAD}",
        }
        print(f"{'target':<22} {'true':>7}   {'estimator':<6} {'estimate':>8} {'95% interval':>18}  covers")
        for name, spec in targets.items():
            estimates = evaluate_log(
                log, spec, seed=args.seed, estimators=["ips", "snips", "dr"], progress=False
            )
            # 3. The truth: the same policy replayed on the same stream of requests.
            truth = (
                replay(traces, [spec], seeds=[args.seed], progress=False, **stream)
                .policies[0]
                .mean("mean_reward")
            )
            for k, e in estimates.items():
                lo, hi = e.ci
                covers = "yes" if lo <= truth <= hi else "no"
                true = f"{truth:.2f}" if k == "ips" else ""
                print(
                    f"{name:<22} {true:>7}   {k:<6} {e.value:>8.2f} {f'[{lo:.2f}, {hi:.2f}]':>18}  {covers}"
                )
                name = ""
    # The bootstrap intervals treat logged requests as independent; here the same 336 requests
    # recur pass after pass and the logger learns as it goes, so an interval may miss the truth
    # more often than one time in twenty.


if __name__ == "__main__":
    main()
