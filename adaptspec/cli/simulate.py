"""``adaptspec simulate``: replay a trace set through policies and compare them with the oracle.

Examples::

    adaptspec simulate                                    # bundled benchmark trace set, default policies
    adaptspec simulate TRACES --policy fixed:16 --policy random --reward tau
    adaptspec simulate --policy ucb --seeds 5 --order shuffled --plot replay.png
    adaptspec simulate TRACES --reward modelled --latency h100-qwen3-8b --batch-size 8 --json
    adaptspec simulate --ab A=fixed:16,B=linucb --seeds 5 --order shuffled --steps 3000
    adaptspec simulate TRACES --seeds 20 --order shuffled --ray auto    # the replays as Ray tasks
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from .._util.ray import ADDRESS_HELP, parse_address
from ..errors import AdaptspecError
from ..reward.functions import REWARD_UNITS, REWARDS, trace_reward_name
from ._types import float_range, int_range, png_output

DEFAULT_POLICIES = ("random", "ucb", "linucb")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``adaptspec simulate``'s arguments, in the order ``--help`` lists them."""
    _scoring_options(p)
    _replay_options(p)
    _output_options(p)
    _ab_options(p)


def _scoring_options(p: argparse.ArgumentParser) -> None:
    """The trace set, the policies replayed on it and the reward they are scored by."""
    p.add_argument(
        "traces",
        nargs="?",
        default=None,
        metavar="TRACES",
        help="trace set directory (default: the bundled public benchmark set, "
        "adaptspec/data/traces/benchmarks)",
    )
    p.add_argument(
        "--policy",
        action="append",
        metavar="SPEC",
        help="policy spec, repeatable: fixed:16, random, ucb, linucb:alpha=0.5, ... "
        f"(default: those of {', '.join(DEFAULT_POLICIES)} that are available)",
    )
    p.add_argument(
        "--reward",
        choices=REWARDS,
        default=None,
        help="reward: measured ms per token (token_latency), measured throughput, modelled throughput "
        "(needs --latency) or tau (default: token_latency when the trace set has timings, else "
        "modelled with --latency, else tau)",
    )
    p.add_argument(
        "--latency",
        metavar="PROFILE",
        default=None,
        help="latency profile name (cpu-smollm2-bf16, h100-qwen3-8b) or JSON file; re-times the "
        "trace's acceptance for --reward modelled and the tok/s column",
    )
    p.add_argument(
        "--batch-size",
        type=int_range(1),
        default=1,
        metavar="N",
        help="batch size the latency profile is taken at",
    )


def _replay_options(p: argparse.ArgumentParser) -> None:
    """How the policies are replayed: seeds, stream order, steps, featurizer, feedback."""
    p.add_argument(
        "--seeds",
        type=parse_seeds,
        default="1",
        metavar="N|LIST",
        help="number of seeds (0..N-1) or a comma-separated list (default: 1)",
    )
    p.add_argument(
        "--order",
        choices=("logged", "shuffled", "drift"),
        default="logged",
        help="request order: as stored, shuffled per seed, or a drifting domain mix",
    )
    p.add_argument(
        "--steps",
        type=int_range(1, 10_000_000),
        default=None,
        metavar="N",
        help="requests to stream (default: one pass; more repeats the trace set)",
    )
    p.add_argument(
        "--featurizer",
        default="auto",
        metavar="auto|none|DIR",
        help="map the features to policy contexts as the controller does (auto: the featurizer saved "
        "with the policies' head, else the bundled head's when it fits the trace set)",
    )
    p.add_argument(
        "--feedback",
        choices=("auto", "bandit"),
        default="auto",
        help="what a learning policy learns after each request: auto (as the controller feeds it: a "
        "full-feedback policy such as the cold default fi-ucb every arm its chosen arm's rounds show, "
        "when the trace set keeps per-round taus; any other the chosen arm's reward) or bandit (every "
        "policy the chosen arm's reward only); the table and the JSON say which each policy got",
    )


def _output_options(p: argparse.ArgumentParser) -> None:
    """What is written (table, JSON, plot, per-step log) and where it runs (here or on Ray)."""
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        type=png_output,
        default=None,
        help="write cumulative regret and block sizes over time (in an existing directory; replaces "
        "only a PNG file)",
    )
    p.add_argument(
        "--log",
        metavar="DIR",
        default=None,
        help="also write each policy's seed-0 decisions as a new decision log (for adaptspec ope)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the decision log at --log (only a decision log: anything else is refused)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        type=parse_address,
        help="run the (policy, seed) replays as Ray tasks (pip install 'adaptspec[ray]'); same report. "
        + ADDRESS_HELP[len("run as Ray tasks: ") :],
    )


