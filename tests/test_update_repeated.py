"""``Policy.update_repeated``: the rows of one batched round learnt in one step.

The reference is the same rewards fed one by one (``update_batch``): the posterior must match
(a second method, not the one-step formula itself); the noise estimate counts the residuals
against the prediction before the round (closed form from ``predict``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.errors import AdaptspecError
from adaptspec.policies.spec import make_policy

ARMS = [1, 2, 4]
rounds = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.lists(st.floats(-3, 3), min_size=1, max_size=16),
        st.lists(st.floats(-2, 2), min_size=3, max_size=3),
    ),
    min_size=1,
    max_size=8,
)


def _pair(spec: str, **kw):
    return [make_policy(spec, ARMS, seed=0, standardize=False, dim=3, **kw) for _ in range(2)]


@pytest.mark.parametrize("spec,kw", [("lints", {}), ("linucb", {}), ("lints", {"discount": 0.9})])
@settings(max_examples=40, deadline=None)
@given(data=rounds)
def test_one_step_posterior_equals_the_rows_fed_one_by_one(spec, kw, data):
    fast, slow = _pair(spec, **kw)
    for arm, rewards, x in data:
        x = np.asarray(x)
        fast.update_repeated(x, ARMS[arm], rewards)
        slow.update_batch(np.repeat(x[None], len(rewards), axis=0), np.full(len(rewards), ARMS[arm]), rewards)
    probe = np.random.default_rng(0).normal(size=(5, 3))
    np.testing.assert_allclose(fast.predict(probe), slow.predict(probe), rtol=1e-9, atol=1e-9)
    phi = fast.map.phi_many(probe)
    np.testing.assert_allclose(
        fast.core.mean_var_many(phi)[1], slow.core.mean_var_many(phi)[1], rtol=1e-9, atol=1e-12
    )
    assert fast.version == slow.version == sum(len(r) for _, r, _ in data)
    assert fast.noise_stats[0] == pytest.approx(slow.noise_stats[0])


def test_the_noise_estimate_counts_each_row_against_the_prediction_before_the_round():
    pol = make_policy("lints", ARMS, seed=0, standardize=False, dim=2)
    x = np.array([1.0, 0.5])
    pol.update_repeated(x, 2, [1.0, 2.0])
    before = pol.predict(x[None])[0, 1]  # arm 2's mean after the first round
    n0, ss0 = pol.noise_stats
    rewards = np.array([0.5, 1.5, 3.0])
    pol.update_repeated(x, 2, rewards)
    n1, ss1 = pol.noise_stats
    assert n1 - n0 == 3
    assert ss1 - ss0 == pytest.approx(float(((rewards - before) ** 2).sum()))


def test_a_cold_policy_buffers_them_like_single_updates():
    fast = make_policy("lints", ARMS, seed=0, warmup=4)
    slow = make_policy("lints", ARMS, seed=0, warmup=4)
    x = np.array([0.3, -1.0])
    for rewards in ([1.0, 2.0, 0.5], [0.2, 0.7, 1.1]):
        fast.update_repeated(x, 4, rewards)
        slow.update_batch(np.repeat(x[None], 3, axis=0), np.full(3, 4), rewards)
    np.testing.assert_allclose(fast.predict(x[None]), slow.predict(x[None]))


def test_bad_input_raises_and_changes_nothing():
    pol = make_policy("lints", ARMS, seed=0, standardize=False, dim=2)
    x = np.array([1.0, 0.0])
    for bad in (([1.0, float("nan")], 2), ([1.0], 3), (["a"], 2)):
        with pytest.raises(AdaptspecError):
            pol.update_repeated(x, bad[1], bad[0])
    assert pol.version == 0
    pol.update_repeated(x, 2, [])  # no rows: nothing learnt
    assert pol.version == 0
