"""Off-policy estimators: exact unbiasedness, coverage and shrinking error on logs with a known value."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from adaptspec.analysis.ope import (
    dm,
    dr,
    evaluate,
    evaluate_log,
    fit_reward_model,
    ips,
    policy_probs,
    snips,
    switch_dr,
)
from adaptspec.errors import AdaptspecError
from adaptspec.policies import Fixed, Oracle, RandomPolicy
from adaptspec.reward.functions import trace_rewards
from adaptspec.simulators.replay import replay_log
from adaptspec.simulators.synthetic import generate
from adaptspec.traces import DecisionLog


def simplex(k):
    return arrays(np.float64, k, elements=st.floats(0.05, 1.0)).map(lambda v: v / v.sum())


@settings(max_examples=60, deadline=None)
@given(data=st.data(), k=st.integers(2, 6))
def test_ips_and_dr_are_exactly_unbiased(data, k):
    """E over the logging policy of each per-round term equals the target's true value."""
    mu = data.draw(simplex(k))  # logging probabilities
    pi = data.draw(simplex(k))  # target probabilities
    r = data.draw(arrays(np.float64, k, elements=st.floats(-5, 5)))
    r_hat = data.draw(arrays(np.float64, k, elements=st.floats(-5, 5)))
    truth = float(pi @ r)
    acts = np.arange(k)
    target = np.tile(pi, (k, 1))
    ips_terms = [ips([r[a]], [a], [mu[a]], target[:1]) for a in acts]
    dr_terms = [dr([r[a]], [a], [mu[a]], target[:1], r_hat[None, :]) for a in acts]
    sw_terms = [switch_dr([r[a]], [a], [mu[a]], target[:1], r_hat[None, :], tau=np.inf) for a in acts]
    assert float(mu @ ips_terms) == pytest.approx(truth, abs=1e-9)
    assert float(mu @ dr_terms) == pytest.approx(truth, abs=1e-9)
    assert np.allclose(sw_terms, dr_terms)
    assert dm(target[:1], r[None, :]) == pytest.approx(truth)  # DM is exact with the true model


def bandit_log(n, rng, k=4, d=3):
    """Contexts, a softmax logging policy, and Bernoulli-ish rewards with a linear mean."""
    X = rng.normal(size=(n, d))
    W = np.array([[0.5, -0.2, 0.1], [0.0, 0.4, 0.0], [-0.3, 0.0, 0.5], [0.2, 0.2, -0.2]])[:k]
    mu = 1.0 + X @ W.T  # true mean reward (n, k)
    logits = X @ np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [0.5, 0.5, 0]])[:k].T
    p_log = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    p_log = 0.8 * p_log + 0.2 / k
    a = (rng.random(n)[:, None] > np.cumsum(p_log, axis=1)).sum(axis=1).clip(0, k - 1)
    r = mu[np.arange(n), a] + rng.normal(0, 0.5, n)
    target = np.zeros((n, k))
    target[np.arange(n), np.argmax(mu, axis=1)] = 0.9
    target += 0.1 / k
    truth = float((target * mu).sum(axis=1).mean())
    return X, a, p_log[np.arange(n), a], r, target, truth


def test_ips_and_dr_cover_the_truth_and_error_shrinks():
    errs = {"ips": {}, "dr": {}}
    cover = {"ips": 0, "dr": 0}
    reps = 12
    for n in (400, 6400):
        for e in errs:
            errs[e][n] = []
        for s in range(reps):
            rng = np.random.default_rng(s)
            X, a, p, r, target, truth = bandit_log(n, rng)
            est = evaluate(r, a, p, target, X, estimators=["ips", "dr"], n_boot=200, seed=s)
            for e in errs:
                errs[e][n].append(abs(est[e].value - truth))
                if n == 400:
                    lo, hi = est[e].ci
                    cover[e] += lo <= truth <= hi
    for e in errs:
        assert cover[e] >= reps - 3  # ~95% intervals
        assert np.mean(errs[e][6400]) < 0.45 * np.mean(errs[e][400])  # ~1/sqrt(16) = 0.25 expected
    assert np.mean(errs["dr"][6400]) < np.mean(errs["ips"][6400])  # a good model lowers variance


