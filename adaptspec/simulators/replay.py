"""Replay: stream a trace set's requests through policies and score them against the oracle.

A trace set holds the outcome of every block size on every request, so any policy can be
replayed on it: the policy sees the request's features, picks an arm, and learns what the
controller would feed it after that request (:func:`feedback_of` says which, and the report
keeps it per policy):

- ``full``: a policy with ``full_feedback`` (``fi-ucb``, the cold default; ``fi-linucb``) gets
  every arm's counterfactual reward from the rounds of the arm it chose (``update_full``),
  priced by the controller's own pricer (:mod:`adaptspec.simulators.counterfactuals`), whenever
  the trace set keeps per-round taus;
- ``bandit``: any other learning policy (or a full-feedback one on a trace set without rounds, or
  with ``feedback="bandit"``) gets the chosen arm's reward (``update``), in a tight loop;
- ``none``: policies that do not learn (``learning = False``: fixed, random, a frozen offline head),
  replayed vectorised with ``decide_batch``;
- ``oracle``: the oracle (``full_information = True``) is given each request's reward row.

>>> from adaptspec.traces import TraceSet
>>> ts = TraceSet.from_arrays(["a", "b"], ["math", "chat"], [1, 2, 4],
...                           np.array([[1.0, 1.9, 3.0], [1.0, 2.0, 1.5]]))
>>> rep = replay(ts, ["fixed:2", "random"], reward="tau", seeds=[0, 1, 2])
>>> [(p.name, round(p.mean("mean_tau"), 2), round(p.mean("pct_oracle"), 1)) for p in rep.policies]
[('fixed:2', 1.95, 78.0), ('random', 1.38, 55.3)]
>>> rep.best_fixed_block_size, rep.oracle.mean("mean_reward"), rep.best_fixed.mean("pct_oracle")
(4, 2.5, 90.0)
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
from tqdm.auto import tqdm

from .._util.numbers import rounded
from ..analysis.statistics import mean_interval
from ..costs.latency import LatencyProfile, get_profile
from ..errors import AdaptspecError
from ..policies.base import Policy
from ..policies.baselines import Fixed, Oracle
from ..policies.spec import make_policy
from ..reward.functions import REWARD_UNITS, check_reward_name, pct_of, trace_costs, trace_rewards
from ..traces import TraceSet
from .counterfactuals import replay_feedback
from .in_sample import in_sample_warnings

ORDERS = ("logged", "shuffled", "drift")
#: what a replay feeds a learning policy: ``auto`` (full feedback to a policy with ``full_feedback``
#: when the trace set keeps per-round taus, as the controller feeds it) or ``bandit`` (the chosen arm only)
FEEDBACK_MODES = ("auto", "bandit")
#: what each policy got, in words (the report's legend)
FEEDBACK_KINDS = {
    "full": "every arm the chosen arm's rounds show (update_full), priced as the controller prices them",
    "bandit": "the chosen arm's reward (update)",
    "none": "does not learn",
    "oracle": "every arm's reward, before deciding",
}
METRICS = ("mean_reward", "mean_tau", "throughput", "pct_oracle", "pct_best_fixed", "cumulative_regret")
_CHUNK = 65536


# ============================================================================ request streams
def stream_order(
    traces: TraceSet, order: str = "logged", seed: int = 0, n_steps: int | None = None
) -> np.ndarray:
    """Request indices in the order they are replayed (``n_steps`` of them, default one pass).

    - ``logged``: stored order, repeated if ``n_steps`` exceeds the trace set;
    - ``shuffled``: a seeded permutation per pass;
    - ``drift``: the domain mix changes over time: domains come in a seeded order, each
      concentrated in its own stretch of the stream and overlapping its neighbours.

    >>> from adaptspec.traces import TraceSet
    >>> ts = TraceSet.from_arrays(list("abcdef"), list("xxxyyy"), [1], np.ones((6, 1)))
    >>> stream_order(ts, "logged", n_steps=8).tolist()
    [0, 1, 2, 3, 4, 5, 0, 1]
    >>> sorted(stream_order(ts, "shuffled", seed=1).tolist())
    [0, 1, 2, 3, 4, 5]
    """
    if order not in ORDERS:
        raise AdaptspecError(f"unknown order {order!r}: choose one of {', '.join(ORDERS)}")
    n = traces.n_requests
    T = n if n_steps is None else int(n_steps)
    if T < 1:
        raise AdaptspecError(f"the number of steps must be >= 1, got {n_steps}")
    if order == "logged":
        return np.resize(np.arange(n, dtype=np.int64), T)
    rng = np.random.default_rng([int(seed), 7])
    passes = -(-T // n)
    idx = np.concatenate([rng.permutation(n) for _ in range(passes)])[:T].astype(np.int64)
    if order == "shuffled":
        return idx
    names, dom = np.unique(traces.domains.astype(str), return_inverse=True)
    d = len(names)
    rank = rng.permutation(d)[dom[idx]]
    key = (rank + 0.5) / d + rng.normal(0.0, 0.5 / d, size=T)
    return idx[np.argsort(key, kind="stable")]


# ============================================================================ running one policy
def _build(p: Any, arms: tuple[int, ...], seed: int) -> tuple[str, Policy]:
    if isinstance(p, str):
        return p, make_policy(p, arms, seed=seed)
    if isinstance(p, Policy):
        q = copy.deepcopy(p)
        if q.arms != arms:
            raise AdaptspecError(f"policy {q.label} has arms {list(q.arms)}, the trace set has {list(arms)}")
        q.seed = seed
        q.rng = np.random.default_rng(seed)
        return q.label, q
    if callable(p):
        q = p(arms, seed)
        if not isinstance(q, Policy):
            raise AdaptspecError(f"policy factory {p!r} returned {type(q).__name__}, not a Policy")
        return q.label, q
    raise AdaptspecError(f"not a policy, spec or factory: {p!r}")


def feedback_of(policy: Policy, feedback: Any = None) -> str:
    """Which feedback :func:`run_policy` gives ``policy`` (a key of :data:`FEEDBACK_KINDS`) when
    given ``feedback`` (a :class:`~adaptspec.simulators.counterfactuals.Feedback`, or None).

    >>> from adaptspec.policies.spec import make_policy
    >>> [feedback_of(make_policy(s, (1, 2, 4)), feedback=object()) for s in ("fi-ucb", "ucb", "fixed:2", "oracle")]
    ['full', 'bandit', 'none', 'oracle']
    >>> feedback_of(make_policy("fi-ucb", (1, 2, 4)))
    'bandit'
    """
    if policy.full_information:
        return "oracle"
    if not getattr(policy, "learning", True):
        return "none"
    return "full" if policy.full_feedback and feedback is not None else "bandit"


def run_policy(
    policy: Policy,
    rewards: np.ndarray,
    idx: np.ndarray,
    contexts: np.ndarray | None = None,
    progress: Any = None,
    feedback: Any = None,
) -> np.ndarray:
    """Arm index chosen at each step of the stream ``idx`` over the reward matrix ``rewards``.

    Learning policies get ``update`` with the chosen arm's reward after every decision; a
    policy with ``full_feedback`` gets ``update_full`` with every arm's counterfactual reward
    instead when ``feedback`` (a :class:`~adaptspec.simulators.counterfactuals.Feedback` or
    ``OnlineFeedback`` of this reward matrix, :func:`~adaptspec.simulators.counterfactuals.replay_feedback`;
    each call prices with its own ``feedback.fresh()``) is given, and ``update`` where the feedback
    has no priced rounds (as the controller's learner does). :func:`feedback_of` says which.
    ``progress`` is a tqdm bar (or None) advanced by steps.
    """
    T = len(idx)
    if policy.contextual and contexts is None:
        raise AdaptspecError(f"policy {policy.label} needs features, and this trace set has none")
    X = None
    if policy.contextual:
        X = np.asarray(contexts, dtype=np.float64)
        policy.check_contexts(X, len(X))  # validates every row once; fixes dim
    kind = feedback_of(policy, feedback)
    if kind == "oracle":
        if getattr(policy, "learning", True):
            raise AdaptspecError(f"{policy.label}: full-information policies must not learn")
        out = np.empty(T, dtype=np.int64)
        for s in range(0, T, _CHUNK):
            j = idx[s : s + _CHUNK]
            out[s : s + len(j)] = policy.decide_batch(
                None if X is None else X[j], len(j), rewards=rewards[j]
            )[0]
            if progress is not None:
                progress.update(len(j))
        return out
    if kind == "none":
        out = np.empty(T, dtype=np.int64)
        for s in range(0, T, _CHUNK):
            j = idx[s : s + _CHUNK]
            out[s : s + len(j)] = policy.decide_batch(None if X is None else X[j], len(j))[0]
            if progress is not None:
                progress.update(len(j))
        return out
    if kind == "full":
        return _full_feedback_loop(policy, rewards, feedback, idx, X, progress)
    return _learning_loop(policy, rewards, idx, X, progress)


def _full_feedback_loop(
    policy: Policy, rewards: np.ndarray, feedback: Any, idx: np.ndarray, X: np.ndarray | None, progress: Any
) -> np.ndarray:
    """Decide, then learn every arm the chosen arm's rounds show (``update_full``), or the chosen
    arm alone (``update``) where its rounds were not priced; a fresh pricer per replay."""
    out = np.empty(len(idx), dtype=np.int64)
    feedback = feedback.fresh()
    for t, i in enumerate(idx.tolist()):
        x = None if X is None else X[i]
        d = policy.decide(x)
        a = policy.arm_index(d.block_size)
        shown = feedback.at(i, a)
        if shown is not None:
            policy.update_full(x, shown.rewards, shown.observed)
        else:
            policy.update(x, d.block_size, rewards[i, a])
        out[t] = a
    if progress is not None:
        progress.update(len(idx))
    return out


def _learning_loop(
    policy: Policy, rewards: np.ndarray, idx: np.ndarray, X: np.ndarray | None, progress: Any
) -> np.ndarray:
    T = len(idx)
    out = np.empty(T, dtype=np.int64)
    R = rewards.tolist()
    steps = idx.tolist()
    # Inputs were validated once above, so the per-step path skips the public checks, unless
    # a policy overrides the public methods (then they are what defines it).
    fast = type(policy).decide is Policy.decide and type(policy).update is Policy.update
    choose, learn = policy._choose, policy._update
    tick = 2048
    for t, i in enumerate(steps):
        x = None if X is None else X[i]
        if fast:
            a, _ = choose(x)
            learn(x, a, R[i][a])
            policy.version += 1
        else:
            d = policy.decide(x)
            a = policy.arm_index(d.block_size)
            policy.update(x, d.block_size, R[i][a])
        out[t] = a
        if progress is not None and (t + 1) % tick == 0:
            progress.update(tick)
    if progress is not None:
        progress.update(T % tick)
    return out


# ============================================================================ reports
def _ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float] | None:
    v = np.asarray(values, dtype=np.float64)
    return mean_interval(v, level) if np.all(np.isfinite(v)) else None


@dataclass
class PolicyResult:
    """One policy over all seeds: per-seed metrics, mean regret curve, seed-0 choices."""

    name: str
    values: dict[str, np.ndarray]
    curve: np.ndarray
    chosen: np.ndarray
    block_size: int | None = None
    feedback: str = "bandit"  # what it learnt from: a key of FEEDBACK_KINDS

    def mean(self, metric: str) -> float:
        v = self.values[metric]
        return float(np.mean(v)) if np.all(np.isfinite(v)) else float("nan")

    def ci(self, metric: str) -> tuple[float, float] | None:
        """95% t-interval over seeds (None with one seed)."""
        return _ci(self.values[metric])

    def summary(self, curve: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {"policy": self.name, "feedback": self.feedback}
        if self.block_size is not None:
            d["block_size"] = self.block_size
        for m in METRICS:
            x = self.mean(m)
            d[m] = rounded(x)
        if curve:
            d["cumulative_regret_curve"] = [rounded(x) for x in self.curve.mean(axis=0)]
        d["ci95"] = {
            m: (None if (c := self.ci(m)) is None else [rounded(c[0]), rounded(c[1])]) for m in METRICS
        }
        return d


@dataclass
class ReplayReport:
    """What :func:`replay` returns: per-policy results plus the oracle and the best fixed arm."""

    policies: list[PolicyResult]
    oracle: PolicyResult
    best_fixed: PolicyResult
    reward: str
    order: str
    seeds: list[int]
    n_steps: int
    arms: tuple[int, ...]
    curve_steps: np.ndarray
    latency: str | None = None
    traces: str | None = None
    has_throughput: bool = True
    extras: dict = field(default_factory=dict)
    #: the profile that priced the counterfactual rounds full-feedback policies learnt from (None: none did)
    feedback_profile: str | None = None
    #: what the caller should know about the replay (a head scored on the requests it was trained on, ...)
    warnings: list[str] = field(default_factory=list)

    @property
    def best_fixed_block_size(self) -> int:
        return int(self.best_fixed.block_size)  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        """The ``simulate --json`` object (see DESIGN.md), plus run details and curves."""
        return {
            "traces": self.traces,
            "reward": self.reward,
            "latency": self.latency,
            "order": self.order,
            "seeds": list(self.seeds),
            "n_steps": self.n_steps,
            "arms": list(self.arms),
            "curve_steps": [int(s) for s in self.curve_steps],
            "feedback_profile": self.feedback_profile,
            "policies": [p.summary() for p in self.policies],
            "oracle": self.oracle.summary(),
            "best_fixed": self.best_fixed.summary(),
            "warnings": list(self.warnings),
        }

    def table(self) -> str:
        """A plain-text table for people."""
        unit = REWARD_UNITS[self.reward]
        head = [
            "policy",
            "feedback",
            f"reward ({unit})",
            "mean tau",
            "tok/s",
            "% oracle",
            "% best fixed",
            "regret",
        ]
        rows = []
        for p in [*self.policies, self.best_fixed, self.oracle]:
            name = p.name + (" (best fixed)" if p is self.best_fixed else "")
            ci = p.ci("mean_reward")
            rew = _fmt(p.mean("mean_reward")) + ("" if ci is None else f" ± {_fmt((ci[1] - ci[0]) / 2)}")
            tp = p.mean("throughput")
            rows.append(
                [
                    name,
                    p.feedback,
                    rew,
                    f"{p.mean('mean_tau'):.2f}",
                    "-" if not math.isfinite(tp) else f"{tp:.1f}",
                    f"{p.mean('pct_oracle'):.1f}",
                    f"{p.mean('pct_best_fixed'):.1f}",
                    _fmt(p.mean("cumulative_regret")),
                ]
            )
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

        def line(r):
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

        seeds = f"{len(self.seeds)} seed{'s' if len(self.seeds) > 1 else ''}"
        title = (
            f"{self.traces or 'trace set'}: {self.n_steps} steps over {self.extras.get('requests', '?')} requests, "
            f"arms {list(self.arms)}, "
            f"reward {self.reward}{'' if self.latency is None else ' @ ' + self.latency}, "
            f"order {self.order}, {seeds}" + ("" if len(self.seeds) < 2 else " (± is the 95% CI)")
        )
        out = [title, line(head), line(["-" * w for w in widths])]
        out += [line(r) for r in rows]
        for kind in dict.fromkeys(p.feedback for p in [*self.policies, self.best_fixed, self.oracle]):
            where = f" (on {self.feedback_profile})" if kind == "full" and self.feedback_profile else ""
            out.append(f"feedback {kind}: {FEEDBACK_KINDS[kind]}{where}")
        if not self.has_throughput:
            out.append("tok/s: no timings in this trace set; pass --latency PROFILE to model them")
        out += [f"warning: {w}" for w in self.warnings]
        return "\n".join(out)


def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    a = abs(x)
    return f"{x:.0f}" if a >= 1000 else f"{x:.1f}" if a >= 100 else f"{x:.2f}" if a >= 1 else f"{x:.3f}"


# ============================================================================ replay
def replay_job(ctx: dict, spec: Any, seed: int, idx: np.ndarray, progress: Any = None) -> tuple:
    """One (policy, seed) replay of :func:`replay` over the stream ``idx``: ``(name, metrics,
    regret curve, arm indices chosen, feedback kind)``. ``ctx`` holds what :func:`replay` derived
    from the trace set (reward, tau and cost matrices, features, arms, the curve's steps, the
    counterfactual feedback or None)."""
    name, pol = _build(spec, ctx["arms"], seed)
    if progress is not None:
        progress.set_postfix_str(name, refresh=False)
    a = run_policy(pol, ctx["R"], idx, ctx["X"], progress, feedback=ctx["feedback"])
    m, c = _metrics(a, idx, ctx["R"], ctx["tau"], ctx["best"], ctx["fixed"], ctx["costs"], ctx["steps"])
    return name, m, c, a.astype(np.int16), feedback_of(pol, ctx["feedback"])


def _metrics(
    a: np.ndarray,
    idx: np.ndarray,
    R: np.ndarray,
    tau: np.ndarray,
    best: np.ndarray,
    fixed: int,
    costs: tuple[np.ndarray, np.ndarray] | None,
    steps: np.ndarray,
) -> tuple[dict[str, float], np.ndarray]:
    r = R[idx, a]
    opt = best[idx]
    fx = R[idx, fixed]
    regret = np.cumsum(opt - r)
    m = {
        "mean_reward": float(r.mean()),
        "mean_tau": float(tau[idx, a].mean()),
        "throughput": float("nan")
        if costs is None
        else float(costs[0][idx, a].sum() / costs[1][idx, a].sum()),
        "pct_oracle": float(pct_of(r.sum(), opt.sum())),
        "pct_best_fixed": float(pct_of(r.sum(), fx.sum())),
        "cumulative_regret": float(regret[-1]),
    }
    return m, regret[steps - 1]


def finite_rewards(traces: TraceSet, reward: str, profile: Any = None, batch_size: int = 1) -> np.ndarray:
    """``trace_rewards(traces, ...)`` (n, K), with an error naming the first request and block
    size whose reward is not finite (a replay cannot score it)."""
    R = trace_rewards(traces, reward, profile, batch_size)
    if not np.all(np.isfinite(R)):
        bad = np.argwhere(~np.isfinite(R))[0]
        raise AdaptspecError(
            f"reward {reward} is not finite for request {traces.request_ids[bad[0]]!r}, "
            f"block size {traces.arms[bad[1]]}"
        )
    return R


def replay(
    traces: TraceSet,
    policies: Sequence[Any] | str | Policy,
    *,
    reward: str = "tau",
    latency: LatencyProfile | str | None = None,
    batch_size: int = 1,
    seeds: Iterable[int] = (0,),
    order: str = "logged",
    n_steps: int | None = None,
    progress: bool | None = None,
    curve_points: int = 200,
    ray: str | bool | None = None,
    feedback: str = "auto",
) -> ReplayReport:
    """Replay ``policies`` (specs, Policy objects or ``factory(arms, seed)``) on ``traces``.

    The report's ``warnings`` name every head a policy stands on that was trained on these
    requests (:mod:`adaptspec.simulators.in_sample`: its scores are then in-sample).

    Each policy runs once per seed (a fresh policy seeded with it; Policy objects are copied,
    keeping what they learnt, with their generator re-seeded); the stream order uses the
    same seed. ``reward`` is ``tau``, ``throughput`` or ``token_latency`` (measured) or ``modelled`` (with
    ``latency``). Throughput in the report is total tokens over total decode time (modelled
    when a latency profile is given). Regret is against the per-request oracle.

    ``ray`` runs every (policy, seed) replay as a Ray task (:mod:`adaptspec.collect.ray_tasks`):
    ``True`` (a local Ray, or the one already initialised) or a cluster address. The report
    is the same as without it: each replay is deterministic given its seed, and the results
    are assembled in the same order.

    ``feedback``: ``auto`` feeds a policy with ``full_feedback`` every arm's counterfactual
    reward from the rounds of the arm it chose when the trace set keeps per-round taus, priced by
    the controller's pricer as a controller set up alike prices them
    (:func:`~adaptspec.simulators.counterfactuals.replay_feedback`): on ``latency`` when given, else
    on the costs measured from the rounds as they are served (the controller's default);
    ``bandit`` feeds every learning policy the chosen arm's reward; feedback already made for this
    trace set and reward (a :class:`~adaptspec.simulators.counterfactuals.Feedback` or
    ``OnlineFeedback``) is used as given. Each result says which it got.
    """
    check_reward_name(reward)
    policies, seeds = _checked(policies, seeds, feedback)
    prof = None if latency is None else get_profile(latency)
    R = finite_rewards(traces, reward, prof, batch_size)
    T = traces.n_requests if n_steps is None else int(n_steps)
    ctx = _replay_context(traces, R, prof, batch_size, T, curve_points)
    probes = [_build(spec, traces.arms, seeds[0])[1] for spec in policies]  # what each spec builds, once
    fb = None
    if not isinstance(feedback, str) or any(feedback_of(p, True) == "full" for p in probes):
        fb = _feedback(feedback, traces, R, reward, prof, batch_size)
    ctx["feedback"] = fb
    orders = [stream_order(traces, order, seed, T) for seed in seeds]
    jobs = [(spec, seed, idx) for seed, idx in zip(seeds, orders) for spec in policies]
    with _progress_bar(T * len(jobs), progress) as bar:
        oracle, best_fixed = _reference_results(ctx, orders)
        results = _run_jobs(ctx, jobs, ray, bar, T)
    policy_results = _policy_results(results, len(policies))
    any_full = any(p.feedback == "full" for p in policy_results)
    return ReplayReport(
        policies=policy_results,
        oracle=oracle,
        best_fixed=best_fixed,
        reward=reward,
        order=order,
        seeds=seeds,
        n_steps=T,
        arms=traces.arms,
        curve_steps=ctx["steps"],
        latency=None if prof is None else prof.name,
        traces=None if traces.path is None else str(traces.path),
        has_throughput=ctx["costs"] is not None,
        extras={"requests": traces.n_requests},
        feedback_profile=fb.profile if fb is not None and any_full else None,
        warnings=in_sample_warnings(probes, traces),
    )


def _checked(
    policies: Sequence[Any] | str | Policy, seeds: Iterable[int], feedback: Any
) -> tuple[list, list[int]]:
    """:func:`replay`'s policies as a list and its seeds as ints, refused without a seed or with an
    unknown feedback mode."""
    if isinstance(feedback, str) and feedback not in FEEDBACK_MODES:
        raise AdaptspecError(f"unknown feedback {feedback!r}: choose one of {', '.join(FEEDBACK_MODES)}")
    if isinstance(policies, (str, Policy)):
        policies = [policies]
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise AdaptspecError("replay needs at least one seed")
    return list(policies), seeds


def _replay_context(
    traces: TraceSet, R: np.ndarray, prof: LatencyProfile | None, batch_size: int, T: int, curve_points: int
) -> dict:
    """What every replay job reads (:func:`replay_job`'s ``ctx``) but the counterfactual feedback:
    the reward, tau and cost matrices, each request's best reward, the best fixed arm, the steps
    the regret curve keeps (at most ``curve_points`` of ``T``), the features and the arms."""
    tau = traces.tau_matrix()
    costs = trace_costs(traces, prof, batch_size)
    return {
        "R": R,
        "tau": tau,
        "best": R.max(axis=1),
        "fixed": int(np.argmax(R.mean(axis=0))),
        "costs": costs,
        "steps": np.unique(np.linspace(1, T, min(T, max(2, curve_points))).round().astype(np.int64)),
        "X": traces.features,
        "arms": traces.arms,
    }


def _progress_bar(total: int, progress: bool | None) -> tqdm:
    """The replay's progress bar over ``total`` steps (``progress`` None: shown on a terminal)."""
    return tqdm(
        total=total,
        desc="replay",
        unit="step",
        unit_scale=True,
        leave=False,
        disable=(not progress) if progress is not None else None,
        delay=1.0,
    )


def _reference_results(ctx: dict, orders: list[np.ndarray]) -> tuple[PolicyResult, PolicyResult]:
    """The oracle and the best fixed arm, replayed over every stream order."""
    arms, fixed = ctx["arms"], ctx["fixed"]
    refs = {"oracle": Oracle(arms), "fixed": Fixed(arms[fixed], arms=arms)}
    vals = {k: {m: [] for m in METRICS} for k in refs}
    curves: dict[str, list[np.ndarray]] = {k: [] for k in refs}
    chosen: dict[str, np.ndarray] = {}
    for k, idx in enumerate(orders):
        for key, ref in refs.items():
            a = run_policy(ref, ctx["R"], idx, ctx["X"])
            m, c = _metrics(a, idx, ctx["R"], ctx["tau"], ctx["best"], fixed, ctx["costs"], ctx["steps"])
            for name, v in m.items():
                vals[key][name].append(v)
            curves[key].append(c)
            if k == 0:
                chosen[key] = a.astype(np.int16)
    oracle = _result("oracle", vals["oracle"], curves["oracle"], chosen["oracle"], "oracle")
    best_fixed = _result(
        f"fixed:{arms[fixed]}", vals["fixed"], curves["fixed"], chosen["fixed"], "none", arms[fixed]
    )
    return oracle, best_fixed


def _run_jobs(ctx: dict, jobs: list[tuple], ray: str | bool | None, bar: tqdm, T: int) -> list[tuple]:
    """Every (policy, seed, order) job's :func:`replay_job` result, in the jobs' order: here, or
    as Ray tasks when ``ray`` is given."""
    if ray is not None and ray is not False:
        from .ray_sweep import replay_jobs

        return replay_jobs(replay_job, ctx, jobs, None if ray is True else ray, bar, T)
    return [replay_job(ctx, spec, seed, idx, bar) for spec, seed, idx in jobs]


def _policy_results(results: list[tuple], n_policies: int) -> list[PolicyResult]:
    """The jobs' results (seed-major) gathered per policy, over its seeds; a name given twice is
    numbered (``ucb#2``)."""
    names: list[str] = []
    vals: list[dict[str, list[float]]] = []
    curves: list[list[np.ndarray]] = []
    chosen: list[np.ndarray] = []
    kinds: list[str] = []
    for n, (name, m, c, a, kind) in enumerate(results):  # seed-major, as the jobs
        k, j = divmod(n, n_policies)
        if k == 0:
            names.append(name)
            vals.append({mm: [] for mm in METRICS})
            curves.append([])
            chosen.append(a)
            kinds.append(kind)
        for mm, v in m.items():
            vals[j][mm].append(v)
        curves[j].append(c)
    seen: dict[str, int] = {}
    for i, n in enumerate(names):
        seen[n] = seen.get(n, 0) + 1
        if seen[n] > 1:
            names[i] = f"{n}#{seen[n]}"
    return [_result(n, v, c, ch, kd) for n, v, c, ch, kd in zip(names, vals, curves, chosen, kinds)]


def _result(
    name: str, v: dict[str, list[float]], c: list[np.ndarray], ch: np.ndarray, kind: str, b: int | None = None
) -> PolicyResult:
    """A policy's :class:`PolicyResult` from its per-seed metrics and regret curves."""
    return PolicyResult(name, {m: np.asarray(x) for m, x in v.items()}, np.stack(c), ch, b, kind)


# ============================================================================ decision logs
def replay_log(
    traces: TraceSet,
    policy: Any,
    *,
    reward: str = "tau",
    latency: LatencyProfile | str | None = None,
    batch_size: int = 1,
    seed: int = 0,
    order: str = "logged",
    n_steps: int | None = None,
    start_time: float = 1.7e9,
    variant: str | None = None,
    progress: bool | None = None,
    feedback: Any = "auto",
):
    """Run one policy like the controller would and return its decision log as a table.

    Every step goes through the public ``decide`` and ``update`` (``update_full`` for a policy
    with ``full_feedback``, fed as :func:`replay` feeds it), so each row carries the decision's
    full probability vector and propensity; append it to a :class:`~adaptspec.traces.DecisionLog`
    to evaluate other policies off-policy. ``feedback``: as :func:`replay`'s, or a
    :class:`~adaptspec.simulators.counterfactuals.Feedback` of this trace set and reward already
    computed. With counterfactual feedback every row also carries the controller's ``cf_``
    columns (every arm's counterfactual reward, tokens, censored and approximate marks), as a
    served log does for any policy.
    """
    import pyarrow as pa

    check_reward_name(reward)
    prof = None if latency is None else get_profile(latency)
    R = trace_rewards(traces, reward, prof, batch_size)
    fb = _feedback(feedback, traces, R, reward, prof, batch_size)
    name, pol = _build(policy, traces.arms, seed)
    if pol.full_information:
        raise AdaptspecError(f"{name} sees every arm's reward: it cannot produce a decision log")
    X = traces.features
    if pol.contextual and X is None:
        raise AdaptspecError(f"policy {name} needs features, and this trace set has none")
    idx = stream_order(traces, order, seed, n_steps)
    kind = feedback_of(pol, fb)
    fb = None if fb is None else fb.fresh()
    chosen, probs, version, shown = _run_logged(pol, name, idx, X, R, fb, kind, progress)
    cols = _log_columns(traces, R, idx, chosen, probs, version, f"{name}/{seed}", name, variant, start_time)
    if fb is not None:
        cols.update(_cf_columns(shown, len(traces.arms)))
    return pa.table(cols)


def _run_logged(
    pol: Any, name: str, idx: np.ndarray, X: Any, R: np.ndarray, fb: Any, kind: str, progress: bool | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Any]]:
    """Steps the policy through the requests idx: each step's arm index, probabilities, policy version
    and shown feedback."""
    T, K = len(idx), R.shape[1]
    chosen = np.empty(T, dtype=np.int64)
    probs = np.empty((T, K))
    version = np.empty(T, dtype=np.int64)
    shown: list[Any] = []
    for t, i in enumerate(
        tqdm(
            idx.tolist(),
            desc=f"log {name}",
            unit="step",
            leave=False,
            delay=1.0,
            disable=(not progress) if progress is not None else None,
        )
    ):
        x = None if X is None else X[i].astype(np.float64)
        ctx = x if pol.contextual else None
        d = pol.decide(ctx)
        a = pol.arm_index(d.block_size)
        chosen[t], probs[t], version[t] = a, d.probs, d.version
        s = None if fb is None else fb.at(i, a)  # priced for every policy, as the controller logs it
        shown.append(s)
        if kind == "full" and s is not None:
            pol.update_full(ctx, s.rewards, s.observed)
        elif kind in ("full", "bandit"):
            pol.update(ctx, d.block_size, R[i, a])
    return chosen, probs, version, shown


def _log_columns(
    traces: TraceSet,
    R: np.ndarray,
    idx: np.ndarray,
    chosen: np.ndarray,
    probs: np.ndarray,
    version: np.ndarray,
    id_prefix: str,
    name: str,
    variant: str | None,
    start_time: float,
) -> dict[str, Any]:
    """The decision log's columns, as the controller writes them, for the steps run."""
    import pyarrow as pa

    T, K = probs.shape
    X = traces.features
    arms = traces.arm_array
    new = traces.new_tokens_matrix()[idx, chosen]
    rounds = traces.rounds_matrix()[idx, chosen]
    dec = traces.decode_s_matrix()
    cols = {
        "decision_id": pa.array([f"{id_prefix}/{t}" for t in range(T)]),
        "time": pa.array(((start_time + np.arange(T)) * 1e6).astype(np.int64)).cast(
            pa.timestamp("us", tz="UTC")
        ),
        "request_id": pa.array(traces.request_ids[idx].tolist(), pa.string()),
        "policy": pa.array([name] * T),
        "version": pa.array(version),
        "variant": pa.array([variant] * T, pa.string()),
        "block_size": pa.array(arms[chosen]),
        "propensity": pa.array(probs[np.arange(T), chosen]),
        "probs": pa.FixedSizeListArray.from_arrays(pa.array(probs.ravel()), K).cast(pa.list_(pa.float64())),
        "arms": pa.FixedSizeListArray.from_arrays(pa.array(np.tile(arms, T)), K).cast(pa.list_(pa.int64())),
        "reward": pa.array(R[idx, chosen]),
        "new_tokens": pa.array(new, pa.float64(), mask=np.isnan(new)).cast(pa.int64()),
        "decode_ms": pa.array(
            np.zeros(T) if dec is None else 1000 * dec[idx, chosen],
            mask=None if dec is not None else np.ones(T, bool),
        ),
        "mean_tau": pa.array(traces.tau_matrix()[idx, chosen]),
        "rounds": pa.array(rounds, pa.float64(), mask=np.isnan(rounds)).cast(pa.int64()),
    }
    if X is not None:
        f = X[idx].astype(np.float32)
        cols["features"] = pa.FixedSizeListArray.from_arrays(pa.array(f.ravel()), f.shape[1]).cast(
            pa.list_(pa.float32())
        )
    return cols


def _feedback(
    feedback: Any, traces: TraceSet, R: np.ndarray, reward: str, prof: LatencyProfile | None, batch_size: int
) -> Any:
    """The counterfactual feedback ``feedback`` asks for (a mode of :data:`FEEDBACK_MODES`, or
    feedback already made for this trace set and reward), or None (the chosen arm only)."""
    if not isinstance(feedback, str):
        if feedback.rewards.shape[:2] != R.shape:
            raise AdaptspecError(
                f"feedback of shape {feedback.rewards.shape[:2]} does not fit this trace set's "
                f"{R.shape} rewards"
            )
        return feedback
    if feedback not in FEEDBACK_MODES:
        raise AdaptspecError(f"unknown feedback {feedback!r}: choose one of {', '.join(FEEDBACK_MODES)}")
    return replay_feedback(traces, R, reward, prof, batch_size) if feedback == "auto" else None


def _cf_columns(shown: list[Any], k: int) -> dict[str, Any]:
    """The decision log's ``cf_`` columns of rows whose rounds showed ``shown`` (None: not priced, null)."""
    import pyarrow as pa

    T = len(shown)
    mask = np.array([s is None for s in shown])
    blank = (np.full(k, np.nan), np.zeros(k, bool), np.full(k, np.nan), np.zeros(k, bool))
    rows = [blank if s is None else s for s in shown]

    def lists(pos: int, kind: Any, flip: bool = False) -> Any:
        values = np.stack([np.asarray(r[pos]) for r in rows]) if rows else np.zeros((0, k))
        flat = pa.array((~values if flip else values).ravel(), kind)
        return pa.ListArray.from_arrays(pa.array(np.arange(T + 1) * k, pa.int32()), flat, mask=pa.array(mask))

    return {
        "cf_rewards": lists(0, pa.float64()),
        "cf_tokens": lists(2, pa.float64()),
        "cf_censored": lists(1, pa.bool_(), flip=True),
        "cf_approximate": lists(3, pa.bool_()),
    }
