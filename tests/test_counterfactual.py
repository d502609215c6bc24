"""Counterfactual outcomes (adaptspec.reward.counterfactual, adaptspec.simulators.counterfactuals):
against a brute-force simulation of hidden drafts, against the dense replay where a prefix of a
draft is what a shorter block drafts, and the trace-set feedback a replay gives a learner."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.costs.latency import CostCurve, LatencyProfile, get_profile
from adaptspec.errors import AdaptspecError
from adaptspec.reward.counterfactual import counterfactuals, from_outcome
from adaptspec.reward.functions import trace_rewards
from adaptspec.speculator import Outcome, Round
from adaptspec.traces.dense import DenseRequest, replay_rounds

FLAT = LatencyProfile(
    "flat", draft=CostCurve((1, 16), (0.004, 0.006)), verify=CostCurve((1, 16), (0.020, 0.030))
)


def leading(flags: list[bool], n: int) -> int:
    """Drafts accepted among the first n: the run of correct drafts from the start."""
    k = 0
    while k < n and k < len(flags) and flags[k]:
        k += 1
    return k


@st.composite
def requests(draw):
    """Hidden draft correctness per round, the arm that ran, and the rounds it ran (brute force)."""
    arms = sorted(draw(st.sets(st.integers(1, 12), min_size=1, max_size=6)) | {1})
    decided = draw(st.sampled_from(arms))
    n_rounds = draw(st.integers(1, 8))
    hidden = [draw(st.lists(st.booleans(), min_size=12, max_size=12)) for _ in range(n_rounds)]
    taus = [leading(h, decided - 1) + 1 for h in hidden]
    # the last round commits the request's last tokens: anything from 1 to what it accepted
    taus[-1] = draw(st.integers(1, taus[-1]))
    return arms, decided, hidden, taus


@given(requests())
@settings(max_examples=300, deadline=None)
def test_tokens_and_censoring_against_brute_force(case) -> None:
    arms, decided, hidden, taus = case
    cf = counterfactuals(
        taus, [decided] * len(taus), arms=arms, decided=decided, context_tokens=10, profile=FLAT
    )
    for k, b in enumerate(arms):
        truth, knowable = 0, True
        for r, (h, t) in enumerate(zip(hidden, taus)):
            last = r == len(taus) - 1
            if last:  # the request ends here whatever the block: at most the tokens that were left
                truth += min(leading(h, b - 1) + 1, t)
            else:
                truth += leading(h, b - 1) + 1
                if b > decided and t == decided:  # every draft verified was accepted: longer ones unseen
                    knowable = False
        assert cf.censored[k] == (not knowable)
        if knowable:
            assert cf.tokens[k] == truth
        else:
            assert cf.tokens[k] <= truth
        assert cf.approximate[k] == (b not in (1, decided))


def test_prefix_consistent_dense_request_matches_its_replay() -> None:
    """Where every block drafts the same first tokens (accept = min(L, b - 1) at every position), a
    shorter block's counterfactual is exact: equal to replaying that block on the dense trace."""
    L, n = 3, 61  # 60 tokens after the prefill token: divisible by every tau below
    accept = np.minimum(L, np.arange(1, 16))[None, :].repeat(n - 1, axis=0).astype(np.uint8)
    req = DenseRequest(
        np.arange(n),
        accept,
        np.zeros_like(accept, np.float32),
        np.zeros_like(accept, np.float32),
        np.zeros(4, np.float32),
        20,
        "length",
    )
    arms = [1, 2, 3, 4]  # taus 1, 2, 3, 4 divide 60
    for b in (4, 6):
        rounds = replay_rounds(req, b, max_new_tokens=200, profile=FLAT)
        cf = counterfactuals(
            [r.tau for r in rounds],
            [r.block_size for r in rounds],
            arms=arms,
            decided=b,
            context_tokens=20,
            profile=FLAT,
            decode_s=sum(r.draft_s + r.verify_s for r in rounds),
            new_tokens=n,
        )
        for k, a in enumerate(arms):
            truth = replay_rounds(req, a, max_new_tokens=200, profile=FLAT)
            assert cf.tokens[k] / cf.rounds == pytest.approx(np.mean([r.tau for r in truth]))
            assert cf.decode_s[k] == pytest.approx(sum(r.draft_s + r.verify_s for r in truth))


