"""Round-time attribution (adaptspec/reward/attribution.py): the padded round's cost model and
serial cost sharing, against closed forms, the airport game's Shapley formula and brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.costs.latency import CostCurve, LatencyProfile, get_profile
from adaptspec.errors import AdaptspecError
from adaptspec.reward.attribution import attribute, batch_round_s, batch_rounds_s, by_serial_cost, by_tokens

#: A pass costs a + k * (positions in the pass): a = 38 ms, k = 2 ms; no draft cost.
A, K = 0.038, 0.002
LINEAR = LatencyProfile(
    "linear", draft=CostCurve((1,), (0.0,)), verify=CostCurve((1,), (A + K,), tail_slope_s=K)
)
#: Every pass costs 50 ms, whatever it holds (draft 10 ms when any row speculates, verify 40 ms).
FLAT = LatencyProfile("flat", draft=CostCurve((2,), (0.010,)), verify=CostCurve((1,), (0.040,)))
NO_DRAFT = CostCurve((1,), (0.0,))
#: The shipped profiles' target passes alone (the part of a round that is an airport game).
VERIFY_ONLY = [
    LatencyProfile(f"{name} verify", draft=NO_DRAFT, verify=get_profile(name).verify)
    for name in ("cpu-smollm2-bf16", "h100-qwen3-8b")
]

blocks_st = st.lists(st.integers(1, 16), min_size=1, max_size=12)


# ============================================================================ the padded round
def test_a_round_costs_its_widest_block_times_its_rows():
    # one row at B = 8 among seven plain rows: the target pass computes 8 x 8 = 64 positions
    assert batch_round_s(LINEAR, [8] + [1] * 7, [100] * 8) == pytest.approx(A + K * 64, rel=1e-12)
    assert batch_round_s(LINEAR, [1] * 8, [100] * 8) == pytest.approx(A + K * 8, rel=1e-12)
    assert batch_round_s(LINEAR, [], []) == 0.0


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["cpu-smollm2-bf16", "h100-qwen3-8b", "vllm-cpu-smollm2"]), st.data())
def test_many_rounds_priced_at_once_are_each_round_priced_alone(name, data):
    p = get_profile(name)
    n = data.draw(st.integers(1, 8))
    ctx = data.draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))
    rounds = data.draw(st.lists(st.lists(st.integers(1, 12), min_size=n, max_size=n), min_size=1, max_size=6))
    np.testing.assert_allclose(
        batch_rounds_s(p, np.array(rounds), ctx), [batch_round_s(p, r, ctx) for r in rounds], rtol=1e-12
    )


def test_the_draft_pass_is_padded_over_the_speculating_rows_only():
    d, kd, pc = 0.005, 0.001, 1e-5
    p = LatencyProfile(
        "lin", draft=CostCurve((1,), (d,), tail_slope_s=kd, per_context_s=pc), verify=LINEAR.verify
    )
    blocks, ctx = [1, 4, 8, 2], [10, 20, 30, 40]
    # draft: 3 speculating rows x 8 positions, their contexts 20 + 30 + 40; verify: 4 rows x 8
    draft = d + kd * (3 * 8 - 1) + pc * (20 + 30 + 40)
    assert batch_round_s(p, blocks, ctx) == pytest.approx(draft + A + K * 32, rel=1e-12)
    assert batch_round_s(p, [1, 1], [10, 20]) == pytest.approx(A + K * 2, rel=1e-12)  # plain: no draft pass


# ============================================================================ serial cost sharing
def test_serial_shares_by_hand_for_a_linear_cost():
    # t = a + k * rows * maxB; rows [1, 1, 4, 8]: C(1) = a + 4k, C(4) = a + 16k, C(8) = a + 32k.
    # Everyone pays C(1)/4 = a/4 + k; the step 1 -> 4 (12k) is split by the two rows at >= 4;
    # the step 4 -> 8 (16k) is the B = 8 row's alone.
    blocks = [1, 1, 4, 8]
    want = [A / 4 + K, A / 4 + K, A / 4 + K + 6 * K, A / 4 + K + 6 * K + 16 * K]
    round_s = A + 32 * K
    np.testing.assert_allclose(by_serial_cost(round_s, blocks, [100] * 4, LINEAR), want, rtol=1e-12)
    np.testing.assert_allclose(
        by_serial_cost(2 * round_s, blocks, [100] * 4, LINEAR), 2 * np.array(want), rtol=1e-12
    )
    # the motivating case: one row at 8 among seven plain rows pays the 56k its width adds
    shares = by_serial_cost(A + 64 * K, [8] + [1] * 7, [100] * 8, LINEAR)
    np.testing.assert_allclose(shares, [(A + 8 * K) / 8 + 56 * K] + [(A + 8 * K) / 8] * 7, rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(blocks_st)
def test_serial_shares_equal_the_airport_games_closed_form_for_a_linear_cost(blocks):
    # Littlechild & Owen: sort the rows, b_(0) = 1; the j-th pays C(1)/n plus, for every m <= j,
    # the cost of widening b_(m-1) -> b_(m), k * n * (b_(m) - b_(m-1)), split among the n - m + 1
    # rows that need it. Row by row, ties included: a second method from the code's distinct widths.
    n = len(blocks)
    order = sorted(range(n), key=lambda i: blocks[i])
    want, paid, prev = [0.0] * n, (A + K * n) / n, 1
    for m, i in enumerate(order):
        paid += K * n * (blocks[i] - prev) / (n - m)
        want[i], prev = paid, blocks[i]
    round_s = A + K * n * max(blocks)  # the closed form of the padded round
    assert batch_round_s(LINEAR, blocks, [100] * n) == pytest.approx(round_s, rel=1e-12)
    np.testing.assert_allclose(by_serial_cost(round_s, blocks, [100] * n, LINEAR), want, rtol=1e-9)
    np.testing.assert_allclose(
        by_tokens(round_s, blocks), [round_s * b / sum(blocks) for b in blocks], rtol=1e-12
    )


def test_the_draft_pass_is_shared_by_the_speculating_rows():
    # FLAT: C(1) = 40 ms, C(w >= 2) = 50 ms; the 10 ms drafter pass is split by the two speculating rows
    np.testing.assert_allclose(
        by_serial_cost(0.050, [1, 3, 1, 5], [0] * 4, FLAT), [0.010, 0.015, 0.010, 0.015], rtol=1e-12
    )


def _shapley_plus_base(profile: LatencyProfile, blocks: list[int], ctx: list[int]) -> np.ndarray:
    """C(empty)/n plus the Shapley value of S -> C(S) - C(empty), by brute force over orderings, where
    C(S) is the padded round with the rows in S at their widths and the others at width 1."""
    n = len(blocks)
    cost: dict[frozenset, float] = {}

    def c(s: frozenset) -> float:
        if s not in cost:
            cost[s] = batch_round_s(profile, [b if i in s else 1 for i, b in enumerate(blocks)], ctx)
        return cost[s]

    phi = np.zeros(n)
    for perm in itertools.permutations(range(n)):
        s: frozenset = frozenset()
        for i in perm:
            phi[i] += c(s | {i}) - c(s)
            s = s | {i}
    return c(frozenset()) / n + phi / math.factorial(n)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(VERIFY_ONLY),
    st.lists(st.tuples(st.integers(1, 12), st.integers(0, 2000)), min_size=1, max_size=5),
)
def test_serial_shares_are_the_shapley_value_of_the_padded_verify_pass(profile, rows):
    blocks, ctx = [b for b, _ in rows], [c for _, c in rows]
    modelled = batch_round_s(profile, blocks, ctx)
    np.testing.assert_allclose(
        by_serial_cost(modelled, blocks, ctx, profile),
        _shapley_plus_base(profile, blocks, ctx),
        rtol=1e-9,
        atol=1e-15,
    )


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["cpu-smollm2-bf16", "h100-qwen3-8b"]),
    st.lists(st.tuples(st.integers(1, 16), st.integers(0, 4000)), min_size=1, max_size=12),
    st.floats(1e-4, 1.0),
)
def test_shares_sum_to_the_round_plain_rows_pay_the_plain_share_and_equal_blocks_pay_equal(
    name, rows, round_s
):
    p = get_profile(name)
    blocks, ctx = [b for b, _ in rows], [c for _, c in rows]
    n = len(blocks)
    shares = attribute("marginal", round_s, blocks, ctx, p)
    assert shares.sum() == pytest.approx(round_s, rel=1e-9)
    scale = round_s / batch_round_s(p, blocks, ctx)
    plain_share = batch_round_s(p, [1] * n, ctx) / n * scale
    for i in range(n):
        if blocks[i] == 1:
            assert shares[i] == pytest.approx(plain_share, rel=1e-9)
        for j in range(n):
            if blocks[i] == blocks[j]:
                assert shares[i] == pytest.approx(shares[j], rel=1e-9)
            elif blocks[i] > blocks[j]:
                assert shares[i] >= shares[j] * (1 - 1e-9)  # a wider row never pays less


def test_attribute_checks_its_arguments_and_falls_back_to_tokens_without_a_cost_model():
    np.testing.assert_allclose(attribute("marginal", 0.05, [1, 4], [0, 0], None), by_tokens(0.05, [1, 4]))
    np.testing.assert_allclose(attribute("tokens", 0.05, [1, 4], [0, 0], FLAT), by_tokens(0.05, [1, 4]))
    with pytest.raises(AdaptspecError, match="attribution must be one of"):
        attribute("shapley", 0.05, [1, 4], [0, 0], FLAT)
    with pytest.raises(AdaptspecError, match="a context per row"):
        attribute("marginal", 0.05, [1, 4], [0], FLAT)
    with pytest.raises(AdaptspecError, match="block sizes must be >= 1"):
        attribute("marginal", 0.05, [0, 4], [0, 0], FLAT)
