"""Replay feeds each policy what the controller would (issue 46, item 10): the cold default
(fi-ucb, full feedback) replayed on the shipped benchmark traces chooses exactly what an
AdaptiveController serving the same requests chooses, the log it writes carries the controller's
cf_ columns, and the report says which feedback each policy got."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from adaptspec.cli import main
from adaptspec.control import AdaptiveController
from adaptspec.reward.functions import trace_rewards
from adaptspec.simulators.counterfactuals import MEASURED
from adaptspec.simulators.replay import replay, replay_log
from adaptspec.speculator import Outcome, Prefill, Round
from adaptspec.traces import DecisionLog, TraceSet, load_traces

BENCH = Path(__file__).resolve().parents[1] / "adaptspec" / "data" / "traces" / "benchmarks"
PROFILE = "cpu-smollm2-fast"  # the benchmark set's latency_profile


def bench_subset(n: int = 40) -> TraceSet:
    """``n`` requests of the shipped benchmark set, spread over its domains."""
    ts = load_traces(BENCH)
    return ts.subset(np.linspace(0, ts.n_requests - 1, n).round().astype(int))


class TraceSpeculator:
    """A speculator that decodes a request as its trace row says it went at the block size asked:
    read here straight from the trace set's Parquet rows, not through the code under test."""

    def __init__(self, ts: TraceSet) -> None:
        self.max_block_size = max(ts.arms)
        self.limit = int(ts.meta["max_new_tokens"])
        rows = pq.read_table(BENCH / "outcomes.parquet").to_pylist()
        self.rows = {(r["request_id"], r["block_size"]): r for r in rows}
        self.ids = ts.request_ids.tolist()
        self.prompt = dict(
            zip(
                pq.read_table(BENCH / "requests.parquet").column("request_id").to_pylist(),
                pq.read_table(BENCH / "requests.parquet").column("prompt_tokens").to_pylist(),
            )
        )

    def prefill(self, prompt_ids, temperature=0.0, seed=None):
        rid = self.ids[prompt_ids[0]]
        return Prefill(
            first_token=0, prompt_tokens=int(self.prompt[rid]), features=np.zeros(1, np.float32), state=rid
        )

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        row = self.rows[(prefill.state, int(block_size))]
        rounds, made = [], 1  # the prefill's token
        for tau, d_ms, v_ms in zip(row["tau"], row["draft_ms"], row["verify_ms"]):
            rounds.append(Round(min(int(block_size), self.limit - made), tau, d_ms / 1000, v_ms / 1000))
            made += tau
        return Outcome(
            [0] * row["new_tokens"],
            rounds,
            decode_s=row["decode_ms"] / 1000,
            finish_reason="length" if row["new_tokens"] == self.limit else "eos",
        )


def hand_replay(ts: TraceSet, passes: int, latency: str | None) -> tuple[list[int], list[float]]:
    """fi-ucb served by an AdaptiveController (``latency`` as given: None is the default, which
    prices counterfactual rounds on the costs it measures) over the trace rows, in stored order,
    each update applied before the next decision (what a replay's step is): block sizes chosen
    and rewards."""
    chosen, rewards = [], []
    with AdaptiveController(
        TraceSpeculator(ts),
        "fi-ucb",
        arms=ts.arms,
        reward="token_latency",
        latency=latency,
        decide_on_caller=True,
        decide_timeout_s=60.0,
        seed=0,
    ) as c:
        for _ in range(passes):
            for i in range(ts.n_requests):
                g = c.generate([i], max_new_tokens=ts.meta["max_new_tokens"])
                c.sync()
                chosen.append(g.decision.block_size)
                rewards.append(g.reward)
    return chosen, rewards


@pytest.mark.parametrize("latency", [None, PROFILE], ids=["default", "profile"])
def test_replay_feeds_the_cold_default_as_the_controller_does(latency: str | None) -> None:
    ts = bench_subset(16)
    passes = 2
    want_arms, want_r = hand_replay(ts, passes, latency)
    rep = replay(
        ts,
        ["fi-ucb"],
        reward="token_latency",
        latency=latency,
        order="logged",
        n_steps=passes * ts.n_requests,
    )
    got = rep.policies[0]
    assert got.feedback == "full" and rep.feedback_profile == (latency or MEASURED)
    assert np.asarray(ts.arms)[got.chosen.astype(int)].tolist() == want_arms
    # % of the best fixed size, from the controller's own rewards and the trace's decode times read here
    rows = pq.read_table(BENCH / "outcomes.parquet").to_pylist()
    ms_per_token = {(r["request_id"], r["block_size"]): -r["decode_ms"] / r["new_tokens"] for r in rows}
    ids = ts.request_ids.tolist() * passes
    fixed = {b: sum(ms_per_token[(rid, b)] for rid in ids) for b in ts.arms}
    best = max(fixed.values())  # rewards are negative ms per token: the largest sum is the best
    want_pct = 100.0 * best / sum(want_r)  # pct_of a negative reward: best fixed over what was earned
    assert got.mean("pct_best_fixed") == pytest.approx(want_pct, abs=0.5)
    bandit = replay(
        ts,
        ["fi-ucb"],
        reward="token_latency",
        latency=latency,
        order="logged",
        n_steps=passes * ts.n_requests,
        feedback="bandit",
    ).policies[0]
    assert bandit.feedback == "bandit"
    assert np.asarray(ts.arms)[bandit.chosen.astype(int)].tolist() != want_arms  # the test tells them apart


