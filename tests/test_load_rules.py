"""The learned rule's warm start (adaptspec/load_rules/learned.py) and the simulator's misjudged cost models
(adaptspec/simulators/load_sim.py): the warm start prefers what the goodput model predicts, computed
here from the closed forms, and learning from measured rewards corrects a wrong cost model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.costs.latency import CostCurve, LatencyProfile, get_profile
from adaptspec.errors import AdaptspecError
from adaptspec.load_rules import LEVEL_ROWS, LEVELS, Goodput, Learned
from adaptspec.simulators.load_sim import draft_acceptance, misjudged, simulate
from adaptspec.traces.dense import DenseRequest

ARMS = [1, 2, 3, 4, 6, 8]
#: a pass costs 30 ms up to 16 tokens, then 20 ms a token more; a 2 ms draft pass
KNEE = LatencyProfile(
    "knee", draft=CostCurve((2,), (0.002,)), verify=CostCurve((1, 16), (0.030, 0.030), tail_slope_s=0.020)
)
#: what an engine that thinks verification is free per token believes of the same machine
FLAT = LatencyProfile("flat", draft=CostCurve((2,), (0.002,)), verify=CostCurve((1,), (0.030,)))


def _request(n_tokens: int, accepted: int, largest: int = 8, prompt: int = 10) -> DenseRequest:
    n = n_tokens - 1
    acc = np.array([[min(accepted, b - 1) for b in range(2, largest + 1)]] * n, dtype=np.uint8)
    ones = np.ones((n, largest - 1), np.float32)
    return DenseRequest(np.arange(n_tokens), acc, ones, 0 * ones, np.zeros(2, np.float32), prompt, "length")


def _goodput_argmax(profile: LatencyProfile, acceptance: float, rows: int, context: float) -> int:
    """The block size with the most expected tokens per second for ``rows`` rows all at it: the
    geometric series of independent acceptance over the profile's draft + verify time."""
    rate = {b: sum(acceptance**k for k in range(b)) / float(profile.round_s(b, context, rows)) for b in ARMS}
    return max(rate, key=rate.get)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["cpu-smollm2-bf16", "h100-qwen3-8b", "knee"]), st.floats(0.05, 0.95), st.floats(50, 2000)
)
def test_the_warm_start_prefers_the_goodput_models_block_size_at_every_level(name, acceptance, context):
    profile = KNEE if name == "knee" else get_profile(name)
    rule = Learned(ARMS, profile, prior=acceptance, context=context)
    for level, rows in enumerate(LEVEL_ROWS):
        expected = _goodput_argmax(profile, acceptance, rows, context)
        # every row count of the level shares its preference (the level's largest count: 3 -> 4 rows)
        for r in {rows, (LEVELS[level - 1] + 1 if level else 1)}:
            assert rule.preference(r) == expected


def test_a_cold_rule_starts_at_plain_speed_and_a_level_borrows_from_the_others():
    from adaptspec.load_rules import COLD_WEIGHT, LEVEL_WEIGHT

    rule = Learned(ARMS, KNEE, seed=0)
    assert rule.preference(1) is None  # every block size ties before the first round
    x16, x1 = rule.features(4), rule.features(0)  # 9-16 rows, 1 row
    np.testing.assert_allclose(rule.policy.predict(np.stack([x16, x1])), 1.0)
    rewards = [0.5, 0.7, 0.6, 0.8]
    rule.policy.update_repeated(x16, 8, rewards)
    n, m = len(rewards), float(np.mean(rewards))
    # ridge by hand: n (w + c - m)^2 + LEVEL_WEIGHT w^2 + COLD_WEIGHT (c - 1)^2, level term w, shared c
    w, c = np.linalg.solve([[n + LEVEL_WEIGHT, n], [n, n + COLD_WEIGHT]], [n * m, n * m + COLD_WEIGHT])
    got = rule.policy.predict(np.stack([x16, x1]))[:, ARMS.index(8)]
    assert got == pytest.approx([w + c, c], rel=1e-9)  # the unseen level borrows the shared term
    assert rule.preference(16) == 1 and rule.preference(1) == 1  # B = 8 is now below plain's 1.0 at both
    with pytest.raises(AdaptspecError, match="prior acceptance"):
        Learned(ARMS, KNEE, prior=1.0)
    for bad in ({"noise": 0.0}, {"level_weight": float("nan")}):
        with pytest.raises(AdaptspecError, match="must be > 0"):
            Learned(ARMS, KNEE, **bad)


def test_learning_corrects_a_cost_model_that_thinks_long_blocks_are_free():
    # 16 rows, 5 drafts of 7 right everywhere: on the true (knee) cost one token a row fills the
    # flat part and plain is best (brute force below); the flat model says B = 8 (6 tokens for
    # 32 ms instead of 1 for 30). Goodput on the flat model stays at 8; the learned rule starts
    # there and moves to plain from measured rewards.
    reqs = [_request(129, 5)]
    fixed = {
        b: simulate(_fixed(b), reqs, KNEE, clients=16, requests=32, prefill=False).tokens_per_s for b in ARMS
    }
    assert max(fixed, key=fixed.get) == 1
    prior = draft_acceptance(reqs, 8)
    assert prior == pytest.approx(5 / 6)
    rule = Learned(ARMS, FLAT, prior=prior, seed=0)
    assert rule.preference(16) == 8
    for _ in range(2):  # one decision a round: ~200 rounds to unlearn a prior this wrong
        simulate(rule, reqs, KNEE, clients=16, requests=32, prefill=False)
    assert rule.preference(16) == 1
    late = simulate(rule, reqs, KNEE, clients=16, requests=32, prefill=False)
    assert max(late.block_sizes, key=late.block_sizes.get) == 1
    goodput = simulate(Goodput(ARMS, FLAT, prior=prior), reqs, KNEE, clients=16, requests=32, prefill=False)
    assert max(goodput.block_sizes, key=goodput.block_sizes.get) == 8
    assert late.tokens_per_s > 1.5 * goodput.tokens_per_s and late.tokens_per_s >= 0.9 * fixed[1]


