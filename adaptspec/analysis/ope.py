"""Off-policy evaluation: the value of a target policy from another policy's decision log.

Inputs are arrays: logged ``actions`` (arm indices), their ``propensities`` under the logging
policy, the observed ``rewards``, and the target policy's probability of every arm for every
logged context (``target``, shape ``(n, K)``). With ``w = target[t, a_t] / p_t``:

- IPS: ``mean(w r)``, unbiased when every arm the target plays had a positive logging probability;
- SNIPS: ``sum(w r) / sum(w)``, slightly biased, much lower variance;
- DM: ``mean(sum_a target[t, a] r_hat(x_t, a))`` with a reward model ``r_hat``;
- DR: DM plus ``mean(w (r - r_hat(x_t, a_t)))``: unbiased if either the propensities or the
  model are right;
- switch-DR: DR, but rounds whose weight exceeds ``tau`` keep only their DM term.

Intervals are bootstrap percentiles over rounds (the reward model is held fixed).

**Why an estimate can lie outside every logged reward** (:func:`weight_diagnostics`, each weighted
estimate's ``diagnostics`` and ``note``): IPS is unbiased only where the logging policy could
play every arm the target plays (*support*); a round whose logged arm the target never plays has
weight 0, so when the target's arms were rarely or never logged the mean weight falls below 1 and
IPS shrinks toward 0 (an estimate of -1.5 ms/token from rewards of -4 to -6 is that, not a better
policy); a few large weights leave a small *effective sample size* ``(sum w)^2 / sum w^2``; and
switch-DR drops (clips) the correction of rounds whose weight exceeds ``tau``. SNIPS divides the
mean weight out, and DR leans on the reward model where the weights say nothing.

>>> rng = np.random.default_rng(0)
>>> n, K = 4000, 3
>>> mu = np.array([0.2, 0.5, 0.8])                 # true mean reward of each arm
>>> a = rng.integers(0, K, n)                      # uniform logging policy
>>> r = rng.binomial(1, mu[a]).astype(float)
>>> target = np.tile([0.0, 0.0, 1.0], (n, 1))      # always arm 2: true value 0.8
>>> est = evaluate(r, a, np.full(n, 1 / K), target, n_boot=200)
>>> {k: round(e.value, 2) for k, e in est.items()}
{'ips': 0.79, 'snips': 0.78, 'dm': 0.78, 'dr': 0.78, 'switch-dr': 0.78}
>>> lo, hi = est["ips"].ci; bool(lo < 0.8 < hi)
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from tqdm.auto import tqdm

from .._util.numbers import rounded
from ..errors import AdaptspecError
from ..policies.base import Policy

ESTIMATORS = ("ips", "snips", "dm", "dr", "switch-dr")


@dataclass(frozen=True)
class WeightDiagnostics:
    """What the importance weights ``w = target[t, a_t] / p_t`` say about a weighted estimate:
    ``ess`` the effective sample size ``(sum w)^2 / sum w^2`` of ``n`` rounds; ``mean_weight`` (1
    in expectation when the logging policy covers the target); ``max_weight``; ``support`` the
    share of the target's probability on arms the logging policy could play (None: its full
    probabilities were not logged); ``clipped`` the share of rounds whose weight exceeds
    switch-DR's ``tau`` (their correction dropped)."""

    n: int
    ess: float
    mean_weight: float
    max_weight: float
    support: float | None
    clipped: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "ess": rounded(self.ess),
            "mean_weight": rounded(self.mean_weight),
            "max_weight": rounded(self.max_weight),
            "support": None if self.support is None else rounded(self.support),
            "clipped": rounded(self.clipped),
        }


@dataclass(frozen=True)
class Estimate:
    """A policy value with its bootstrap interval and standard error; a weighted estimator's
    (IPS, SNIPS, DR, switch-DR) ``diagnostics``, and a ``note`` saying why its value should not be
    read as is (outside the logged rewards, weak support, few effective rounds), else None."""

    estimator: str
    value: float
    ci: tuple[float, float]
    se: float
    n: int
    diagnostics: WeightDiagnostics | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "value": rounded(self.value),
            "ci": [rounded(self.ci[0]), rounded(self.ci[1])],
            "se": rounded(self.se),
            "n": self.n,
        }
        if self.diagnostics is not None:
            d["diagnostics"] = self.diagnostics.to_dict()
            d["note"] = self.note
        return d


