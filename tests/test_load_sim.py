"""Replay under load (adaptspec/simulators/load_sim.py, adaptspec/load_rules/), against closed forms and
brute force. Round-time attribution (adaptspec/reward/attribution.py) is tested in tests/test_attribution.py."""

from __future__ import annotations

import numpy as np
import pytest

from adaptspec.costs.latency import CostCurve, LatencyProfile
from adaptspec.errors import AdaptspecError
from adaptspec.load_rules import Fixed, Goodput, Learned, Table, expected_tau
from adaptspec.simulators.load_sim import simulate
from adaptspec.traces.dense import DenseRequest

#: Every pass costs 50 ms, whatever it holds (draft 10 ms when any row speculates, verify 40 ms).
FLAT = LatencyProfile("flat", draft=CostCurve((2,), (0.010,)), verify=CostCurve((1,), (0.040,)))


def _request(n_tokens: int, accepted: int, largest: int = 8, prompt: int = 10) -> DenseRequest:
    """A dense trace whose rounds accept ``min(accepted, B - 1)`` drafts everywhere."""
    n = n_tokens - 1
    acc = np.array([[min(accepted, b - 1) for b in range(2, largest + 1)]] * n, dtype=np.uint8)
    ones = np.ones((n, largest - 1), np.float32)
    return DenseRequest(np.arange(n_tokens), acc, ones, 0 * ones, np.zeros(2, np.float32), prompt, "length")


# ============================================================================ the simulator
def test_closed_loop_rounds_and_throughput_in_closed_form():
    # 2 clients, 13 tokens each, every draft right: B = 4 commits 4 a round, 3 rounds of 50 ms
    reqs = [_request(13, 7), _request(13, 7)]
    run = simulate(Fixed(4), reqs, FLAT, clients=2, requests=2, prefill=False)
    assert (run.rounds, run.tokens) == (3, 26) and run.duration_s == pytest.approx(0.15)
    assert run.tokens_per_s == pytest.approx(26 / 0.15)
    np.testing.assert_allclose(run.latency_s, [0.15, 0.15])
    plain = simulate(Fixed(1), reqs, FLAT, clients=2, requests=2, prefill=False)  # 12 plain steps of 40 ms
    assert plain.rounds == 12 and plain.duration_s == pytest.approx(0.48)


def test_a_closed_loop_client_sends_its_next_request_when_the_last_finishes():
    reqs = [_request(5, 0)]  # 4 plain steps of 40 ms each
    run = simulate(Fixed(1), reqs, FLAT, clients=1, requests=3, prefill=True)
    prefill = float(FLAT.verify(10, 0, 1))
    assert run.duration_s == pytest.approx(3 * (prefill + 4 * 0.040))
    np.testing.assert_allclose(run.ttft_s, [prefill] * 3)
    assert run.mean_rows == pytest.approx(4 * 0.040 / (prefill + 4 * 0.040))


def test_max_rows_queues_the_rest_and_poisson_arrivals_all_served():
    reqs = [_request(9, 3)]
    run = simulate(Fixed(4), reqs, FLAT, clients=6, requests=6, max_rows=2, prefill=False)
    assert run.mean_rows == pytest.approx(2.0) and len(run.latency_s) == 6
    # 6 requests, 2 at a time, 2 rounds each (4 tokens a round after the first): 3 waves x 2 rounds
    assert run.rounds == 6 and run.duration_s == pytest.approx(6 * 0.05)
    poisson = simulate(Fixed(2), reqs, FLAT, rate=5.0, requests=20, seed=3)
    assert len(poisson.latency_s) == 20 and poisson.tokens == 20 * 9


def test_a_day_follows_its_client_count():
    reqs = [_request(9, 0)]  # 8 plain steps: 0.32 s a request without prefill
    run = simulate(Fixed(1), reqs, FLAT, day=[(1.0, 1), (1.0, 4)], requests=1000, prefill=False)
    # phase 1, one client: requests start at 0, 0.32, 0.64, 0.96 s; phase 2 from 1 s, four clients:
    # three new ones start at 1.0, 1.32, 1.64, 1.96 s (12), the first one at 1.28, 1.60, 1.92 s (3);
    # nothing starts after 2 s, the last ends at 1.96 + 0.32 s
    assert len(run.latency_s) == 19 and run.duration_s == pytest.approx(2.28)
    assert run.mean_rows == pytest.approx(19 * 0.32 / 2.28)
    with pytest.raises(AdaptspecError, match="exactly one"):
        simulate(Fixed(1), reqs, FLAT, clients=1, rate=1.0)


# ============================================================================ the rules
def test_expected_tau_matches_a_monte_carlo_of_independent_acceptance():
    rng = np.random.default_rng(0)
    for a, b in ((0.3, 4), (0.7, 8), (0.9, 2)):
        draws = rng.random((200_000, b - 1)) < a
        tau = 1 + np.cumprod(draws, axis=1).sum(axis=1)
        assert float(expected_tau(np.array([a]), b)[0]) == pytest.approx(tau.mean(), rel=0.01)


def test_goodput_speculates_where_drafts_are_right_and_not_where_they_are_wrong():
    good, bad = [_request(41, 7)], [_request(41, 0)]
    arms = [1, 2, 4, 8]
    # every draft right on a flat cost: the longest block; every draft wrong: plain decoding
    assert simulate(
        Goodput(arms, FLAT), good, FLAT, clients=1, requests=2, prefill=False
    ).block_sizes.keys() >= {8}
    run = simulate(Goodput(arms, FLAT), bad, FLAT, clients=1, requests=3, prefill=False)
    assert max(run.block_sizes, key=run.block_sizes.get) == 1


def test_the_learned_rule_finds_each_load_levels_best_block_size():
    # a pass costs 30 ms up to 16 tokens, then 20 ms a token more: one row verifies 8 for the
    # price of 1; 16 rows fill the flat part with one token each (brute force says which is best)
    cost = LatencyProfile(
        "knee", draft=CostCurve((2,), (0.002,)), verify=CostCurve((1, 16), (0.030, 0.030), tail_slope_s=0.020)
    )
    reqs = [_request(129, 5)]
    best = {}
    for clients in (1, 16):
        fixed = {
            b: simulate(
                Fixed(b), reqs, cost, clients=clients, requests=clients * 2, prefill=False
            ).tokens_per_s
            for b in (1, 2, 4, 8)
        }
        best[clients] = max(fixed, key=fixed.get)
    assert best == {1: 8, 16: 1}
    rule = Learned([1, 2, 4, 8], cost, seed=0)
    for clients in (1, 16, 1, 16):  # learn at both levels
        simulate(rule, reqs, cost, clients=clients, requests=clients * 2, prefill=False)
    for clients in (1, 16):
        run = simulate(rule, reqs, cost, clients=clients, requests=clients * 2, prefill=False)
        assert max(run.block_sizes, key=run.block_sizes.get) == best[clients]


def test_table_uses_the_level_that_holds_the_rows():
    t = Table({1: 4, 4: 3, 16: 2})
    assert [t.block_size(r) for r in (1, 2, 4, 5, 16, 64)] == [4, 3, 3, 2, 2, 2]
