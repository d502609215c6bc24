"""LinUCB / LinTS: ridge statistics against direct solves, standardisation warm-up, priors, learning."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from _policy_helpers import ARMS, DIM, linear_stream
from adaptspec.errors import AdaptspecError
from adaptspec.policies import LinTS, LinUCB, SquareCB, Standardizer
from adaptspec.policies.ridge import DiscountedRidgeArms, RidgeArms
from adaptspec.policies.squarecb import squarecb_probs


def _direct(k, d, data, prior_mean, prior_prec, gamma=None, every=1):
    """theta and A for every arm by solving the normal equations from scratch. With a discount,
    observation s (1-based) weighs gamma^(every * decays after it), decays happening at the
    start of updates every+1, 2 every+1, ..."""
    T = len(data)
    thetas, As = [], []
    for a in range(k):
        A = prior_prec[a].copy()
        b = prior_prec[a] @ prior_mean[a]
        for t, (arm, x, r) in enumerate(data):
            if arm == a:
                s = t + 1
                w = 1.0 if gamma is None else gamma ** (every * ((T - 1) // every - (s - 1) // every))
                A += w * np.outer(x, x)
                b += w * r * x
        thetas.append(np.linalg.solve(A, b))
        As.append(A)
    return thetas, As


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(0, 60),
    gamma=st.sampled_from([None, 0.9, 0.99]),
    full=st.booleans(),
    every=st.sampled_from([1, 3, 16]),
)
def test_cores_equal_direct_solves(seed, n, gamma, full, every):
    rng = np.random.default_rng(seed)
    k, d = 3, 4
    pm = rng.normal(size=(k, d))
    if full:
        M = rng.normal(size=(k, d, d))
        pp = M @ M.transpose(0, 2, 1) + 0.5 * np.eye(d)
    else:
        pp = np.stack([np.diag(v) for v in rng.uniform(0.2, 3.0, size=(k, d))])
    core = (
        RidgeArms(k, d, prior_mean=pm, prior_precision=pp)
        if gamma is None
        else DiscountedRidgeArms(k, d, gamma, prior_mean=pm, prior_precision=pp, every=every)
    )
    data = [(int(rng.integers(k)), rng.normal(size=d) * 3, float(rng.normal() * 5)) for _ in range(n)]
    for a, x, r in data:
        core.update(a, x, r)
    thetas, As = _direct(k, d, data, pm, pp, gamma, every)
    X = rng.normal(size=(5, d))
    mu, var = core.mean_var_many(X)
    for a in range(k):
        assert np.allclose(mu[:, a], X @ thetas[a], rtol=1e-7, atol=1e-7)
        assert np.allclose(
            var[:, a], np.einsum("nd,nd->n", X, np.linalg.solve(As[a], X.T).T), rtol=1e-7, atol=1e-9
        )
    m1, v1 = core.mean_var(X[0])
    assert np.allclose(m1, mu[0]) and np.allclose(v1, var[0])
    out, best, _ = core.mean_var_score(X[1], 0.5)
    assert np.allclose(out, [mu[1], var[1], mu[1] + 0.5 * np.sqrt(var[1])], rtol=1e-9, atol=1e-12)
    assert best == int(np.argmax(out[2]))


def test_warmup_standardises_then_equals_a_frozen_standardizer():
    """After the warm-up the statistics are exactly those of a policy given the same standardiser
    from the start and fed the same updates."""
    X, R, _ = linear_stream(200, seed=1)
    X = X * np.array([100.0, 0.01, 1.0, 5.0]) + np.array([1e3, -3.0, 0.0, 7.0])
    rng = np.random.default_rng(0)
    arms = rng.integers(0, 3, 200)
    warm = LinUCB(ARMS, warmup=40, seed=0)
    for t in range(200):
        if t < 40:
            assert warm.warming_up and np.allclose(warm.decide(X[t]).probs, 1 / 3)
        warm.update(X[t], ARMS[arms[t]], R[t, arms[t]])
    assert not warm.warming_up
    st = Standardizer.fit(X[:40], R[np.arange(40), arms[:40]])
    assert np.allclose(warm.map.mean, st.mean) and np.allclose(warm.map.scale, st.scale)
    frozen = LinUCB(ARMS, standardize=st, seed=0)
    for t in range(200):
        frozen.update(X[t], ARMS[arms[t]], R[t, arms[t]])
    assert np.allclose(warm.core.theta, frozen.core.theta) and np.allclose(warm.core.A_inv, frozen.core.A_inv)
    assert np.allclose(warm.predict(X[:5]), frozen.predict(X[:5]))
    # predictions are in reward units
    assert abs(warm.predict(X[:50]).mean() - R[:50].mean()) < 1.0


def test_prior_is_the_starting_point_and_needs_a_fixed_map():
    st = Standardizer(np.zeros(DIM), np.ones(DIM))
    mean = np.array([[1.0, 0, 0, 0, 5.0], [0, 1.0, 0, 0, 5.0], [0, 0, 1.0, 0, 5.0]])
    pol = LinUCB(ARMS, standardize=st, prior_mean=mean, prior_precision=1e6, alpha=0.0)
    x = np.array([0.0, 0.0, 2.0, 0.0])
    assert pol.decide(x).block_size == 8
    assert np.allclose(pol.predict(x[None]), [[5.0, 5.0, 7.0]])
    with pytest.raises(AdaptspecError, match="prior"):
        LinUCB(ARMS, prior_mean=mean)  # standardize=True: the prior's space does not exist yet
    with pytest.raises(AdaptspecError, match="prior_precision"):
        LinUCB(ARMS, standardize=st, prior_precision=-np.ones(DIM + 1))
    with pytest.raises(AdaptspecError, match="prior_mean"):
        LinUCB(ARMS, standardize=st, prior_mean=np.zeros(3))
    pol.update(x, 8, 0.0)
    pol.set_prior(np.zeros(DIM + 1), 2.0)  # forgets the feedback, keeps the map
    assert np.allclose(pol.core.theta, 0.0) and pol.core.count.sum() == 0


def test_linucb_uses_no_inverse_per_decision(monkeypatch):
    pol = LinUCB(ARMS, standardize=False, seed=0)
    X, R, _ = linear_stream(50, seed=2)
    pol.update(X[0], 2, 1.0)

    def boom(*a, **k):
        raise AssertionError("matrix inverse or solve called")

    monkeypatch.setattr(np.linalg, "inv", boom)
    monkeypatch.setattr(np.linalg, "solve", boom)
    for t in range(1, 50):
        d = pol.decide(X[t])
        pol.update(X[t], d.block_size, R[t, pol.arm_index(d.block_size)])


def _pct_of_oracle(pol, X, R, E):
    got = []
    for t in range(len(X)):
        d = pol.decide(X[t])
        a = pol.arm_index(d.block_size)
        pol.update(X[t], d.block_size, R[t, a])
        got.append(E[t, a])
    got = np.array(got)
    return 100 * got[-500:].sum() / E[-500:].max(axis=1).sum()


@pytest.mark.parametrize(
    "make",
    [
        lambda: LinUCB(ARMS, seed=0),
        lambda: LinTS(ARMS, mc_samples=128, seed=0),
        lambda: LinUCB(ARMS, discount=0.995, seed=0),
        lambda: SquareCB(ARMS, seed=0),
    ],
    ids=["linucb", "lints", "linucb-discount", "squarecb"],
)
def test_learns_a_linear_optimum(make):
    X, R, E = linear_stream(2000, seed=3)
    pct = _pct_of_oracle(make(), X, R, E)
    fixed = 100 * E[-500:].mean(axis=0).max() / E[-500:].max(axis=1).mean()
    assert pct > 97.0 and pct > fixed + 5


def test_discounted_linucb_tracks_a_changed_reward_function():
    """Arm rewards flip sign at t=1500: the discounted policy recovers, the plain one lags."""
    X, R, E = linear_stream(3000, seed=4)
    R2, E2 = R.copy(), E.copy()
    R2[1500:] = R[1500:, ::-1]
    E2[1500:] = E[1500:, ::-1]

    def score(pol):
        got = []
        for t in range(3000):
            d = pol.decide(X[t])
            a = pol.arm_index(d.block_size)
            pol.update(X[t], d.block_size, R2[t, a])
            got.append(E2[t, a])
        got = np.array(got)
        return 100 * got[2000:].sum() / E2[2000:].max(axis=1).sum()

    fast, slow = score(LinUCB(ARMS, discount=0.99, seed=0)), score(LinUCB(ARMS, seed=0))
    assert fast > 95.0 and fast > slow + 3.0


def test_squarecb_probabilities_closed_form():
    mu = np.array([1.0, 0.5, 0.0, 1.0])
    p = squarecb_probs(mu, gamma=10.0)
    assert p[1] == pytest.approx(1 / (4 + 10 * 0.5)) and p[2] == pytest.approx(1 / (4 + 10 * 1.0))
    assert p[3] == pytest.approx(1 / 4)  # a tie with the best: gap 0
    assert p.sum() == pytest.approx(1.0) and p.min() > 0
    P = squarecb_probs(np.vstack([mu, mu[::-1]]), gamma=10.0)
    assert np.allclose(P[0], p) and np.allclose(P.sum(axis=1), 1.0)
    assert np.allclose(squarecb_probs(mu, gamma=0.0), 0.25)  # no confidence in the oracle: uniform


@settings(max_examples=30, deadline=None)
@given(mu=st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=12), gamma=st.floats(0, 1e6))
def test_squarecb_probabilities_always_a_distribution(mu, gamma):
    p = squarecb_probs(np.array(mu), gamma)
    assert np.all(p >= -1e-12) and p.sum() == pytest.approx(1.0)
    assert np.argmax(p) == np.argmax(mu) or p[np.argmax(mu)] == pytest.approx(p.max())


def test_lints_propensity_matches_its_choices():
    X, R, _ = linear_stream(300, seed=5)
    pol = LinTS(ARMS, mc_samples=256, warmup=12, seed=0)
    for t in range(40):  # little data: the posterior is wide and the choice random
        d = pol.decide(X[t])
        pol.update(X[t], d.block_size, R[t, pol.arm_index(d.block_size)])
    x = X[299]
    state = pol.state_dict()
    counts, probs = np.zeros(3), np.zeros(3)
    for _ in range(1500):
        d = pol.decide(x)
        counts[pol.arm_index(d.block_size)] += 1
        probs += d.probs
    assert probs.max() / 1500 < 0.95  # the check is not trivial
    assert np.allclose(counts / 1500, probs / 1500, atol=0.04)
    pol.load_state_dict(state)
    idx, _ = pol.decide_batch(np.repeat(x[None], 1500, axis=0))
    assert np.allclose(np.bincount(idx, minlength=3) / 1500, probs / 1500, atol=0.04)


@pytest.mark.parametrize("cls", [LinUCB, LinTS])
def test_update_rechecks_a_context_changed_since_its_decision(cls):
    # an update whose context equals the decision's is not validated twice; one that was
    # changed in place since (here to NaN) is, and raises without learning anything
    pol = cls([2, 4], warmup=4, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(10):
        x = rng.normal(size=3)
        pol.update(x, pol.decide(x).block_size, 1.0)
    x = rng.normal(size=3)
    d = pol.decide(x)
    before = pol.state_dict()
    with pytest.raises(AdaptspecError, match="1-D"):  # the same bytes, another shape
        pol.update(x.reshape(1, 3), d.block_size, 1.0)
    x[1] = np.nan
    with pytest.raises(AdaptspecError, match="NaN"):
        pol.update(x, d.block_size, 1.0)
    after = pol.state_dict()
    np.testing.assert_equal(after["state"]["core"]["A_inv"], before["state"]["core"]["A_inv"])
    assert after["version"] == before["version"]
