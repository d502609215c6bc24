"""Fleet replay: R replicas learning one policy together on a full-information trace set.

Requests of one stream go to the replicas in turn (request ``t`` to replica ``t mod R``). Each
replica decides with its own copy of the policy and learns from the reward of the block size
it chose (or, given the counterfactual feedback, every block size the request showed), exactly as :class:`~adaptspec.fleet.SharedState` makes a served replica learn: its own
update at once, and every ``sync_every`` of its own updates it publishes its sums and rebuilds
its policy as prior + everyone's published sums (:mod:`adaptspec.fleet.stats`). Deterministic
(no threads, no network): the consistency window is the ``sync_every`` updates alone.

The learning curve is the mean regret against the best fixed block size of the trace set, as a
function of the number of requests *per replica*: with R replicas sharing, a replica has learnt
from about R times as many rewards as it has served, so its curve should reach the
single-replica curve's level about R times sooner (:func:`speedup`).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np

from .stats import family_for, merge_sums

__all__ = ["fleet_replay", "learning_curve", "speedup"]


def fleet_replay(
    make: Callable[[int], Any],
    rewards: np.ndarray,
    contexts: np.ndarray | None,
    *,
    replicas: int,
    steps_per_replica: int,
    sync_every: int = 8,
    seed: int = 0,
    feedback: Any = None,
) -> np.ndarray:
    """Regret against the best fixed arm of every request each replica served: ``(replicas, steps)``.

    ``make(i)`` builds replica ``i``'s policy (same spec and seed for all: they differ by what
    they learn). The stream draws requests uniformly with replacement (``seed``). ``feedback``
    (a :class:`~adaptspec.simulators.counterfactuals.Feedback` of ``rewards``): a policy that
    learns every arm a request shows (``full_feedback``, shared by its family) learns them, as a
    served replica does; without it, the arm that ran.
    """
    R = np.asarray(rewards, dtype=np.float64)
    best = int(np.argmax(R.mean(axis=0)))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, R.shape[0], size=replicas * steps_per_replica)
    pols = [make(i) for i in range(replicas)]
    fam = family_for(pols[0])
    full = feedback is not None and pols[0].full_feedback and fam.full_feedback
    local = [fam.zero() for _ in range(replicas)]
    published = [fam.zero() for _ in range(replicas)]
    since = [0] * replicas
    regret = np.empty((replicas, steps_per_replica))
    X = None if contexts is None else np.asarray(contexts, dtype=np.float64)
    for t, i in enumerate(idx.tolist()):
        r = t % replicas
        pol = pols[r]
        x = None if X is None or not pol.contextual else X[i]
        d = pol.decide(x)
        a = pol.arm_index(d.block_size)
        regret[r, t // replicas] = R[i, best] - R[i, a]
        pre = fam.before(pol)
        if full:
            rew, obs = feedback.rewards[i, a], feedback.observed[i, a]
            pol.update_full(x, rew, obs)
            fam.observe_full(local[r], pol, x, rew, obs, pre)
        else:
            pol.update(x, d.block_size, float(R[i, a]))
            fam.observe(local[r], pol, x, a, float(R[i, a]), pre)
        since[r] += 1
        if replicas > 1 and since[r] >= sync_every:
            since[r] = 0
            published[r] = copy.deepcopy(local[r])
            others = merge_sums(fam, [published[s] for s in range(replicas) if s != r])
            fam.apply(pol, fam.add(others, local[r]))
    return regret


def learning_curve(regret: np.ndarray, width: int) -> np.ndarray:
    """Mean regret over replicas (and seeds: stack them first) in bins of ``width`` requests per replica."""
    flat = regret.reshape(-1, regret.shape[-1])
    n = flat.shape[1] - flat.shape[1] % width
    return flat[:, :n].reshape(flat.shape[0], n // width, width).mean(axis=(0, 2))


def reach(curve: np.ndarray, width: int, level: float) -> float:
    """Requests (per replica) after which a binned curve's running minimum is at or below ``level`` (NaN: never)."""
    below = np.flatnonzero(np.minimum.accumulate(curve) <= level)
    return float((below[0] + 1) * width) if len(below) else np.nan


def speedup(
    single: np.ndarray, single_width: int, fleet: np.ndarray, fleet_width: int, levels: np.ndarray
) -> np.ndarray:
    """For each regret level: requests one replica alone needs to reach it / requests per replica of the fleet.

    Compare curves binned over the same number of rewards learnt from (``fleet_width`` =
    ``single_width / replicas``), so that both are measured at the same resolution and with the
    same noise (a bin of either averages the same number of requests).
    """
    return np.array([reach(single, single_width, L) / reach(fleet, fleet_width, L) for L in levels])
