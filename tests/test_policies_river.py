"""River adapter: river.bandit policies and river regressors behind the adaptspec protocol."""

from __future__ import annotations

import numpy as np
import pytest

from _policy_helpers import ARMS, linear_stream, river_regressor
from adaptspec.errors import AdaptspecError
from adaptspec.policies import RiverPolicy, make_policy


def test_wraps_context_free_river_policies_and_learns():
    from river import bandit, proba

    rng = np.random.default_rng(0)
    means = {2: 0.3, 4: 0.7, 8: 0.5}
    for river_pol in (
        bandit.UCB(delta=1.0),
        bandit.EpsilonGreedy(epsilon=0.1),
        bandit.ThompsonSampling(reward_obj=proba.Gaussian(), burn_in=2),
    ):
        pol = RiverPolicy(ARMS, policy=river_pol, seed=0)
        assert not pol.contextual
        chosen = []
        for _ in range(400):
            d = pol.decide()
            chosen.append(d.block_size)
            pol.update(None, d.block_size, means[d.block_size] + rng.normal(0, 0.1))
        assert np.mean(np.array(chosen[-100:]) == 4) > 0.75, type(river_pol).__name__


def test_probe_propensities_match_river_epsilon_greedy():
    from river import bandit

    pol = RiverPolicy(ARMS, policy=bandit.EpsilonGreedy(epsilon=0.3), probe=400, seed=1)
    for b, r in [(2, 0.1), (4, 1.0), (8, 0.2)]:
        pol.update(None, b, r)
    d = pol.decide()
    # river explores with probability 0.3 uniformly: p(best) = 0.7 + 0.1
    assert d.probs == pytest.approx([0.1, 0.8, 0.1], abs=0.05)


def test_argmax_policies_are_pulled_once():
    from river import bandit

    assert RiverPolicy(ARMS, policy=bandit.UCB(delta=1.0)).probe == 1
    assert RiverPolicy(ARMS, policy=bandit.LinUCBDisjoint()).probe == 1
    assert RiverPolicy(ARMS, policy=bandit.EpsilonGreedy(epsilon=0.1), probe=8).probe == 8


def test_regressor_mode_learns_a_contextual_optimum():
    X, R, E = linear_stream(800, seed=2)
    pol = RiverPolicy(ARMS, regressor=river_regressor(), exploration="ucb", seed=0)
    assert pol.contextual
    got = []
    for t in range(800):
        d = pol.decide(X[t])
        a = pol.arm_index(d.block_size)
        pol.update(X[t], d.block_size, R[t, a])
        got.append(E[t, a])
    assert np.sum(got[-300:]) / E[-300:].max(axis=1).sum() > 0.95


def test_contextual_river_policy_gets_dict_contexts():
    from river import bandit

    X, R, _ = linear_stream(30, seed=3)
    pol = RiverPolicy(ARMS, policy=bandit.LinUCBDisjoint(), seed=0)
    assert pol.contextual
    for t in range(30):
        d = pol.decide(X[t])
        pol.update(X[t], d.block_size, R[t, pol.arm_index(d.block_size)])
    assert set(pol.model._bayes_lin_regs) <= set(ARMS)
    assert pol.dim == X.shape[1]


def test_adapter_errors_and_specs():
    from river import bandit

    with pytest.raises(AdaptspecError, match="exactly one"):
        RiverPolicy(ARMS)
    with pytest.raises(AdaptspecError, match="exactly one"):
        RiverPolicy(ARMS, policy=bandit.UCB(delta=1.0), regressor=river_regressor())
    with pytest.raises(AdaptspecError, match="river.bandit"):
        RiverPolicy(ARMS, policy=object())
    with pytest.raises(AdaptspecError, match="unknown river model"):
        make_policy("river:nope", ARMS)
    for spec, label in [
        ("river", "river:linear"),
        ("river:ucb,delta=2", "river:ucb"),
        ("river:ts", "river:ts"),
        ("river:linucb,alpha=0.5", "river:linucb"),
        ("river:exp3,gamma=0.2", "river:exp3"),
    ]:
        assert make_policy(spec, ARMS, seed=0).label == label
    with pytest.raises(AdaptspecError):
        make_policy("river:ucb,bogus=1", ARMS)
    pol = RiverPolicy(ARMS, regressor=river_regressor())
    with pytest.raises(AdaptspecError, match="state"):
        pol.load_state_dict(
            RiverPolicy(ARMS, policy=bandit.UCB(delta=1.0)).state_dict()
            | {"name": "river", "label": pol.label}
        )
