"""The vLLM plug-in's measured step costs (adaptspec.vllm.step_costs), without vLLM: the means
against numpy's and the closed form of an exponential average, the sizes not measured against a
linear prior's closed form (0.038 s + 0.002 s a verified position: a round of R rows at B costs
0.038 + 0.002 R B), and the goodput rule priced by it choosing as the measured costs say."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.costs.latency import CostCurve, LatencyProfile
from adaptspec.load_rules import Goodput
from adaptspec.vllm.step_costs import StepCosts

PRIOR = LatencyProfile(
    "linear",
    draft=CostCurve((1,), (0.0,)),
    verify=CostCurve((1,), (0.040,), tail_slope_s=0.002),
    context_tokens=100,
)
#: the load levels' largest request counts (1, 2, 3-4, 5-8, 9-16, 17-32, more), written out
LEVEL_TOP = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 9: 16, 16: 16, 17: 32, 33: 64, 100: 64}


def prior_round(rows: int, block: int) -> float:
    return 0.038 + 0.002 * rows * block


@pytest.mark.parametrize("rows", sorted(LEVEL_TOP))
def test_a_level_nothing_ran_at_is_the_priors_round_at_the_levels_largest_request_count(rows):
    c = StepCosts(PRIOR, max_block_size=9)
    top = LEVEL_TOP[rows]
    for b in range(1, 10):
        assert c.verify(b, None, rows) == pytest.approx(rows / top * prior_round(top, b), rel=1e-12)
        assert c.draft(b, None, rows) == 0.0  # the drafter's pass is in the step's time


@settings(max_examples=60, deadline=None)
@given(
    times=st.lists(st.floats(0.001, 1.0), min_size=4, max_size=64),
    rows=st.integers(1, 8),
    block=st.integers(1, 9),
)
def test_up_to_the_window_a_measured_size_is_the_mean_seconds_a_request(times, rows, block):
    c = StepCosts(PRIOR, max_block_size=9, min_steps=4, window=64)
    for t in times:
        c.observe(rows=rows, block=block, step_s=t)
    assert c.verify(block, None, rows) == pytest.approx(rows * np.mean(np.array(times) / rows), rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(y1=st.floats(0.01, 1.0), y2=st.floats(0.01, 1.0), k=st.integers(0, 200))
def test_beyond_the_window_it_is_an_exponential_average(y1, y2, k):
    window = 16
    c = StepCosts(PRIOR, max_block_size=4, min_steps=1, window=window)
    for t in [y1] * window + [y2] * k:
        c.observe(rows=1, block=2, step_s=t)
    # closed form: each step after the first `window` moves the mean 1/window of the way to y2
    assert c.verify(2, None, 1) == pytest.approx(y2 + (y1 - y2) * (1 - 1 / window) ** k, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    m1=st.floats(0.01, 0.5),
    m2=st.floats(0.01, 0.5),
    b1=st.integers(1, 4),
    gap=st.integers(1, 4),
    rows=st.sampled_from([1, 3, 8]),
)
def test_sizes_not_measured_are_linear_between_measured_ones_and_scaled_by_the_prior_beyond(
    m1, m2, b1, gap, rows
):
    b2 = b1 + gap
    c = StepCosts(PRIOR, max_block_size=9, min_steps=2)
    for _ in range(2):
        c.observe(rows=rows, block=b1, step_s=rows * m1)
        c.observe(rows=rows, block=b2, step_s=rows * m2)
    top = LEVEL_TOP[rows]
    for b in range(1, 10):
        if b1 <= b <= b2:
            per_row = m1 + (m2 - m1) * (b - b1) / (b2 - b1)
        elif b < b1:
            per_row = m1 * prior_round(top, b) / prior_round(top, b1)
        else:
            per_row = m2 * prior_round(top, b) / prior_round(top, b2)
        assert c.verify(b, None, rows) == pytest.approx(rows * per_row, rel=1e-9)


def test_a_size_seen_fewer_than_min_steps_times_is_not_measured_yet_and_levels_keep_apart():
    c = StepCosts(PRIOR, max_block_size=9, min_steps=3)
    for _ in range(2):
        c.observe(rows=3, block=2, step_s=0.3)
    assert c.verify(2, None, 4) == pytest.approx(prior_round(4, 2))  # two steps: the prior's still
    c.observe(rows=3, block=2, step_s=0.3)
    assert c.verify(2, None, 4) == pytest.approx(0.4)  # 3 and 4 requests: one level, 0.1 s a request
    assert c.verify(2, None, 2) == pytest.approx(
        prior_round(2, 2)
    )  # 2 requests: another level, nothing measured
    assert c.stats() == {"4": {2: 100.0}}


def test_the_plain_step_is_measured_from_one_step_the_others_from_min_steps():
    c = StepCosts(PRIOR, max_block_size=9, min_steps=3)
    c.observe(rows=4, block=1, step_s=0.2)
    c.observe(rows=4, block=3, step_s=0.4)
    assert c.verify(1, None, 4) == pytest.approx(0.2)  # one plain step: measured
    # B = 3, seen once, is not: priced from the measured plain step by the prior's ratio
    assert c.verify(3, None, 4) == pytest.approx(0.2 * prior_round(4, 3) / prior_round(4, 1))
    assert c.stats() == {"4": {1: 50.0}}


@pytest.mark.parametrize(
    "rows, block, step_s",
    [(0, 2, 0.1), (1, 0, 0.1), (1, 10, 0.1), (1, 2, 0.0), (1, 2, -1.0), (1, 2, math.nan)],
)
def test_an_observation_outside_the_model_changes_nothing(rows, block, step_s):
    c = StepCosts(PRIOR, max_block_size=9, min_steps=1)
    c.observe(rows=rows, block=block, step_s=step_s)
    assert c.stats() == {} and c.verify(2, None, 1) == pytest.approx(prior_round(1, 2))


class _Row:
    """A row as the load rules read it: its acceptance so far, tokens out, context."""

    def __init__(self) -> None:
        self.accepted, self.rejected, self.m, self.context = 30, 10, 0, 100


def test_the_goodput_rule_priced_by_the_measured_steps_chooses_as_they_say():
    # vLLM at one request on this CPU: a step verifying 4 drafts cost no more than one verifying none,
    # so at the row's acceptance (34 / 48 = 0.71: 30 of 40 drafts, smoothed towards the prior 0.5 by 8
    # drafts) the widest block commits the most tokens a second
    flat = StepCosts(PRIOR, max_block_size=5, min_steps=1)
    for b in range(1, 6):
        flat.observe(rows=1, block=b, step_s=0.050)
    assert Goodput([1, 2, 3, 4, 5], flat).choose([_Row()], None) == [5]
    # the same sizes measured at 10x plain's step: no block's expected tokens (under 1 / (1 - 0.71) < 4) pay for it
    steep = StepCosts(PRIOR, max_block_size=5, min_steps=1)
    steep.observe(rows=1, block=1, step_s=0.050)
    for b in range(2, 6):
        steep.observe(rows=1, block=b, step_s=0.500)
    assert Goodput([1, 2, 3, 4, 5], steep).choose([_Row()], None) == [1]


def _learned_rule_in_a_linear_world(
    per_token_s: float, acceptance: float, margin: float, rounds: int = 400
) -> tuple[int, dict[int, int]]:
    """The plug-in's learned rule (warm from adaptspec's own bf16 profile, full information, priced
    by StepCosts) at 4 requests, in a world whose step costs 36 ms + ``per_token_s`` a verified
    token (vLLM's steps on this CPU: ~3 ms at 8 requests, BENCHMARKS.md) and whose drafts are each
    accepted with ``acceptance``. Its preference at the end, and the block sizes it ran in the last half."""
    from adaptspec.costs.latency import get_profile
    from adaptspec.load_rules import Learned
    from adaptspec.load_rules.load import Load, RowView

    arms = list(range(1, 10))
    costs = StepCosts(get_profile("cpu-smollm2-bf16"), max_block_size=9)
    rule = Learned(arms, costs, prior=0.4, seed=0, full_info=True, margin=margin)
    rng = np.random.default_rng(0)
    rows, load, played = [RowView(100) for _ in range(4)], Load(rows=4, queue=0), {}
    for r in range(rounds):
        b = rule.choose(rows, load)[0]
        step_s = 0.036 + per_token_s * 4 * b
        costs.observe(4, b, step_s)
        # a row's tau: 1 + the drafts accepted before the first rejected one, at most b - 1
        taus = [1 + min(int(rng.geometric(1 - acceptance)) - 1, b - 1) for _ in rows]
        rule.feedback(rows, [b] * 4, taus, [step_s / 4] * 4, load)
        if r >= rounds // 2:
            played[b] = played.get(b, 0) + 1
    return rule.preference(4), played


def _best_block(per_token_s: float, acceptance: float, margin: float) -> int:
    """Closed form: E[tau] at B is sum_{i<B} acceptance^i, a step at 4 requests costs 36 ms + 4 B
    per_token_s, and a speculating size's speed counts 1 / (1 + margin)."""
    speed = {
        b: sum(acceptance**i for i in range(b)) / (0.036 + per_token_s * 4 * b) / (1 + margin * (b > 1))
        for b in range(1, 10)
    }
    return max(speed, key=speed.get)


@pytest.mark.parametrize(
    "per_token_s, acceptance, margin, best",
    [
        (0.003, 0.3, 0.0, 2),  # B = 2's rounds 1.04x plain's: speculating pays, by the rounds
        (0.003, 0.3, 0.1, 1),  # ... but not by the margin
        (0.001, 0.5, 0.1, 3),  # B = 3's rounds 1.32x plain's: past the margin
        (0.003, 0.2, 0.0, 1),  # no block size pays
    ],
)
def test_the_learned_rule_priced_by_the_measured_steps_finds_the_best_block_at_four_requests(
    per_token_s, acceptance, margin, best
):
    assert _best_block(per_token_s, acceptance, margin) == best  # the closed form, checked against the table
    preference, played = _learned_rule_in_a_linear_world(per_token_s, acceptance, margin)
    assert preference == best
    assert max(played, key=played.get) == best


def test_a_margin_outside_zero_to_one_is_refused():
    from adaptspec.errors import AdaptspecError
    from adaptspec.load_rules import Learned

    for bad in (-0.1, 1.0, math.nan):
        with pytest.raises(AdaptspecError, match="margin"):
            Learned([1, 2], PRIOR, margin=bad)


def test_serve_gives_the_learned_rule_its_load_margin():
    import argparse

    from adaptspec.cli.serve import add_arguments
    from adaptspec.load_rules import SPECULATION_MARGIN
    from adaptspec.load_rules.round_rule import make_load_rule

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--load-margin", "0.1"])
    assert args.load_margin == 0.1 and parser.parse_args([]).load_margin == SPECULATION_MARGIN == 0.1
    assert parser.parse_args(["--load-margin", "0"]).load_margin == 0.0
    with pytest.raises(SystemExit):
        parser.parse_args(["--load-margin", "1"])
    rule = make_load_rule("learned", [1, 2, 4], "cpu-smollm2-bf16", margin=args.load_margin)
    assert rule.discount == pytest.approx(1 / 1.1)