def test_snips_dm_and_switch():
    rng = np.random.default_rng(0)
    X, a, p, r, target, truth = bandit_log(3000, rng)
    k = target.shape[1]
    assert snips(r, a, p, target) == pytest.approx(truth, abs=0.1)
    r_hat = fit_reward_model(X, a, r, k)
    assert dm(target, r_hat) == pytest.approx(truth, abs=0.1)
    assert switch_dr(r, a, p, target, r_hat, tau=0.0) == pytest.approx(dm(target, r_hat))  # all DM
    assert switch_dr(r, a, p, target, r_hat, tau=1e9) == pytest.approx(dr(r, a, p, target, r_hat))
    w = target[np.arange(len(a)), a] / p
    assert snips(r, a, p, target) == pytest.approx(np.sum(w * r) / np.sum(w))


def test_reward_models():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(2000, 3))
    a = rng.integers(0, 2, 2000)
    r = np.where(a == 0, 1 + 2 * X[:, 0], -1 + X[:, 1]) + rng.normal(0, 0.1, 2000)
    pred = fit_reward_model(X, a, r, 2, folds=2)
    np.testing.assert_allclose(pred[:, 0], 1 + 2 * X[:, 0], atol=0.1)
    np.testing.assert_allclose(pred[:, 1], -1 + X[:, 1], atol=0.1)
    # cross-fitting: a row's own reward never informs its prediction (leave-one-out with the mean model)
    a2, r2 = np.zeros(5, dtype=int), np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    loo = fit_reward_model(None, a2, r2, 1, model="mean", folds=5)[:, 0]
    np.testing.assert_allclose(loo, [(r2.sum() - x) / 4 for x in r2])
    # an arm that was never logged gets the overall mean
    assert fit_reward_model(None, a2, r2, 2, model="mean", folds=1)[0, 1] == pytest.approx(4.0)
    with pytest.raises(AdaptspecError, match="unknown reward model"):
        fit_reward_model(None, a2, r2, 1, model="forest")


def test_policy_probs():
    assert policy_probs(Fixed(4, arms=[1, 4]), n=2).tolist() == [[0.0, 1.0], [0.0, 1.0]]
    np.testing.assert_allclose(policy_probs(RandomPolicy([1, 2, 4]), n=3), 1 / 3)
    with pytest.raises(AdaptspecError, match="cannot be evaluated off-policy"):
        policy_probs(Oracle([1, 4]), n=1)


def test_evaluate_log_recovers_replay_values(tmp_path):
    ts = generate("cpu-small", n_requests=300, seed=2, per_round=False)
    log = DecisionLog(tmp_path / "log")
    log.append(replay_log(ts, "random", reward="throughput", seed=0, n_steps=6000, order="shuffled"))
    log = DecisionLog.read(tmp_path / "log")
    R = trace_rewards(ts, "throughput")
    pos = {rid: i for i, rid in enumerate(ts.request_ids)}
    idx = np.array([pos[rid] for rid in log.table.column("request_id").to_pylist()])
    for b in (2, 8):
        truth = R[idx, ts.arms.index(b)].mean()
        est = evaluate_log(log, f"fixed:{b}", n_boot=200)
        for e in ("ips", "dr"):
            lo, hi = est[e].ci
            assert lo - 0.5 <= truth <= hi + 0.5, (b, e, est[e], truth)
        assert est["dr"].se < est["ips"].se


@pytest.mark.parametrize(
    "args,msg",
    [
        (([1.0], [0], [0.5], [[0.5, 0.6]]), "do not sum to 1"),
        (([1.0], [0], [0.0], [[1.0, 0.0]]), "propensity 0 outside (0, 1]"),
        (([1.0], [2], [0.5], [[1.0, 0.0]]), "actions must be arm indices in 0..1"),
        (([np.nan], [0], [0.5], [[1.0, 0.0]]), "reward 0 is not finite"),
        (([1.0, 2.0], [0], [0.5], [[1.0, 0.0]]), "must be 1-D of one length"),
    ],
)
def test_bad_inputs(args, msg):
    with pytest.raises(AdaptspecError) as e:
        evaluate(*args, n_boot=20)
    assert msg in str(e.value)
    with pytest.raises(AdaptspecError, match="unknown estimator 'magic'"):
        evaluate([1.0], [0], [1.0], [[1.0]], estimators=["magic"])
