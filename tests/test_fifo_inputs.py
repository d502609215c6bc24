"""A FIFO (named pipe) where a file is expected is refused in one line, never read.

Opening a FIFO for reading blocks until something opens it for writing: a reader that opened
one would hang forever. Every read runs in a thread here; one that has not finished after
10 s fails the test (and the FIFO is then opened for writing, which lets the stuck reader go).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from adaptspec.errors import AdaptspecError
from adaptspec.traces import DecisionLog
from adaptspec.traces.dense import DenseTraceSet
from adaptspec.traces.log_writer import journal_rows, log_rows

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")


def outcome_in_time(fn, fifo: Path, timeout: float = 10.0) -> dict:
    """``{"value": ...}`` or ``{"error": ...}`` of ``fn()``, asserting it finished within ``timeout``
    seconds (else a writer opens and closes ``fifo`` to let a blocked reader go, and the test fails)."""
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
    return out


def refused(fn, fifo: Path, timeout: float = 10.0) -> str:
    """The one-line AdaptspecError ``fn()`` raises, asserting it raised within ``timeout`` seconds."""
    out = outcome_in_time(fn, fifo, timeout)
    err = out.get("error")
    assert isinstance(err, AdaptspecError), f"expected an AdaptspecError, got {out!r}"
    msg = str(err)
    assert "\n" not in msg and str(fifo) in msg and "not a regular file" in msg and "FIFO" in msg, msg
    return msg


def decision_rows(n: int) -> list[dict]:
    return [
        {
            "decision_id": f"d-{i}",
            "time": 1.7e9 + i,
            "policy": "ucb",
            "variant": "A",
            "block_size": 4,
            "propensity": 1.0,
            "probs": [0.0, 0.0, 1.0],
            "arms": [1, 2, 4],
            "reward": 1.0,
        }
        for i in range(n)
    ]


def test_a_dense_trace_sets_meta_json_that_is_a_fifo(tmp_path):
    d = tmp_path / "dense"
    d.mkdir()
    os.mkfifo(d / "meta.json")
    assert "dense trace set's meta.json" in refused(lambda: DenseTraceSet.open(d), d / "meta.json")
    assert "dense trace set's meta.json" in refused(
        lambda: DenseTraceSet.create(d, {"max_block_size": 4}), d / "meta.json"
    )


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
    refused(
        lambda: DecisionLog(log).append(decision_rows(3)[2:]), fifo
    )  # a writer reads every part's ids first
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


def test_a_fifo_part_in_a_live_servers_log_makes_ab_a_503_not_a_hang(tmp_path, caplog):
    """... whose reason names no path of the server's (issue 46, item 11): its log does."""
    from fastapi.testclient import TestClient

    from adaptspec.serving import CompletionService, ServerLimits, create_app
    from adaptspec.serving.tiny import tiny_speculator

    spec, codec = tiny_speculator(0)
    svc = CompletionService.build(
        spec,
        {"A": "fixed:4"},
        codec=codec,
        log_dir=tmp_path / "log",
        limits=ServerLimits(max_context=512, vocab_size=128),
    )
    with TestClient(create_app(svc)) as client:
        fifo = tmp_path / "log" / "part-99999999999999999999-1-000000.parquet"
        os.mkfifo(fifo)  # appeared after the server started (it checks its log at start)
        r = refused_in_time(lambda: client.get("/ab"), fifo)
        message = r.json()["error"]["message"]
        assert r.status_code == 503 and "the decision log cannot be read now" in message, r.text
        assert str(tmp_path) not in message and fifo.name not in message
        assert any(str(fifo) in r.getMessage() + str(r.exc_info) for r in caplog.records)
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def refused_in_time(fn, fifo: Path, timeout: float = 10.0):
    """``fn()``'s value, asserting it came within ``timeout`` seconds."""
    out = outcome_in_time(fn, fifo, timeout)
    assert "value" in out, out
    return out["value"]


