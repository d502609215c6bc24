"""Costs measured from the rounds (costs/measured.py): the curves against the closed form of
the times the rounds carried, and the counterfactual prices of a decoder whose costs are not the
CPU profile's against what each block size really earns on it (a second run at that size)."""

from __future__ import annotations

import numpy as np
import pytest

from adaptspec import AdaptiveController
from adaptspec.control.full_feedback import CounterfactualPricer, pricing_profile
from adaptspec.costs.latency import get_profile
from adaptspec.costs.measured import MeasuredCosts
from adaptspec.speculator import Decision, Outcome, Prefill, Round

PRIOR = get_profile("cpu-smollm2-fast")
ARMS = (1, 2, 4, 8, 16)
#: drafts right in each round, in turn: the true best block size on the flat costs below is 8, on the
#: CPU profile's 4 (checked in the test from the closed form)
RIGHT = (0, 0, 0, 2, 4, 1, 2, 1, 4, 2)


def verify_s(b: int) -> float:
    return 0.020 + 0.0002 * b  # a GPU-like pass: about as dear at every block size


def draft_s(b: int) -> float:
    return 0.001 if b > 1 else 0.0


def rounds(b: int, n: int, rows: int = 1) -> list[Round]:
    return [Round(b, 1, draft_s(b), verify_s(b), rows=rows)] * n


class FlatCosts:
    """A speculator whose rounds accept ``RIGHT`` drafts in turn and take ``verify_s`` + ``draft_s``."""

    max_block_size = 16
    feature_dim = 1

    def prefill(self, prompt_ids, temperature=0.0, seed=None):
        return Prefill(
            first_token=1, prompt_tokens=len(prompt_ids), features=np.ones(1, np.float32), state=None
        )

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        b = int(block_size)
        tokens, out, i = [prefill.first_token], [], 0
        while len(tokens) < max_new_tokens:
            v = min(b, max_new_tokens - len(tokens))
            tau = min(RIGHT[i % len(RIGHT)] + 1, v)
            out.append(Round(v, tau, draft_s(v), verify_s(v)))
            tokens += [2] * tau
            i += 1
        return Outcome(tokens, out, sum(r.draft_s + r.verify_s for r in out))


def closed_form_speed(b: int, profile=None) -> float:
    """Tokens per second of block size ``b`` over one cycle of ``RIGHT`` (on ``profile``'s round times)."""
    tau = np.minimum(np.asarray(RIGHT) + 1, b).mean()
    t = draft_s(b) + verify_s(b) if profile is None else float(profile.round_s(b))
    return float(tau / t)


def test_the_fitted_verify_curve_has_the_measured_ratios_inside_and_its_straight_lines_outside():
    m = MeasuredCosts(PRIOR, min_rounds=4)
    for b in (4, 8, 12):
        m.observe(Outcome([1] * 5, rounds(b, 6), decode_s=1.0))
    p = m.profile()
    assert m.measured
    for a, b in ((4, 8), (4, 12), (8, 12), (5, 11), (1, 4), (2, 16), (1, 32)):  # the line the times lie on
        assert float(p.verify_s(b) / p.verify_s(a)) == pytest.approx(verify_s(b) / verify_s(a), rel=1e-6)
    assert float(p.draft_s(8)) == pytest.approx(0.001, rel=1e-6) and float(p.draft_s(1)) == 0.0
    assert float(p.draft_s(2) / p.draft_s(16)) == pytest.approx(1.0, rel=1e-6)


def test_the_prior_until_two_sizes_have_enough_rounds_timed_alone():
    m = MeasuredCosts(PRIOR, min_rounds=4)
    m.observe(Outcome([1] * 5, rounds(4, 10), decode_s=1.0))
    m.observe(Outcome([1] * 5, rounds(8, 3), decode_s=1.0))  # too few of the second size
    m.observe(Outcome([1] * 5, rounds(16, 10, rows=3), decode_s=1.0))  # batched: holds other rows' work
    m.observe(Outcome([1] * 5, [Round(16, 1, 0.0, 0.0)] * 10, decode_s=1.0))  # not timed
    assert not m.measured and m.profile() is PRIOR
    m.observe(Outcome([1] * 5, rounds(8, 1), decode_s=1.0))
    assert m.measured


