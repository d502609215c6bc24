"""A trace set's counterfactual feedback, priced as the controller prices it: for every request and
every arm that could run, the reward each arm would have been paid from that arm's rounds.

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

Which profile prices the rounds (:func:`feedback_profile`): the replay's ``latency`` when given
(the one its reward matrix is modelled on), else the trace set's ``latency_profile``, else the
controller's :data:`~adaptspec.reward.pricing.DEFAULT_PROFILE`.

>>> from adaptspec.traces import TraceSet
>>> import pyarrow as pa
>>> ts = TraceSet.from_arrays(["q"], ["chat"], [1, 2, 4], np.array([[1.0, 1.5, 2.0]]), prompt_tokens=[20])
>>> has_rounds(ts)
False
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..reward.pricing import DEFAULT_PROFILE, CounterfactualPricer
from ..errors import AdaptspecError
from ..reward.functions import trace_context
from ..reward.latency import LatencyProfile, get_profile
from ..speculator import Decision, Outcome, Round


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
    for r, b, t in zip(out.column("request_id").to_pylist(), out.column("block_size").to_pylist(),
                       out.column("tau").to_pylist()):
        taus[rid[r]][col[int(b)]] = [int(x) for x in (t or [])]
    return taus


def feedback_profile(traces: Any, latency: LatencyProfile | str | None = None) -> LatencyProfile:
    """The profile a replay prices counterfactual rounds with (see the module docstring)."""
    return get_profile(latency or traces.meta.get("latency_profile") or DEFAULT_PROFILE)


def trace_outcome(taus: list[int], block_size: int, limit: int, decode_s: float, new_tokens: float) -> Outcome:
    """The :class:`~adaptspec.speculator.Outcome` a decoder returned for one trace row: a round per
    tau, verifying ``block_size`` positions or, at the request's end, what is left of ``limit``
    (``max_new_tokens``; 0: no limit known) after the tokens before it (the prefill's included);
    ``new_tokens`` NaN: the rounds' tokens and the prefill's. Raises when a round commits more than
    its verified length allows (not an outcome a decoder can return)."""
    rounds, made = [], 1
    for t in taus:
        v = min(block_size, limit - made) if limit else block_size
        if not 1 <= t <= v:
            raise AdaptspecError(f"block size {block_size}: a round commits {t} tokens where "
                                 f"max_new_tokens={limit} leaves {v}")
        rounds.append(Round(v, int(t), 0.0, 0.0))
        made += int(t)
    n = made if np.isnan(new_tokens) else int(new_tokens)
    return Outcome([0] * n, rounds, decode_s=float(decode_s))


def trace_feedback(traces: Any, R: np.ndarray, reward: str, profile: LatencyProfile | str | None = None,
                   batch_size: int = 1, max_new_tokens: int | None = None) -> Feedback:
    """Counterfactual feedback of every (request, arm that ran) of ``traces`` for reward matrix
    ``R`` (n, K) of reward ``reward``, priced by the controller's pricer on ``profile`` (see
    :func:`feedback_profile`) at ``batch_size``; a round's verified length is its arm, cut to what
    is left of ``max_new_tokens`` (default: the trace set's) at the request's end."""
    prof = feedback_profile(traces, profile)
    pricer = CounterfactualPricer(reward, prof, batch_size=batch_size)
    limit = int(max_new_tokens or traces.meta.get("max_new_tokens") or 0)
    taus = per_round_taus(traces)
    arms = tuple(int(a) for a in traces.arms)
    n, k = R.shape
    pt = traces.prompt_tokens
    dec = traces.decode_s_matrix()
    new = traces.new_tokens_matrix()
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
            try:
                out = trace_outcome(taus[i][j], b, limit, np.nan if dec is None else dec[i, j], new[i, j])
            except AdaptspecError as e:
                raise AdaptspecError(f"request {rid[i]!r}, {e}") from None
            decision = Decision(b, 1.0, np.eye(k)[j], arms, "replay", decision_id=f"{rid[i]}@{b}")
            fb = pricer.price(decision, out, float(R[i, j]), prompt,
                              reward_context=None if ctx is None else float(ctx[i, j]))
            if fb is None:  # learnt from as a bandit: the arm that ran alone
                rew[i, j, j], obs[i, j, j] = R[i, j], True
                continue
            priced[i, j] = True
            rew[i, j], tok[i, j], obs[i, j], apx[i, j] = fb.rewards, fb.tokens, fb.observed, fb.approximate
    return Feedback(rew, obs, apx, priced, tok, prof.name)