def _ab_options(p: argparse.ArgumentParser) -> None:
    """The simulated A/B test between two policies."""
    p.add_argument(
        "--ab",
        metavar="A=SPEC,B=SPEC",
        default=None,
        help="replay an A/B test of two policies instead (adaptspec.simulators.ab): when would the "
        "always-valid sequential test have stopped, and did it pick the better policy? "
        '--json then prints {"ab": {...}}',
    )
    p.add_argument(
        "--ab-split",
        type=float_range(0, 1, lo_open=True, hi_open=True),
        default=0.5,
        metavar="F",
        help="share of requests sent to the first --ab variant",
    )
    p.add_argument(
        "--ab-alpha",
        type=float_range(0, 1, lo_open=True, hi_open=True),
        default=0.05,
        metavar="A",
        help="significance level of the --ab test",
    )


def pair_spec(spec: str, head: Path) -> str:
    """``spec`` with ``head=HEAD`` when it is a ``neural-linear`` spec that names no head (which
    would stand on the bundled head, trained on another trace set).

    >>> pair_spec("neural-linear", Path("h")), pair_spec("neural-linear:alpha=0.2", Path("h"))
    ('neural-linear:head=h', 'neural-linear:alpha=0.2,head=h')
    >>> pair_spec("neural-linear:head=mine", Path("h")), pair_spec("ucb", Path("h"))
    ('neural-linear:head=mine', 'ucb')
    """
    from ..policies.spec import parse_spec

    name, args, opts = parse_spec(spec)
    if name != "neural-linear" or args or "head" in opts:
        return spec
    return f"{spec.strip()}{',' if ':' in spec and spec.partition(':')[2].strip() else ':'}head={head}"


def parse_seeds(text: str) -> list[int]:
    """``"3"`` -> [0, 1, 2]; ``"4,7"`` -> [4, 7] (an argparse type)."""
    try:
        if "," in text:
            seeds = [int(s) for s in text.split(",") if s.strip()]
        else:
            k = int(text)
            if not 1 <= k <= 10_000:
                raise ValueError
            seeds = list(range(k))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a count in 1..10000 or a list like 0,1,2, got {text!r}"
        ) from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0 or max(seeds) >= 2**63:
        raise argparse.ArgumentTypeError(f"seeds must be distinct integers in 0..2**63-1, got {text!r}")
    return seeds


def run(args: argparse.Namespace) -> int:
    """Replay the policies on the trace set and print the report (a table, or JSON with
    ``--json``); ``--plot`` and ``--log`` also write the regret plot and each policy's decision
    log. ``--ab`` replays an A/B test instead."""
    from ..traces import load_traces

    if args.log and not args.ab:
        from .._util.outputs import check_output

        check_output(args.log, "decision-log", args.force, reads=[args.traces])
    traces = load_traces(args.traces)
    reward = args.reward or trace_reward_name(traces.has_timings, args.latency)
    if args.ab:
        if args.ray:
            raise AdaptspecError("--ray runs the replays of --policy sweeps; --ab runs in one process")
        return _run_ab(args, traces, reward)
    policies, traces = _policies(args, traces)
    feedback = args.feedback
    if args.log and feedback == "auto":  # priced once, for the replay and every policy's log
        feedback = _priced_feedback(args, traces, reward)
    report = _replay(args, traces, policies, reward, feedback)
    if args.plot:
        plot_report(report, args.plot)
    if args.log:
        _write_logs(args, traces, policies, reward, feedback, report.seeds[0])
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print(report.table())
        if args.plot:
            print(f"plot: {args.plot}")
        if args.log:
            print(f"decision log: {args.log}")
    return 0


def _policies(args: argparse.Namespace, traces) -> tuple[list, Any]:
    """``(policies, traces)``: ``--policy`` or the defaults that fit the trace set, head-based
    ones paired with the head trained on it; the traces' features mapped by the featurizer
    the policies share, if any."""
    from ..models.bundled import paired_head
    from ..paths import BUNDLED_HEAD
    from ..policies.featurizer import featurizer_for
    from ..policies.spec import REGISTRY

    policies = args.policy or [
        s for s in DEFAULT_POLICIES if s in REGISTRY and not (s.startswith("lin") and traces.features is None)
    ]
    home = paired_head(traces.path)  # each bundled trace set with the head trained on it
    if home != BUNDLED_HEAD:
        policies = [pair_spec(s, home) for s in policies]
    feat = featurizer_for(
        [s for s in policies if isinstance(s, str)],
        None if traces.features is None else traces.features.shape[1],
        args.featurizer,
        default_head=home,
    )
    if feat is not None:
        path, traces = traces.path, feat.transform_traces(traces)
        traces.path = path  # the same requests (their features mapped): the report names them, the in-sample check reads it
    return policies, traces


def _priced_feedback(args: argparse.Namespace, traces, reward: str) -> Any:
    """The counterfactual feedback of ``--feedback auto``, priced once for the replay and every
    policy's log; ``bandit`` where the traces keep no rounds to price."""
    from ..costs.latency import get_profile
    from ..simulators.counterfactuals import replay_feedback
    from ..simulators.replay import finite_rewards

    prof = None if args.latency is None else get_profile(args.latency)
    rewards = finite_rewards(traces, reward, prof, args.batch_size)
    return replay_feedback(traces, rewards, reward, prof, args.batch_size) or "bandit"  # None: no rounds


