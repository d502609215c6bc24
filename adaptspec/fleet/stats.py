"""Additive statistics of a policy: what replicas of a fleet exchange, and how a policy is rebuilt from them.

Every policy family that can be shared learns from sums: per arm, the context-free bandits keep
a count, a reward sum and a sum of squares; the linear ones (LinUCB, LinTS) and NeuralLinear a
ridge posterior ``A_a = P_a + sum phi phi^T``, ``b_a = P_a m_a + sum r phi`` (``P``, ``m``: the
prior). A replica keeps the sums of *its own* feedback (:meth:`Family.observe`), publishes them
whole, and rebuilds its policy as *prior + the sum over replicas* (:meth:`Family.apply`). Sums
do not depend on the order of the updates, so the merged statistics are those of one process
that saw every feedback (to floating-point rounding), and publishing cumulative sums (not
increments) makes a repeated or replayed message harmless.

Two quantities are *not* order-free, and are shared as the sum of each replica's own
increments, an estimate of the same quantity rather than the single process's value:

- the noise estimate of the linear policies and NeuralLinear (prequential residuals: each was
  scored against the replica's posterior at that moment);
- NeuralLinear's evidence for each head weight (the same prequential scores).

The context-free families' running reward statistics (count, mean, M2, min, max: what UCB's
bonus scale and Thompson sampling's prior use) merge exactly (Chan et al.'s parallel variance).

Full information (``fi-ucb``, :class:`FullInfo`): a request updates every arm it showed
(:meth:`Family.observe_full`), and the sums are per arm the count, sum and sum of squares of the
rewards shown, the reference arm's (the smallest block size's) count and sum, and per arm the
count and sum of its differences from the reference on the requests that showed both: the paired
means (the policy's estimates) of the merged sums are exactly those of one process that saw every
request. Two are estimates, summed over the replicas' own increments: the prequential errors of the
differences (the bonus' scale: each difference was scored against the replica's mean difference
at that moment) and the running statistics of the first rewards (the scale's fallback, fed only
until every arm has an outcome, which each replica judges on its own view of the fleet).

Not shareable (refused by :func:`family_for` with one line): discounted or windowed policies
(a discount weighs an observation by its age in *global* update order, which replicas do not
share; a window needs that order too), EXP3 (its importance weights use each replica's own
probabilities and running reward range), LinUCB / LinTS with the default warm-up standardiser
(each replica would fit its own feature map: use ``standardize=false`` on a featurizer's
output, or a fixed ``Standardizer``), SquareCB, river policies and the full-information linear
policy (``fi-linucb``). Policies that learn nothing
(``fixed``, ``random``, ``head``) share nothing and need no family (:data:`NOTHING`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from ..errors import AdaptspecError

__all__ = ["Family", "family_for", "NOTHING", "merge_sums"]

Sums = dict[str, np.ndarray]


def merge_sums(family: "Family", parts: list[Sums]) -> Sums:
    """The fleet's sums: the sum of the parts (exact merge of running statistics where there are some)."""
    out = family.zero()
    for p in parts:
        out = family.add(out, p)
    return out