# ============================================================================ issue 38, item 3: every reader of a user's file
def refused_in_one_line(fn, fifo: Path, timeout: float = 10.0) -> str:
    """Like :func:`refused`, for readers that look for a regular file before reading one (a FIFO
    there is then "no such artefact"): an AdaptspecError in one line within ``timeout`` seconds."""
    out = outcome_in_time(fn, fifo, timeout)
    err = out.get("error")
    assert isinstance(err, AdaptspecError), f"expected an AdaptspecError, got {out!r}"
    assert "\n" not in str(err) and str(fifo.parent) in str(err), str(err)
    return str(err)


def _latency_profile(tmp_path: Path) -> Path:
    from adaptspec.costs.latency import get_profile

    p = tmp_path / "profile.json"
    get_profile("cpu-smollm2-bf16").save(p)
    return p


def _checkpoint(tmp_path: Path) -> Path:
    from adaptspec.control.policy_checkpoint import write_checkpoint
    from adaptspec.policies import UCB

    pol = UCB([1, 4, 8], seed=0)
    pol.update(None, 4, 2.0)
    return write_checkpoint(tmp_path / "ck", pol, {"updates": 1, "last_decision_id": "d1", "arms": [1, 4, 8]})


def _head(tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(
        Path(__file__).resolve().parents[1] / "adaptspec" / "models" / "weights" / "smollm2-135m-head",
        tmp_path / "head",
    )
    return tmp_path / "head"


def _swap_in_fifo(f: Path) -> Path:
    f.unlink()
    os.mkfifo(f)
    return f


def test_a_latency_profile_that_is_a_fifo(tmp_path):
    from adaptspec.costs.latency import LatencyProfile, get_profile

    fifo = _swap_in_fifo(_latency_profile(tmp_path))
    assert "latency profile" in refused(lambda: LatencyProfile.load(fifo), fifo)
    refused(lambda: get_profile(str(fifo)), fifo)


def test_a_checkpoints_files_that_are_fifos(tmp_path):
    from adaptspec.control.policy_checkpoint import load_policy, read_checkpoint
    from adaptspec.policies import UCB

    ck = _checkpoint(tmp_path)
    fifo = _swap_in_fifo(ck / "checkpoint.json")
    refused(lambda: read_checkpoint(ck), fifo)
    ck2 = _checkpoint(tmp_path / "second")
    fifo2 = _swap_in_fifo(ck2 / "policy.npz")
    refused_in_one_line(lambda: load_policy(ck2, UCB([1, 4, 8], seed=0)), fifo2)


@pytest.mark.parametrize(
    "name", ["config.json", "model.safetensors", "featurizer.json", "featurizer.safetensors"]
)
def test_a_heads_files_that_are_fifos(tmp_path, name):
    from adaptspec.policies.featurizer import Featurizer
    from adaptspec.policies.offline_head import HeadModel

    head = _head(tmp_path)
    fifo = _swap_in_fifo(head / name)
    refused_in_one_line(
        lambda: HeadModel.load(head) if "featurizer" not in name else Featurizer.load(head), fifo
    )


def test_policy_state_and_tensor_readers_refuse_a_fifo_themselves(tmp_path):
    """The shared readers, called on a FIFO directly (not behind an is_file() check)."""
    from adaptspec._util.atomic import read_descriptor, read_tensors
    from adaptspec._util.checks import read_npz, read_safetensors
    from adaptspec.policies import UCB

    fifo = tmp_path / "x"
    os.mkfifo(fifo)
    refused(lambda: read_npz(fifo, "policy state file"), fifo)
    refused(lambda: read_safetensors(fifo, "drafter weights file"), fifo)
    refused(lambda: read_tensors(fifo), fifo)
    refused(lambda: read_descriptor(fifo, "adaptspec-checkpoint", 1, "checkpoint"), fifo)
    refused(lambda: UCB([1, 4], seed=0).load_state(fifo), fifo)


def test_a_dflash_config_that_is_a_fifo(tmp_path):
    import shutil

    from adaptspec.decoding import dflash_format

    d = tmp_path / "drafter"
    shutil.copytree(Path(__file__).resolve().parent / "data" / "dflash-reference-tiny" / "drafter", d)
    fifo = _swap_in_fifo(d / "config.json")
    refused(lambda: dflash_format.load(d), fifo)
    assert dflash_format.is_dflash_dir(d) is False  # asked whether it is one: no, at once


def test_a_blockpilot_result_file_that_is_a_fifo(tmp_path):
    from adaptspec.traces import import_blockpilot

    folder = tmp_path / "bp" / "gsm8k_0T0.0"
    folder.mkdir(parents=True)
    (folder / "4.json").write_text('{"0": 2.5, "1": 3.0}')
    os.mkfifo(folder / "8.json")
    refused(lambda: import_blockpilot(tmp_path / "bp"), folder / "8.json")


def _cli(cwd: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "OMP_NUM_THREADS": "1",
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    return subprocess.run(
        [sys.executable, "-m", "adaptspec", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "TS", "--reward", "modelled", "--latency", "FIFO", "--no-progress"],
        ["serve", "--tiny", "--threads", "1", "--reward", "modelled", "--latency", "FIFO"],
    ],
    ids=["simulate", "serve"],
)
def test_latency_naming_a_fifo_is_exit_2_and_one_line_not_a_hang(tmp_path, argv):
    """Issue 38, item 3: these blocked forever."""
    from adaptspec.traces.traceset import DEFAULT_TRACES

    fifo = tmp_path / "profile.json"
    os.mkfifo(fifo)
    argv = [str(fifo) if a == "FIFO" else str(DEFAULT_TRACES) if a == "TS" else a for a in argv]
    p = _cli(tmp_path, *argv)  # a hang is a TimeoutExpired: the test fails
    assert "Traceback" not in p.stderr and p.returncode == 2 and p.stderr.count("\n") == 1, (
        p.returncode,
        p.stderr,
    )
    assert str(fifo) in p.stderr and "not a regular file" in p.stderr and "FIFO" in p.stderr, p.stderr


SWAPPER = r"""
import os, sys
d = sys.argv[1]
target, regular, fifo = (os.path.join(d, n) for n in ("meta.json", ".regular", ".fifo"))
while not os.path.exists(os.path.join(d, "stop")):
    with open(regular, "wb") as f:
        f.write(b"{}")
    os.replace(regular, target)
    os.mkfifo(fifo)
    os.replace(fifo, target)
"""


def test_a_fifo_swapped_in_between_the_check_and_the_open_never_blocks(tmp_path):
    """``open_regular`` checks the type, then opens with O_NONBLOCK and checks the opened file again:
    a path that another process turns into a FIFO and back, again and again (renamed over it),
    gives either the file's bytes or the one-line refusal, never a blocked open. Each read runs
    under the 10 s guard of :func:`refused_in_one_line`'s kind."""
    import time

    from adaptspec._util.files import JSON_BYTES, read_bytes

    target = tmp_path / "meta.json"
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(tmp_path)])
    outcomes: dict[str, int] = {"bytes": 0, "refused": 0}

    def reads() -> None:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline or not (outcomes["bytes"] and outcomes["refused"]):
            try:
                assert read_bytes(target, "a trace set's meta.json", limit=JSON_BYTES) == b"{}"
                outcomes["bytes"] += 1
            except AdaptspecError as e:
                assert "not a regular file" in str(e) or "no such file" in str(e), e
                outcomes["refused"] += 1
            if time.monotonic() > deadline + 20:
                break

    t = threading.Thread(target=reads, daemon=True)
    try:
        t.start()
        t.join(30)
        assert not t.is_alive(), f"a read blocked ({outcomes})"
    finally:
        (tmp_path / "stop").touch()
        swapper.wait(10)
    assert outcomes["bytes"] and outcomes["refused"], outcomes
