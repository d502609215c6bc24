"""The controller learns from every block size at once (issue 40, at serve time): the book prices
every arm's counterfactual reward from a request's rounds, the decision log keeps them, a policy
with ``full_feedback`` learns them, resume replays them; a bandit policy learns as before.

The expected rewards come from the definition (docs/simulator.md, counterfactual outcomes),
written out here from the toy's rounds and the latency profile's costs: an arm ``B`` would have
committed ``sum_r min(tau_r, B)`` tokens over the same rounds, so it needs ``rounds * committed /
tokens`` rounds of its own cost, scaled by the measured over the profile's time of what ran.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from adaptspec import AdaptiveController
from adaptspec.control.policy_checkpoint import state_digest
from adaptspec.costs.latency import get_profile
from adaptspec.errors import AdaptspecError
from adaptspec.policies import make_policy
from adaptspec.schedules import as_schedule
from adaptspec.speculator import Outcome, Prefill, Round
from adaptspec.traces import DecisionLog
from adaptspec.traces.log_writer import DecisionLogWriter, journal_rows, log_rows

HERE = Path(__file__).resolve().parent
PROFILE = get_profile("cpu-smollm2-fast")  # what the controller prices with when it has no profile of its own
ARMS = (4, 6, 8)


class ToyTaus:
    """A pure-Python speculator with a known acceptance: each round the drafter gets 0-2 drafts
    right (drawn from the prompt's seed, whatever the block size), so a round commits
    ``tau = min(right + 1, verified) <= 3``: with every arm >= 4 no round accepts all it verified
    before the request's end, and every arm is observed on every request. The decode time is
    made up (not the profile's): 7 ms + 3 ms a round + 1 ms a verified position."""

    max_block_size = 8
    feature_dim = 2

    def prefill(self, prompt_ids, temperature=0.0, seed=None):
        ids = [int(i) for i in prompt_ids]
        return Prefill(
            first_token=1,
            prompt_tokens=len(ids),
            features=np.array([1.0, len(ids)], np.float32),
            state={"seed": sum(ids)},
        )

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        b = block_size if isinstance(block_size, int) else as_schedule(block_size).draft_size([])
        rng = np.random.default_rng(prefill.state["seed"])
        tokens, rounds = [prefill.first_token], []
        while len(tokens) < max_new_tokens:
            v = min(b, max_new_tokens - len(tokens))
            tau = min(int(rng.integers(1, 4)), v)
            rounds.append(Round(v, tau, 0.0, 0.0))
            tokens += [2] * tau
        decode_s = 0.001 * (7 + 3 * len(rounds) + sum(r.block_size for r in rounds))
        return Outcome(tokens, rounds, decode_s)


def prompt(i: int) -> list[int]:
    return [i % 11 + 1, i % 5 + 20, i, 7] + [3] * (i % 4)


def round_s(b: int, context: int) -> float:
    return float(PROFILE.draft_s(b, context) + PROFILE.verify_s(b, context))


def closed_form(outcome: Outcome, decided: int, prompt_tokens: int, arms=ARMS) -> dict[int, float]:
    """Each arm's token_latency reward (minus ms per new token) on this request, from its rounds."""
    taus = [r.tau for r in outcome.rounds]
    verified = [r.block_size for r in outcome.rounds]
    committed, new = sum(taus), len(outcome.tokens)
    ctx = [prompt_tokens + 1 + sum(taus[:i]) for i in range(len(taus))]  # committed before each round
    ran = sum(round_s(v, c) for v, c in zip(verified, ctx))
    out = {}
    for b in arms:
        if b == decided:
            out[b] = -1000.0 * outcome.decode_s / new  # exactly the measured reward
            continue
        tokens = sum(min(t, b) for t in taus)
        cost = sum(
            round_s(min(b, v) if v < decided else b, c) for v, c in zip(verified, ctx)
        )  # a short last round: cut alike
        out[b] = -1000.0 * (outcome.decode_s / ran) * (committed / tokens) * cost / new
    return out


def test_fi_ucb_learns_every_arms_counterfactual_reward_and_the_log_keeps_it(tmp_path):
    rewards: dict[int, list[float]] = {b: [] for b in ARMS}
    decided = []
    with AdaptiveController(ToyTaus(), "fi-ucb", arms=ARMS, log_dir=tmp_path / "log") as c:
        for i in range(12):
            g = c.generate(prompt(i), max_new_tokens=23)
            want = closed_form(g.outcome, g.decision.block_size, len(prompt(i)))
            assert g.reward == pytest.approx(
                want[g.decision.block_size], rel=1e-12
            )  # the arm that ran: its measured reward
            for b in ARMS:
                rewards[b].append(want[b])
            decided.append(g.decision.block_size)
        c.sync()
        means = c.policy_snapshot().means()
        assert c.stats()["update_errors"] == 0
    assert len(set(decided)) >= 2  # the arm that ran moved, so the others came from counterfactuals
    np.testing.assert_allclose(means, [np.mean(rewards[b]) for b in ARMS], rtol=1e-9)
    log = DecisionLog.read(tmp_path / "log")
    want = np.array([rewards[b] for b in ARMS]).T
    np.testing.assert_allclose(log.cf_rewards, want, rtol=1e-9)
    assert np.array_equal(
        log.cf_rewards[np.arange(12), log.actions], log.rewards
    )  # exactly the logged reward
    assert not log.cf_censored.any() and log.cf_observed.all()
    assert np.array_equal(log.cf_approximate, log.block_sizes[:, None] != np.asarray(ARMS)[None, :])
    committed = np.array([r["new_tokens"] - 1 for r in log.table.to_pylist()], dtype=float)
    np.testing.assert_allclose(
        log.cf_tokens, np.repeat(committed[:, None], len(ARMS), axis=1)
    )  # every tau < every arm
    np.testing.assert_allclose(log.propensities, 1.0)  # the chosen arm's propensity is still logged


def test_censored_counterfactuals_round_trip_and_only_observed_arms_are_learnt(tmp_path):
    """A round that accepts all of B = 2 censors B = 4 (all but the last round); B <= 2 are observed."""

    class Full(ToyTaus):
        def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
            rounds = [Round(2, 2, 0.0, 0.0), Round(2, 1, 0.0, 0.0), Round(2, 2, 0.0, 0.0)]
            return Outcome([1] * 6, rounds, 0.012)

    with AdaptiveController(Full(), "fi-ucb", arms=(1, 2, 4), log_dir=tmp_path / "log", seed=3) as c:
        d = c.decide([1.0, 4.0])
        while d.block_size != 2:  # the policy's own choice until it plays 2: only 2's rounds are wanted
            c.feedback(
                d.decision_id, reward=-1.0
            )  # a given reward: the arm that ran alone, no counterfactual
            d = c.decide([1.0, 4.0])
        before = c.sync().policy_snapshot().stats.n.copy()
        c.feedback(d.decision_id, Full().decode(None, 2, 6))
        after = c.sync().policy_snapshot().stats.n
        rows = c.pending_log_rows()
    assert (after - before).tolist() == [1.0, 1.0, 0.0]  # B = 4 censored: not learnt
    assert all(r.get("cf_rewards") is None for r in rows[:-1])  # given rewards carry none
    last = rows[-1]
    assert last["cf_censored"] == [False, False, True] and last["cf_tokens"] == [3.0, 5.0, 5.0]
    assert last["cf_approximate"] == [False, False, True]
    log = DecisionLog.read(tmp_path / "log")
    assert log.cf_censored[-1].tolist() == [False, False, True] and np.isnan(log.cf_rewards[:-1]).all()


def test_a_re_decision_followed_by_another_censors_past_its_last_full_round(tmp_path):
    """redecide_every=1: each round is its own decision. The first accepts all of B = 2 and the
    request goes on, so B = 4 is only a lower bound there; the last round ends the request."""

    class TwoRounds(ToyTaus):
        per_round = True

        def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
            schedule, rounds, tokens = as_schedule(block_size), [], [1]
            for accept_all in (True, False):
                b = schedule.draft_size(rounds)
                rounds.append(Round(b, b if accept_all else 1, 0.0, 0.001))
                tokens += [2] * rounds[-1].tau
            return Outcome(tokens, rounds, 0.002)

    with AdaptiveController(
        TwoRounds(), "fixed:2", arms=(1, 2, 4), redecide_every=1, log_dir=tmp_path, latency="cpu-smollm2-fast"
    ) as c:  # priced on a profile from the first request on
        assert len(c.generate(prompt(0), max_new_tokens=8).decisions) == 2
        first, last = c.pending_log_rows()
    assert first["cf_censored"] == [False, False, True] and first["cf_tokens"] == [1.0, 2.0, 2.0]
    assert last["cf_censored"] == [False, False, False] and last["cf_tokens"] == [1.0, 1.0, 1.0]


CRASH_SCRIPT = textwrap.dedent("""
    import os, signal, sys, json
    sys.path.insert(0, {tests!r})
    from test_controller_full_info import ARMS, ToyTaus, prompt
    from adaptspec import AdaptiveController
    c = AdaptiveController(ToyTaus(), "fi-ucb", arms=ARMS, log_dir={log!r}, checkpoint_dir={ck!r},
                           checkpoint_every=1000, checkpoint_interval_s=None, roll_rows=5)
    for i in range(14):
        g = c.generate(prompt(i), max_new_tokens=23)
        if i == 5:
            c.checkpoint()
    c.sync()
    print(json.dumps({{"digest": c.policy_digest(), "means": c.policy_snapshot().means().tolist()}}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_crash_resumes_the_full_information_state_exactly(tmp_path):
    log, ck = tmp_path / "log", tmp_path / "ck"
    p = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT.format(tests=str(HERE), log=str(log), ck=str(ck))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    before = json.loads(p.stdout.splitlines()[-1])
    assert journal_rows(log)  # the crash left rows in the journal: recovered, then replayed
    with AdaptiveController(
        ToyTaus(), "fi-ucb", arms=ARMS, log_dir=log, checkpoint_dir=ck, checkpoint_interval_s=None
    ) as c:
        assert c.resumed["updates_at_checkpoint"] == 6 and c.resumed["replayed"] == 8
        assert c.policy_digest() == before["digest"]
        np.testing.assert_allclose(c.policy_snapshot().means(), before["means"], rtol=0, atol=0)
    # the same rows learnt from the arm that ran alone give another state: the replay used the vectors
    pol = make_policy("fi-ucb", ARMS, seed=0)
    for r in log_rows(log, ["block_size", "reward"]):
        pol.update(None, r["block_size"], r["reward"])
    assert state_digest(pol) != before["digest"]


def test_a_bandit_policy_learns_the_arm_that_ran_exactly_as_before(tmp_path):
    with AdaptiveController(ToyTaus(), "ucb", arms=ARMS, log_dir=tmp_path / "log") as c:
        for i in range(10):
            c.generate(prompt(i), max_new_tokens=23)
        digest = c.sync().policy_digest()
    pol = make_policy("ucb", ARMS, seed=0)
    rows = log_rows(tmp_path / "log", ["block_size", "reward", "cf_rewards"])
    for r in rows:
        pol.update(None, r["block_size"], r["reward"])
    assert state_digest(pol) == digest
    assert all(r["cf_rewards"] is not None for r in rows)  # the log keeps them whatever the policy (for OPE)


def test_the_direct_method_learns_arms_the_logging_policy_never_played(tmp_path):
    """A log of fixed:4 says nothing of B = 8 by itself; its counterfactual rewards do."""
    from adaptspec.analysis.ope import evaluate_log

    want = []
    with AdaptiveController(ToyTaus(), "fixed:4", arms=ARMS, log_dir=tmp_path / "log") as c:
        for i in range(8):
            g = c.generate(prompt(i), max_new_tokens=23)
            want.append(closed_form(g.outcome, 4, len(prompt(i)))[8])
    log = DecisionLog.read(tmp_path / "log")
    opts = {"estimators": ("dm", "ips"), "reward_model": "mean", "folds": 1, "n_boot": 20}
    full = evaluate_log(log, "fixed:8", counterfactuals=True, **opts)
    assert full["dm"].value == pytest.approx(np.mean(want), rel=1e-9)
    assert full["ips"].value == 0.0  # the weights still come from the logged propensities
    bandit = evaluate_log(log, "fixed:8", **opts)
    assert bandit["dm"].value == pytest.approx(
        np.mean(log.rewards), rel=1e-9
    )  # arm 8 unseen: the global mean


def test_a_decoder_that_verifies_prefixes_of_one_draft_has_exact_counterfactuals(tmp_path):
    class Prefixes(ToyTaus):
        prefix_drafts = True  # the protocol's declaration: one draft a round, a prefix verified

    with AdaptiveController(Prefixes(), "fi-ucb", arms=ARMS, log_dir=tmp_path) as c:
        c.generate(prompt(0), max_new_tokens=23)
        (row,) = c.pending_log_rows()
    assert row["cf_approximate"] == [False, False, False] and row["cf_censored"] == [False, False, False]


def test_with_prefix_drafts_every_speculating_arm_pays_for_the_drafted_block(tmp_path):
    """A decoder that drafts 8 every round and verifies the chosen prefix: had it verified B' < 8,
    it would still have drafted 8 (B' = 1: a plain step, nothing drafted)."""

    class Draft8(ToyTaus):
        prefix_drafts = True

        def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
            out = super().decode(prefill, block_size, max_new_tokens)
            return Outcome(
                out.tokens,
                [
                    Round(r.block_size, r.tau, 0.0, 0.0, drafted=8 if r.block_size > 1 else 0)
                    for r in out.rounds
                ],
                out.decode_s,
            )

    arms = (1, 4, 6, 8)
    with AdaptiveController(Draft8(), "fixed:6", arms=arms, log_dir=tmp_path / "log") as c:
        g = c.generate(prompt(3), max_new_tokens=23)
        (row,) = c.pending_log_rows()
    taus = [r.tau for r in g.outcome.rounds]
    ctx = [len(prompt(3)) + 1 + sum(taus[:i]) for i in range(len(taus))]
    verified = [r.block_size for r in g.outcome.rounds]

    def secs(b: int) -> float:  # the profile's time of arm b's rounds (a short last round cut alike)
        vs = [min(b, v) if v < 6 else b for v in verified]
        return sum(
            float(PROFILE.draft_s(8 if x > 1 else 1, c) + PROFILE.verify_s(x, c)) for x, c in zip(vs, ctx)
        )

    committed, new = sum(taus), len(g.outcome.tokens)
    scale = g.outcome.decode_s / sum(
        float(PROFILE.draft_s(8 if v > 1 else 1, c) + PROFILE.verify_s(v, c)) for v, c in zip(verified, ctx)
    )
    want = [-1000.0 * scale * committed / sum(min(t, b) for t in taus) * secs(b) / new for b in arms]
    np.testing.assert_allclose(row["cf_rewards"], want, rtol=1e-9)


def test_a_custom_reward_has_no_counterfactuals(tmp_path):
    def reward(outcome):
        return float(outcome.mean_tau)

    with AdaptiveController(ToyTaus(), "fi-ucb", arms=ARMS, reward=reward, log_dir=tmp_path / "log") as c:
        g = c.generate(prompt(1), max_new_tokens=23)
        n = c.sync().policy_snapshot().stats.n.tolist()
    assert n == [float(b == g.decision.block_size) for b in ARMS]  # its value at another arm is unknown
    assert np.isnan(DecisionLog.read(tmp_path / "log").cf_rewards).all()


def test_the_cold_default_is_fi_ucb_where_the_controller_can_feed_it_every_arm():
    class NoHead(ToyTaus):
        feature_dim = 3  # the bundled head reads 1153

    with AdaptiveController(NoHead(), reward="tau") as c:
        assert c.policy_spec == "fi-ucb" and c.policy_choice.startswith("fi-ucb: no head fits")
    with AdaptiveController(NoHead(), reward=lambda outcome: 1.0) as c:  # no counterfactuals: bandit UCB
        assert c.policy_spec == "ucb"


def test_the_machine_speed_calibrates_every_arm_alike():
    """With a speed reference, the policy learns each reward divided by the machine's factor (the
    first request's: its decode time over the profile's time of its rounds at the reference context)."""
    with AdaptiveController(ToyTaus(), "fi-ucb", arms=ARMS, speed_reference="cpu-smollm2-fast") as c:
        g = c.generate(prompt(2), max_new_tokens=23)
        means = c.sync().policy_snapshot().means()
    want = closed_form(g.outcome, g.decision.block_size, len(prompt(2)))
    ref = PROFILE.context_tokens
    factor = g.outcome.decode_s / sum(round_s(r.block_size, ref) for r in g.outcome.rounds)
    np.testing.assert_allclose(means, [want[b] / factor for b in ARMS], rtol=1e-9)


def test_log_columns_round_trip_journal_and_parquet_and_old_logs_still_read(tmp_path):
    log = tmp_path / "log"
    old = {
        "decision_id": "old",
        "time": 0.0,
        "policy": "ucb",
        "block_size": 4,
        "propensity": 1.0,
        "probs": [1.0, 0.0, 0.0],
        "arms": list(ARMS),
        "reward": -9.0,
    }
    DecisionLog(log).append([old])  # a part written before the columns existed
    with AdaptiveController(ToyTaus(), "fi-ucb", arms=ARMS, log_dir=log, roll_rows=1000) as c:
        for i in range(3):
            c.generate(prompt(i), max_new_tokens=23)
        c.generate(prompt(9), max_new_tokens=1)  # no round ran: no reward, no counterfactual
        journal = {r["decision_id"]: r for r in journal_rows(log)}
    assert len(journal) == 4
    parquet = {r["decision_id"]: r for r in DecisionLog.read(log).table.to_pylist()}
    for did, r in journal.items():
        for k in ("cf_rewards", "cf_tokens", "cf_censored", "cf_approximate"):
            assert parquet[did].get(k) == r.get(k), (did, k)
    assert sum(r.get("cf_rewards") is None for r in journal.values()) == 1
    read = DecisionLog.read(log)
    assert (
        np.isnan(read.cf_rewards[0]).all() and read.cf_censored[0].all() and not read.cf_approximate[0].any()
    )
    assert np.isfinite(read.cf_rewards[1:4]).all() and np.isnan(read.cf_rewards[4]).all()
    # a single old part alone reads too: the columns are optional
    only_old = tmp_path / "old"
    DecisionLog(only_old).append([old])
    assert DecisionLog.read(only_old).cf_observed.tolist() == [[False, False, False]]


@pytest.mark.parametrize(
    "column, value, why",
    [
        ("cf_rewards", [1.0, 2.0], "one value per arm"),
        ("cf_censored", [True, False], "one value per arm"),
        ("cf_tokens", [1.0, "x", 2.0], "finite numbers"),
        ("cf_approximate", [1, 0, 0], "true/false"),
    ],
)
def test_bad_counterfactual_columns_are_refused_in_one_line(tmp_path, column, value, why):
    row = {
        "decision_id": "d",
        "time": 0.0,
        "policy": "ucb",
        "block_size": 4,
        "propensity": 1.0,
        "probs": [1.0, 0.0, 0.0],
        "arms": list(ARMS),
        "reward": -9.0,
        column: value,
    }
    with DecisionLogWriter(tmp_path / "j") as w, pytest.raises(AdaptspecError, match=why):
        w.append(row)
    if column in ("cf_rewards", "cf_censored"):
        with pytest.raises(AdaptspecError, match="values for 3 arms"):
            DecisionLog(tmp_path / "p").append([row])


def test_a_non_finite_logged_counterfactual_is_refused_on_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pa.table(
        {
            "decision_id": ["d"],
            "time": pa.array([0], pa.timestamp("us", tz="UTC")),
            "policy": ["ucb"],
            "block_size": [4],
            "propensity": [1.0],
            "probs": [[1.0, 0.0, 0.0]],
            "arms": [list(ARMS)],
            "cf_rewards": [[1.0, float("nan"), 2.0]],
        }
    )
    (tmp_path / "log").mkdir()
    pq.write_table(t, tmp_path / "log" / "part-1.parquet")
    with pytest.raises(AdaptspecError, match="cf_rewards.*row 0: NaN or infinite"):
        DecisionLog.read(tmp_path / "log")


def test_ope_counterfactuals_from_the_command_line(tmp_path, capsys):
    """`adaptspec ope LOG --counterfactuals` gives the direct method the closed-form value of an
    arm the logging policy never played; a log without counterfactuals is one line."""
    from adaptspec.cli import main

    want = []
    with AdaptiveController(ToyTaus(), "fixed:4", arms=ARMS, log_dir=tmp_path / "log") as c:
        for i in range(6):
            g = c.generate(prompt(i), max_new_tokens=23)
            want.append(closed_form(g.outcome, 4, len(prompt(i)))[8])
    args = [
        "ope",
        str(tmp_path / "log"),
        "--policy",
        "fixed:8",
        "--estimator",
        "dm",
        "--reward-model",
        "mean",
        "--folds",
        "1",
        "--bootstrap",
        "20",
        "--json",
    ]
    assert main(args + ["--counterfactuals"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policies"][0]["estimates"]["dm"]["value"] == pytest.approx(np.mean(want), rel=1e-6)

    with AdaptiveController(
        ToyTaus(), "fixed:4", arms=ARMS, log_dir=tmp_path / "plain", reward=lambda o: 1.0
    ) as c:
        c.generate(prompt(0), max_new_tokens=23)
    assert main(["ope", str(tmp_path / "plain"), "--policy", "fixed:8", "--counterfactuals"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no counterfactual rewards" in err[0]


@pytest.mark.parametrize("prefix_drafts", [True, False])
def test_an_engines_controller_told_prefix_drafts_has_exact_counterfactuals(tmp_path, prefix_drafts):
    """Issue 45: an engine that drafts one block a round and verifies a prefix of it (vLLM's methods
    under adaptspec.vllm) says so with ``prefix_drafts``; then every shorter arm's counterfactual is
    exact, as for a speculator declaring it (the test above); without it, the arms other than the one
    that ran are approximate (each would have drafted a block of its own). The rounds are the toy's."""
    spec = ToyTaus()
    p = spec.prefill(prompt(3))
    with AdaptiveController.for_engine(
        ARMS, feature_dim=2, policy="fixed:6", log_dir=tmp_path, latency=PROFILE, prefix_drafts=prefix_drafts
    ) as c:
        d = c.decide(p.features)
        out = spec.decode(p, d.block_size, 23)
        assert c.feedback(d.decision_id, out) == "applied"
        (row,) = c.pending_log_rows()
    ran = ARMS.index(6)
    assert row["cf_censored"] == [False, False, False]
    assert row["cf_approximate"] == [False if i == ran else not prefix_drafts for i in range(len(ARMS))]


def test_prefix_drafts_is_for_an_engine_and_a_boolean():
    with pytest.raises(AdaptspecError, match="a speculator declares its own prefix_drafts"):
        AdaptiveController(ToyTaus(), "fixed:4", arms=ARMS, prefix_drafts=True)
    with pytest.raises(AdaptspecError, match="prefix_drafts must be True or False"):
        AdaptiveController.for_engine(ARMS, feature_dim=2, policy="fixed:4", prefix_drafts="yes")
