"""The parts of the composed controller, each alone, and the one Decision check at the boundary.

Expected values come from a second method: a fresh policy fed the same rewards directly
(``Policy.update``), a policy deciding without the decider, the order rows were handed in.
"""

from __future__ import annotations

import ast
import inspect
import threading
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from _controller_helpers import FakeSpeculator
from adaptspec import AdaptiveController, AdaptspecError
from adaptspec.control import block_sizes
from adaptspec.control.block_sizes import fallback_decision
from adaptspec.control.book import DecisionBook, DecisionLogError
from adaptspec.control.checkpointer import Checkpointer
from adaptspec.control.config import ControllerConfig
from adaptspec.control.context import Contexts
from adaptspec.control.decider import Decider, copy_policy
from adaptspec.control.policy_checkpoint import state_digest
from adaptspec.control.updates import Learner, Update, UpdateQueue, UpdateWorker
from adaptspec.policies import make_policy
from adaptspec.policies.base import Policy
from adaptspec.speculator import Decision, Outcome, Round
from adaptspec.traces import log_writer
from adaptspec.traces.log_writer import DecisionLogWriter

ARMS = (1, 2, 4, 8)
CONTROL = Path(block_sizes.__file__).parent


class Answers(Policy):
    """A policy whose decision is whatever block size (or probabilities) the test sets."""

    name = "answers"

    def __init__(self, arms, block_size=4, probs=None, seed=None):
        self.block_size, self.fixed_probs = block_size, probs
        super().__init__(arms, seed=seed)

    def _probs(self, context):
        p = np.zeros(len(self.arms))
        p[self.arms.index(4)] = 1.0
        return p

    def decide(self, context=None):
        probs = np.zeros(len(self.arms)) if self.fixed_probs is None else np.asarray(self.fixed_probs, float)
        if self.fixed_probs is None and self.block_size in self.arms:
            probs[self.arms.index(self.block_size)] = 1.0
        elif self.fixed_probs is None:
            probs[self.arms.index(4)] = 1.0
        return Decision(self.block_size, 1.0, probs, self.arms, "answers")

    def _update(self, context, arm, reward):
        pass


def decider_for(policy, timeout_s=1.0, contextual=False):
    return Decider(
        copy_policy(policy),
        Contexts(None, contextual=contextual, policy_label="p"),
        arms=ARMS,
        fallback_block_size=2,
        timeout_s=timeout_s,
    )


