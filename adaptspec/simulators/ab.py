"""A/B replay: an A/B test of two policy specs simulated on a full-information trace set.

Each request of the stream goes to the first variant with probability ``split``; each
variant's policy decides and learns on its own requests only, paid from the trace's reward
matrix, and the always-valid sequential test
(:func:`~adaptspec.analysis.statistics.sequential_test`) watches the rewards. Because every
arm's reward is in the trace, each policy can also serve the whole stream alone: that is the
truth the test is scored against (did it stop, and did it pick the policy that is better?).
A served log's A/B report is :mod:`adaptspec.analysis.ab`.

>>> from adaptspec.traces import TraceSet
>>> rng = np.random.default_rng(0)
>>> tau = np.column_stack([rng.uniform(1.0, 2.0, 400), rng.uniform(1.5, 3.0, 400)])   # block size 4 pays more
>>> ts = TraceSet.from_arrays([f"r{i}" for i in range(400)], ["chat"] * 400, [2, 4], tau)
>>> sim = simulate_ab(ts, {"A": "fixed:2", "B": "fixed:4"}, seeds=[0, 1], n_steps=400)
>>> sim.better, sim.stopped, sim.correct
('B', 2, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .._util.markdown import sig, table
from .._util.numbers import rounded
from ..analysis.statistics import sequential_test, welch_p
from ..errors import AdaptspecError
from ..reward.functions import trace_rewards

__all__ = ["ABSimulation", "simulate_ab"]


@dataclass
class ABSimulation:
    """What :func:`simulate_ab` returns: the two specs, each one's true value on the whole stream
    (mean over seeds), and one run of the sequential test per seed (``runs``, JSON objects)."""

    specs: dict[str, str]
    true_value: dict[str, float]
    runs: list[dict[str, Any]]
    reward: str
    latency: str | None
    order: str
    split: float
    alpha: float
    tau_sd: float
    min_n: int
    #: what each variant's policy learnt from (a key of :data:`~adaptspec.simulators.replay.FEEDBACK_KINDS`)
    feedback: dict[str, str] | None = None

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    @property
    def better(self) -> str:
        return max(self.names, key=lambda n: self.true_value[n])

    @property
    def stopped(self) -> int:
        return sum(d["stopped_at"] is not None for d in self.runs)

    @property
    def correct(self) -> int:
        return sum(d["correct"] is True for d in self.runs)

    @property
    def wrong(self) -> int:
        return sum(d["correct"] is False for d in self.runs)

    @property
    def median_stop(self) -> float | None:
        stops = [d["stopped_at"] for d in self.runs if d["stopped_at"] is not None]
        return float(np.median(stops)) if stops else None

    def to_json(self) -> dict[str, Any]:
        """The ``simulate --ab --json`` object (under ``"ab"``)."""
        a, b = self.names
        return {
            "variants": {
                n: {
                    "spec": self.specs[n],
                    "true_value": rounded(self.true_value[n]),
                    "feedback": (self.feedback or {}).get(n),
                }
                for n in self.names
            },
            "better": self.better,
            "true_difference": rounded(self.true_value[a] - self.true_value[b]),
            "reward": self.reward,
            "latency": self.latency,
            "order": self.order,
            "split": self.split,
            "alpha": self.alpha,
            "tau_sd": self.tau_sd,
            "min_n": self.min_n,
            "stopped": self.stopped,
            "runs": len(self.runs),
            "median_stop": self.median_stop,
            "correct": self.correct,
            "wrong": self.wrong,
            "seeds": self.runs,
        }

    def to_text(self) -> str:
        """A plain-text summary for people: the setting, a table of the runs, the tally."""
        a, b = self.names
        fb = self.feedback or {}
        lines = [
            f"A/B replay: {a} = {self.specs[a]}, {b} = {self.specs[b]}; reward {self.reward}, "
            f"split {self.split:.2f}, alpha {self.alpha}, order {self.order}"
            + (f"; feedback {a} {fb.get(a)}, {b} {fb.get(b)}" if fb else ""),
            "true value on the whole stream: "
            + ", ".join(f"{n} {sig(self.true_value[n])}" for n in self.names)
            + f" -> {self.better} is better",
        ]
        head = ["seed", "requests", "stopped at", "winner", "correct", "final p", f"mean {a}", f"mean {b}"]
        rows = [
            [
                d["seed"],
                d["requests"],
                "-" if d["stopped_at"] is None else d["stopped_at"],
                d["winner"] or "-",
                "-" if d["correct"] is None else ("yes" if d["correct"] else "NO"),
                sig(d["p_value"]),
                sig(d["mean"][a]),
                sig(d["mean"][b]),
            ]
            for d in self.runs
        ]
        lines.append(table(head, rows))
        lines.append(
            f"stopped in {self.stopped}/{len(self.runs)} runs (median after {sig(self.median_stop)} "
            f"requests); picked the better policy {self.correct} times, the worse {self.wrong} times"
        )
        return "\n".join(lines)


def simulate_ab(
    traces: Any,
    specs: Mapping[str, str],
    *,
    reward: str = "tau",
    latency: Any = None,
    batch_size: int = 1,
    seeds: Sequence[int] = (0,),
    order: str = "shuffled",
    n_steps: int | None = None,
    split: float = 0.5,
    alpha: float = 0.05,
    tau_sd: float = 0.2,
    min_n: int = 10,
) -> ABSimulation:
    """Replay an A/B test of two policy specs on a full-information trace set, once per seed.

    Each request of the stream (``stream_order``) goes to the first variant with probability
    ``split``; each variant's policy decides and learns on its own requests only. The truth is
    each policy's mean reward when it alone serves the whole stream, so "correct" means the
    test picked the policy that is better on this stream. Each policy learns what the controller
    would feed it (:func:`~adaptspec.simulators.replay.feedback_of`): a full-feedback one every
    arm its chosen arm's rounds show when the trace set keeps per-round taus.
    """
    from ..costs.latency import get_profile
    from ..policies.spec import make_policy
    from .counterfactuals import replay_feedback
    from .replay import feedback_of, stream_order

    names = list(specs)
    if len(names) != 2:
        raise AdaptspecError(f"an A/B simulation needs two variants, got {len(names)}")
    if not 0 < split < 1:
        raise AdaptspecError(f"split must be in (0, 1), got {split}")
    prof = None if latency is None else get_profile(latency)
    R = trace_rewards(traces, reward, prof, batch_size)
    X, arms = traces.features, traces.arms
    full = any(feedback_of(make_policy(specs[n], arms), True) == "full" for n in names)
    fb = replay_feedback(traces, R, reward, prof, batch_size) if full else None
    kinds: dict[str, str] = {}
    runs = []
    truth: dict[str, list[float]] = {n: [] for n in names}
    for seed in seeds:
        idx = stream_order(traces, order, seed, n_steps)
        to_b = np.random.default_rng([int(seed), 99]).random(len(idx)) >= split
        r, value = _split_run(specs, R, X, arms, idx, to_b, seed, fb, kinds)
        for name in names:
            truth[name].append(value[name])
        g = to_b.astype(np.int64)
        t = sequential_test(g, r, alpha=alpha, tau_sd=tau_sd, min_n=min_n)
        better_here = names[int(truth[names[1]][-1] > truth[names[0]][-1])]
        runs.append(
            {
                **t.to_json(names),
                "seed": int(seed),
                "requests": len(idx),
                "true_value": {n: rounded(truth[n][-1]) for n in names},
                "better": better_here,
                "correct": None if t.winner is None else names[t.winner] == better_here,
                "naive_t_test_p": rounded(welch_p(r, g)),
            }
        )
    return ABSimulation(
        dict(specs),
        {n: float(np.mean(v)) for n, v in truth.items()},
        runs,
        reward,
        None if prof is None else prof.name,
        order,
        split,
        alpha,
        tau_sd,
        min_n,
        kinds,
    )


def _split_run(
    specs: Mapping[str, str],
    R: np.ndarray,
    X: np.ndarray | None,
    arms: Sequence[int],
    idx: np.ndarray,
    to_b: np.ndarray,
    seed: int,
    fb: Any,
    kinds: dict[str, str],
) -> tuple[np.ndarray, dict[str, float]]:
    """One seed's test: each variant's policy decides and learns on its own requests (the second
    variant's where to_b), giving the reward each request got; and each policy alone over the whole
    stream, its true value. kinds gets each variant's feedback."""
    from ..policies.spec import make_policy
    from .replay import feedback_of, run_policy

    r = np.empty(len(idx))
    value: dict[str, float] = {}
    for k, name in enumerate(specs):
        mask = to_b if k == 1 else ~to_b
        pol = make_policy(specs[name], arms, seed=seed)
        if getattr(pol, "full_information", False):
            raise AdaptspecError(f"{specs[name]} sees every arm's reward: it cannot run in an A/B test")
        kinds[name] = feedback_of(pol, fb)
        if mask.any():
            r[mask] = R[idx[mask], run_policy(pol, R, idx[mask], X, feedback=fb)]
        alone = make_policy(specs[name], arms, seed=seed)
        value[name] = float(R[idx, run_policy(alone, R, idx, X, feedback=fb)].mean())
    return r, value