def _fixed(b: int):
    from adaptspec.load_rules import Fixed

    return Fixed(b)


@settings(max_examples=30, deadline=None)
@given(st.floats(0.1, 8.0), st.integers(1, 64), st.integers(1, 16), st.floats(0, 3000))
def test_a_misjudged_profile_scales_only_the_verify_cost_beyond_one_token(factor, batch, block, context):
    p = get_profile("cpu-smollm2-bf16")
    wrong = misjudged(p, factor)
    n = block * batch
    # the curve's token part scales; its per-sequence context reads (per_context_s) do not
    v, c = p.verify, float(context)
    tokens_part = float(p.verify(block, context, batch)) - v.per_context_s * c * batch - v.per_pair_s * n * c
    base = v.values_s[0]
    expected = (
        base + factor * (tokens_part - base) + v.per_context_s * c * batch + factor * v.per_pair_s * n * c
    )
    assert float(wrong.verify(block, context, batch)) == pytest.approx(expected, rel=1e-9)
    assert float(wrong.draft_s(block, context, batch)) == float(p.draft_s(block, context, batch))
    assert float(wrong.verify(1, 0, 1)) == pytest.approx(float(p.verify(1, 0, 1)))
    with pytest.raises(AdaptspecError, match="factor"):
        misjudged(p, 0.0)


class _Row:
    def __init__(self, context: int) -> None:
        self.context = context


def test_a_decision_holds_for_its_rounds_at_one_level_and_its_rows_are_learnt_in_one_update():
    from adaptspec.load_rules.load import Load

    rule = Learned(ARMS, KNEE, prior=0.5, seed=3, hold=3)
    rows = [_Row(100), _Row(300)]
    load = Load(rows=2, queue=0)
    first = rule.choose(rows, load)  # a level's first round is plain (the scale)
    assert first == [1, 1]
    rule.feedback(rows, first, [1, 1], [0.015, 0.015], load)  # the model's plain round: scale 1
    plain = float(KNEE.verify(1, 200, 2))
    chosen, expected = [], []
    for k in range(3):
        b = rule.choose(rows, load)
        chosen.append(b[0])
        taus, shares = [1 + k % 2, 2], [0.02 + 0.001 * k, 0.03]
        rule.feedback(rows, b, taus, shares, load)
        expected += [
            t * (plain / 2) / s for t, s in zip(taus, shares)
        ]  # each row's speed-up over its plain share
    assert len(set(chosen)) == 1 and chosen[0] != 1  # one decision, held for 3 rounds
    assert rule.policy.version == 2  # the plain round learnt; the held rows not yet
    rule.choose([_Row(200)], Load(rows=1, queue=0))  # another level: a new decision, the held one learnt
    # the reference: a policy with the same prior fed the same rewards one by one
    ref = Learned(ARMS, KNEE, prior=0.5, seed=3).policy
    x2 = Learned.context(1)
    ref.update_batch(np.repeat(x2[None], 2, axis=0), np.ones(2, dtype=int), [plain / 2 / 0.015 * 1] * 2)
    ref.update_batch(np.repeat(x2[None], 6, axis=0), np.full(6, chosen[0]), expected)
    for level in range(len(LEVELS) + 1):
        x = Learned.context(level)
        np.testing.assert_allclose(rule.policy.predict(x[None]), ref.predict(x[None]), rtol=1e-9)
    assert rule.policy.version == ref.version == 8
    with pytest.raises(AdaptspecError, match="hold"):
        Learned(ARMS, KNEE, prior=0.5, hold=0)


@pytest.mark.parametrize(
    "plain_every, plain_every_max, forced",
    [
        (2, None, [1, 4, 7, 10, 13, 16, 19, 22, 25, 28]),  # a plain round after 2 without one, always
        (2, 8, [1, 6, 15, 24]),  # after 2, then 4, then 8, 8, ...
        (32, 512, [1]),
    ],
)
def test_forced_plain_rounds_come_after_a_gap_that_doubles_up_to_its_most(
    plain_every, plain_every_max, forced
):
    from adaptspec.load_rules.load import Load

    flat = LatencyProfile("flat", draft=CostCurve((1,), (0.0,)), verify=CostCurve((1,), (0.040,)))
    rule = Learned([1, 4], flat, prior=0.9, hold=1, plain_every=plain_every, plain_every_max=plain_every_max)
    rows, load, plain = [_Row(100)], Load(rows=1, queue=0), []
    for n in range(1, 31):
        b = rule.choose(rows, load)[0]
        if b == 1:
            plain.append(n)
        rule.feedback(
            rows, [b], [b], [0.040], load
        )  # every draft accepted at plain's cost: B = 4 is 4x plain
    assert plain == forced
    for bad in ({"plain_every": 0}, {"plain_every_max": 16, "plain_every": 32}, {"plain_every": True}):
        with pytest.raises(AdaptspecError, match="plain_every"):
            Learned([1, 4], flat, prior=0.9, **bad)
