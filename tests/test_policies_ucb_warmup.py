"""UCB's probabilities during warm-up: what its decisions do (round-robin), never a NaN (issue 30.5).

An arm without data has no mean, so during warm-up UCB's scores are no probabilities; the
expected probabilities come from a second method: the decisions a copy of the policy makes,
one ``decide`` per request without learning in between.
"""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import given, settings, strategies as st

from adaptspec.policies.ucb import UCB

ARMS = [1, 2, 4, 8, 16]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(ARMS), st.floats(-50, 50)), max_size=25),
    st.integers(1, 3),
    st.sampled_from([0.0, 0.1]),
    st.integers(1, 12),
    st.booleans(),
)
def test_probs_batch_are_the_decisions_a_frozen_copy_makes(updates, warmup, epsilon, n, throughput):
    pol = (
        UCB.throughput(ARMS, warmup_rounds=2 * len(ARMS), epsilon=epsilon, seed=0)
        if throughput
        else UCB(ARMS, warmup=warmup, epsilon=epsilon, seed=0)
    )
    for i, (b, r) in enumerate(updates):
        pol.decide()  # moves the round-robin position like a served policy's decisions do
        pol.update(None, b, r)
    P = pol.probs_batch(None, n)
    assert P.shape == (n, len(ARMS)) and np.isfinite(P).all()
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    frozen = copy.deepcopy(pol)
    decided = np.stack([frozen.decide().probs for _ in range(n)])
    np.testing.assert_allclose(P, decided)
    np.testing.assert_allclose(pol.decide().probs, P[0])  # probs_batch did not move the policy


def test_an_unplayed_arm_is_played_next_with_all_the_mass():
    pol = UCB([4, 8, 16], seed=0)
    pol.update(None, 4, 1.0)
    pol.update(None, 16, 3.0)
    # 8 has no data: the next decision is 8 (closed form: the round-robin's only arm left)
    assert pol.probs_batch(None, 3).tolist() == [[0.0, 1.0, 0.0]] * 3