class Family:
    """How one policy family's statistics are kept, added and applied (subclasses per family)."""

    #: keys of the sums whose merge is an estimate (see the module docstring), for reports
    approximate: tuple[str, ...] = ()
    #: where a sum may be infinite (key -> index), checked by :meth:`check`; elsewhere every value is finite
    infinite_ok: dict[str, Any] = {}

    def __init__(self, policy: Any) -> None:
        self.arms = tuple(int(a) for a in policy.arms)
        self.k = len(self.arms)

    def fingerprint(self, policy: Any) -> str:
        """What every replica of one variant must agree on (policy type, arms, feature map, prior)."""
        h = hashlib.sha256(json.dumps(self._identity(policy), sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]

    def _identity(self, policy: Any) -> dict[str, Any]:
        return {"name": policy.name, "label": policy.label, "arms": list(self.arms)}

    def zero(self) -> Sums:
        raise NotImplementedError

    def add(self, a: Sums, b: Sums) -> Sums:
        return {k: a[k] + b[k] for k in a}

    def before(self, policy: Any) -> Any:
        """What :meth:`observe` needs from the policy just before an update (default: nothing)."""
        return None

    #: whether :meth:`observe_full` is supported (a policy with ``full_feedback`` can share every arm it learns)
    full_feedback = False

    def observe(
        self, sums: Sums, policy: Any, context: np.ndarray | None, arm: int, reward: float, pre: Any
    ) -> None:
        """Add one update, already applied to ``policy``, to ``sums`` (in place)."""
        raise NotImplementedError

    def observe_full(
        self,
        sums: Sums,
        policy: Any,
        context: np.ndarray | None,
        rewards: np.ndarray,
        observed: np.ndarray,
        pre: Any,
    ) -> None:
        """Add one full-information update (``policy.update_full``, already applied) to ``sums`` (in place)."""
        raise AdaptspecError(f"the shared statistics of {type(self).__name__} are of the arm that ran only")

    def apply(self, policy: Any, total: Sums) -> None:
        """Set ``policy``'s learnt statistics to prior + ``total``."""
        raise NotImplementedError

    @staticmethod
    def updates(sums: Sums) -> int:
        """Number of updates the sums hold."""
        return int(np.asarray(sums["count"]).sum())

    def check(self, sums: Sums) -> None:
        """Refuse sums that this family cannot merge: other keys or shapes (another policy, head or
        dimension), an infinity where a sum must be finite, a negative count."""
        ref = self.zero_like(sums)
        extra = sorted(set(sums) - set(ref))
        if extra:
            raise AdaptspecError(f"shared statistics hold an array {extra[0]!r} this policy does not keep")
        for k, v in ref.items():
            if k not in sums or np.shape(sums[k]) != np.shape(v):
                raise AdaptspecError(
                    f"shared statistics {k!r} have shape {np.shape(sums.get(k))}, expected {np.shape(v)}"
                )
            finite = np.isfinite(np.asarray(sums[k], dtype=np.float64))
            if k in self.infinite_ok:
                finite[self.infinite_ok[k]] = True
            if not finite.all():
                raise AdaptspecError(f"shared statistics {k!r} hold an infinity")
        if "count" in sums and (np.asarray(sums["count"]) < 0).any():
            raise AdaptspecError("shared statistics 'count' hold a negative count")

    def zero_like(self, sums: Sums) -> Sums:
        return self.zero()


class _Nothing(Family):
    """Policies that learn nothing online: nothing to share."""

    def __init__(self) -> None:
        self.arms, self.k = (), 0

    def zero(self) -> Sums:
        return {"count": np.zeros(0, np.int64)}

    def observe(self, sums: Sums, policy: Any, context: Any, arm: int, reward: float, pre: Any) -> None:
        pass

    def apply(self, policy: Any, total: Sums) -> None:
        pass

    def fingerprint(self, policy: Any) -> str:
        return "nothing"


NOTHING = _Nothing()


# ----------------------------------------------------------------------------- context-free
def _welford_merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Merge two running (count, mean, M2, min, max) vectors (Chan, Golub & LeVeque)."""
    na, nb = a[0], b[0]
    if nb == 0:
        return a.copy()
    if na == 0:
        return b.copy()
    n = na + nb
    d = b[1] - a[1]
    return np.array(
        [n, a[1] + d * nb / n, a[2] + b[2] + d * d * na * nb / n, min(a[3], b[3]), max(a[4], b[4])]
    )


class ContextFree(Family):
    """EpsilonGreedy, UCB (and ucb-throughput), ThompsonSampling: per-arm n, s, ss, pulls and running stats."""

    infinite_ok = {"running": slice(3, 5)}  # min and max of no reward yet: +inf, -inf

    def zero(self) -> Sums:
        k = self.k
        return {
            "n": np.zeros(k),
            "s": np.zeros(k),
            "ss": np.zeros(k),
            "count": np.zeros(k, np.int64),
            "running": np.array([0.0, 0.0, 0.0, np.inf, -np.inf]),
        }

    def add(self, a: Sums, b: Sums) -> Sums:
        out = {k: a[k] + b[k] for k in ("n", "s", "ss", "count")}
        out["running"] = _welford_merge(a["running"], b["running"])
        return out

    def observe(self, sums: Sums, policy: Any, context: Any, arm: int, reward: float, pre: Any) -> None:
        from ..policies.context_free import RunningStats

        sums["n"][arm] += 1.0
        sums["s"][arm] += reward
        sums["ss"][arm] += reward * reward
        sums["count"][arm] += 1
        RunningStats.add(sums["running"], reward)

    def apply(self, policy: Any, total: Sums) -> None:
        st = policy.stats
        st.n, st.s, st.ss = total["n"].copy(), total["s"].copy(), total["ss"].copy()
        st.pulls = total["count"].astype(np.int64).copy()
        policy.running = total["running"].copy()
        policy.version = self.updates(total)

    def _identity(self, policy: Any) -> dict[str, Any]:
        return {**super()._identity(policy), "discount": policy.discount, "window": policy.window}


# ----------------------------------------------------------------------------- full information
class FullInfo(Family):
    """fi-ucb (:class:`~adaptspec.policies.fi_ucb.FullInfoUCB`): what every request showed, per arm.

    ``n``, ``s``, ``ss``, ``count``: per arm, the requests that showed it, the sum and the sum of
    squares of its rewards there; ``requests``: the updates (requests, one per ``update_full``);
    ``ref``: the requests that showed the reference arm and the sum of its rewards; ``diff``: per
    arm, the requests that showed it and the reference, and the sum of its differences from the
    reference there. All of these are sums, so the paired means ``ref_s / ref_n + diff_s / diff_n``
    of the merged sums are one process's. ``err`` (count and sum of squares of the prequential
    errors of the differences) and ``running`` (the running statistics of the rewards seen before
    every arm had an outcome, merged with Chan et al.'s update) are estimates: see the module
    docstring.
    """

    approximate = ("err", "running")
    infinite_ok = {"running": slice(3, 5)}  # min and max of no reward yet: +inf, -inf
    full_feedback = True
    #: (key, row) of every count (row None: the whole array) and of every sum of squares, never negative
    _COUNTS = (
        ("n", None),
        ("count", None),
        ("requests", None),
        ("ref", 0),
        ("diff", 0),
        ("err", 0),
        ("running", 0),
    )
    _SQUARES = (("ss", None), ("err", 1), ("running", 2))

    def zero(self) -> Sums:
        k = self.k
        return {
            "n": np.zeros(k),
            "s": np.zeros(k),
            "ss": np.zeros(k),
            "count": np.zeros(k, np.int64),
            "requests": np.zeros(1, np.int64),
            "ref": np.zeros(2),
            "diff": np.zeros((2, k)),
            "err": np.zeros(2),
            "running": np.array([0.0, 0.0, 0.0, np.inf, -np.inf]),
        }

    def add(self, a: Sums, b: Sums) -> Sums:
        out = {k: a[k] + b[k] for k in a if k != "running"}
        out["running"] = _welford_merge(a["running"], b["running"])
        return out

    @staticmethod
    def updates(sums: Sums) -> int:
        return int(np.asarray(sums["requests"]).sum())

    def check(self, sums: Sums) -> None:
        """The common checks, and no negative count (or sum of squares) anywhere."""
        super().check(sums)
        for keys, what in ((self._COUNTS, "count"), (self._SQUARES, "sum of squares")):
            for key, row in keys:
                v = np.asarray(sums[key])
                if np.min(v if row is None else v[row], initial=0) < 0:
                    raise AdaptspecError(f"shared statistics {key!r} hold a negative {what}")

    def before(self, policy: Any) -> Any:
        # the policy feeds its running statistics until every arm has an outcome (counts never decrease)
        return bool((policy.stats.n > 0.5).all()), policy.err.copy()

    def observe(self, sums: Sums, policy: Any, context: Any, arm: int, reward: float, pre: Any) -> None:
        r, seen = np.zeros(self.k), np.zeros(self.k, dtype=bool)  # the arm that ran alone: one arm shown
        r[arm], seen[arm] = reward, True
        self.observe_full(sums, policy, context, r, seen, pre)

    def observe_full(
        self, sums: Sums, policy: Any, context: Any, rewards: np.ndarray, observed: np.ndarray, pre: Any
    ) -> None:
        from ..policies.fi_ucb import merge_running

        ready, err = pre
        seen = np.asarray(observed, dtype=bool)
        of = seen.astype(np.float64)
        r = np.where(seen, np.asarray(rewards, dtype=np.float64), 0.0)
        sums["n"] += of
        sums["s"] += r
        sums["ss"] += r * r
        sums["count"] += seen
        sums["requests"] += 1
        ref = policy.ref_index  # the arm every request shows (FullInfoUCB: the smallest block size)
        if seen[ref]:
            sums["ref"] += (1.0, r[ref])
            sums["diff"][0] += of
            sums["diff"][1] += r - of * r[ref]
        if not ready:
            merge_running(sums["running"], r[seen])
        sums["err"] += policy.err - err

    def apply(self, policy: Any, total: Sums) -> None:
        state = policy.state_dict()  # the policy's own checks, flags and estimates, through its public state
        learnt = state["state"]
        learnt["stats"] = {
            "n": total["n"].copy(),
            "s": total["s"].copy(),
            "ss": total["ss"].copy(),
            "pulls": total["count"].astype(np.int64),
        }
        for key in ("running", "ref", "diff", "err"):
            learnt[key] = np.array(total[key], dtype=np.float64)
        state["version"] = self.updates(total)
        policy.load_state_dict(state)


# ----------------------------------------------------------------------------- linear
class Linear(Family):
    """LinUCB and LinTS with a fixed feature map: per-arm ``sum phi phi^T``, ``sum r phi``, counts, noise."""

    approximate = ("noise",)

    def __init__(self, policy: Any) -> None:
        super().__init__(policy)
        self.dim_out: int | None = None if policy.map is None else int(policy.map.out_dim)

    def _identity(self, policy: Any) -> dict[str, Any]:
        # stable before the dimension is known (standardize=false learns it from the first context);
        # a dimension mismatch shows as a shape mismatch of the sums
        ident = {
            **super()._identity(policy),
            "lam": policy.lam,
            "intercept": policy.fit_intercept,
            "noise": str(policy.noise),
            "noise_prior": list(policy.noise_prior),
        }
        pm, pp = policy._prior
        if pm is not None or pp is not None:
            ident["prior"] = hashlib.sha256(
                np.asarray(0.0 if pm is None else pm, float).tobytes()
                + np.asarray(0.0 if pp is None else pp, float).tobytes()
            ).hexdigest()
        m = policy.standardize
        if m is not False:  # a fixed Standardizer
            ident["map"] = hashlib.sha256(
                np.concatenate([m.mean, m.scale, [m.reward_mean, m.reward_scale]]).tobytes()
            ).hexdigest()
        return ident

    def zero(self) -> Sums:
        d = self.dim_out or 0
        return {
            "xx": np.zeros((self.k, d, d)),
            "xr": np.zeros((self.k, d)),
            "count": np.zeros(self.k, np.int64),
            "noise": np.zeros(2),
        }

    def zero_like(self, sums: Sums) -> Sums:
        width = np.shape(sums["xr"])[1] if "xr" in sums and np.ndim(sums["xr"]) == 2 else None
        if width == 0 and "count" in sums and np.sum(sums["count"]) == 0:
            # a replica that has learnt nothing yet publishes sums of width 0: zero, whatever the dimension
            return {**self.zero(), "xx": np.zeros((self.k, 0, 0)), "xr": np.zeros((self.k, 0))}
        if self.dim_out is None and width:  # dimension learnt from the fleet (never from an empty replica)
            self.dim_out = int(width)
        return self.zero()

    def add(self, a: Sums, b: Sums) -> Sums:
        if a["xr"].shape != b["xr"].shape:  # one side has not learnt the dimension yet
            if a["count"].sum() == 0:
                return {k: v.copy() for k, v in b.items()} | {"noise": a["noise"] + b["noise"]}
            if b["count"].sum() == 0:
                return {k: v.copy() for k, v in a.items()} | {"noise": a["noise"] + b["noise"]}
        return super().add(a, b)

    def before(self, policy: Any) -> Any:
        return policy.noise_stats.copy()

    def observe(self, sums: Sums, policy: Any, context: Any, arm: int, reward: float, pre: Any) -> None:
        if policy.map is None:
            policy._ensure_core()
        phi = policy.map.phi(np.asarray(context, dtype=np.float64))
        if self.dim_out is None or sums["xr"].shape[1] != phi.shape[0]:
            self.dim_out = int(phi.shape[0])
            fresh = self.zero()
            fresh["noise"] = sums["noise"]
            sums.update(fresh)
        r = float(policy.map.reward(reward))
        sums["xx"][arm] += np.outer(phi, phi)
        sums["xr"][arm] += r * phi
        sums["count"][arm] += 1
        sums["noise"] += policy.noise_stats - pre

    def apply(self, policy: Any, total: Sums) -> None:
        if self.updates(total) == 0 and policy.core is None:
            return
        if policy.core is None:
            d = total["xr"].shape[1] - int(policy.fit_intercept)
            policy.dim = d if policy.dim is None else policy.dim
            policy._ensure_core()
        core = policy.core
        P, m = core.prior_precision, core.prior_mean
        A = P + total["xx"]
        _positive_definite(A)
        A_inv = np.linalg.inv(A)
        A_inv = 0.5 * (A_inv + A_inv.transpose(0, 2, 1))
        b = np.einsum("kde,ke->kd", P, m) + total["xr"]
        core.A_inv[...] = A_inv
        core.theta[...] = np.einsum("kde,ke->kd", A_inv, b)
        core.count = total["count"].astype(np.int64).copy()
        core._u_for = None
        policy.noise_stats = total["noise"].copy()
        policy._last = None
        policy.version = self.updates(total)


# ----------------------------------------------------------------------------- neural-linear
class NeuralLinearFamily(Linear):
    """NeuralLinear: the same sums on the head's features, for every head weight's posterior, plus the evidence."""

    approximate = ("noise", "evidence")

    def __init__(self, policy: Any) -> None:
        Family.__init__(self, policy)
        self.dim_out = int(policy.map.out_dim)
        self.grid = len(policy.prior_grid)
        self._prior_prec: list[np.ndarray] | None = None

    def _identity(self, policy: Any) -> dict[str, Any]:
        return {
            **Family._identity(self, policy),
            "head": policy.fingerprint,
            "grid": policy.prior_grid.tolist(),
            "discount": policy.discount,
        }

    def zero(self) -> Sums:
        return {**super().zero(), "evidence": np.zeros(self.grid)}

    def zero_like(self, sums: Sums) -> Sums:
        return self.zero()

    def before(self, policy: Any) -> Any:
        return policy.noise_stats.copy(), policy.evidence.copy()

    def observe(self, sums: Sums, policy: Any, context: Any, arm: int, reward: float, pre: Any) -> None:
        noise, evidence = pre
        phi = policy.map.phi(np.asarray(context, dtype=np.float64))
        r = float(policy.map.reward(reward))
        sums["xx"][arm] += np.outer(phi, phi)
        sums["xr"][arm] += r * phi
        sums["count"][arm] += 1
        sums["noise"] += policy.noise_stats - noise
        sums["evidence"] += policy.evidence - evidence

    def apply(self, policy: Any, total: Sums) -> None:
        from ..policies.neural_linear import _spd_inv

        k, d = self.k, self.dim_out
        if self._prior_prec is None:  # the prior precision of every head weight, once
            self._prior_prec = [np.linalg.inv(c.prior_cov) for c in policy.cores]
        data = np.zeros((k * d, k * d))
        for a in range(k):
            data[a * d : (a + 1) * d, a * d : (a + 1) * d] = total["xx"][a]
        posts = []  # every posterior first: a total that is not a posterior changes nothing
        for core, L in zip(policy.cores, self._prior_prec):
            _positive_definite(L + data)
            S = _spd_inv(L + data)
            posts.append((S, (S @ (L @ core.prior_mean.reshape(-1) + total["xr"].reshape(-1))).reshape(k, d)))
        for core, (S, theta) in zip(policy.cores, posts):
            core.S, core.theta = S, theta
            core.count = total["count"].astype(np.int64).copy()
        policy.evidence = total["evidence"].copy()
        policy.noise_stats = total["noise"].copy()
        policy._last = None
        policy._select()
        policy.version = self.updates(total)


def _positive_definite(A: np.ndarray) -> None:
    """Refuse a posterior precision that is not symmetric positive definite (sums no replica could have made)."""
    try:
        np.linalg.cholesky(A)
    except np.linalg.LinAlgError:
        raise AdaptspecError(
            "the merged statistics are not a posterior (a precision matrix is not positive "
            "definite): a replica published sums no policy makes"
        ) from None


def family_for(policy: Any) -> Family:
    """The :class:`Family` of ``policy``; a policy whose statistics cannot be merged raises one line."""
    from ..policies.context_free import ContextFreePolicy
    from ..policies.exp3 import EXP3
    from ..policies.fi_ucb import FullInfoUCB
    from ..policies.linear import LinearPolicy
    from ..policies.neural_linear import NeuralLinear
    from ..policies.standardizer import Standardizer

    label = getattr(policy, "label", type(policy).__name__)
    if getattr(policy, "discount", None) is not None or getattr(policy, "window", None) is not None:
        raise AdaptspecError(
            f"policy {label} forgets (discount or window) and cannot be shared: its weights depend "
            "on the global order of updates, which replicas do not share; drop discount/window"
        )
    if isinstance(policy, NeuralLinear):
        return NeuralLinearFamily(policy)
    if isinstance(policy, EXP3):
        raise AdaptspecError(
            f"policy {label} cannot be shared: EXP3's importance weights use each replica's own "
            "probabilities and reward range"
        )
    if isinstance(policy, FullInfoUCB):
        return FullInfo(policy)
    if isinstance(policy, ContextFreePolicy):
        return ContextFree(policy)
    if type(policy).__name__ in ("LinUCB", "LinTS") and isinstance(policy, LinearPolicy):
        if policy.standardize is True:
            raise AdaptspecError(
                f"policy {label} with its warm-up standardiser cannot be shared: each replica would "
                "fit its own feature map; use standardize=false (on a featurizer's output) or a fixed "
                "Standardizer"
            )
        if policy.standardize is not False and not isinstance(policy.standardize, Standardizer):
            raise AdaptspecError(f"policy {label}: unknown standardize setting")
        return Linear(policy)
    if not getattr(policy, "learning", True) or getattr(policy, "name", None) in (
        "fixed",
        "random",
        "head",
        "oracle",
    ):
        return NOTHING
    raise AdaptspecError(
        f"policy {label} cannot be shared: sharing supports ucb, ucb-throughput, eps-greedy, ts, "
        "fi-ucb, linucb/lints (standardize=false) and neural-linear"
    )