# ============================================================================ checks
def _check(rewards: Any, actions: Any, propensities: Any, target: Any) -> tuple[np.ndarray, ...]:
    r = np.asarray(rewards, dtype=np.float64)
    a = np.asarray(actions)
    p = np.asarray(propensities, dtype=np.float64)
    pi = np.asarray(target, dtype=np.float64)
    n = r.shape[0] if r.ndim == 1 else -1
    if r.ndim != 1 or a.shape != (n,) or p.shape != (n,):
        raise AdaptspecError(
            f"rewards, actions and propensities must be 1-D of one length, got {r.shape}, {a.shape}, {p.shape}"
        )
    if n == 0:
        raise AdaptspecError("no logged rounds to evaluate")
    if pi.ndim != 2 or pi.shape[0] != n:
        raise AdaptspecError(f"target probabilities must have shape ({n}, K), got {pi.shape}")
    if not np.issubdtype(a.dtype, np.integer) or a.min() < 0 or a.max() >= pi.shape[1]:
        raise AdaptspecError(f"actions must be arm indices in 0..{pi.shape[1] - 1}")
    if not np.all(np.isfinite(r)):
        raise AdaptspecError(f"reward {int(np.flatnonzero(~np.isfinite(r))[0])} is not finite")
    if np.any(~np.isfinite(p) | (p <= 0) | (p > 1 + 1e-9)):
        raise AdaptspecError(
            f"propensity {int(np.flatnonzero(~np.isfinite(p) | (p <= 0) | (p > 1 + 1e-9))[0])} outside (0, 1]"
        )
    bad = ~np.isfinite(pi).all(axis=1) | (pi < -1e-12).any(axis=1) | (np.abs(pi.sum(axis=1) - 1) > 1e-6)
    if bad.any():
        raise AdaptspecError(f"target probabilities of round {int(np.flatnonzero(bad)[0])} do not sum to 1")
    return r, a.astype(np.int64), p, pi


def importance_weights(actions: Any, propensities: Any, target: Any) -> np.ndarray:
    """``target[t, a_t] / p_t`` per round."""
    a = np.asarray(actions, dtype=np.int64)
    pi = np.asarray(target, dtype=np.float64)
    return pi[np.arange(len(a)), a] / np.asarray(propensities, dtype=np.float64)


def weight_diagnostics(
    actions: Any, propensities: Any, target: Any, logging_probs: Any = None, switch_tau: float = 10.0
) -> WeightDiagnostics:
    """The :class:`WeightDiagnostics` of a log: ``logging_probs`` (n, K) the logging policy's
    probability of every arm (the decision log's ``probs``), for the support.

    >>> a = np.array([0, 0, 1, 1]); p = np.full(4, 0.5)
    >>> pi = np.tile([0.0, 0.0, 1.0], (4, 1))              # the target plays arm 2, never logged
    >>> d = weight_diagnostics(a, p, pi, np.tile([0.5, 0.5, 0.0], (4, 1)))
    >>> d.mean_weight, d.ess, d.support
    (0.0, 0.0, 0.0)
    """
    w = importance_weights(actions, propensities, target)
    sw, sw2 = float(w.sum()), float((w * w).sum())
    support = None
    if logging_probs is not None:
        q = np.asarray(logging_probs, dtype=np.float64)
        pi = np.asarray(target, dtype=np.float64)
        if q.shape != pi.shape:
            raise AdaptspecError(f"logging probabilities have shape {q.shape}, expected {pi.shape}")
        support = float(np.mean(np.sum(np.where(q > 0, pi, 0.0), axis=1)))
    return WeightDiagnostics(
        len(w),
        sw * sw / sw2 if sw2 > 0 else 0.0,
        float(w.mean()),
        float(w.max()),
        support,
        float(np.mean(w > switch_tau)),
    )