# ============================================================================ config
def test_config_keeps_the_settings_as_given_and_is_the_controllers_keyword_arguments():
    c = ControllerConfig(decide_timeout_s=1, log_dir="runs/log", arms=(1, 4))
    assert (
        c.decide_timeout_s == 1
        and type(c.decide_timeout_s) is int
        and c.log_dir == "runs/log"
        and c.arms == (1, 4)
    )
    params = inspect.signature(AdaptiveController.__init__).parameters
    keywords = {n: p.default for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == {f.name: f.default for f in fields(ControllerConfig)}


@pytest.mark.parametrize(
    "setting,value",
    [
        ("decide_timeout_s", 0),
        ("decide_timeout_s", float("nan")),
        ("decide_timeout_s", "fast"),
        ("feedback_timeout_s", -1.0),
        ("checkpoint_every", 0),
        ("checkpoint_every", 2.5),
        ("checkpoint_every", True),
        ("checkpoint_interval_s", 0),
        ("roll_rows", 0),
        ("roll_interval_s", -5),
        ("blas_threads", 0),
        ("redecide_every", 0),
        ("fallback_block_size", 0),
        ("arms", []),
        ("arms", [1, 2.5]),
        ("arms", "1,2"),
        ("seed", 1.5),
        ("reward", 3),
        ("variant", 7),
        ("round_rule", 3),
    ],
)
def test_config_refuses_each_bad_setting_with_one_error_naming_it(setting, value):
    with pytest.raises(AdaptspecError, match=setting):
        ControllerConfig(**{setting: value})


def test_config_refuses_a_round_rule_with_redecisions():
    with pytest.raises(AdaptspecError, match="cannot be combined"):
        ControllerConfig(round_rule="history", redecide_every=4)


# ============================================================================ contexts
def test_contexts_check_features_or_map_them_with_the_featurizer():
    from adaptspec.policies.featurizer import Featurizer

    raw = Contexts(None, contextual=True, policy_label="linucb", raw_width=3)
    x = raw(np.array([1, 2, 3], dtype=np.int64))
    assert x.dtype == np.float64 and x.tolist() == [1.0, 2.0, 3.0]
    for bad, msg in (
        (np.array([1.0, np.inf]), "NaN or infinite"),
        (np.ones((2, 2)), "1-D"),
        ("abc", "vector"),
    ):
        with pytest.raises(AdaptspecError, match=msg):
            raw(bad)
    rng = np.random.default_rng(0)
    f = Featurizer.fit(rng.normal(size=(40, 5)), dim=2)
    mapped = Contexts(f, contextual=True, policy_label="linucb")
    v = rng.normal(size=5)
    assert np.array_equal(mapped(v), f(v)) and mapped.width == 2
    free = Contexts(None, contextual=False, policy_label="ucb")
    assert free(None) is None and free.for_policy(np.ones(3)) is None


# ============================================================================ the decider
def test_the_decider_decides_with_the_snapshot_and_checks_what_it_gets():
    pol = Answers(ARMS, block_size=np.int64(8))
    d = decider_for(pol)
    try:
        got = d.decide(None)
        assert (
            got.block_size == 8
            and type(got.block_size) is int
            and got.decision_id
            and got.probs.dtype == np.float64
        )
        assert d.decisions == 1 and sum(d.fallbacks.values()) == 0
    finally:
        d.close()


def test_the_decider_falls_back_when_the_policy_raises_or_is_late():
    class Raises(Answers):
        def decide(self, context=None):
            raise RuntimeError("bug")

    class Late(Answers):
        def decide(self, context=None):
            time.sleep(0.3)
            return super().decide(context)

    for pol, reason in ((Raises(ARMS), "error"), (Late(ARMS), "timeout")):
        d = decider_for(pol, timeout_s=0.05)
        try:
            got = d.decide(None)
            assert (got.block_size, got.propensity, got.extras["fallback"]) == (2, 1.0, reason)
            assert d.fallbacks[reason] == 1
        finally:
            d.close()


def test_published_copies_carry_the_random_generator_over():
    """Decisions across publishes draw the same random stream as one policy deciding alone."""
    pol = make_policy("random", ARMS, seed=3)
    reference = copy_policy(pol)
    d = decider_for(pol)
    try:
        got = []
        for i in range(30):
            got.append(d.decide(None).block_size)
            if i % 7 == 0:
                d.publish(copy_policy(pol))  # the same learnt state, a fresh generator state
        assert got == [reference.decide(None).block_size for _ in range(30)]
    finally:
        d.close()


# ============================================================================ the book
class ListLog:
    """A decision-log writer that keeps rows in memory (and can be told to fail)."""

    def __init__(self):
        self.rows, self.fail, self.checked = [], False, []

    def append(self, row, *, checked=False):
        if self.fail:
            raise AdaptspecError("disk full")
        self.rows.append(row)
        self.checked.append(checked)


def outcome(b=4, tau=3):
    return Outcome([1] * tau, [Round(b, tau, 0.001, 0.002)], decode_s=0.003)


def opened(book, did, b=4):
    book.open(fallback_decision(b, ARMS, "error", did), np.ones(2), request_id=f"r-{did}")


def test_the_book_settles_each_decision_once_and_counts_every_way_out():
    q, lg = UpdateQueue(), ListLog()
    book = DecisionBook(q, reward_fn=lambda o: float(o.new_tokens), log_writer=lg, feedback_timeout_s=0.05)
    for did in ("a", "b", "c", "d"):
        opened(book, did)
    assert book.feedback("a", outcome(), None) == ("applied", 3.0)
    assert book.feedback("a", outcome(), None) == ("duplicate", None)
    assert book.feedback("b", Outcome([], [], 0.0), None) == ("applied", 0.0)  # no tokens: reward 0, defined
    book.abandon("c", "decode_error")
    time.sleep(0.1)
    book.expire()
    assert book.feedback("d", outcome(), None) == ("late", None)
    assert book.feedback("never", outcome(), None) == ("unknown", None)
    counts = {k: v for k, v in book.counts.items() if v}
    assert counts == {"applied": 2, "duplicate": 1, "decode_error": 1, "expired": 1, "late": 1, "unknown": 1}
    assert [r["decision_id"] for r in lg.rows] == ["a", "b", "c", "d"] and all(lg.checked)
    assert [r["reward"] for r in lg.rows] == [3.0, 0.0, None, None] and q.enqueued == 2


def test_an_undefined_reward_is_logged_without_one_and_not_learnt():
    q, lg = UpdateQueue(), ListLog()

    def tokens_per_s(o):
        return o.new_tokens / o.decode_s  # no round ran: ZeroDivisionError

    book = DecisionBook(q, reward_fn=tokens_per_s, log_writer=lg)
    opened(book, "a")
    assert book.feedback("a", Outcome([], [], 0.0), None) == ("no_reward", None)
    assert q.enqueued == 0 and lg.rows[0]["reward"] is None


def test_the_book_logs_and_queues_in_one_order_under_concurrency():
    q, lg = UpdateQueue(), ListLog()
    book = DecisionBook(q, reward_fn=lambda o: 1.0, log_writer=lg)
    ids = [f"d{i}" for i in range(200)]
    for did in ids:
        opened(book, did)

    def settle(part):
        for did in part:
            book.feedback(did, None, float(int(did[1:])))

    threads = [threading.Thread(target=settle, args=(ids[k::4],)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queued = []
    while (u := q.get()) is not None:
        queued.append(u.decision_id)
    assert queued == [r["decision_id"] for r in lg.rows] and sorted(queued) == sorted(ids)


def test_a_row_that_cannot_be_logged_is_not_learnt():
    q, lg = UpdateQueue(), ListLog()
    book = DecisionBook(q, reward_fn=lambda o: 1.0, log_writer=lg)
    opened(book, "a")
    lg.fail = True
    with pytest.raises(DecisionLogError, match="disk full"):
        book.feedback("a", None, 2.0)
    assert q.enqueued == 0 and book.counts["log_error"] == 1 and book.log_errors == 1


# ============================================================================ learner and update worker
class Published:
    def __init__(self):
        self.copies = []

    def publish(self, policy):
        self.copies.append(policy)

    def rng_state(self):
        raise RuntimeError("no decisions here")


def rewards(n, seed=0):
    rng = np.random.default_rng(seed)
    return [Update(rng.normal(size=3), int(rng.choice(ARMS)), float(rng.normal()), f"d{i}") for i in range(n)]


def test_the_update_worker_applies_in_queue_order_and_publishes():
    us = rewards(40)
    ref = make_policy("linucb:standardize=false", ARMS, seed=0)
    for u in us:
        ref.update(u.context, u.block_size, u.reward)
    q, pub = UpdateQueue(), Published()
    book = DecisionBook(q, reward_fn=lambda o: 1.0, feedback_timeout_s=None)
    learner = Learner(make_policy("linucb:standardize=false", ARMS, seed=0), contextual=True)
    w = UpdateWorker(learner, q, decider=pub, book=book)
    w.start()
    for u in us:
        q.put(u)
    w.sync(10)
    assert pub.copies and state_digest(pub.copies[-1]) == state_digest(ref)
    assert pub.copies[-1] is not learner.policy  # decisions get a copy, never the learning policy
    w.stop()
    assert learner.updates == 40 and learner.last_decision_id == "d39" and not w.is_alive()


def test_a_failing_update_is_counted_and_the_worker_goes_on():
    learner = Learner(make_policy("ucb", ARMS), contextual=False)
    learner.apply(Update(None, 3, 1.0, "bad"))  # not an arm: the policy refuses it
    learner.apply(Update(None, 4, 1.0, "good"))
    ref = make_policy("ucb", ARMS)
    ref.update(None, 4, 1.0)
    assert learner.errors == 1 and learner.updates == 2 and state_digest(learner.policy) == state_digest(ref)


# ============================================================================ the checkpointer
def test_checkpoint_then_resume_with_the_log_after_it_equals_the_whole_log_applied(tmp_path):
    us = rewards(30, seed=1)
    log_dir = tmp_path / "log"
    with DecisionLogWriter(log_dir, "A") as w:
        for u in us:
            probs = np.zeros(len(ARMS))
            probs[ARMS.index(u.block_size)] = 1.0
            w.append(
                {
                    "decision_id": u.decision_id,
                    "policy": "p",
                    "variant": "A",
                    "block_size": u.block_size,
                    "propensity": 1.0,
                    "probs": probs,
                    "arms": list(ARMS),
                    "reward": u.reward,
                    "features": u.context.astype(np.float32),
                }
            )
    ref = make_policy("linucb:standardize=false", ARMS, seed=0)
    for u in us:  # what was logged: float32 contexts
        ref.update(u.context.astype(np.float32).astype(np.float64), u.block_size, u.reward)
    meta = {
        "variant": "A",
        "policy_label": "linucb",
        "policy_spec": "linucb:standardize=false",
        "arms": list(ARMS),
        "seed": 0,
        "reward": "tau",
    }
    first = Learner(make_policy("linucb:standardize=false", ARMS, seed=0), contextual=True)
    ck = Checkpointer(tmp_path / "ck", meta=meta, log_dir=log_dir, every=10, interval_s=None)
    info = ck.resume(first)  # no checkpoint yet: the whole log is replayed
    assert info == {"checkpoint": None, "updates_at_checkpoint": 0, "replayed": 30}
    assert state_digest(first.policy) == state_digest(ref)
    partial = Learner(make_policy("linucb:standardize=false", ARMS, seed=0), contextual=True)
    for u in us[:12]:
        partial.apply(
            Update(u.context.astype(np.float32).astype(np.float64), u.block_size, u.reward, u.decision_id)
        )
    assert not ck.due(9) and ck.due(12)
    ck.write(partial.policy, partial.updates, partial.last_decision_id)
    resumed = Learner(make_policy("linucb:standardize=false", ARMS, seed=0), contextual=True)
    info = Checkpointer(tmp_path / "ck", meta=meta, log_dir=log_dir).resume(resumed)
    assert info["updates_at_checkpoint"] == 12 and info["replayed"] == 18 and resumed.updates == 30
    assert state_digest(resumed.policy) == state_digest(ref)
    with pytest.raises(AdaptspecError, match="variant 'A'"):
        Checkpointer(tmp_path / "ck", meta={**meta, "variant": "B"}).resume(
            Learner(make_policy("linucb", ARMS), contextual=True)
        )


# ============================================================================ one Decision check, at the boundary
BAD = [
    (0, "not one of"),
    (3.5, "not an integer"),
    (True, "not an integer"),
    (5, "not one of"),
    (float("nan"), "not an integer"),
    (np.float64(4.0), "not an integer"),
]


@pytest.mark.parametrize("block_size,why", BAD)
def test_a_bad_decision_is_refused_where_it_enters(tmp_path, caplog, block_size, why):
    pol = Answers(ARMS, block_size=block_size)
    with AdaptiveController(FakeSpeculator(), pol, log_dir=tmp_path, fallback_block_size=2) as c:
        g = c.generate([1, 2, 3], max_new_tokens=8)
        assert (g.decision.block_size, g.fallback, g.decision.policy) == (2, "invalid", "fallback:2")
        assert c.stats()["fallbacks"] == {"error": 0, "timeout": 0, "invalid": 1}
        assert all(r.block_size <= 2 for r in g.outcome.rounds) and g.reward is not None
    assert why in caplog.text
    from adaptspec.traces import DecisionLog

    assert DecisionLog.read(tmp_path).table.column("block_size").to_pylist() == [2]


def test_bad_probabilities_or_another_arm_set_are_refused_too():
    for pol in (
        Answers(ARMS, 4, probs=[0.5, 0.5, 0.5, 0.5]),
        Answers(ARMS, 4, probs=[0.0, 0.0, np.nan, 1.0]),
    ):
        d = decider_for(pol)
        try:
            assert d.decide(None).extras["fallback"] == "invalid"
        finally:
            d.close()
    other = Answers((1, 4), 4)
    d = decider_for(other)
    try:
        assert d.decide(None).extras["fallback"] == "invalid"
    finally:
        d.close()


def test_the_decision_is_checked_once_per_decision_and_never_downstream(tmp_path, monkeypatch):
    calls = {"boundary": 0, "log_writer": 0}
    real = block_sizes.decision_fault

    def counting(where):
        def f(*a):
            calls[where] += 1
            return real(*a)

        return f

    monkeypatch.setattr(block_sizes, "decision_fault", counting("boundary"))
    monkeypatch.setattr(log_writer, "decision_fault", counting("log_writer"))
    spec = FakeSpeculator()
    with AdaptiveController(spec, "linucb", log_dir=tmp_path, redecide_every=2, roll_rows=3) as c:
        gs = [c.generate([i, 2, 3], max_new_tokens=12) for i in range(4)]
        d = c.decide(spec.prefill([9, 9]).features)
        c.feedback(d.decision_id, reward=1.0)
        c.sync()
    decisions = sum(len(g.decisions) for g in gs) + 1
    assert decisions > 5 and calls == {"boundary": decisions, "log_writer": 0}


def test_the_control_package_has_one_decision_check_called_in_one_place():
    """Statically: ``check_decision`` is called once, by the decider; ``decision_fault`` only by
    the check; no module of the controller casts a decision's block size."""
    calls: dict[str, list[str]] = {}
    casts = []
    for path in sorted(CONTROL.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                if name in ("check_decision", "decision_fault", "valid_decision"):
                    calls.setdefault(name, []).append(path.name)
                if (
                    name in ("int", "float")
                    and node.args
                    and isinstance(node.args[0], ast.Attribute)
                    and node.args[0].attr == "block_size"
                    and path.name != "block_sizes.py"
                ):
                    casts.append(path.name)
    assert calls == {"check_decision": ["decider.py"], "decision_fault": ["block_sizes.py"]}
    assert casts == []


class _ThreadRecordingPolicy:
    """A context-free policy over (1, 4) that records the thread it decides on and can be slow or fail."""

    arms = (1, 4)
    contextual = False

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.delay_s, self.fail, self.threads = delay_s, fail, []
        self.rng = np.random.default_rng(0)

    def decide(self, ctx):
        from adaptspec.speculator import Decision

        self.threads.append(threading.get_ident())
        if self.fail:
            raise RuntimeError("boom")
        time.sleep(self.delay_s)
        return Decision(4, 1.0, np.array([0.0, 1.0]), (1, 4), "recording")


def _decider(policy, on_caller: bool) -> Decider:
    return Decider(
        policy,
        Contexts(None, contextual=False, policy_label="recording"),
        arms=(1, 4),
        fallback_block_size=1,
        timeout_s=0.05,
        on_caller=on_caller,
    )


def test_a_decider_on_the_caller_decides_on_the_calling_thread_and_uses_a_late_decision():
    fast = _ThreadRecordingPolicy()
    d = _decider(fast, on_caller=True)
    assert d.decide(d.context(None)).block_size == 4
    assert fast.threads == [threading.get_ident()]  # no hand-off to a decision thread
    slow = _ThreadRecordingPolicy(delay_s=0.12)
    d = _decider(slow, on_caller=True)
    assert d.decide(d.context(None)).block_size == 4  # over its 0.05 s budget, used all the same
    assert (d.late, d.fallbacks["timeout"]) == (1, 0)
    failing = _decider(_ThreadRecordingPolicy(fail=True), on_caller=True)
    got = failing.decide(failing.context(None))
    assert (got.block_size, got.extras["fallback"], failing.fallbacks["error"]) == (1, "error", 1)
    assert d.rng_state()["bit_generator"] == "PCG64" and d.snapshot() is not slow  # a private copy
    d.close()


def test_a_decider_with_its_thread_still_cuts_a_late_decision_off():
    slow = _ThreadRecordingPolicy(delay_s=0.3)
    d = _decider(slow, on_caller=False)
    got = d.decide(d.context(None))
    assert (got.block_size, got.extras["fallback"], d.fallbacks["timeout"], d.late) == (1, "timeout", 1, 0)
    d.close()


class _Blocking(_ThreadRecordingPolicy):
    """Decides only once ``release`` is set; ``returned`` is set when it has."""

    def __init__(self) -> None:
        super().__init__()
        self.release, self.returned = threading.Event(), threading.Event()

    def decide(self, ctx):
        self.release.wait()
        try:
            return super().decide(ctx)
        finally:
            self.returned.set()


def test_a_late_decision_holding_the_thread_gives_every_later_decision_its_fallback_at_once():
    stuck = _Blocking()
    d = Decider(
        stuck,
        Contexts(None, contextual=False, policy_label="blocking"),
        arms=(1, 4),
        fallback_block_size=1,
        timeout_s=0.5,
    )
    try:
        t0 = time.perf_counter()
        first = d.decide(d.context(None))
        t1 = time.perf_counter()
        later = [d.decide(d.context(None)) for _ in range(5)]
        t2 = time.perf_counter()
        assert t1 - t0 >= 0.5 and first.extras["fallback"] == "timeout"  # waited its budget once
        assert t2 - t1 < 0.5  # queued behind it: 5 x 0.5 s
        assert [g.extras.get("fallback") for g in later] == ["timeout"] * 5
        assert (d.decisions, d.fallbacks["timeout"]) == (6, 6)
        stuck.release.set()
        assert stuck.returned.wait(5)
        time.sleep(0.2)  # the late answer's future settles
        again = d.decide(d.context(None))
        assert (again.block_size, "fallback" in again.extras) == (4, False)  # the policy decides again
        assert len(stuck.threads) == 2  # the 5 behind it were never asked of it
    finally:
        stuck.release.set()
        d.close()


NEVER_RETURNS = """
import threading, numpy as np
from adaptspec.control.context import Contexts
from adaptspec.control.decider import Decider

class Never:
    arms, contextual, rng = (1, 4), False, np.random.default_rng(0)
    def decide(self, ctx):
        threading.Event().wait()

d = Decider(Never(), Contexts(None, contextual=False, policy_label="never"), arms=(1, 4), fallback_block_size=1,
            timeout_s=0.05)
print(d.decide(d.context(None)).extras["fallback"], d.decide(d.context(None)).extras["fallback"], flush=True)
d.close()
"""


def test_a_policy_that_never_returns_does_not_keep_the_process_from_exiting():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", NEVER_RETURNS], capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout.split()) == (0, ["timeout", "timeout"]), out.stderr[-2000:]


def test_decide_on_caller_is_checked_where_it_enters():
    with pytest.raises(AdaptspecError, match="decide_on_caller must be True or False, got 1"):
        ControllerConfig(decide_on_caller=1)
