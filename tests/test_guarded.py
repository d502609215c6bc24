"""GuardedThread (adaptspec/_util/guarded.py): a background thread's failures are logged once, handed to
its owner, restarted, and stop it for good only when they come too often."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from adaptspec._util.guarded import GuardedThread


def run(body, on_failure=None, **kw) -> tuple[GuardedThread, list[str]]:
    told: list[str] = []
    g = GuardedThread("t", body, on_failure or told.append, **kw)
    g.start()
    g.join(10)
    assert not g.alive
    return g, told


def failing(errors):
    """A body that raises the next of ``errors`` each run, then returns."""
    it = iter(errors)

    def body():
        e = next(it, None)
        if e is not None:
            raise e

    return body


def test_a_normal_end_is_not_a_failure():
    g, told = run(lambda: None)
    assert (g.state, g.failures, told) == ("ok", 0, [])


def test_each_failure_is_told_to_the_owner_and_the_body_restarts(caplog):
    caplog.set_level(logging.ERROR, logger="adaptspec.guarded")
    g, told = run(failing([KeyError("replica"), ValueError("x")]), max_failures=3)
    assert told == ["KeyError: 'replica'", "ValueError: x"]
    assert (g.state, g.failures, g.last_error, g.gave_up) == ("degraded", 2, "ValueError: x", False)
    assert [bool(r.exc_info) for r in caplog.records] == [True, True]  # two distinct errors: two tracebacks


def test_the_same_error_again_is_one_line_with_its_count(caplog):
    caplog.set_level(logging.ERROR, logger="adaptspec.guarded")
    g, _ = run(failing([ZeroDivisionError("float division by zero")] * 4), max_failures=10)
    assert [bool(r.exc_info) for r in caplog.records] == [True, False, False, False]
    assert "4 times" in caplog.records[-1].getMessage()


def test_too_many_failures_within_the_window_stop_it_and_spaced_ones_do_not():
    g, told = run(failing([RuntimeError("a")] * 5), max_failures=3, window_s=60)
    assert (g.state, g.failures, len(told), g.gave_up) == ("failed", 3, 3, True)
    calls = []

    def slow_failures():  # three failures 0.2 s apart, with a window of 0.1 s: never 3 within it
        calls.append(1)
        if len(calls) <= 3:
            time.sleep(0.2)
            raise RuntimeError("spaced")

    g, told = run(slow_failures, max_failures=2, window_s=0.1)
    assert (g.gave_up, g.failures, len(calls)) == (False, 3, 4)
    time.sleep(0.15)
    assert g.state == "ok"  # the last failure is older than the window


def test_an_owner_that_cannot_clean_up_stops_it():
    def cannot(message):
        raise OSError("disk gone")

    g, _ = run(failing([RuntimeError("first")]), on_failure=cannot, max_failures=5)
    assert g.state == "failed" and g.gave_up


def test_a_base_exception_in_the_body_is_caught_too():
    g, told = run(failing([KeyboardInterrupt()]), max_failures=3)
    assert told == ["KeyboardInterrupt: "] and g.state == "degraded"


@pytest.mark.parametrize("n", [0, -1, 1.5])
def test_max_failures_must_be_a_positive_int(n):
    with pytest.raises(ValueError, match="max_failures"):
        GuardedThread("t", lambda: None, lambda m: None, max_failures=n)


def test_it_runs_on_its_own_named_daemon_thread():
    seen = []
    g, _ = run(lambda: seen.append((threading.current_thread().name, threading.current_thread().daemon)))
    assert seen == [("t", True)]


# ============================================================================ the watchdog (issue 46, items 2 and 3)
def stuck_body(guard_ref: list, release: threading.Event, seen: list):
    """A body that beats once, then makes no progress until ``release`` (a decode that never returns)."""

    def body():
        guard_ref[0].beat()
        release.wait(60)
        seen.append(guard_ref[0].idle())

    return body


def test_the_join_returns_once_the_stall_is_told_however_long_the_telling_takes():
    # the owner's answer to a stall takes a while (as on a busy host, where the watchdog's thread is
    # late): join_unless_stalled returns after it, never between the stall and the telling
    release, seen, told, ref = threading.Event(), [], [], [None]

    def slow_tell(message):
        time.sleep(0.5)
        told.append(message)

    g = ref[0] = GuardedThread(
        "decoder", stuck_body(ref, release, seen), lambda m: None, stall_s=0.2, on_stall=slow_tell
    )
    g.start()
    g.join_unless_stalled(60)
    assert told == ["no progress for 0.2 s"] and g.failures == 1
    release.set()
    g.join(10)


def test_a_busy_thread_without_progress_is_stalled_told_once_logged_where_and_not_waited_for(caplog):
    caplog.set_level(logging.WARNING, logger="adaptspec.guarded")
    release, seen, told, ref = threading.Event(), [], [], [None]
    g = ref[0] = GuardedThread(
        "decoder", stuck_body(ref, release, seen), lambda m: None, stall_s=0.2, on_stall=told.append
    )
    g.start()
    g.join_unless_stalled(60)  # returns once stalled, though the thread is still alive
    assert g.alive and g.stalled and g.state == "stalled"
    assert told == ["no progress for 0.2 s"]
    assert g.report() == {"state": "stalled", "failures": 1, "last_error": "no progress for 0.2 s"}
    stalls = [r for r in caplog.records if "stalled" in r.getMessage()]
    assert len(stalls) == 1
    assert (
        "in body" in stalls[0].getMessage() and "release.wait(60)" in stalls[0].getMessage()
    )  # where it is stuck
    release.set()
    g.join(10)
    # it moved again: its own idle() says once that it had been stalled (its work was answered)
    assert seen == [True] and not g.stalled and g.state == "degraded" and told == ["no progress for 0.2 s"]


def test_an_idle_thread_is_never_stalled():
    started, release, told = threading.Event(), threading.Event(), []
    ref = [None]

    def body():
        ref[0].idle()  # waiting for work, as long as it takes
        started.set()
        release.wait(60)

    g = ref[0] = GuardedThread("idle", body, lambda m: None, stall_s=0.05, on_stall=told.append)
    g.start()
    started.wait(10)
    g.join(0.5)  # ten stall bounds, waiting: no progress is expected
    assert (g.state, told, g.failures) == ("ok", [], 0)
    release.set()
    g.join(10)


def test_a_failure_of_the_owners_stall_handler_is_logged_and_the_thread_stays_stalled(caplog):
    caplog.set_level(logging.ERROR, logger="adaptspec.guarded")
    release, seen, ref = threading.Event(), [], [None]

    def refuse(message):
        raise RuntimeError("cannot answer")

    g = ref[0] = GuardedThread(
        "t", stuck_body(ref, release, seen), lambda m: None, stall_s=0.1, on_stall=refuse
    )
    g.start()
    g.join_unless_stalled(60)
    assert g.state == "stalled"
    release.set()
    g.join(10)
    assert any("answering the work of a stalled thread failed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("s", [0, -1, float("inf"), float("nan"), True, "5"])
def test_stall_s_must_be_a_positive_number(s):
    with pytest.raises(ValueError, match="stall_s"):
        GuardedThread("t", lambda: None, lambda m: None, stall_s=s)