def test_replay_log_feeds_full_feedback_and_logs_the_counterfactuals(tmp_path: Path) -> None:
    ts = bench_subset(24)
    rep = replay(ts, ["fi-ucb"], reward="token_latency", order="logged")
    log = DecisionLog(tmp_path / "log")
    log.append(replay_log(ts, "fi-ucb", reward="token_latency", order="logged"))
    back = DecisionLog.read(tmp_path / "log")
    arms = np.asarray(ts.arms)
    assert back.table.column("block_size").to_pylist() == arms[rep.policies[0].chosen.astype(int)].tolist()
    cf = back.cf_rewards
    priced = np.isfinite(cf).all(axis=1)
    # the first request is learnt as a bandit (one block size timed: nothing to price the others with yet),
    # every later one is priced on the costs measured so far, as the controller's default pricer does
    assert not priced[0] and priced[1:].all()
    played = np.searchsorted(arms, back.table.column("block_size").to_numpy())
    assert np.array_equal(
        cf[np.arange(len(cf)), played][1:], back.rewards[1:]
    )  # the arm that ran: its own reward
    # the shorter arms are never censored (a round that ran shows every shorter verify)
    censored = back.cf_censored[1:]
    assert not censored[arms[None, :] <= arms[played[1:]][:, None]].any()


def test_simulate_says_which_feedback_each_policy_got(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sub = tmp_path / "bench"
    bench_subset(24).write(sub)
    assert (
        main(
            [
                "simulate",
                str(sub),
                "--policy",
                "fi-ucb",
                "--policy",
                "ucb",
                "--policy",
                "fixed:4",
                "--no-progress",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [p["feedback"] for p in out["policies"]] == ["full", "bandit", "none"]
    assert out["oracle"]["feedback"] == "oracle" and out["feedback_profile"] == MEASURED
    assert (
        main(["simulate", str(sub), "--policy", "fi-ucb", "--no-progress", "--feedback", "bandit", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["policies"][0]["feedback"] == "bandit" and out["feedback_profile"] is None
    assert main(["simulate", str(sub), "--policy", "fi-ucb", "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "feedback full: every arm the chosen arm's rounds show" in table
    assert "feedback" in table.splitlines()[1]  # a column of the table


def test_a_trace_set_without_rounds_replays_full_feedback_policies_as_bandits() -> None:
    R = np.array([[1.0, 2.0, 3.0], [1.0, 1.5, 1.2], [1.0, 1.0, 1.0]])
    ts = TraceSet.from_arrays(list("abc"), ["x"] * 3, [1, 2, 4], R)
    rep = replay(ts, ["fi-ucb"], reward="tau")
    assert rep.policies[0].feedback == "bandit" and rep.feedback_profile is None


def test_an_ab_replay_feeds_each_variant_as_the_controller_would() -> None:
    from adaptspec.simulators.ab import simulate_ab

    sim = simulate_ab(
        bench_subset(24), {"A": "fi-ucb", "B": "ucb"}, reward="token_latency", seeds=[0], n_steps=48
    )
    assert sim.feedback == {"A": "full", "B": "bandit"}
    assert (
        sim.to_json()["variants"]["A"]["feedback"] == "full" and "feedback A full, B bandit" in sim.to_text()
    )


def test_the_evaluation_feeds_full_feedback_contenders_and_says_so() -> None:
    from adaptspec.evaluation.core import contender_feedback, run_contenders, spec_contender

    ts = bench_subset(16)
    R = trace_rewards(ts, "token_latency")
    full, bandit = (
        spec_contender("fi-ucb", "fi-ucb", "context-free"),
        spec_contender("ucb", "ucb", "context-free"),
    )
    assert contender_feedback([bandit], ts, R, "token_latency") is None  # nothing to price for
    fb = contender_feedback([full, bandit], ts, R, "token_latency")
    kinds: dict[str, str] = {}
    idx = np.tile(np.arange(ts.n_requests), 2)
    chosen = run_contenders([full, bandit], R, None, idx, ts.arms, 0, feedback=fb, kinds=kinds)
    assert kinds == {"fi-ucb": "full", "ucb": "bandit"}
    want = replay(ts, ["fi-ucb"], reward="token_latency", order="logged", n_steps=len(idx)).policies[0].chosen
    assert np.array_equal(chosen["fi-ucb"], want)