def _replay(args: argparse.Namespace, traces, policies: list, reward: str, feedback: Any):
    """The replay of every policy over the seeds: here, or as Ray tasks with ``--ray``."""
    from ..simulators.replay import replay

    options = {
        "reward": reward,
        "latency": args.latency,
        "batch_size": args.batch_size,
        "seeds": args.seeds,
        "order": args.order,
        "n_steps": args.steps,
        "progress": False if args.no_progress else None,
        "feedback": feedback,
    }
    if args.ray:
        from .._util.ray import session

        with session(args.ray):
            return replay(traces, policies, ray=True, **options)
    return replay(traces, policies, **options)


def _write_logs(
    args: argparse.Namespace, traces, policies: list, reward: str, feedback: Any, seed: int
) -> None:
    """``--log``: one decision log of every policy but the oracle, replayed with the first seed."""
    from .._util.outputs import write_dir
    from ..simulators.replay import replay_log
    from ..traces import DecisionLog

    def write(tmp: Path) -> None:
        log = DecisionLog(tmp)
        for spec in policies:
            if spec.split(":")[0].strip().lower() == "oracle":
                continue
            log.append(
                replay_log(
                    traces,
                    spec,
                    reward=reward,
                    latency=args.latency,
                    batch_size=args.batch_size,
                    seed=seed,
                    order=args.order,
                    n_steps=args.steps,
                    progress=False if args.no_progress else None,
                    feedback=feedback,
                )
            )

    write_dir(args.log, "decision-log", args.force, write, reads=[args.traces])


def _run_ab(args: argparse.Namespace, traces, reward: str) -> int:
    from ..ab.variants import parse_ab_specs
    from ..simulators.ab import simulate_ab

    for flag, value in (("--policy", args.policy), ("--plot", args.plot), ("--log", args.log)):
        if value:
            raise AdaptspecError(f"--ab replays its own two policies: {flag} does not apply")
    sim = simulate_ab(
        traces,
        parse_ab_specs(args.ab),
        reward=reward,
        latency=args.latency,
        batch_size=args.batch_size,
        seeds=args.seeds,
        order=args.order,
        n_steps=args.steps,
        split=args.ab_split,
        alpha=args.ab_alpha,
    )
    print(json.dumps({"ab": sim.to_json()}) if args.json else sim.to_text())
    return 0


def plot_report(report, path: str) -> None:
    """Two panels: cumulative regret (mean over seeds, band = min..max) and the block size
    each policy chose over time (seed 0, moving average), against the oracle's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .._util.atomic import save_figure

    arms = np.asarray(report.arms)
    steps = report.curve_steps
    T = report.n_steps
    win = max(1, T // 30)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7.5), sharex=True)
    results = [*report.policies, report.best_fixed]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, res in enumerate(results):
        c = colors[i % len(colors)]
        label = res.name + (" (best fixed)" if res is report.best_fixed else "")
        ls = "--" if res is report.best_fixed else "-"
        mean = res.curve.mean(axis=0)
        ax1.plot(steps, mean, ls, color=c, label=label)
        if res.curve.shape[0] > 1:
            ax1.fill_between(steps, res.curve.min(axis=0), res.curve.max(axis=0), color=c, alpha=0.15, lw=0)
        b = arms[res.chosen.astype(np.int64)].astype(float)
        if len(b) >= win:
            ma = np.convolve(b, np.ones(win) / win, mode="valid")
            ax2.plot(np.arange(win, len(b) + 1), ma, ls, color=c, label=label)
    ob = arms[report.oracle.chosen.astype(np.int64)].astype(float)
    if len(ob) >= win:
        ax2.plot(
            np.arange(win, len(ob) + 1),
            np.convolve(ob, np.ones(win) / win, mode="valid"),
            ":",
            color="black",
            label="oracle",
        )
    unit = REWARD_UNITS[report.reward]
    ax1.set_ylabel(f"cumulative regret ({unit})")
    ax1.set_title(
        f"{Path(report.traces).name if report.traces else 'trace set'}: regret against the per-request "
        f"oracle, {len(report.seeds)} seed{'s' if len(report.seeds) > 1 else ''}, order {report.order}"
    )
    ax1.legend(loc="upper left", fontsize=8)
    ax1.grid(alpha=0.3)
    ax2.set_ylabel(f"block size chosen ({win}-request moving average)")
    ax2.set_xlabel("request")
    ax2.set_yticks(arms)
    ax2.set_ylim(arms.min() - 0.5, arms.max() + 0.5)
    ax2.grid(alpha=0.3)
    ax2.legend(loc="upper left", fontsize=8, ncol=2)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
