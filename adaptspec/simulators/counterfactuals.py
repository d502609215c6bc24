"""A trace set's counterfactual feedback, priced as the controller prices it: for every request and
every arm that could run, the reward each arm would have been paid from that arm's rounds.

Two ways, as the controller has two (:func:`replay_feedback` picks the one that matches how the
controller would be set up):

- on a fixed latency profile (the controller's ``latency=``): :func:`trace_feedback` prices every
  (request, arm) once, a :class:`Feedback` of arrays;
- on the costs measured from the rounds themselves (the controller's default, no ``latency``:
  :class:`~adaptspec.costs.measured.MeasuredCosts`, which learns as requests come, so the
  prices depend on what was served before): :class:`OnlineFeedback` prices each request when a
  replay serves it, with a fresh pricer per replay, exactly as a controller serving that stream.

Replaying a full-information policy (``full_feedback``) on a trace set needs, after it chose arm
``j`` on request ``i``, every arm's counterfactual reward from the rounds ``j`` ran there and
which arms they show: ``rewards[i, j]`` (K,) and ``observed[i, j]`` (K,). They come from the
controller's own function, :meth:`~adaptspec.reward.pricing.CounterfactualPricer.price`,
given the trace row as the :class:`~adaptspec.speculator.Outcome` the decoder returned (its
rounds' taus, each round's verified length cut to what ``max_new_tokens`` left, the measured
decode time and new tokens) and the prompt's length: the arm that ran is paid its own reward
from the reward matrix (what the bandit replay pays it), the others their counterfactual reward,
timed by the latency profile and scaled to the measured time of what ran. Where the pricer gives
nothing (no round ran, or the rounds cannot be priced) the request is learnt from as a bandit
(``priced`` False), as the controller's learner does.

Which profile :func:`trace_feedback` prices the rounds with (:func:`feedback_profile`): the
``latency`` given, else the trace set's ``latency_profile``, else the controller's
:data:`~adaptspec.reward.pricing.DEFAULT_PROFILE`.

>>> from adaptspec.traces import TraceSet
>>> import pyarrow as pa
>>> ts = TraceSet.from_arrays(["q"], ["chat"], [1, 2, 4], np.array([[1.0, 1.5, 2.0]]), prompt_tokens=[20])
>>> has_rounds(ts)
False
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from ..costs.latency import LatencyProfile, get_profile
from ..costs.measured import MeasuredCosts
from ..errors import AdaptspecError
from ..reward.functions import trace_context
from ..reward.pricing import DEFAULT_PROFILE, CounterfactualPricer
from ..speculator import Decision, Outcome, Round, arm_label, drafted_positions, verified_positions

#: what :class:`OnlineFeedback` reports as its profile
MEASURED = "costs measured from the rounds as served (the controller's default)"


class Shown(NamedTuple):
    """Every arm's counterfactual outcome one request's rounds show (K each): ``rewards`` (a lower
    bound where not ``observed``), ``observed``, ``tokens``, ``approximate``."""

    rewards: np.ndarray
    observed: np.ndarray
    tokens: np.ndarray
    approximate: np.ndarray


@dataclass(frozen=True)
class Feedback:
    """``rewards`` (n, K, K): ``rewards[i, j, k]`` the reward of arm ``k`` on request ``i``
    seen from the rounds of arm ``j`` (a lower bound where not observed, as the decision log's
    ``cf_rewards``); ``observed`` (n, K, K) where that is known (not censored); ``approximate``
    (n, K, K) where it is known only approximately (another block drafted); ``priced`` (n, K):
    the rounds of arm ``j`` on request ``i`` were priced (else that request is learnt from as a
    bandit, and only ``[i, j, j]`` is set; None: all were); ``tokens`` (n, K, K): the tokens the
    rounds would have committed at each arm (None: not kept); ``profile``: the name of the
    profile that priced them."""

    rewards: np.ndarray
    observed: np.ndarray
    approximate: np.ndarray
    priced: np.ndarray | None = None
    tokens: np.ndarray | None = None
    profile: str | None = None

    def fresh(self) -> "Feedback":
        """The feedback one replay uses (priced once: this one)."""
        return self

    def at(self, i: int, j: int) -> Shown | None:
        """What the rounds of arm ``j`` on request ``i`` show (None: not priced, learnt as a bandit)."""
        if self.priced is not None and not self.priced[i, j]:
            return None
        tok = np.full(self.rewards.shape[2], np.nan) if self.tokens is None else self.tokens[i, j]
        return Shown(self.rewards[i, j], self.observed[i, j], tok, self.approximate[i, j])


@dataclass(frozen=True)
class OnlineFeedback:
    """Counterfactual feedback priced as a replay serves each request, on the costs measured from
    the rounds so far (a fresh :class:`~adaptspec.costs.measured.MeasuredCosts` per replay:
    :meth:`fresh`), as a controller with no latency profile prices them. ``outcomes[i][j]`` is the
    outcome of arm ``j`` on request ``i``; ``rewards`` the reward matrix (the arm that ran is paid
    its own)."""

    outcomes: list
    rewards: np.ndarray
    reward: str
    arms: tuple[int, ...]
    prompt_tokens: tuple
    request_ids: tuple
    batch_size: int = 1
    pricer: Any = None
    profile: str = MEASURED

    def fresh(self) -> "OnlineFeedback":
        """This feedback with a pricer that has measured nothing yet (one per replay)."""
        costs = MeasuredCosts(get_profile(DEFAULT_PROFILE))
        return replace(self, pricer=CounterfactualPricer(self.reward, costs, batch_size=self.batch_size))

    def at(self, i: int, j: int) -> Shown | None:
        """Price the rounds of arm ``j`` on request ``i`` now (the pricer learns their costs)."""
        if self.pricer is None:
            raise AdaptspecError(
                "OnlineFeedback.at needs fresh() first: each replay prices with its own pricer"
            )
        k = len(self.arms)
        d = Decision(
            self.arms[j],
            1.0,
            np.eye(k)[j],
            self.arms,
            "replay",
            decision_id=f"{self.request_ids[i]}@{self.arms[j]}",
        )
        fb = self.pricer.price(d, self.outcomes[i][j], float(self.rewards[i, j]), self.prompt_tokens[i])
        return None if fb is None else Shown(fb.rewards, fb.observed, fb.tokens, fb.approximate)


def has_rounds(traces: Any) -> bool:
    """Whether ``traces`` keeps every outcome's per-round taus (what counterfactuals are read from)."""
    out = traces.outcomes
    return "tau" in out.column_names and out.num_rows > 0 and out.column("tau").null_count == 0