def weight_note(estimator: str, value: float, rewards: np.ndarray, diag: WeightDiagnostics) -> str | None:
    """Why ``estimator``'s ``value`` should not be read as a policy value, in one line (None: no
    reason): outside the logged rewards' range, the target's arms not all logged (support), a
    mean weight far from 1 (IPS scales with it), few effective rounds, clipped corrections."""
    lo, hi = float(rewards.min()), float(rewards.max())
    why = []
    if math.isfinite(value) and not lo - 1e-9 * max(1.0, abs(lo)) <= value <= hi + 1e-9 * max(1.0, abs(hi)):
        why.append(f"outside the logged rewards [{lo:.4g}, {hi:.4g}]")
    if diag.support is not None and diag.support < 0.999:
        why.append(
            f"{100 * (1 - diag.support):.1f}% of the target's probability is on arms the logging policy "
            "never played (no support)"
        )
    if estimator == "ips" and abs(diag.mean_weight - 1.0) > 0.1:
        why.append(
            f"mean importance weight {diag.mean_weight:.3g} (1 with support; IPS scales with it, SNIPS "
            "divides it out)"
        )
    if diag.ess < 0.1 * diag.n:
        why.append(f"effective sample size {diag.ess:.1f} of {diag.n} rounds")
    if estimator == "switch-dr" and diag.clipped > 0:
        why.append(f"{100 * diag.clipped:.1f}% of rounds clipped (weight above tau: the reward model alone)")
    return "; ".join(why) or None


# ============================================================================ point estimators
def ips(rewards: Any, actions: Any, propensities: Any, target: Any) -> float:
    """Inverse propensity scoring."""
    r, a, p, pi = _check(rewards, actions, propensities, target)
    return float(np.mean(importance_weights(a, p, pi) * r))


def snips(rewards: Any, actions: Any, propensities: Any, target: Any) -> float:
    """Self-normalised IPS (NaN when the target gives the logged actions no weight at all)."""
    r, a, p, pi = _check(rewards, actions, propensities, target)
    w = importance_weights(a, p, pi)
    return float(np.sum(w * r) / np.sum(w)) if np.sum(w) > 0 else float("nan")


def dm(target: Any, r_hat: Any) -> float:
    """Direct method: the reward model's value of the target policy."""
    return float(np.mean(np.sum(np.asarray(target) * np.asarray(r_hat), axis=1)))


def dr(rewards: Any, actions: Any, propensities: Any, target: Any, r_hat: Any) -> float:
    """Doubly robust."""
    return float(
        np.mean(_dr_terms(*_check(rewards, actions, propensities, target), np.asarray(r_hat, float)))
    )


def switch_dr(
    rewards: Any, actions: Any, propensities: Any, target: Any, r_hat: Any, tau: float = 10.0
) -> float:
    """Switch doubly robust: the DR correction only where the weight is at most ``tau``."""
    return float(
        np.mean(_dr_terms(*_check(rewards, actions, propensities, target), np.asarray(r_hat, float), tau))
    )


def _dr_terms(
    r: np.ndarray, a: np.ndarray, p: np.ndarray, pi: np.ndarray, r_hat: np.ndarray, tau: float = math.inf
) -> np.ndarray:
    if r_hat.shape != pi.shape:
        raise AdaptspecError(f"reward model predictions have shape {r_hat.shape}, expected {pi.shape}")
    t = np.arange(len(a))
    w = pi[t, a] / p
    corr = w * (r - r_hat[t, a])
    return np.sum(pi * r_hat, axis=1) + np.where(w <= tau, corr, 0.0)


