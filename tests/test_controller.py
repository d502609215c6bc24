"""AdaptiveController: the loop, the split form, fallbacks, threads, checkpoints, crash recovery, the log writer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from _controller_helpers import FakeSpeculator, Misbehaving
from _threads import torch_threads
from adaptspec import AdaptiveController, AdaptspecError
from adaptspec.control.policy_checkpoint import latest_checkpoint, read_checkpoint, state_digest
from adaptspec.policies import LinUCB, make_policy
from adaptspec.reward.functions import DEFAULT_REWARD, reward_function
from adaptspec.speculator import Outcome
from adaptspec.traces import DecisionLog
from adaptspec.traces.log_writer import DecisionLogWriter, journal_rows, log_rows

ARMS = (1, 2, 4, 6, 8, 10, 12, 16)
HERE = Path(__file__).resolve().parent


def prompt(i: int) -> list[int]:
    return [i % 13 + 1, i % 7 + 20, i % 5 + 40, i]


def replayed_digest(log_dir: Path, spec: str, variant: str | None, arms=ARMS, seed=0) -> tuple[str, int]:
    """Digest of a fresh policy fed every logged reward of ``variant`` in log order, and how many."""
    pol = make_policy(spec, arms, seed=seed)
    n = 0
    for r in log_rows(log_dir, ["variant", "block_size", "reward", "features"]):
        if r["variant"] == variant and r["reward"] is not None:
            x = None if r["features"] is None else np.asarray(r["features"], np.float32).astype(np.float64)
            pol.update(x if pol.contextual else None, r["block_size"], r["reward"])
            n += 1
    return state_digest(pol), n


@pytest.fixture
def one_torch_thread():
    """One torch thread: tiny models gain nothing from more, and a busy second core makes them crawl."""
    with torch_threads(1):
        yield


def test_blas_threads_limited_while_open_and_restored_at_close():
    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = blas_threads()
    with AdaptiveController(FakeSpeculator(), "fixed:4"):
        assert blas_threads() and all(n == 1 for n in blas_threads())
    assert blas_threads() == before
    with AdaptiveController(FakeSpeculator(), "fixed:4", blas_threads=None):
        assert blas_threads() == before
    with pytest.raises(AdaptspecError, match="blas_threads"):
        AdaptiveController(FakeSpeculator(), "fixed:4", blas_threads=0)


# ============================================================================ the loop
def test_generate_runs_the_whole_loop_and_logs_it(tmp_path):
    spec = FakeSpeculator()
    with AdaptiveController(spec, "linucb:standardize=false", variant="A", log_dir=tmp_path / "log") as c:
        g = c.generate(prompt(3), max_new_tokens=20, request_id="r3")
        c.sync()
        # the reward is the simulator's reward function (the default one) applied to the outcome
        assert (
            g.reward == pytest.approx(reward_function(DEFAULT_REWARD)(g.outcome))
            and DEFAULT_REWARD == "token_latency"
        )
        assert g.outcome.new_tokens == 20 and g.decision.block_size in ARMS and g.fallback is None
        assert g.decision.decision_id and g.prefill_s >= 0 and 0 <= g.overhead_s < 1.0
        s = c.stats()
        assert (s["decisions"], s["updates"], s["feedback"]["applied"], s["pending"]) == (1, 1, 1, 0)
        rows = c.pending_log_rows()
    assert len(rows) == 1
    log = DecisionLog.read(tmp_path / "log")
    row = log.table.to_pylist()[0]
    assert (
        row["decision_id"] == g.decision.decision_id and row["request_id"] == "r3" and row["variant"] == "A"
    )
    assert row["block_size"] == g.decision.block_size and row["propensity"] == g.decision.propensity
    assert row["reward"] == pytest.approx(g.reward)
    assert row["new_tokens"] == 20 and row["rounds"] == len(g.outcome.rounds)
    assert row["mean_tau"] == pytest.approx(g.outcome.mean_tau)
    pre = spec.prefill(prompt(3))
    assert np.array_equal(np.asarray(row["features"], np.float32), pre.features)


def test_contextual_policy_learns_through_the_controller(tmp_path):
    # the fake speculator's best block grows with features[0]; a learning policy beats a bad fixed one
    spec = FakeSpeculator()
    totals = {}
    for name in ("linucb:standardize=false", "fixed:1"):
        with AdaptiveController(spec, name, reward="throughput") as c:
            r = []
            for i in range(150):
                r.append(c.generate(prompt(i), max_new_tokens=24).reward)
                c.sync()
            totals[name] = np.mean(r[50:])
    assert totals["linucb:standardize=false"] > 1.3 * totals["fixed:1"]


def test_reward_options():
    spec = FakeSpeculator()
    with AdaptiveController(spec, "fixed:4", reward="tau") as c:
        g = c.generate(prompt(1), max_new_tokens=16)
        assert g.reward == pytest.approx(g.outcome.mean_tau)
    with AdaptiveController(spec, "fixed:4", reward="modelled", latency="cpu-smollm2-bf16") as c:
        g = c.generate(prompt(1), max_new_tokens=16)
        assert g.reward == pytest.approx(reward_function("modelled", "cpu-smollm2-bf16")(g.outcome))
    with AdaptiveController(spec, "fixed:4", reward=lambda o: 7.0) as c:
        assert c.generate(prompt(1), max_new_tokens=4).reward == 7.0


# ============================================================================ split form
def test_feedback_late_out_of_order_twice_and_never(tmp_path):
    spec = FakeSpeculator()
    with AdaptiveController(spec, "linucb:standardize=false", log_dir=tmp_path, feedback_timeout_s=0.3) as c:
        pres = [spec.prefill(prompt(i)) for i in range(4)]
        ds = [c.decide(p.features, request_id=f"q{i}") for i, p in enumerate(pres)]
        assert len({d.decision_id for d in ds}) == 4
        outs = [spec.decode(p, d.block_size, 12) for p, d in zip(pres, ds)]
        # out of order: 2, 0, 1; decision 3 never gets feedback
        assert [c.feedback(ds[i].decision_id, outs[i]) for i in (2, 0, 1)] == ["applied"] * 3
        assert c.feedback(ds[0].decision_id, outs[0]) == "duplicate"
        assert c.feedback("no-such-decision", outs[0]) == "unknown"
        deadline = time.time() + 5
        while c.stats()["feedback"]["expired"] == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert c.feedback(ds[3].decision_id, outs[3]) == "late"
        assert c.feedback(ds[3].decision_id, reward=1.0) == "late"
        s = c.sync().stats()
        assert s["feedback"]["applied"] == 3 and s["feedback"]["duplicate"] == 1
        assert s["feedback"]["unknown"] == 1 and s["feedback"]["expired"] == 1 and s["feedback"]["late"] == 2
        assert s["updates"] == 3 and s["pending"] == 0
    rows = {r["decision_id"]: r for r in DecisionLog.read(tmp_path).table.to_pylist()}
    assert len(rows) == 4
    assert rows[ds[3].decision_id]["reward"] is None and rows[ds[3].decision_id]["request_id"] == "q3"
    assert all(rows[ds[i].decision_id]["reward"] is not None for i in range(3))


def test_explicit_reward_and_no_reward_outcomes(tmp_path):
    spec = FakeSpeculator()
    with AdaptiveController(spec, "ucb", log_dir=tmp_path) as c:
        d = c.decide(spec.prefill(prompt(0)).features)
        assert c.feedback(d.decision_id, reward=3.5) == "applied"
        d2 = c.decide(None)  # context-free policy: features are optional
        empty = Outcome(tokens=[1], rounds=[], decode_s=0.0)  # no round ran: throughput undefined
        assert c.feedback(d2.decision_id, empty) == "no_reward"
        assert c.sync().stats()["updates"] == 1
    rows = sorted(DecisionLog.read(tmp_path).table.to_pylist(), key=lambda r: r["reward"] is None)
    assert rows[0]["reward"] == 3.5 and rows[1]["reward"] is None and rows[1]["mean_tau"] is None


# ============================================================================ fallbacks
@pytest.mark.parametrize("mode,reason", [("raise", "error"), ("sleep", "timeout"), ("invalid", "invalid")])
def test_fallback_block_size_when_the_policy_fails(tmp_path, mode, reason):
    pol = Misbehaving(ARMS, mode=mode, sleep_s=0.5)
    with AdaptiveController(
        FakeSpeculator(), pol, log_dir=tmp_path, fallback_block_size=6, decide_timeout_s=0.1
    ) as c:
        g = c.generate(prompt(1), max_new_tokens=10)
        assert g.decision.block_size == 6 and g.fallback == reason
        assert g.outcome.new_tokens == 10 and g.reward is not None  # the request still succeeded
        assert c.stats()["fallbacks"][reason] == 1
        assert g.outcome.rounds[0].block_size == 6 and all(r.block_size <= 6 for r in g.outcome.rounds)
    row = DecisionLog.read(tmp_path).table.to_pylist()[0]
    assert row["policy"] == "fallback:6" and row["propensity"] == 1.0 and row["block_size"] == 6


def test_a_stuck_policy_does_not_stick_requests():
    pol = Misbehaving(ARMS, mode="sleep", sleep_s=1.0)
    with AdaptiveController(FakeSpeculator(), pol, decide_timeout_s=0.05) as c:
        t = time.perf_counter()
        gs = [c.generate(prompt(i), max_new_tokens=6) for i in range(3)]
        assert time.perf_counter() - t < 1.0
        assert all(g.fallback == "timeout" for g in gs)


# ============================================================================ threads
def test_decisions_never_wait_for_a_slow_update():
    spec = FakeSpeculator()
    pol = Misbehaving(ARMS, update_sleep_s=0.25)
    with AdaptiveController(spec, pol) as c:
        for i in range(4):
            c.generate(prompt(i), max_new_tokens=6)
        assert c.stats()["queued"] >= 2  # the updates are still being applied...
        t = time.perf_counter()
        for i in range(20):
            c.decide(spec.prefill(prompt(i)).features)
        assert time.perf_counter() - t < 0.2  # ... yet 20 decisions took no time
        assert c.sync().stats()["updates"] == 4


def test_concurrent_requests_are_all_logged_and_learnt_in_log_order(tmp_path):
    spec = FakeSpeculator(sleep_s=0.001)
    errors = []
    with AdaptiveController(
        spec, "linucb:standardize=false", variant="A", log_dir=tmp_path, roll_rows=7
    ) as c:

        def client(k: int) -> None:
            try:
                for i in range(6):
                    c.generate(prompt(100 * k + i), max_new_tokens=12)
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        c.sync()
        assert not errors
        s = c.stats()
        assert s["decisions"] == 96 and s["updates"] == 96 and s["pending"] == 0
        digest = c.policy_digest()
    log = DecisionLog.read(tmp_path)
    assert len(log) == 96 and len(set(log.table.column("decision_id").to_pylist())) == 96
    # the policy learnt exactly the logged feedback, in log order
    assert replayed_digest(tmp_path, "linucb:standardize=false", "A") == (digest, 96)


def test_speculator_calls_are_serialised_across_controllers():
    spec = FakeSpeculator()
    active = []
    orig = spec.decode

    def decode(*a, **k):
        active.append(1)
        assert len(active) == 1, "two decode calls overlapped"
        time.sleep(0.002)
        active.pop()
        return orig(*a, **k)

    spec.decode = decode
    c1 = AdaptiveController(spec, "fixed:4", variant="A")
    c2 = AdaptiveController(spec, "fixed:8", variant="B")
    threads = [
        threading.Thread(target=lambda c=c: [c.generate(prompt(i), max_new_tokens=4) for i in range(10)])
        for c in (c1, c2, c1, c2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c1.stats()["feedback"]["applied"] == 20 and c2.stats()["feedback"]["applied"] == 20
    c1.close()
    c2.close()


# ============================================================================ re-decision and streaming
def test_redecide_every_k_rounds_splits_the_request(tmp_path):
    spec = FakeSpeculator()
    with AdaptiveController(spec, "random", log_dir=tmp_path, redecide_every=3, seed=5) as c:
        g = c.generate(prompt(2), max_new_tokens=60)
        c.sync()
        n_rounds = len(g.outcome.rounds)
        assert len(g.decisions) == -(-n_rounds // 3) >= 3
        for j, d in enumerate(g.decisions):  # each decision governs its own 3 rounds
            rs = g.outcome.rounds[3 * j : 3 * j + 3]
            assert all(r.block_size <= d.block_size for r in rs)
        assert c.stats()["updates"] == len(g.decisions)
    rows = DecisionLog.read(tmp_path).table.to_pylist()
    assert len(rows) == len(g.decisions)
    assert sum(r["new_tokens"] for r in rows) == g.outcome.new_tokens
    assert sum(r["rounds"] for r in rows) == n_rounds
    assert sum(r["decode_ms"] for r in rows) == pytest.approx(1000 * g.outcome.decode_s)


def test_on_tokens_streams_first_token_then_rounds():
    got = []
    with AdaptiveController(FakeSpeculator(), "fixed:4") as c:
        g = c.generate(prompt(4), max_new_tokens=20, on_tokens=got.append)
    assert got[0] == g.outcome.tokens[:1]
    assert sum(got, []) == g.outcome.tokens
    assert len(got) == 1 + len(g.outcome.rounds)


def test_a_round_rule_runs_inside_every_request_from_the_chosen_block_size(one_torch_thread):
    from adaptspec.schedules import AcceptanceHistory
    from decoding_helpers import make_decoder, reference_greedy, tiny_target

    model = tiny_target("llama", vocab=96)
    dec = make_decoder(model, max_block_size=16)
    ids = [3, 14, 15, 9, 2, 6, 53, 58]
    want = reference_greedy(model, ids, 24)
    rule = AcceptanceHistory(block_size=2, max_block_size=16, shrink=1)
    with AdaptiveController(dec, "fixed:6", arms=[1, 6], round_rule=rule, reward="tau") as c:
        g = c.generate(ids, max_new_tokens=24)
        assert g.tokens == want
        # the rule starts from the policy's choice and then follows the rounds
        expect = [
            rule.with_block_size(6).draft_size(g.outcome.rounds[:i]) for i in range(len(g.outcome.rounds))
        ]
        assert [r.draft_size for r in g.outcome.rounds] == [
            min(e, 24 - 1 - sum(r.tau for r in g.outcome.rounds[:i])) for i, e in enumerate(expect)
        ]
        assert len({r.draft_size for r in g.outcome.rounds}) > 1
    with AdaptiveController(dec, "fixed:1", arms=[1, 6], round_rule="history") as c:
        assert {r.draft_size for r in c.generate(ids, max_new_tokens=12).outcome.rounds} == {
            1
        }  # 1: plain throughout
    with pytest.raises(AdaptspecError, match="cannot be combined"):
        AdaptiveController(dec, "fixed:6", arms=[1, 6], round_rule="history", redecide_every=2)
    with pytest.raises(AdaptspecError, match="unknown round schedule"):
        AdaptiveController(dec, "fixed:6", arms=[1, 6], round_rule="sometimes")


def test_lossless_on_a_real_tiny_decoder_with_redecisions(one_torch_thread):
    from decoding_helpers import make_decoder, reference_greedy, tiny_target

    model = tiny_target("llama", vocab=96)
    dec = make_decoder(model, max_block_size=16)
    ids = [3, 14, 15, 9, 2, 6, 53, 58]
    want = reference_greedy(model, ids, 24)
    with AdaptiveController(dec, "random", redecide_every=2, seed=1, decide_timeout_s=1.0) as c:
        g = c.generate(ids, max_new_tokens=24)
        g2 = c.generate(ids, max_new_tokens=24)
    assert g.tokens == want[: len(g.tokens)] and g2.tokens == g.tokens
    assert len(g.decisions) > 1 and len({d.block_size for d in g.decisions + g2.decisions}) > 1


# ============================================================================ checkpoints and resume
def test_checkpoint_and_resume_continue_exactly(tmp_path):
    spec = FakeSpeculator()
    opts = dict(variant="A", checkpoint_every=4, checkpoint_interval_s=None)

    def run(c, lo, hi):
        out = []
        for i in range(lo, hi):
            out.append(c.generate(prompt(i), max_new_tokens=16).decision.block_size)
            c.sync()
        return out

    with AdaptiveController(spec, "linucb:standardize=false", **opts) as c:
        straight = run(c, 0, 24)
        digest_straight = c.policy_digest()
    a = AdaptiveController(
        spec, "linucb:standardize=false", log_dir=tmp_path / "log", checkpoint_dir=tmp_path / "ck", **opts
    )
    first = run(a, 0, 10)
    a.close()
    info = read_checkpoint(latest_checkpoint(tmp_path / "ck"))
    assert (
        info["updates"] == 10 and info["variant"] == "A" and info["policy_spec"] == "linucb:standardize=false"
    )
    b = AdaptiveController(
        spec, "linucb:standardize=false", log_dir=tmp_path / "log", checkpoint_dir=tmp_path / "ck", **opts
    )
    assert b.resumed["updates_at_checkpoint"] == 10 and b.resumed["replayed"] == 0
    second = run(b, 10, 24)
    assert first + second == straight
    assert b.policy_digest() == digest_straight
    b.close()


CRASH_SCRIPT = textwrap.dedent("""
    import os, signal, sys, json
    sys.path.insert(0, {tests!r})
    from _controller_helpers import FakeSpeculator
    from adaptspec import AdaptiveController
    c = AdaptiveController(FakeSpeculator(), "linucb:standardize=false", variant="A", log_dir={log!r},
                           checkpoint_dir={ck!r}, checkpoint_every=4, checkpoint_interval_s=None, roll_rows=5)
    for i in range({n}):
        g = c.generate([i % 13 + 1, i % 7 + 20, i % 5 + 40, i], max_new_tokens=16)
        print(json.dumps({{"ack": g.decision.decision_id}}), flush=True)
    if {sync}:
        c.sync()
        print(json.dumps({{"digest": c.policy_digest()}}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("sync", [True, False])
def test_sigkill_loses_no_acknowledged_decision_and_resumes_exactly(tmp_path, sync):
    log, ck = tmp_path / "log", tmp_path / "ck"
    script = CRASH_SCRIPT.format(tests=str(HERE), log=str(log), ck=str(ck), n=13, sync=sync)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    acked = [x["ack"] for x in lines if "ack" in x]
    assert len(acked) == 13
    assert journal_rows(log), "the crash should leave journal rows not yet rolled into a part"
    c = AdaptiveController(
        FakeSpeculator(),
        "linucb:standardize=false",
        variant="A",
        log_dir=log,
        checkpoint_dir=ck,
        checkpoint_every=4,
        checkpoint_interval_s=None,
    )
    try:
        ids = set(DecisionLog.read(log).table.column("decision_id").to_pylist())
        assert set(acked) <= ids and len(ids) == 13
        assert not journal_rows(log)  # recovered into a part at start
        r = c.resumed
        assert (
            r["checkpoint"] is not None and 4 <= r["updates_at_checkpoint"] <= 13
        )  # batches of updates vary
        assert r["updates_at_checkpoint"] + r["replayed"] == 13
        digest = c.policy_digest()
        assert (digest, 13) == replayed_digest(log, "linucb:standardize=false", "A")
        if sync:
            assert digest == [x["digest"] for x in lines if "digest" in x][0]
    finally:
        c.close()


def test_resume_refuses_a_checkpoint_that_does_not_fit(tmp_path):
    spec = FakeSpeculator()
    with AdaptiveController(spec, "linucb:standardize=false", variant="A", checkpoint_dir=tmp_path) as c:
        c.generate(prompt(0), max_new_tokens=8)
    with pytest.raises(AdaptspecError, match="variant 'A'"):
        AdaptiveController(spec, "linucb:standardize=false", variant="B", checkpoint_dir=tmp_path)
    with pytest.raises(AdaptspecError, match="arms"):
        AdaptiveController(
            spec, "linucb:standardize=false", variant="A", arms=[1, 4], checkpoint_dir=tmp_path
        )
    with pytest.raises(AdaptspecError, match="linucb"):
        AdaptiveController(spec, "ucb", variant="A", checkpoint_dir=tmp_path)
    # resume=False starts afresh
    with AdaptiveController(
        spec, "linucb:standardize=false", variant="A", checkpoint_dir=tmp_path, resume=False
    ) as c:
        assert c.stats()["updates"] == 0


def test_checkpoint_now_and_write_failures_are_counted(tmp_path):
    spec = FakeSpeculator()
    with AdaptiveController(spec, "ucb", checkpoint_dir=tmp_path / "ck") as c:
        c.generate(prompt(0), max_new_tokens=8)
        path = c.checkpoint()
        assert path is not None and read_checkpoint(path)["updates"] == 1
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(AdaptspecError, match="cannot keep checkpoints here"):  # refused at start, not later
        AdaptiveController(spec, "ucb", checkpoint_dir=blocker / "ck")
    later = tmp_path / "later"
    with AdaptiveController(spec, "ucb", checkpoint_dir=later, checkpoint_every=1) as c:
        later.rmdir()
        later.write_text("the directory went away after the start")
        g = c.generate(prompt(0), max_new_tokens=8)  # requests go on when checkpoints fail
        c.sync()
        deadline = time.time() + 5
        while c.stats()["checkpoint_errors"] == 0 and time.time() < deadline:
            time.sleep(0.05)
        s = c.stats()
        assert s["checkpoint_errors"] >= 1 and g.reward is not None and "checkpoint" in s["last_error"]


# ============================================================================ featurizer
def test_featurizer_maps_features_and_checks_them(tmp_path):
    from adaptspec.policies.featurizer import Featurizer

    spec = FakeSpeculator(dim=6)
    X = np.stack([spec.prefill(prompt(i)).features for i in range(50)])
    f = Featurizer.fit(X, dim=3, keep=[0])
    with AdaptiveController(spec, "linucb:standardize=false", featurizer=f, log_dir=tmp_path) as c:
        g = c.generate(prompt(7), max_new_tokens=8)
        with pytest.raises(AdaptspecError, match="6"):
            c.decide(np.ones(5))
    row = DecisionLog.read(tmp_path).table.to_pylist()[0]
    assert np.array_equal(
        np.asarray(row["features"], np.float32), f(spec.prefill(prompt(7)).features).astype(np.float32)
    )
    assert g.decision.block_size in ARMS
    pol = LinUCB(ARMS, standardize=False, dim=3)
    with pytest.raises(AdaptspecError, match="expects 3"):
        AdaptiveController(spec, pol, featurizer=Featurizer.identity(6))


# ============================================================================ bad input
def test_bad_input_gets_clear_errors(tmp_path):
    spec = FakeSpeculator()
    with pytest.raises(AdaptspecError, match="max_block_size"):
        AdaptiveController(spec, "fixed:16", arms=[4, 16, 32])
    with pytest.raises(AdaptspecError, match="fallback block size 5"):
        AdaptiveController(spec, "fixed:4", fallback_block_size=5)
    with pytest.raises(AdaptspecError, match="has no prefill"):
        AdaptiveController(object(), "fixed:4")
    with pytest.raises(AdaptspecError, match="unknown policy"):
        AdaptiveController(spec, "no-such-policy")
    with pytest.raises(AdaptspecError, match="decide_timeout_s"):
        AdaptiveController(spec, "fixed:4", decide_timeout_s=0)
    with AdaptiveController(spec, "linucb", log_dir=tmp_path) as c:
        with pytest.raises(AdaptspecError, match="NaN"):
            c.decide(np.array([1.0, np.nan, 0.0, 0.0]))
        with pytest.raises(AdaptspecError, match="contextual"):
            c.decide(None)
        with pytest.raises(AdaptspecError, match="outcome or a reward"):
            c.feedback("x")
        with pytest.raises(AdaptspecError, match="finite"):
            c.feedback("x", reward=float("inf"))
        with pytest.raises(AdaptspecError, match="Outcome"):
            c.feedback("x", outcome="tokens")
        with pytest.raises(AdaptspecError, match="max_new_tokens"):
            c.generate(prompt(0), max_new_tokens=0)
        with pytest.raises(AdaptspecError, match="another writer"):
            AdaptiveController(spec, "fixed:4", log_dir=tmp_path)  # same variant (None), same log
    with pytest.raises(AdaptspecError, match="closed"):
        c.decide(np.zeros(4))


def test_a_decode_error_propagates_and_the_decision_is_logged(tmp_path):
    spec = FakeSpeculator()

    def boom(*a, **k):
        raise RuntimeError("decoder crashed")

    spec.decode = boom
    with AdaptiveController(spec, "fixed:4", log_dir=tmp_path) as c:
        with pytest.raises(RuntimeError, match="decoder crashed"):
            c.generate(prompt(0), max_new_tokens=8)
        assert c.stats()["feedback"]["decode_error"] == 1 and c.stats()["pending"] == 0
    row = DecisionLog.read(tmp_path).table.to_pylist()[0]
    assert row["reward"] is None and row["block_size"] == 4


def test_close_waits_for_running_requests(tmp_path):
    c = AdaptiveController(FakeSpeculator(sleep_s=0.4), "fixed:4", log_dir=tmp_path)
    out = []
    t = threading.Thread(target=lambda: out.append(c.generate(prompt(0), max_new_tokens=8)))
    t.start()
    time.sleep(0.1)  # the request is decoding
    c.close()
    t.join()
    assert out and out[0].reward is not None
    assert DecisionLog.read(tmp_path).table.column("reward").to_pylist() == [out[0].reward]
    with pytest.raises(AdaptspecError, match="closed"):
        c.generate(prompt(0), max_new_tokens=8)


def test_a_refused_prompt_is_a_prefill_error():
    from adaptspec.control.controller import PrefillError

    spec = FakeSpeculator()

    def refuse(prompt_ids, **kw):
        raise AdaptspecError("prompt has token ids outside 0..95")

    spec.prefill = refuse
    with AdaptiveController(spec, "fixed:4") as c:
        with pytest.raises(PrefillError, match="outside 0..95"):
            c.generate([500], max_new_tokens=4)
        assert c.stats()["decisions"] == 0


def test_close_logs_pending_decisions_as_dropped(tmp_path):
    spec = FakeSpeculator()
    c = AdaptiveController(spec, "fixed:4", log_dir=tmp_path)
    d = c.decide(spec.prefill(prompt(0)).features)
    c.close()
    c.close()  # idempotent
    rows = DecisionLog.read(tmp_path).table.to_pylist()
    assert [r["decision_id"] for r in rows] == [d.decision_id] and rows[0]["reward"] is None


# ============================================================================ the log writer
def row(i: int, variant: str = "A") -> dict:
    return {
        "decision_id": f"d{i}",
        "time": 1.7e9 + i,
        "policy": "fixed:4",
        "variant": variant,
        "block_size": 4,
        "propensity": 1.0,
        "probs": [0.0, 1.0],
        "arms": [1, 4],
        "reward": float(i),
        "features": [0.5, float(i)],
    }


def test_writer_rolls_parts_and_keeps_order(tmp_path):
    with DecisionLogWriter(tmp_path, "A", roll_rows=3) as w:
        for i in range(8):
            w.append(row(i))
        assert len(DecisionLog(tmp_path).parts()) == 2 and len(w.pending_rows()) == 2
        assert [r["decision_id"] for r in log_rows(tmp_path)] == [f"d{i}" for i in range(8)]
    assert [r["decision_id"] for r in DecisionLog.read(tmp_path).table.to_pylist()] == [
        f"d{i}" for i in range(8)
    ]
    assert not list(tmp_path.glob(".journal-*"))


def test_writer_rejects_bad_rows_and_writes_nothing(tmp_path):
    with DecisionLogWriter(tmp_path, "A") as w:
        for bad, msg in (
            ({"propensity": 0.5}, "propensity"),
            ({"block_size": 8}, "not one of"),
            ({"probs": [0.2, 0.2]}, "sum to 1"),
            ({"reward": float("nan")}, "reward"),
            ({"junk": 1}, "unknown decision-log column"),
        ):
            with pytest.raises(AdaptspecError, match=msg):
                w.append({**row(0), **bad})
        assert w.pending_rows() == []
    with pytest.raises(AdaptspecError, match="name"):
        DecisionLogWriter(tmp_path, "bad name")


def test_writer_recovers_a_dead_writers_journal(tmp_path):
    w = DecisionLogWriter(tmp_path, "A", roll_rows=100)
    for i in range(4):
        w.append(row(i))
    seg = next(tmp_path.glob(".journal-A-*.jsonl"))
    # simulate a crash: torn last line, and a part already holding row d0 (died between part and delete)
    with open(seg, "a") as f:
        f.write('{"decision_id": "torn", "ti')
    DecisionLog(tmp_path).append([row(0)])
    w._release()  # the process "dies": its lock goes, its journal stays
    w2 = DecisionLogWriter(tmp_path, "A")
    assert w2.recovered == 3
    ids = DecisionLog.read(tmp_path).table.column("decision_id").to_pylist()
    assert sorted(ids) == ["d0", "d1", "d2", "d3"]
    w2.close()