def per_round_taus(traces: Any) -> list[list[list[int]]]:
    """``taus[i][j]``: the tau of every round of request ``i`` at arm ``j`` (the trace set's
    ``tau`` lists); a trace set without them raises."""
    out = traces.outcomes
    if "tau" not in out.column_names:
        raise AdaptspecError("this trace set has no per-round tau lists: counterfactuals need the rounds")
    rid = {r: i for i, r in enumerate(traces.request_ids.tolist())}
    col = {a: j for j, a in enumerate(traces.arms)}
    n, k = traces.n_requests, len(traces.arms)
    taus: list[list[list[int]]] = [[[] for _ in range(k)] for _ in range(n)]
    for r, b, t in zip(
        out.column("request_id").to_pylist(),
        out.column("block_size").to_pylist(),
        out.column("tau").to_pylist(),
    ):
        taus[rid[r]][col[int(b)]] = [int(x) for x in (t or [])]
    return taus


def feedback_profile(traces: Any, latency: LatencyProfile | str | None = None) -> LatencyProfile:
    """The profile a replay prices counterfactual rounds with (see the module docstring)."""
    return get_profile(latency or traces.meta.get("latency_profile") or DEFAULT_PROFILE)


def per_round_times(traces: Any) -> list[list[list[tuple[float, float]]]]:
    """``times[i][j]``: every round's ``(draft_s, verify_s)`` of request ``i`` at arm ``j`` (the
    trace set's ``draft_ms`` and ``verify_ms`` lists; empty where it has none)."""
    out = traces.outcomes
    n, k = traces.n_requests, len(traces.arms)
    times: list[list[list[tuple[float, float]]]] = [[[] for _ in range(k)] for _ in range(n)]
    if "draft_ms" not in out.column_names or "verify_ms" not in out.column_names:
        return times
    rid = {r: i for i, r in enumerate(traces.request_ids.tolist())}
    col = {a: j for j, a in enumerate(traces.arms)}
    for r, b, d, v in zip(
        out.column("request_id").to_pylist(),
        out.column("block_size").to_pylist(),
        out.column("draft_ms").to_pylist(),
        out.column("verify_ms").to_pylist(),
    ):
        if d is not None and v is not None and len(d) == len(v):
            times[rid[r]][col[int(b)]] = [(float(x) / 1000, float(y) / 1000) for x, y in zip(d, v)]
    return times


def trace_outcome(
    taus: list[int],
    block_size: int,
    limit: int,
    decode_s: float,
    new_tokens: float,
    times: list[tuple[float, float]] | None = None,
) -> Outcome:
    """The :class:`~adaptspec.speculator.Outcome` a decoder returned for one trace row: a round per
    tau, verifying ``block_size`` positions or, at the request's end, what is left of ``limit``
    (``max_new_tokens``; 0: no limit known) after the tokens before it (the prefill's included),
    timed by ``times`` (each round's draft and verify seconds; None or another length: untimed);
    ``new_tokens`` NaN: the rounds' tokens and the prefill's. Raises when a round commits more than
    its verified length allows (not an outcome a decoder can return)."""
    rounds, made = [], 1
    timed = times if times is not None and len(times) == len(taus) else [(0.0, 0.0)] * len(taus)
    tree = (
        block_size < 0
    )  # a tree arm -N: rounds of N + 1 positions drafted at its depth (speculator.tree_arm)
    for t, (d_s, v_s) in zip(taus, timed):
        most = drafted_positions(block_size) if tree else block_size
        v = min(most, limit - made) if limit else most
        if not 1 <= t <= v:
            raise AdaptspecError(
                f"block size {arm_label(block_size)}: a round commits {t} tokens where "
                f"max_new_tokens={limit} leaves {v}"
            )
        if tree:  # what the tree showed of other arms is not in a trace set: only this arm is known
            rounds.append(
                Round(
                    verified_positions(block_size) if v > 1 else 1,
                    int(t),
                    d_s,
                    v_s,
                    drafted=v if v > 1 else 0,
                    tree=v > 1,
                )
            )
        else:
            rounds.append(Round(v, int(t), d_s, v_s))
        made += int(t)
    n = made if np.isnan(new_tokens) else int(new_tokens)
    return Outcome([0] * n, rounds, decode_s=float(decode_s))


