"""Full-information learners (fi-ucb, fi-linucb): update_full against independent computations,
the protocol's checks, and a replay that feeds them counterfactuals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from adaptspec.errors import AdaptspecError
from adaptspec.policies import UCB, FullInfoLinUCB, FullInfoUCB, LinUCB
from adaptspec.policies.spec import make_policy

finite = st.floats(-50, 50, allow_nan=False, width=32)


@given(k=st.integers(1, 6), n=st.integers(1, 30), data=st.data())
@settings(max_examples=150, deadline=None)
def test_all_arms_observed_means_are_sample_means(k: int, n: int, data) -> None:
    R = data.draw(arrays(np.float64, (n, k), elements=finite))
    pol = FullInfoUCB(list(range(1, k + 1)), seed=0)
    for r in R:
        pol.update_full(None, r, np.ones(k, dtype=bool))
    assert np.allclose(pol.means(), R.mean(axis=0), atol=1e-9)
    assert pol.version == n


@given(k=st.integers(2, 6), n=st.integers(1, 40), data=st.data())
@settings(max_examples=150, deadline=None)
def test_paired_means_with_censored_arms(k: int, n: int, data) -> None:
    """The reference arm's mean over every request plus each arm's mean difference from it on the
    requests that showed it (computed here with a masked mean)."""
    R = data.draw(arrays(np.float64, (n, k), elements=finite))
    M = data.draw(arrays(np.bool_, (n, k)))
    M[:, 0] = True  # the smallest block size is shown by every request
    pol = FullInfoUCB(list(range(1, k + 1)), seed=0)
    for r, m in zip(R, M):
        pol.update_full(None, r, m)
    want = np.full(k, np.nan)
    for j in range(k):
        if M[:, j].any():
            want[j] = R[:, 0].mean() + (R[M[:, j], j] - R[M[:, j], 0]).mean()
    got = pol.means()
    assert np.allclose(got[~np.isnan(want)], want[~np.isnan(want)], atol=1e-9)
    assert np.array_equal(pol.stats.n, M.sum(axis=0).astype(float))


def test_largest_arm_first_then_optimism_only_where_censored() -> None:
    pol = FullInfoUCB([1, 2, 4, 8], seed=0)
    assert pol.decide().block_size == 8
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(400):
        d = pol.decide()
        seen.append(d.block_size)
        mean = np.array([-40.0, -36.0, -34.0, -35.0])
        r = mean + rng.normal(0, 3, size=1) + rng.normal(0, 0.3, size=4)  # requests differ, arms a little
        m = np.array([1, 2, 4, 8]) <= d.block_size  # longer blocks censored
        pol.update_full(None, r, m)
    assert seen.count(4) > 0.9 * len(seen)  # the best
    assert 0 < seen.count(8) < 0.1 * len(seen)  # the censored arm is still tried, rarely
    assert seen.count(1) == seen.count(2) == 0  # always shown, so never explored


def test_state_round_trip_and_bandit_update() -> None:
    pol = FullInfoUCB([1, 4, 8], seed=3)
    pol.update_full(None, [1.0, 2.0, 3.0], [True, True, False])
    pol.update(None, 8, 5.0)
    other = FullInfoUCB([1, 4, 8], seed=3)
    other.load_state_dict(pol.state_dict())
    assert np.allclose(other.means(), pol.means()) and other.decide().block_size == pol.decide().block_size
    assert pol.means()[2] == 5.0  # shown alone, without the reference: its own mean


def test_update_full_checks() -> None:
    pol = FullInfoUCB([1, 4, 8], seed=0)
    for bad in (
        ([1.0, 2.0], [True, True]),
        ([1.0, np.nan, 2.0], [True, True, True]),
        ([1.0, 2.0, 3.0], [1, 1, 1]),
    ):
        with pytest.raises(AdaptspecError):
            pol.update_full(None, *bad)
    assert pol.version == 0 and pol.stats.n.sum() == 0
    pol.update_full(None, [1.0, np.nan, 2.0], [True, False, True])  # an unobserved value is ignored
    with pytest.raises(AdaptspecError, match="update\\(\\)"):
        UCB([1, 4]).update_full(None, [1.0, 2.0], [True, True])
    with pytest.raises(AdaptspecError, match="update\\(\\)"):
        LinUCB([1, 4]).update_full([0.0], [1.0, 2.0], [True, True])


def test_fi_linucb_statistics_are_per_arm_ridge_regressions() -> None:
    """With raw features (no standardiser), each arm's posterior mean is the ridge solution on the
    requests that showed it: (lam I + Phi^T Phi)^-1 Phi^T r (closed form)."""
    rng = np.random.default_rng(1)
    n, d, arms, lam = 60, 3, [1, 2, 4], 2.0
    X = rng.normal(size=(n, d))
    R = X @ rng.normal(size=(d, 3)) + rng.normal(0, 0.1, size=(n, 3))
    M = rng.random((n, 3)) < 0.7
    pol = FullInfoLinUCB(arms, standardize=False, lam=lam, dim=d, seed=0)
    for x, r, m in zip(X, R, M):
        pol.update_full(x, r, m)
    Phi = np.hstack([X, np.ones((n, 1))])
    for j in range(3):
        P = Phi[M[:, j]]
        theta = np.linalg.solve(lam * np.eye(d + 1) + P.T @ P, P.T @ R[M[:, j], j])
        assert np.allclose(pol.core.theta[j], theta, atol=1e-8)


def test_fi_linucb_warm_up_plays_the_largest_arm_then_the_best_mean() -> None:
    pol = FullInfoLinUCB([1, 2, 4], warmup=12, seed=0)
    x = np.array([0.3, -1.0])
    assert pol.decide(x).block_size == 4
    pol.update_full(x, [1.0, 3.0, 2.0], [True, True, True])
    assert pol.decide(-x).block_size == 2 and pol.decide(-x).propensity == 1.0
    assert pol.warming_up


def test_specs_and_replay_with_feedback() -> None:
    from adaptspec.simulators.counterfactuals import Feedback
    from adaptspec.simulators.replay import run_policy

    assert isinstance(make_policy("fi-ucb", [1, 2, 4]), FullInfoUCB)
    assert make_policy("fi-linucb:alpha=0.1", [1, 2, 4]).alpha == 0.1
    rng = np.random.default_rng(2)
    n, k = 50, 3
    R = rng.normal(size=(n, k)) + np.array([0.0, 1.0, 0.5])
    fb = Feedback(
        np.repeat(R[:, None, :], k, axis=1), np.ones((n, k, k), dtype=bool), np.zeros((n, k, k), bool)
    )
    idx = rng.integers(0, n, size=200)
    full = make_policy("fi-ucb", [1, 2, 4], seed=0)
    a = run_policy(full, R, idx, feedback=fb)
    assert np.allclose(full.means(), R[idx].mean(axis=0))  # every arm learnt every request
    assert full.version == 200 and a[0] == 2
    bandit = make_policy("fi-ucb", [1, 2, 4], seed=0)
    run_policy(bandit, R, idx)  # no feedback: the arm that ran only
    assert bandit.stats.n.sum() == 200


def test_learned_load_rule_counterfactual_rewards_closed_form() -> None:
    """A round at B = 4 over two rows (one capped at 2 by its own request): every other block
    size's rewards, from min(tau, B') over the cost model's round time at B' (hand-computed)."""
    from adaptspec.costs.latency import CostCurve, LatencyProfile
    from adaptspec.load_rules import Learned

    # verify: 0.040 s flat up to 2 rows x 1 token, then 0.002 s per token; no draft cost
    prof = LatencyProfile(
        "toy", draft=CostCurve((1,), (0.0,)), verify=CostCurve((2,), (0.040,), tail_slope_s=0.002)
    )
    rule = Learned([1, 2, 4, 8], prof, full_info=True)
    unit = 0.5
    cf = rule.counterfactual_rewards(4, [4, 2], [3, 2], [0.03, 0.02], [100.0, 100.0], unit)
    t = {b: 0.040 + 0.002 * max(2 * b - 2, 0) for b in (1, 2, 4)}  # two rows padded to the widest block
    assert set(cf) == {1, 2}  # only the shorter sizes: a longer one is known only where a row rejected
    assert cf[1] == pytest.approx([1 * unit / (0.03 * t[1] / t[4]), 1 * unit / (0.02 * t[1] / t[4])])
    assert cf[2] == pytest.approx([2 * unit / (0.03 * t[2] / t[4]), 2 * unit / (0.02 * t[2] / t[4])])
    censored = rule.counterfactual_rewards(4, [4, 4], [4, 1], [0.03, 0.03], [100.0, 100.0], unit)
    assert set(censored) == {1, 2}
    assert rule.counterfactual_rewards(1, [1, 1], [1, 1], [0.02, 0.02], [100.0, 100.0], unit) == {}


def test_learned_load_rule_with_full_information_learns_every_shorter_size_its_rounds_show() -> None:
    """Rounds driven through choose / feedback at one level: every block size's estimate equals the
    ridge posterior mean (level term prior 0, weight LEVEL_WEIGHT; shared term prior 1, weight
    COLD_WEIGHT) of the rewards computed here by hand: the played size's own, and min(tau, B') over
    the cost model's round time at B' for every shorter size; no longer size learns."""
    from adaptspec.costs.latency import CostCurve, LatencyProfile
    from adaptspec.load_rules import COLD_WEIGHT, LEVEL_WEIGHT, Learned
    from adaptspec.load_rules.load import Load

    prof = LatencyProfile(
        "toy", draft=CostCurve((1,), (0.0,)), verify=CostCurve((2,), (0.040,), tail_slope_s=0.002)
    )
    arms = [1, 2, 4, 8]
    rule = Learned(arms, prof, seed=1, hold=1, full_info=True)

    class Row:
        context = 100

    rows, load = [Row(), Row()], Load(rows=2, queue=0)
    plain = float(prof.verify(1, 100, 2))  # the model's plain round over two rows (the scale stays 1)
    t = lambda b: 0.040 + 0.002 * max(2 * b - 2, 0)  # noqa: E731  two rows padded to b
    seen = {a: [] for a in arms}
    rng = np.random.default_rng(0)
    for _ in range(40):
        b = rule.choose(rows, load)[0]
        taus = [int(x) for x in rng.integers(1, b + 1, size=2)]
        shares = [t(b) / 2] * 2 if b > 1 else [plain / 2] * 2
        rule.feedback(rows, [b, b], taus, shares, load)
        for a in arms:
            if a <= b:
                seen[a] += [
                    min(tau, a) * (plain / 2) / (s * t(a) / t(b)) if b > 1 else 1.0
                    for tau, s in zip(taus, shares)
                ]
    rule.choose([Row()], Load(rows=1, queue=0))  # another level: the last decision is learnt
    assert len(seen[8]) < len(seen[1])
    for i, a in enumerate(arms):
        n, m = len(seen[a]), float(np.mean(seen[a])) if seen[a] else 0.0
        # minimise n (w + c - m)^2 + L w^2 + C (c - 1)^2 over the level term w and the shared term c
        A = np.array([[n + LEVEL_WEIGHT, n], [n, n + COLD_WEIGHT]])
        w, c = np.linalg.solve(A, [n * m, n * m + COLD_WEIGHT])
        got = rule.policy.predict(rule.features(1)[None])[0]
        assert got[i] == pytest.approx(w + c, rel=1e-9)
