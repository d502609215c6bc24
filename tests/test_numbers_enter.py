"""Every number a caller or a file hands in is checked where it enters, and learnt state stays
finite (issue 46: items 5, 8, 9, 12, 14, 18, 19, 20).

Each case and its neighbours: what is refused is one AdaptspecError line and changes nothing;
what is accepted next to it still works. Real files (decision logs written through the writer
or by pyarrow, checkpoints on disk), no mocks.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec import AdaptiveController, AdaptspecError
from adaptspec.control.context_width import settle_width
from adaptspec.control.protocol import engine_shape
from adaptspec.policies import make_policy
from adaptspec.reward.functions import check_reward
from adaptspec.speculator import REWARD_LIMIT, Outcome, Round
from adaptspec.traces import DecisionLog
from adaptspec.traces.log_writer import DecisionLogWriter, log_rows

ARMS = [1, 2, 4, 8]


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert isinstance(e.value, AdaptspecError) and msg and "\n" not in msg, msg
    return msg


def outcome(block_size: int, tau: int) -> Outcome:
    """One honest round of ``block_size`` committing ``tau`` tokens (1 + tau tokens with the first)."""
    return Outcome([7] * (1 + tau), [Round(block_size, tau, 0.001, 0.01)], 0.011)


# ============================================================================ rewards: type and size
@pytest.mark.parametrize(
    "bad",
    [
        "5",
        True,
        False,
        np.bool_(True),
        None,
        [1.0],
        float("nan"),
        float("inf"),
        1e300,
        1e308,
        -1e300,
        REWARD_LIMIT * 1.0000001,
        np.float64(2e9),
    ],
)
def test_check_reward_refuses_what_is_not_a_plausible_reward(bad):
    with pytest.raises(AdaptspecError) as e:
        check_reward(bad)
    one_line(e)


@pytest.mark.parametrize("good", [0, 5, -12.5, np.float32(3.5), np.int64(7), REWARD_LIMIT, -REWARD_LIMIT])
def test_check_reward_takes_every_real_number_within_the_limit(good):
    assert check_reward(good) == float(good)


@pytest.mark.parametrize("bad", ["5", True, 1e308, 1e300, float("nan")])
def test_feedback_refuses_a_reward_of_the_wrong_type_or_size_and_the_decision_stays_pending(bad):
    with AdaptiveController.for_engine(arms=ARMS, feature_dim=3, policy="fi-ucb", reward="tau") as c:
        d = c.decide([0.5, 0.1, 2.0])
        with pytest.raises(AdaptspecError) as e:
            c.feedback(d.decision_id, reward=bad)
        assert "reward must be" in one_line(e)
        assert c.stats()["pending"] == 1 and c.stats()["feedback"]["applied"] == 0
        assert c.feedback(d.decision_id, reward=5).status == "applied"  # its neighbour: an int
        assert c.feedback(c.decide([0.5, 0.1, 2.0]).decision_id, reward=np.float32(-3.0)).status == "applied"
        assert c.sync().stats()["updates"] == 2


def test_a_computed_reward_of_implausible_size_is_no_reward():
    with AdaptiveController.for_engine(arms=ARMS, feature_dim=3, policy="ucb", reward=lambda out: 1e300) as c:
        d = c.decide([0.5, 0.1, 2.0])
        r = c.feedback(d.decision_id, outcome(d.block_size, 1))
        assert (r.status, r.reward) == ("no_reward", None)
        assert c.sync().stats()["updates"] == 0


def test_a_policy_refuses_an_implausible_reward_in_every_update_form_and_learns_nothing():
    pol = make_policy("fi-ucb", ARMS, seed=0)
    before = pol.state_dict()
    for call in (
        lambda: pol.update(None, 4, 1e300),
        lambda: pol.update(None, 4, "5"),
        lambda: pol.update_full(None, [1.0, 2.0, 1e300, 1.0], np.ones(4, bool)),
        lambda: pol.update_batch(None, np.array([4, 8]), np.array([1.0, 1e12])),
    ):
        with pytest.raises(AdaptspecError) as e:
            call()
        one_line(e)
    assert pol.state_dict()["version"] == before["version"]
    np.testing.assert_array_equal(pol.state_dict()["state"]["stats"]["ss"], before["state"]["stats"]["ss"])
    # a censored arm's value is ignored, whatever it holds
    pol.update_full(None, [1.0, 2.0, 3.0, float("nan")], np.array([True, True, True, False]))
    assert pol.version == 1


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-REWARD_LIMIT, REWARD_LIMIT, allow_nan=False), min_size=1, max_size=60),
    st.sampled_from(["fi-ucb", "ucb", "ts", "eps-greedy", "exp3"]),
)
def test_rewards_at_the_limit_keep_every_learnt_state_finite(rewards, spec):
    """The closed form: |r| <= 1e9 gives r*r <= 1e18 per update, far from float64's 1.8e308, so
    a learnt state is finite whatever the sequence (and a checkpoint of it can be written)."""
    pol = make_policy(spec, ARMS, seed=0)
    for i, r in enumerate(rewards):
        pol.update(None, ARMS[i % 4], r)
        if spec == "fi-ucb":
            pol.update_full(None, [r, -r, r / 2, 0.0], np.ones(4, bool))
    assert pol.state_fault() is None
    assert all(np.isfinite(v).all() for v in (pol.stats.n, pol.stats.s, pol.stats.ss))
    pol.decide()


def test_linucb_with_contexts_and_rewards_at_their_limits_stays_finite():
    pol = make_policy("linucb", ARMS, seed=0)
    rng = np.random.default_rng(0)
    for i in range(50):
        x = rng.normal(size=5)
        x *= 0.999e9 / np.linalg.norm(x) if i % 2 else 1.0  # about the largest context norm a policy takes
        pol.update(x, ARMS[i % 4], REWARD_LIMIT * (-1) ** i)
    assert pol.state_fault() is None
    with pytest.raises(AdaptspecError) as e:
        pol.update(np.full(5, 1e200), 4, 1.0)
    assert "implausible size" in one_line(e)


# ============================================================================ features
def test_decide_without_features_is_refused_where_the_engine_declared_them():
    with AdaptiveController.for_engine(arms=ARMS, feature_dim=3, policy="fi-ucb", reward="tau") as c:
        with pytest.raises(AdaptspecError) as e:
            c.decide(None)
        assert one_line(e) == (
            "features are missing: the controller's feature_dim is 3 (every request brings its "
            "prefill features, which the log keeps)"
        )
        assert c.stats()["decisions"] == 0 and c.stats()["pending"] == 0
        assert c.decide([1.0, 2.0, 3.0]).block_size in ARMS
    with AdaptiveController.for_engine(
        arms=ARMS, policy="fi-ucb", reward="tau"
    ) as c:  # undeclared: a non-contextual policy needs none
        assert c.decide(None).block_size in ARMS


@pytest.mark.parametrize(
    "bad", [[1e300, 0.0, 0.0], [1e10, 1.0, 1.0], [float("inf"), 0, 0], [float("nan"), 0, 0]]
)
def test_features_of_implausible_size_are_refused(bad):
    with AdaptiveController.for_engine(arms=ARMS, feature_dim=3, policy="linucb", reward="tau") as c:
        with pytest.raises(AdaptspecError) as e:
            c.decide(bad)
        assert one_line(e).startswith("features have ")
        assert (
            c.decide([1e8, 0.0, 0.0]).extras.get("fallback") is None
        )  # within the limit: decided by the policy


# ============================================================================ the decision log, read back
def _log_part(path, **columns):
    """A decision-log part written by pyarrow (the reader's checks are the only ones it meets)."""
    n = len(columns.get("decision_id", ["d0", "d1"]))
    base = {
        "decision_id": [f"d{i}" for i in range(n)],
        "time": [0.0] * n,
        "policy": ["fi-ucb"] * n,
        "variant": [None] * n,
        "block_size": [4] * n,
        "propensity": [1.0] * n,
        "probs": [[0.0, 0.0, 1.0, 0.0]] * n,
        "arms": [ARMS] * n,
        "reward": [2.0] * n,
    }
    base.update(columns)
    path.mkdir(parents=True, exist_ok=True)
    t = pa.table({k: v for k, v in base.items() if k != "time"})
    t = t.append_column("time", pa.array([0] * n, pa.timestamp("us", tz="UTC")))
    pq.write_table(t, path / "part-00000000000000000001-1-000000.parquet")
    return path


CF = {
    "cf_rewards": [[1.0, 1.5, 2.0, 1.8]] * 2,
    "cf_tokens": [[3.0, 5.0, 7.0, 7.0]] * 2,
    "cf_censored": [[False] * 4] * 2,
    "cf_approximate": [[False, True, False, True]] * 2,
}


@pytest.mark.parametrize(
    "case, columns, says",
    [
        ("reward 1e300", {"reward": [2.0, 1e300]}, "column 'reward', row 1: 1e+300 is beyond any reward"),
        (
            "cf_rewards 1e300",
            {**CF, "cf_rewards": [[1.0, 1.5, 2.0, 1.8], [1e300, 1.5, 2.0, 1.8]]},
            "column 'cf_rewards', row 1: a value beyond any reward",
        ),
        (
            "cf at the arm that ran is not the reward",
            {**CF, "reward": [2.0, 2.5]},
            "column 'cf_rewards', row 1: 2 at block size 4 (the arm that ran), but the row's reward is 2.5",
        ),
        (
            "cf_tokens null while cf_rewards is set",
            {**CF, "cf_tokens": [[3.0, 5.0, 7.0, 7.0], None]},
            "column 'cf_tokens', row 1: null while 'cf_rewards' is not",
        ),
        (
            "cf_rewards null while cf_censored is set",
            {**CF, "cf_rewards": [[1.0, 1.5, 2.0, 1.8], None]},
            "column 'cf_rewards', row 1: null while 'cf_tokens' is not",
        ),
        (
            "cf_rewards without a reward",
            {**CF, "reward": [2.0, None]},
            "column 'cf_rewards', row 1: set in a row without a reward",
        ),
    ],
)
def test_a_decision_log_breaking_the_reward_invariants_is_refused_naming_column_and_row(
    tmp_path, case, columns, says
):
    log = _log_part(tmp_path / "log", **columns)
    for read in (lambda: DecisionLog.read(log).table, lambda: log_rows(log)):
        with pytest.raises(AdaptspecError) as e:
            read()
        assert says in one_line(e), case


def test_a_decision_log_keeping_the_invariants_reads(tmp_path):
    """The neighbours: the counterfactuals of a row with them, rewards at the limit, a row without feedback."""
    log = _log_part(tmp_path / "log", **CF, reward=[2.0, 2.0])
    assert DecisionLog.read(log).cf_rewards.shape == (2, 4)
    log2 = _log_part(tmp_path / "log2", reward=[REWARD_LIMIT, None])
    assert np.isnan(DecisionLog.read(log2).rewards[1])


def test_a_resume_from_a_log_with_an_absurd_reward_is_refused_and_a_checkpoint_stays_finite(tmp_path):
    log = _log_part(tmp_path / "log", reward=[2.0, 1e300])
    with pytest.raises(AdaptspecError) as e:
        AdaptiveController.for_engine(
            arms=ARMS, policy="fi-ucb", reward="tau", log_dir=log, checkpoint_dir=tmp_path / "ck"
        )
    assert "1e+300 is beyond any reward" in one_line(e)
    assert not (tmp_path / "ck").exists() or not any(
        p.name.startswith("ckpt-") for p in (tmp_path / "ck").iterdir()
    )


def test_the_controllers_own_log_keeps_every_invariant_it_is_read_with(tmp_path):
    """What the controller writes (counterfactuals included) reads back through the same checks."""
    with AdaptiveController.for_engine(
        arms=ARMS,
        feature_dim=3,
        policy="fi-ucb",
        reward="tau",
        log_dir=tmp_path / "log",
        latency="cpu-smollm2-fast",
        roll_rows=2,
    ) as c:
        for i in range(5):
            d = c.decide([0.5, 0.1, float(i)])
            c.feedback(d.decision_id, outcome(d.block_size, min(d.block_size, 2)))
    log = DecisionLog.read(tmp_path / "log")
    assert len(log) == 5
    has = np.isfinite(log.cf_rewards).all(axis=1)
    assert has.all()
    np.testing.assert_array_equal(log.cf_rewards[np.arange(5), log.actions], log.rewards)


# ============================================================================ checkpoints
def _poison_checkpoint(ck_dir) -> None:
    """Rewrite the newest checkpoint's policy state with an infinite sum of squares (as a
    checkpoint written before rewards were bounded held after feedback(reward=1e308))."""
    from adaptspec.control.policy_checkpoint import latest_checkpoint

    ck = latest_checkpoint(ck_dir)
    pol = make_policy("fi-ucb", ARMS, seed=0)
    pol.load_state(ck / "policy.npz")
    pol.stats.ss[2] = np.inf
    pol.save_state(ck / "policy.npz")  # save_state writes what it is given; write_checkpoint would refuse


def test_a_checkpoint_holding_an_infinity_is_refused_at_resume_and_never_written(tmp_path):
    ck = tmp_path / "ck"
    with AdaptiveController.for_engine(arms=ARMS, policy="fi-ucb", reward="tau", checkpoint_dir=ck) as c:
        for _ in range(3):
            d = c.decide()
            c.feedback(d.decision_id, reward=1.0)
    _poison_checkpoint(ck)
    with pytest.raises(AdaptspecError) as e:
        AdaptiveController.for_engine(arms=ARMS, policy="fi-ucb", reward="tau", checkpoint_dir=ck)
    assert "state refused: stats/ss[2] is inf" in one_line(e)

    from adaptspec.control.policy_checkpoint import write_checkpoint

    pol = make_policy("fi-ucb", ARMS, seed=0)
    pol.stats.s[0] = np.nan
    with pytest.raises(AdaptspecError) as e:
        write_checkpoint(tmp_path / "other", pol, {"updates": 1})
    assert "stats/s[0] is nan" in one_line(e)
    assert not (tmp_path / "other").exists() or not list((tmp_path / "other").glob("ckpt-*"))
    fresh = make_policy(
        "fi-ucb", ARMS, seed=0
    )  # its neighbour: a fresh state holds the sentinels min=+inf, max=-inf
    assert (
        fresh.state_fault() is None and write_checkpoint(tmp_path / "fresh", fresh, {"updates": 0}).is_dir()
    )


# ============================================================================ the writer's lock file
@pytest.mark.parametrize("kind", ["dangling", "to a file"])
def test_the_log_writer_does_not_follow_a_symlinked_lock_file(tmp_path, kind):
    log, outside = tmp_path / "log", tmp_path / "outside"
    log.mkdir()
    if kind == "to a file":
        outside.write_text("mine\n")
    os.symlink(outside, log / ".writer-A.lock")
    with pytest.raises(AdaptspecError) as e:
        DecisionLogWriter(log, name="A")
    assert "is a symbolic link; not following it" in one_line(e)
    assert (outside.read_text() == "mine\n") if kind == "to a file" else not outside.exists()
    os.unlink(log / ".writer-A.lock")
    with DecisionLogWriter(log, name="A") as w:  # its neighbour: the writer's own lock file, again and again
        assert w.feature_dim is None
    with DecisionLogWriter(log, name="A"):
        pass


def test_the_log_writer_refuses_a_lock_file_that_is_not_a_regular_file(tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    os.mkfifo(log / ".writer-A.lock")
    with pytest.raises(AdaptspecError) as e:
        DecisionLogWriter(log, name="A")
    assert "not a regular file" in one_line(e)


# ============================================================================ feedback after close, the pending cap
def test_feedback_after_close_is_late_for_a_dropped_decision_and_logs_nothing(tmp_path):
    c = AdaptiveController.for_engine(
        arms=ARMS, feature_dim=3, policy="fi-ucb", reward="tau", log_dir=tmp_path / "log"
    )
    done, dropped = c.decide([1.0, 2.0, 3.0]), c.decide([1.0, 2.0, 3.0])
    assert c.feedback(done.decision_id, reward=1.0).status == "applied"
    c.close()
    rows = len(log_rows(tmp_path / "log"))
    assert rows == 2  # the applied one, and the one dropped at close (no reward)
    assert c.feedback(dropped.decision_id, reward=1.0).status == "late"
    assert c.feedback(dropped.decision_id, outcome(4, 2)).status == "late"
    assert c.feedback(done.decision_id, reward=1.0).status == "duplicate"
    assert c.feedback("never-decided", reward=1.0).status == "unknown"
    assert len(log_rows(tmp_path / "log")) == rows
    s = c.stats()["feedback"]
    assert (s["late"], s["duplicate"], s["unknown"], s["dropped"], s["applied"]) == (2, 1, 1, 1, 1)
    with pytest.raises(AdaptspecError) as e:  # a bad reward is still refused for what it is
        c.feedback(dropped.decision_id, reward="5")
    one_line(e)


def test_pending_decisions_are_capped_and_the_oldest_expire_first(tmp_path):
    with AdaptiveController.for_engine(
        arms=ARMS, feature_dim=3, policy="fi-ucb", reward="tau", log_dir=tmp_path / "log", max_pending=3
    ) as c:
        ds = [c.decide([1.0, 2.0, float(i)]) for i in range(5)]
        s = c.stats()
        assert s["pending"] == 3 and s["feedback"]["expired"] == 2
        assert [c.feedback(d.decision_id, reward=1.0).status for d in ds] == [
            "late",
            "late",
            "applied",
            "applied",
            "applied",
        ]
    rows = {r["decision_id"]: r["reward"] for r in log_rows(tmp_path / "log")}
    assert rows == {ds[0].decision_id: None, ds[1].decision_id: None, **{d.decision_id: 1.0 for d in ds[2:]}}
    for bad in (0, -1, 2.5, True, None):
        with pytest.raises(AdaptspecError) as e:
            AdaptiveController.for_engine(arms=ARMS, policy="ucb", max_pending=bad)
        assert "max_pending must be a positive integer" in one_line(e)


# ============================================================================ a refused outcome in the split form
def test_a_refused_outcome_is_logged_as_decode_error_and_the_decision_is_no_longer_pending(tmp_path):
    with AdaptiveController.for_engine(
        arms=ARMS, feature_dim=3, policy="fixed:2", reward="tau", log_dir=tmp_path / "log"
    ) as c:
        d = c.decide([1.0, 2.0, 3.0])
        bigger = Outcome([7] * 9, [Round(8, 8, 0.001, 0.01)], 0.011)  # rounds of 8 for a decision of 2
        with pytest.raises(AdaptspecError) as e:
            c.feedback(d.decision_id, bigger)
        one_line(e)
        s = c.stats()
        assert s["feedback"]["decode_error"] == 1 and s["pending"] == 0 and s["feedback"]["applied"] == 0
        assert (
            c.feedback(d.decision_id, outcome(2, 2)).status == "duplicate"
        )  # settled: a second word is ignored
        d2 = c.decide([1.0, 2.0, 3.0])
        assert (
            c.feedback(d2.decision_id, outcome(2, 2)).status == "applied"
        )  # its neighbour: an honest outcome
    rows = {r["decision_id"]: r["reward"] for r in log_rows(tmp_path / "log")}
    assert rows == {d.decision_id: None, d2.decision_id: 2.0}


# ============================================================================ the default's explanation
def test_an_engines_default_explains_itself_by_the_arms_it_was_given():
    with AdaptiveController.for_engine(arms=[1, 2, 4, 8], feature_dim=3) as c:
        assert "max_block_size" not in c.policy_choice
        assert "not all among the arms [1, 2, 4, 8]" in c.policy_choice


# ============================================================================ the width, settled once
def test_the_width_is_settled_by_the_first_part_that_knows_it_and_checked_against_the_others():
    shape, known = engine_shape(ARMS), engine_shape(ARMS, feature_dim=3)
    args = dict(featurizer=None, extra=0, label="linucb")
    # each part alone fixes it, in its own words (what a request of another width is told)
    assert settle_width(known, reads=None, given=None, **args).source.startswith("speculator engine declares")
    assert settle_width(known, reads=None, given=3, **args).source == "the controller's feature_dim is"
    w = settle_width(shape, reads=5, given=None, **args)
    assert (w.raw, w.source, w.declared) == (5, "policy linucb reads", False)
    w = settle_width(shape, reads=None, given=None, logged=7, log_dir="L", **args)
    assert (w.raw, w.source) == (7, "the decision log in L holds")
    w = settle_width(shape, reads=None, given=None, learnt=9, **args)
    assert (w.raw, w.source) == (9, "policy linucb has learnt")
    w = settle_width(shape, reads=None, given=None, **args)
    assert (w.raw, w.source) == (None, "the first request's features had")
    # the load features: the log and the policy hold 5 more than the prefill's
    assert (
        settle_width(
            shape, reads=None, given=None, logged=8, log_dir="L", featurizer=None, extra=5, label="x"
        ).raw
        == 3
    )
    # an earlier part wins; a later one that disagrees is refused naming both
    assert settle_width(known, reads=3, given=3, logged=3, learnt=3, log_dir="L", **args).raw == 3
    for later, says in (
        (dict(reads=4), "policy linucb reads prefill features of 4 values, the engine's have 3"),
        (
            dict(logged=4),
            "L: this decision log holds contexts of 4 features, the speculator's prefill gives 3",
        ),
        (
            dict(learnt=4, checkpoint="CK"),
            "CK: the checkpoint's policy learnt contexts of 4 values, this controller's have 3",
        ),
    ):
        with pytest.raises(AdaptspecError) as e:
            settle_width(known, **{"reads": None, "given": 3, "log_dir": "L", **later}, **args)
        assert one_line(e).startswith(says)
    with pytest.raises(AdaptspecError) as e:
        settle_width(shape, reads=None, given=None, logged=4, learnt=6, log_dir="L", **args)
    assert one_line(e).startswith(
        "policy linucb has learnt contexts of 6 values, but the decision log in L holds 4"
    )


def test_a_featurizer_fixes_the_context_and_the_log_is_checked_against_its_output():
    class F:  # what settle_width reads of a featurizer: its output width
        out_dim = 6

    w = settle_width(
        engine_shape(ARMS),
        reads=10,
        given=None,
        featurizer=F(),
        extra=0,
        label="x",
        logged=6,
        log_dir="L",
        learnt=6,
    )
    assert w.raw == 10
    with pytest.raises(AdaptspecError) as e:
        settle_width(
            engine_shape(ARMS),
            reads=10,
            given=None,
            featurizer=F(),
            extra=0,
            label="x",
            logged=10,
            log_dir="L",
        )
    assert "holds contexts of 10 features, the featurizer gives 6" in one_line(e)


# ============================================================================ a fleet on a real Redis
@pytest.mark.integration
def test_an_absurd_reward_is_refused_before_it_reaches_the_fleet(tmp_path):
    """Two replicas of fi-ucb sharing through a real Redis: feedback(reward=1e308) is refused on
    one, so what it publishes is finite and the other merges it (issue 46: the poisoned replica
    published an infinity the other refused at every sync)."""
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from _redis import RedisServer
    from adaptspec.fleet import SharedState
    from adaptspec.fleet.redis_backend import RedisBackend

    srv = RedisServer(tmp_path / "redis").start()
    try:
        shared = {
            rid: SharedState(
                RedisBackend(f"{srv.url}/0").connect(), rid, sync_every=1, sync_interval_s=5, lease_ttl_s=30
            )
            for rid in ("r1", "r2")
        }

        def replica(rid: str) -> AdaptiveController:
            return AdaptiveController.for_engine(
                arms=ARMS, policy="fi-ucb", reward="tau", variant="A", shared=shared[rid]
            )

        with replica("r1") as a, replica("r2") as b:
            d = a.decide()
            for bad in (1e308, float("inf"), "5"):
                with pytest.raises(AdaptspecError) as e:
                    a.feedback(d.decision_id, reward=bad)
                one_line(e)
            assert a.feedback(d.decision_id, reward=2.0).status == "applied"
            for r in (1.0, 3.0):
                a.feedback(a.decide().decision_id, reward=r)
            a.sync()
            assert shared["r1"].sync_now() and shared["r2"].sync_now()
            status = b.stats()["shared"]
            assert status["refused_entries"] == {} and status["other_replicas"] == 1
            import time

            deadline = time.monotonic() + 60  # the update thread merges the fleet's news at its next tick
            while b.policy_snapshot().stats.n.sum() < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            learnt = b.policy_snapshot()
            assert (learnt.stats.n.sum(), learnt.stats.s.sum()) == (3.0, 6.0)  # r1's three rewards: 2 + 1 + 3
            assert learnt.state_fault() is None
    finally:
        srv.stop()


def test_a_part_is_written_through_a_new_file_never_through_a_planted_link(tmp_path):
    """DecisionLog.append writes its temporary part with O_EXCL (mkstemp): a symbolic link planted
    in the log's folder is never written through, and the part lands in the folder."""
    log, outside = tmp_path / "log", tmp_path / "outside"
    log.mkdir()
    outside.write_text("mine\n")
    for i in range(3):  # links where a careless writer's temporary names would go
        os.symlink(outside, log / f".part-{i}.parquet.tmp")
    row = {
        "decision_id": "d1",
        "time": 0.0,
        "policy": "fixed:4",
        "block_size": 4,
        "propensity": 1.0,
        "probs": [0.0, 1.0],
        "arms": [1, 4],
        "reward": 2.5,
    }
    part = DecisionLog(log).append([row])
    assert part.parent == log and not part.is_symlink() and oct(part.stat().st_mode & 0o777) == "0o644"
    assert outside.read_text() == "mine\n"
    assert DecisionLog.read(log).rewards.tolist() == [2.5]


@pytest.mark.parametrize(
    "change, says",
    [
        ({"reward": 1e300}, "reward 1e+300 is beyond any reward"),
        (
            {**{k: v[0] for k, v in CF.items()}, "reward": 2.5},
            "cf_rewards at block size 4 (the arm that ran) is 2.0",
        ),
        ({"cf_rewards": [1.0, 1.5, 2.0, 1.8]}, "has cf_rewards but not cf_tokens"),
        ({**{k: v[0] for k, v in CF.items()}, "reward": None}, "has cf_rewards without a reward"),
        (
            {**{k: v[0] for k, v in CF.items()}, "cf_rewards": [1e300, 1.5, 2.0, 1.8]},
            "hold a value beyond any reward",
        ),
    ],
)
def test_the_log_writer_refuses_a_row_the_reader_would_refuse(tmp_path, change, says):
    row = {
        "decision_id": "d1",
        "time": 0.0,
        "policy": "fi-ucb",
        "block_size": 4,
        "propensity": 1.0,
        "probs": [0.0, 0.0, 1.0, 0.0],
        "arms": ARMS,
        "reward": 2.0,
    }
    with DecisionLogWriter(tmp_path / "log", name="A") as w:
        with pytest.raises(AdaptspecError) as e:
            w.append({**row, **change})
        assert says in one_line(e)
        w.append(
            {**row, **{k: v[0] for k, v in CF.items()}}
        )  # its neighbour: the row as the controller writes it
    assert log_rows(tmp_path / "log")[0]["cf_rewards"] == CF["cf_rewards"][0]


def test_features_a_featurizer_maps_beyond_the_context_limit_are_refused_not_fallen_back_on(tmp_path):
    from adaptspec.policies.featurizer import Featurizer

    X = np.random.default_rng(0).normal(size=(50, 3))
    f = Featurizer.fit(X)
    with AdaptiveController.for_engine(
        arms=ARMS, feature_dim=3, policy="linucb", featurizer=f, reward="tau", log_dir=tmp_path / "log"
    ) as c:
        for bad in ([1e300, 0.0, 0.0], [1e12, 0.0, 0.0]):
            with pytest.raises(AdaptspecError) as e:
                c.decide(bad)
            assert one_line(e).startswith("the featurizer's contexts of these features have")
        assert c.stats()["fallbacks"]["error"] == 0 and c.stats()["decisions"] == 0
        d = c.decide([1e3, 0.0, 0.0])  # its neighbour: far out, but within the limit
        assert d.extras.get("fallback") is None
        assert c.feedback(d.decision_id, reward=1.0).status == "applied"


def test_ope_with_counterfactuals_on_a_log_holding_an_absurd_reward_is_one_line(tmp_path, capsys):
    """The issue's case: `ope --counterfactuals` reported 6.7e+297 on a log whose cf_rewards held 1e300."""
    from adaptspec.cli import main

    log = _log_part(tmp_path / "log", **{**CF, "cf_rewards": [[1.0, 1.5, 2.0, 1.8], [1e300, 1.5, 2.0, 1.8]]})
    assert main(["ope", str(log), "--policy", "fi-ucb", "--counterfactuals"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "column 'cf_rewards', row 1: a value beyond any reward" in err[0]
    good = _log_part(tmp_path / "good", **CF)  # its neighbour: the same log with plausible rewards estimates
    assert (
        main(
            [
                "ope",
                str(good),
                "--policy",
                "fixed:4",
                "--counterfactuals",
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
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["policies"][0]["estimates"]["dm"]["value"] == pytest.approx(2.0)


def test_a_replica_never_publishes_sums_the_others_would_refuse():
    """A policy object of the caller's own that skips the reward check can still put an infinity in
    a replica's sums (SharedState.update, called directly): it is then not published, and the
    failure is counted and said; its neighbour, a replica of the library's policy, publishes."""
    from adaptspec.fleet import SharedState
    from adaptspec.fleet.backend import MemoryBackend
    from adaptspec.policies.ucb import UCB

    class Sloppy(UCB):  # a user's subclass that trusts every reward
        @staticmethod
        def check_reward(reward):
            return float(reward)

    backend = MemoryBackend()
    for rid, pol in (("sloppy", Sloppy(ARMS, seed=0)), ("fine", UCB(ARMS, seed=0))):
        shared = SharedState(backend, rid, sync_every=1000, sync_interval_s=60, lease_ttl_s=180)
        shared.attach(pol, "A")
        try:
            shared.update(pol, None, 4, 1e300 if rid == "sloppy" else 2.0)
            published = shared.sync_now()
            status = shared.status()
            if rid == "sloppy":
                assert not published and status["sync_errors"] == 1
                assert status["last_error"].startswith(
                    "own statistics not published: shared statistics 'ss' hold an infinity"
                )
            else:
                assert published and status["sync_errors"] == 0
        finally:
            shared.close()
    from adaptspec.fleet.wire import decode

    entries = {rid: decode(blob) for rid, blob in backend.fetch("A").items()}
    assert entries["sloppy"].updates == 0  # what it published when it joined, before the infinity
    assert np.isfinite(entries["sloppy"].sums["ss"]).all()
    assert entries["fine"].updates == 1 and entries["fine"].sums["s"].tolist() == [0.0, 0.0, 2.0, 0.0]
