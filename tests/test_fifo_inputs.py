"""A FIFO (named pipe) where a file is expected is refused in one line, never read.

Opening a FIFO for reading blocks until something opens it for writing: a reader that opened
one would hang forever. Every read runs in a thread here; one that has not finished after
10 s fails the test (and the FIFO is then opened for writing, which lets the stuck reader go).
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from adaptspec.errors import AdaptspecError
from adaptspec.traces import DecisionLog
from adaptspec.traces.dense import DenseTraceSet
from adaptspec.traces.log_writer import journal_rows, log_rows

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")


def refused(fn, fifo: Path, timeout: float = 10.0) -> str:
    """The one-line AdaptspecError ``fn()`` raises, asserting it raised within ``timeout`` seconds."""
    out: dict = {}

    def call() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        try:  # let the blocked reader go: a writer opens and closes the pipe
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as e:
            assert e.errno == errno.ENXIO  # nobody reading any more
        raise AssertionError(f"reading {fifo} did not finish in {timeout} s (it opened the FIFO)")
    err = out.get("error")
    assert isinstance(err, AdaptspecError), f"expected an AdaptspecError, got {out!r}"
    msg = str(err)
    assert "\n" not in msg and str(fifo) in msg and "not a regular file" in msg and "FIFO" in msg, msg
    return msg


def decision_rows(n: int) -> list[dict]:
    return [{"decision_id": f"d-{i}", "time": 1.7e9 + i, "policy": "ucb", "variant": "A", "block_size": 4,
             "propensity": 1.0, "probs": [0.0, 0.0, 1.0], "arms": [1, 2, 4], "reward": 1.0} for i in range(n)]


def test_a_dense_trace_sets_meta_json_that_is_a_fifo(tmp_path):
    d = tmp_path / "dense"
    d.mkdir()
    os.mkfifo(d / "meta.json")
    assert "dense trace set's meta.json" in refused(lambda: DenseTraceSet.open(d), d / "meta.json")
    assert "dense trace set's meta.json" in refused(lambda: DenseTraceSet.create(d, {"max_block_size": 4}), d / "meta.json")


def test_a_dense_trace_sets_part_that_is_a_fifo(tmp_path):
    ds = DenseTraceSet.create(tmp_path / "dense", {"max_block_size": 4, "max_new_tokens": 8})
    os.mkfifo(ds.path / "part-00000.parquet")
    refused(ds.table, ds.path / "part-00000.parquet")
    refused(ds.request_ids, ds.path / "part-00000.parquet")


def test_a_decision_log_part_that_is_a_fifo(tmp_path):
    log = tmp_path / "log"
    DecisionLog(log).append(decision_rows(2))
    fifo = log / "part-99999999999999999999-1-000000.parquet"  # the newest part
    os.mkfifo(fifo)
    refused(lambda: DecisionLog.read(log), fifo)
    refused(lambda: log_rows(log), fifo)
    refused(lambda: DecisionLog(log).append(decision_rows(3)[2:]), fifo)  # a writer reads every part's ids first
    assert len([p for p in log.iterdir() if p.is_file()]) == 1  # nothing was written


def test_a_single_file_decision_log_that_is_a_fifo(tmp_path):
    fifo = tmp_path / "log.parquet"
    os.mkfifo(fifo)
    with pytest.raises(AdaptspecError, match="not a decision log"):  # neither a file nor a directory of parts
        DecisionLog.read(fifo)


def test_a_journal_segment_that_is_a_fifo(tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    fifo = log / ".journal-w-00000001.jsonl"
    os.mkfifo(fifo)
    assert "journal segment" in refused(lambda: journal_rows(log), fifo)


def test_a_trace_sets_files_that_are_fifos_are_refused_by_the_shared_check(tmp_path):
    from adaptspec.traces.traceset import TraceSet

    ts = tmp_path / "ts"
    ts.mkdir()
    os.mkfifo(ts / "meta.json")
    assert "trace set's meta.json" in refused(lambda: TraceSet.read(ts), ts / "meta.json")


def test_a_fifo_part_in_a_live_servers_log_makes_ab_a_503_not_a_hang(tmp_path):
    from fastapi.testclient import TestClient

    from adaptspec.serving import CompletionService, ServerLimits, create_app
    from adaptspec.serving.tiny import tiny_speculator

    spec, codec = tiny_speculator(0)
    svc = CompletionService.build(spec, {"A": "fixed:4"}, codec=codec, log_dir=tmp_path / "log",
                                  limits=ServerLimits(max_context=512, vocab_size=128))
    with TestClient(create_app(svc)) as client:
        fifo = tmp_path / "log" / "part-99999999999999999999-1-000000.parquet"
        os.mkfifo(fifo)  # appeared after the server started (it checks its log at start)
        r = refused_in_time(lambda: client.get("/ab"), fifo)
        assert r.status_code == 503 and str(fifo) in r.json()["error"]["message"], r.text
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def refused_in_time(fn, fifo: Path, timeout: float = 10.0):
    """``fn()``'s value, asserting it came within ``timeout`` seconds."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        raise AssertionError(f"the request did not finish in {timeout} s (it opened {fifo})")
    return out["value"]