# ============================================================================ reward models
def fit_reward_model(
    contexts: np.ndarray | None,
    actions: Any,
    rewards: Any,
    n_arms: int,
    *,
    model: str = "ridge",
    alpha: float = 1.0,
    folds: int = 2,
    seed: int = 0,
    observed: tuple[Any, Any] | None = None,
) -> np.ndarray:
    """Predicted reward of every arm for every logged round, ``(n, n_arms)``.

    ``ridge``: per-arm ridge regression on standardised features with an intercept;
    ``mean``: per-arm mean reward (what ``ridge`` falls back to without features). With
    ``folds > 1`` predictions are cross-fitted: each round is predicted by a model that did
    not see it, which keeps DR's correction honest.

    ``observed``: ``(R, M)``, each ``(n, n_arms)``: every arm's reward where a round revealed it
    (``M`` true), the logged counterfactual rewards of a decision log (``DecisionLog.cf_rewards``
    and ``cf_observed``); each arm is then fitted on every round that showed it, not only the
    rounds that played it. Without it (or in a row that shows nothing) a round shows its
    logged arm's reward alone.

    >>> a = np.array([0, 0, 1, 1]); r = np.array([1.0, 3.0, 5.0, 7.0])
    >>> fit_reward_model(None, a, r, 2, model="mean", folds=1)[0].tolist()
    [2.0, 6.0]
    >>> R = np.array([[1.0, 2.0], [3.0, 4.0], [0.0, 5.0], [0.0, 7.0]])   # rounds 0 and 1 also showed arm 1
    >>> M = np.array([[True, True], [True, True], [False, True], [False, True]])
    >>> fit_reward_model(None, a, r, 2, model="mean", folds=1, observed=(R, M))[0].tolist()
    [2.0, 4.5]
    """
    a = np.asarray(actions, dtype=np.int64)
    r = np.asarray(rewards, dtype=np.float64)
    n = len(a)
    if model not in ("ridge", "mean"):
        raise AdaptspecError(f"unknown reward model {model!r}: choose ridge or mean")
    if not alpha > 0:
        raise AdaptspecError(f"ridge alpha must be > 0, got {alpha}")
    R, M = _shown(a, r, n_arms, observed)
    X = None if (contexts is None or model == "mean") else np.asarray(contexts, dtype=np.float64)
    folds = max(1, min(int(folds), n))
    out = np.empty((n, n_arms))
    if folds == 1:
        return _fit_predict(X, r, R, M, alpha, np.arange(n), np.arange(n))
    fold = np.random.default_rng(seed).permutation(n) % folds
    for f in range(folds):
        test = np.flatnonzero(fold == f)
        train = np.flatnonzero(fold != f)
        out[test] = _fit_predict(X, r, R, M, alpha, train, test)
    return out