def test_the_arm_that_ran_is_paid_its_measured_time() -> None:
    prof = get_profile("cpu-smollm2-fast")
    rounds = [
        Round(4, 3, 0.01, 0.05),
        Round(4, 1, 0.01, 0.05),
        Round(4, 4, 0.01, 0.05),
        Round(2, 2, 0.01, 0.04),
    ]
    out = Outcome(tokens=list(range(11)), rounds=rounds, decode_s=0.5)
    cf = from_outcome(out, decided=4, arms=[1, 2, 4, 8], context_tokens=30, profile=prof)
    lat = cf.rewards("token_latency")
    assert lat[2] == pytest.approx(-1000 * 0.5 / 11)
    assert cf.rewards("throughput")[2] == pytest.approx(11 / 0.5)
    assert cf.rewards("tau").tolist() == pytest.approx([1.0, 7 / 4, 10 / 4, 10 / 4])
    assert cf.censored.tolist() == [False, False, False, True]  # round 3 accepted all 4 of 4
    # plain decoding takes one verify of one token per token: the profile's, times the machine's speed
    ctx = 30 + 1 + np.array([0, 3, 4, 8])
    ran = (prof.draft_s(np.array([4, 4, 4, 2]), ctx) + prof.verify_s(np.array([4, 4, 4, 2]), ctx)).sum()
    plain = (prof.verify_s(1, ctx).sum()) * 10 / 4
    assert cf.decode_s[0] == pytest.approx(0.5 / ran * plain)


def test_bad_rounds_are_one_line() -> None:
    with pytest.raises(AdaptspecError, match="tau <= verified"):
        counterfactuals([5], [4], arms=[1, 4], decided=4, context_tokens=1, profile=FLAT)
    with pytest.raises(AdaptspecError, match="same length"):
        counterfactuals([1, 2], [4], arms=[1, 4], decided=4, context_tokens=1, profile=FLAT)
    cf = counterfactuals([], [], arms=[1, 4], decided=4, context_tokens=1, profile=FLAT)
    assert cf.censored.all() and not cf.observed.any()


def test_trace_feedback_pays_the_arm_that_ran_its_own_reward() -> None:
    from adaptspec.simulators.counterfactuals import trace_feedback
    from adaptspec.traces import TraceSet

    prof = get_profile("cpu-smollm2-fast")
    accept = np.minimum(2, np.arange(1, 8))[None, :].repeat(30, axis=0).astype(np.uint8)
    taus, draft, verify, dec = [], [], [], []
    req = DenseRequest(
        np.arange(31), accept, accept * 0.0, accept * 0.0, np.zeros(2, np.float32), 12, "length"
    )
    arms = [1, 2, 4, 8]
    for b in arms:
        rs = replay_rounds(req, b, max_new_tokens=31, profile=prof)
        taus.append([r.tau for r in rs])
        draft.append([1e3 * r.draft_s for r in rs])
        verify.append([1e3 * r.verify_s for r in rs])
        dec.append(sum(1e3 * (r.draft_s + r.verify_s) for r in rs))
    ts = TraceSet.from_arrays(
        ["a"],
        ["x"],
        arms,
        np.array([[np.mean(t) for t in taus]]),
        prompt_tokens=[12],
        new_tokens=np.array([31]),
        rounds=np.array([[len(t) for t in taus]]),
        decode_ms=np.array([dec]),
        tau=taus,
        draft_ms=draft,
        verify_ms=verify,
        meta={"latency_profile": "cpu-smollm2-fast", "max_new_tokens": 31},
    )
    R = trace_rewards(ts, "token_latency")
    fb = trace_feedback(ts, R, "token_latency")
    assert np.allclose(np.diagonal(fb.rewards[0]), R[0])
    # every draft of B = 8 past the second is rejected: nothing is censored, and the prefix is exact here
    assert fb.observed[0, 3].all()
    assert np.allclose(fb.rewards[0, 3], R[0], rtol=2e-3)