def test_counterfactual_prices_on_measured_costs_match_what_each_size_earns_and_the_cpu_profile_does_not():
    spec = FlatCosts()
    pre = spec.prefill([5, 6, 7])
    truth = {b: -1000.0 * spec.decode(pre, b, 64).decode_s / 63 for b in ARMS}  # each size run for real
    out16 = spec.decode(pre, 16, 64)
    d = Decision(16, 1.0, [0.0] * 4 + [1.0], ARMS, "fixed:16", decision_id="d")
    measured = CounterfactualPricer("token_latency", pricing_profile(None, None))
    for b in (4, 16):  # the rounds of two sizes, timed alone
        measured.price(
            Decision(b, 1.0, [1.0 / 5] * 5, ARMS, "x", decision_id=f"w{b}"),
            spec.decode(pre, b, 64),
            truth[b],
            context_tokens=3,
        )
    assert measured.costs is not None and measured.costs.measured
    cpu = CounterfactualPricer("token_latency", PRIOR)
    got = measured.price(d, out16, truth[16], context_tokens=3)
    old = cpu.price(d, out16, truth[16], context_tokens=3)
    for k, b in enumerate(
        ARMS[1:], start=1
    ):  # every observed size from the same rounds (1 is outside the fit)
        assert got.rewards[k] == pytest.approx(truth[b], rel=0.02), b
    assert abs(old.rewards[2] / truth[4] - 1) > 0.05  # the CPU profile's prices are off on this machine


def test_fi_ucb_without_a_profile_learns_the_best_block_size_of_this_machine_not_of_the_cpu_profile():
    speeds = {b: closed_form_speed(b) for b in ARMS}
    on_cpu = {b: closed_form_speed(b, PRIOR) for b in ARMS}
    assert max(speeds, key=speeds.get) == 8 and max(on_cpu, key=on_cpu.get) == 4  # the setting's premise

    def best_after(**kw) -> int:
        with AdaptiveController(
            FlatCosts(),
            "fi-ucb",
            arms=ARMS,
            reward="token_latency",
            speed_reference=None,
            feedback_timeout_s=None,
            seed=0,
            **kw,
        ) as c:
            for i in range(40):
                c.generate([i % 7 + 1, 3, 4], max_new_tokens=64)
            c.sync()
            return ARMS[int(np.argmax(c.policy_snapshot().means()))]

    assert best_after() == 8
    assert best_after(latency="cpu-smollm2-fast") != 8  # priced on the CPU's costs, the learner is misled


def test_a_request_timed_alone_is_learnt_as_a_bandit_until_two_sizes_are_timed_and_a_batched_one_is_priced():
    spec, pre = FlatCosts(), FlatCosts().prefill([5, 6, 7])
    pricer = CounterfactualPricer("token_latency", pricing_profile(None, None))
    d = Decision(16, 1.0, [0.0] * 4 + [1.0], ARMS, "fixed:16", decision_id="d")
    assert (
        pricer.price(d, spec.decode(pre, 16, 64), -9.0, context_tokens=3) is None
    )  # one size: nothing to price with
    batched = Outcome([1] * 9, [Round(16, 2, 0.001, 0.03, rows=4)] * 4, decode_s=0.12)
    got = pricer.price(
        d, batched, -9.0, context_tokens=3
    )  # other rows' work in its times: priced on the prior
    want = CounterfactualPricer("token_latency", PRIOR).price(d, batched, -9.0, context_tokens=3)
    np.testing.assert_allclose(got.rewards, want.rewards)