def _shown(
    a: np.ndarray, r: np.ndarray, k: int, observed: tuple[Any, Any] | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(R, M)``: every arm's reward where a round shows it; the logged arm's always."""
    n = len(a)
    M = np.zeros((n, k), dtype=bool)
    R = np.zeros((n, k))
    if observed is not None:
        R0 = np.asarray(observed[0], dtype=np.float64)
        M0 = np.asarray(observed[1], dtype=bool)
        if R0.shape != (n, k) or M0.shape != (n, k):
            raise AdaptspecError(
                f"observed rewards and mask must have shape ({n}, {k}), got {R0.shape} and {M0.shape}"
            )
        M = M0 & np.isfinite(R0)
        R = np.where(M, R0, 0.0)
    t = np.arange(n)
    M[t, a] = True
    R[t, a] = r  # the logged reward of the arm that ran
    return R, M


def _fit_predict(
    X: np.ndarray | None,
    r: np.ndarray,
    R: np.ndarray,
    M: np.ndarray,
    alpha: float,
    train: np.ndarray,
    test: np.ndarray,
) -> np.ndarray:
    k = R.shape[1]
    glob = float(r[train].mean()) if len(train) else 0.0
    out = np.full((len(test), k), glob)
    if X is not None:
        mu = X[train].mean(axis=0)
        sd = X[train].std(axis=0)
        sd[sd == 0] = 1.0
        Z = (X - mu) / sd
    for j in range(k):
        m = train[M[train, j]]
        if len(m) == 0:
            continue
        y = R[m, j]
        ym = y.mean()
        if X is None or len(m) < 2:
            out[:, j] = ym
            continue
        Zm = Z[m]
        zm = Zm.mean(axis=0)
        Zc = Zm - zm
        beta = np.linalg.solve(Zc.T @ Zc + alpha * np.eye(Z.shape[1]), Zc.T @ (y - ym))
        out[:, j] = ym + (Z[test] - zm) @ beta
    return out


# ============================================================================ target policies
def policy_probs(policy: Policy, contexts: np.ndarray | None = None, n: int | None = None) -> np.ndarray:
    """``(n, K)`` probabilities the (frozen) ``policy`` gives every arm for each context.

    Uses the policy's ``probs_batch`` when it has one, else one ``decide`` per context (no
    updates in between).
    """
    if policy.full_information:
        raise AdaptspecError(f"{policy.label} needs every arm's reward: it cannot be evaluated off-policy")
    if policy.contextual and contexts is None:
        raise AdaptspecError(f"policy {policy.label} needs features, and the log has none")
    X = None if not policy.contextual else np.asarray(contexts, dtype=np.float64)
    m = len(X) if X is not None else (len(contexts) if contexts is not None else n)
    if m is None:
        raise AdaptspecError("policy_probs needs contexts or n")
    if hasattr(policy, "probs_batch"):
        P = np.asarray(policy.probs_batch(X, m), dtype=np.float64)
    else:
        P = (
            np.stack(
                [
                    np.asarray(policy.decide(None if X is None else X[t]).probs, dtype=np.float64)
                    for t in range(m)
                ]
            )
            if m
            else np.zeros((0, len(policy.arms)))
        )
    if P.shape != (m, len(policy.arms)):
        raise AdaptspecError(
            f"{policy.label}: probabilities have shape {P.shape}, expected ({m}, {len(policy.arms)})"
        )
    return P


# ============================================================================ evaluation with intervals
def evaluate(
    rewards: Any,
    actions: Any,
    propensities: Any,
    target: Any,
    contexts: np.ndarray | None = None,
    *,
    estimators: Sequence[str] = ESTIMATORS,
    reward_model: str = "ridge",
    alpha: float = 1.0,
    folds: int = 2,
    switch_tau: float = 10.0,
    r_hat: np.ndarray | None = None,
    observed: tuple[Any, Any] | None = None,
    logging_probs: Any = None,
    n_boot: int = 500,
    level: float = 0.95,
    seed: int = 0,
    progress: bool | None = None,
) -> dict[str, Estimate]:
    """Every requested estimator with a bootstrap percentile interval.

    ``r_hat`` (``(n, K)`` predicted rewards) replaces the fitted reward model when given;
    ``observed`` (every arm's reward where a round showed it, see :func:`fit_reward_model`) is
    what the fitted one learns from; ``logging_probs`` (n, K) the logging policy's probability of
    every arm, for the weighted estimators' support (:func:`weight_diagnostics`).
    ``progress``: a progress bar on stderr (None: only in a terminal, after a second).
    """
    r, a, p, pi = _check(rewards, actions, propensities, target)
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown:
        raise AdaptspecError(f"unknown estimator {unknown[0]!r}: choose from {', '.join(ESTIMATORS)}")
    if not 0 < level < 1:
        raise AdaptspecError(f"level must be in (0, 1), got {level}")
    n, k = pi.shape
    w = importance_weights(a, p, pi)
    need_model = any(e in ("dm", "dr", "switch-dr") for e in estimators)
    if need_model and r_hat is None:
        r_hat = fit_reward_model(
            contexts, a, r, k, model=reward_model, alpha=alpha, folds=folds, seed=seed, observed=observed
        )
    parts = _estimator_terms(estimators, w, r, a, p, pi, r_hat, switch_tau)
    point = {e: _ratio(num.sum(), den.sum()) for e, (num, den) in parts.items()}
    if n_boot < 1:
        raise AdaptspecError(f"n_boot must be >= 1, got {n_boot}")
    reps = _bootstrap(parts, n, n_boot, np.random.default_rng([seed, 11]), progress)
    out = {}
    q = (1 - level) / 2
    diag = weight_diagnostics(a, p, pi, logging_probs, switch_tau)
    for e in parts:
        v = reps[e][np.isfinite(reps[e])]
        ci = (float(np.quantile(v, q)), float(np.quantile(v, 1 - q))) if len(v) else (math.nan, math.nan)
        d = None if e == "dm" else diag
        out[e] = Estimate(
            e,
            point[e],
            ci,
            float(v.std(ddof=1)) if len(v) > 1 else math.nan,
            n,
            d,
            None if d is None else weight_note(e, point[e], r, d),
        )
    return out


def _estimator_terms(
    estimators: Sequence[str],
    w: np.ndarray,
    r: np.ndarray,
    a: np.ndarray,
    p: np.ndarray,
    pi: np.ndarray,
    r_hat: np.ndarray | None,
    switch_tau: float,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each estimator's per-row terms (num, den): the estimate is sum(c * num) / sum(c * den), with
    c = 1 for the point estimate and the bootstrap's multiplicities for its resamples."""
    parts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    ones = np.ones(len(r))
    for e in estimators:
        if e == "ips":
            parts[e] = (w * r, ones)
        elif e == "snips":
            parts[e] = (w * r, w)
        elif e == "dm":
            parts[e] = (np.sum(pi * r_hat, axis=1), ones)
        elif e == "dr":
            parts[e] = (_dr_terms(r, a, p, pi, r_hat), ones)
        else:
            parts[e] = (_dr_terms(r, a, p, pi, r_hat, switch_tau), ones)
    return parts


def _bootstrap(
    parts: dict[str, tuple[np.ndarray, np.ndarray]],
    n: int,
    n_boot: int,
    rng: np.random.Generator,
    progress: bool | None,
) -> dict[str, np.ndarray]:
    """n_boot resamples of the n rows, each one's estimate by every estimator (NaN where a resample's
    denominator is 0), drawn in chunks of resamples."""
    reps = {e: np.empty(n_boot) for e in parts}
    chunk = max(1, int(2e6 // n))
    bar = tqdm(
        total=n_boot,
        desc="bootstrap",
        unit="resample",
        leave=False,
        delay=1.0,
        disable=(not progress) if progress is not None else None,
    )
    for s in range(0, n_boot, chunk):
        m = min(chunk, n_boot - s)
        bar.update(m)
        idx = rng.integers(0, n, (m, n))
        for e, (num, den) in parts.items():
            nn, dd = num[idx].sum(axis=1), den[idx].sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                reps[e][s : s + m] = np.where(dd > 0, nn / np.where(dd > 0, dd, 1.0), np.nan)
    bar.close()
    return reps


def _ratio(num: float, den: float) -> float:
    return float(num / den) if den > 0 else float("nan")


def evaluate_log(
    log: Any, policy: Policy | str, *, seed: int = 0, counterfactuals: bool = False, **kwargs: Any
) -> dict[str, Estimate]:
    """:func:`evaluate` a policy (object or spec) on a :class:`~adaptspec.traces.DecisionLog`.

    Rows without a reward (feedback never arrived) are left out. ``counterfactuals``: the
    reward model (DM, DR, switch-DR) learns every arm from the log's counterfactual rewards
    where a row observed it (``cf_rewards`` where not ``cf_censored``; docs/data.md), not only
    the arm each row played; the importance weights still use the logged propensities. The
    counterfactuals of arms that would have drafted their own block are approximate (about 1%
    off, docs/evaluation.md section 9), which biases DM alike; DR corrects it on the arms played.
    """
    from ..policies.spec import make_policy

    arms = log.arms
    pol = make_policy(policy, arms, seed=seed) if isinstance(policy, str) else policy
    if tuple(pol.arms) != tuple(sorted(arms)):
        raise AdaptspecError(f"policy {pol.label} has arms {list(pol.arms)}, the log has {list(arms)}")
    r = log.rewards
    keep = np.isfinite(r)
    if not keep.any():
        raise AdaptspecError(f"{log.path}: no row has a reward")
    X = log.contexts if (pol.contextual or kwargs.get("reward_model", "ridge") == "ridge") else None
    if pol.contextual and X is None:
        raise AdaptspecError(f"policy {pol.label} needs features, and the log {log.path} has none")
    P = policy_probs(pol, None if X is None else X[keep], int(keep.sum()))
    order = np.argsort(np.asarray(arms))  # log arm order -> sorted policy arm order
    P = P[:, np.argsort(order)] if not np.all(order == np.arange(len(arms))) else P
    observed = (log.cf_rewards[keep], log.cf_observed[keep]) if counterfactuals else None
    return evaluate(
        r[keep],
        log.actions[keep],
        log.propensities[keep],
        P,
        None if X is None else X[keep],
        seed=seed,
        observed=observed,
        logging_probs=log.probs[keep],
        **kwargs,
    )