def trace_outcomes(traces: Any, max_new_tokens: int | None = None) -> list[list[Outcome]]:
    """``outcomes[i][j]``: the :func:`trace_outcome` of every (request, arm) of ``traces``, timed."""
    limit = int(max_new_tokens or traces.meta.get("max_new_tokens") or 0)
    taus, times = per_round_taus(traces), per_round_times(traces)
    dec, new = traces.decode_s_matrix(), traces.new_tokens_matrix()
    rid = traces.request_ids
    out = []
    for i in range(traces.n_requests):
        row = []
        for j, b in enumerate(traces.arms):
            try:
                row.append(
                    trace_outcome(
                        taus[i][j],
                        int(b),
                        limit,
                        np.nan if dec is None else dec[i, j],
                        new[i, j],
                        times[i][j],
                    )
                )
            except AdaptspecError as e:
                raise AdaptspecError(f"request {rid[i]!r}, {e}") from None
        out.append(row)
    return out


def replay_feedback(
    traces: Any, R: np.ndarray, reward: str, latency: LatencyProfile | str | None = None, batch_size: int = 1
) -> Feedback | OnlineFeedback | None:
    """The counterfactual feedback a replay gives full-feedback policies, priced as a controller set
    up alike prices it: on ``latency`` when given (``AdaptiveController(latency=...)``; a
    :class:`Feedback`), else on the costs measured from the rounds as they are served (the
    controller's default; an :class:`OnlineFeedback`). None when the trace set keeps no per-round taus."""
    if not has_rounds(traces):
        return None
    if latency is not None:
        return trace_feedback(traces, R, reward, latency, batch_size)
    if reward == "modelled":
        raise AdaptspecError("the modelled reward needs a latency profile")
    pt = traces.prompt_tokens
    return OnlineFeedback(
        trace_outcomes(traces),
        np.asarray(R, dtype=np.float64),
        reward,
        tuple(int(a) for a in traces.arms),
        tuple(None if np.isnan(x) else int(x) for x in pt),
        tuple(traces.request_ids.tolist()),
        int(batch_size),
    )


def trace_feedback(
    traces: Any,
    R: np.ndarray,
    reward: str,
    profile: LatencyProfile | str | None = None,
    batch_size: int = 1,
    max_new_tokens: int | None = None,
) -> Feedback:
    """Counterfactual feedback of every (request, arm that ran) of ``traces`` for reward matrix
    ``R`` (n, K) of reward ``reward``, priced by the controller's pricer on ``profile`` (see
    :func:`feedback_profile`) at ``batch_size``; a round's verified length is its arm, cut to what
    is left of ``max_new_tokens`` (default: the trace set's) at the request's end."""
    prof = feedback_profile(traces, profile)
    pricer = CounterfactualPricer(reward, prof, batch_size=batch_size)
    outcomes = trace_outcomes(traces, max_new_tokens)
    arms = tuple(int(a) for a in traces.arms)
    n, k = R.shape
    pt = traces.prompt_tokens
    ctx = trace_context(traces, prof) if reward == "modelled" else None
    rew = np.zeros((n, k, k))
    tok = np.full((n, k, k), np.nan)
    obs = np.zeros((n, k, k), dtype=bool)
    apx = np.zeros((n, k, k), dtype=bool)
    priced = np.zeros((n, k), dtype=bool)
    rid = traces.request_ids
    for i in range(n):
        prompt = None if np.isnan(pt[i]) else int(pt[i])
        for j, b in enumerate(arms):
            decision = Decision(b, 1.0, np.eye(k)[j], arms, "replay", decision_id=f"{rid[i]}@{b}")
            fb = pricer.price(
                decision,
                outcomes[i][j],
                float(R[i, j]),
                prompt,
                reward_context=None if ctx is None else float(ctx[i, j]),
            )
            if fb is None:  # learnt from as a bandit: the arm that ran alone
                rew[i, j, j], obs[i, j, j] = R[i, j], True
                continue
            priced[i, j] = True
            rew[i, j], tok[i, j], obs[i, j], apx[i, j] = fb.rewards, fb.tokens, fb.observed, fb.approximate
    return Feedback(rew, obs, apx, priced, tok, prof.name)
