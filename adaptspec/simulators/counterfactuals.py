"""A trace set's counterfactual feedback: for every request and every arm that could run, the
reward each arm would have been paid from that arm's rounds (:mod:`adaptspec.reward.counterfactual`).

Replaying a full-information policy (``full_feedback``) on a trace set needs, after it chose arm
``j`` on request ``i``, every arm's counterfactual reward from the rounds ``j`` ran there and
which arms they show: ``rewards[i, j]`` (K,) and ``observed[i, j]`` (K,). The arm that ran is
paid its own reward from the reward matrix (what the bandit replay pays it); the others get
counterfactual rewards priced by the trace set's latency profile, scaled to the measured time
of what ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import AdaptspecError
from ..reward.counterfactual import counterfactuals
from ..reward.functions import trace_context
from ..reward.latency import LatencyProfile, get_profile


@dataclass(frozen=True)
class Feedback:
    """``rewards`` (n, K, K): ``rewards[i, j, k]`` the reward of arm ``k`` on request ``i``
    seen from the rounds of arm ``j``; ``observed`` (n, K, K) where that is known (not censored);
    ``approximate`` (n, K, K) where it is known only approximately (another block drafted)."""

    rewards: np.ndarray
    observed: np.ndarray
    approximate: np.ndarray


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


def trace_feedback(traces: Any, R: np.ndarray, reward: str, profile: LatencyProfile | str | None = None,
                   batch_size: int = 1, max_new_tokens: int | None = None) -> Feedback:
    """Counterfactual feedback of every (request, arm that ran) of ``traces`` for reward matrix
    ``R`` (n, K) of reward ``reward``. ``profile`` prices the rounds (default: the trace set's
    ``latency_profile``); a round's verified length is its arm, cut to what is left of
    ``max_new_tokens`` (default: the trace set's) at the request's end."""
    prof = get_profile(profile or traces.meta.get("latency_profile") or "")
    limit = int(max_new_tokens or traces.meta.get("max_new_tokens") or 0)
    taus = per_round_taus(traces)
    arms = np.asarray(traces.arms, dtype=np.int64)
    n, k = R.shape
    pt = traces.prompt_tokens
    dec = traces.decode_s_matrix()
    new = traces.new_tokens_matrix()
    ctx = trace_context(traces, prof) if reward == "modelled" else None
    rew = np.zeros((n, k, k))
    obs = np.zeros((n, k, k), dtype=bool)
    apx = np.zeros((n, k, k), dtype=bool)
    for i in range(n):
        for j, b in enumerate(arms.tolist()):
            t = np.asarray(taus[i][j], dtype=np.int64)
            m = 1 + np.concatenate([[0], np.cumsum(t)[:-1]]) if t.size else t
            v = np.minimum(b, limit - m) if limit else np.full(t.size, b)
            if t.size and np.any(v < t):
                raise AdaptspecError(f"request {traces.request_ids[i]!r}, block size {b}: a round commits more "
                                     f"than max_new_tokens={limit} leaves")
            cf = counterfactuals(t, v, arms=arms, decided=b, context_tokens=int(pt[i]), profile=prof,
                                 decode_s=None if dec is None else float(dec[i, j]),
                                 new_tokens=None if np.isnan(new[i, j]) else int(new[i, j]), batch=batch_size)
            r = cf.rewards(reward, prof, None if ctx is None else float(ctx[i, j]), batch_size)
            r[j] = R[i, j]
            rew[i, j], obs[i, j], apx[i, j] = np.where(cf.observed, r, 0.0), cf.observed, cf.approximate
    return Feedback(rew, obs, apx)
