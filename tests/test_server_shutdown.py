"""SIGTERM ends the server within 30 s whatever its requests are doing (issue 61, item 2).

Real server processes on 127.0.0.1, each ended by SIGTERM with requests in flight: ``adaptspec
serve --speculator`` (a speculator of one's own, served one request at a time) whose decode never
returns, or is honest and long; ``adaptspec serve --tiny`` (the batched engine) with long rows in
flight; and the engine with a target forward that never returns. Each test gives the server a
short ``--shutdown-grace`` and checks what the shutdown promises: requests in flight that finish
within the grace are answered as usual, every other one gets a 503 with the reason before the
process exits, the process is gone well within 30 s of the signal, and every decision whose client
got its answer is in the decision log's parts after the exit (the controllers closed, the journal
rolled), read with the project's reader. Every wait is bounded. Then ``--shutdown-grace`` itself:
a grace that would outlast the 30 s is refused in one line.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from _redis import free_port
from _serving_helpers import sse, wait_up
from adaptspec.traces.log_writer import log_rows

REPO = Path(__file__).resolve().parents[1]

#: a speculator of one's own (the byo example's tiny DFlash loop) whose decode does what its prompt says
SCRIPTED_FACTORY = '''
import threading, time
from examples.byo_dflash import TinyDFlash


class Scripted(TinyDFlash):
    """Decodes as its prompt says: "hang" never returns, "sleep S" sleeps S seconds first."""

    def prefill(self, prompt_ids, temperature=0.0, seed=None):
        self.words = self.codec.decode(prompt_ids).split()  # one request at a time: its decode follows
        return super().prefill(prompt_ids, temperature, seed)

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        if self.words[0] == "hang":
            threading.Event().wait()
        if self.words[0] == "sleep":
            time.sleep(float(self.words[1]))
        return super().decode(prefill, block_size, max_new_tokens, temperature=temperature, seed=seed,
                              on_round=on_round)


def make():
    return Scripted(max_block_size=8)
'''

#: the batched engine whose target forward never returns once the first request has been served
#: (a forward pre-hook, as test_server_reliability's stalled engine), behind the server adaptspec serve runs
STUCK_ENGINE_SERVER = """
import json, logging, sys
sys.path.insert(0, "{tests}")
from test_server_reliability import ForwardGate, LIMITS
from adaptspec.serving import CompletionService
from adaptspec.serving.app import create_app
from adaptspec.serving.engine.batched import EngineSettings
from adaptspec.serving.shutdown import GracefulServer
from adaptspec.serving.tiny import tiny_speculator

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
spec, codec = tiny_speculator(0, verification="exact")
svc = CompletionService.build(spec, {{"A": "fixed:4"}}, codec=codec, limits=LIMITS, log_dir=sys.argv[2],
                              engine=EngineSettings(max_rows=2, max_queue=4))
served = svc.run(svc.parse(b'{{"prompt": "ok", "max_tokens": 4}}'))  # acknowledged: in the log when run returns
print("acknowledged", json.dumps(served.decision.decision_id), flush=True)
ForwardGate(spec.target.model).armed.set()  # never released: every forward from now on hangs
try:
    GracefulServer(create_app(svc), svc, float(sys.argv[3]), host="127.0.0.1", port=int(sys.argv[1])).run()
finally:
    svc.close()
"""


@contextmanager
def server(argv: list[str], port: int, out: Path, env: dict | None = None):
    """The server process of ``argv`` on ``port`` (its output in ``out``), once it answers; killed if a test left it running."""
    proc = subprocess.Popen(argv, stdout=open(out, "wb"), stderr=subprocess.STDOUT, cwd=out.parent, env=env)
    try:
        wait_up(proc, f"http://127.0.0.1:{port}", out)
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def own_speculator(tmp_path: Path, grace_s: float):
    """``adaptspec serve --speculator`` over :data:`SCRIPTED_FACTORY`, its grace ``grace_s``, logging to
    ``tmp_path/log`` (:func:`server`'s context)."""
    (tmp_path / "scripted.py").write_text(SCRIPTED_FACTORY)
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "adaptspec",
        "serve",
        "--speculator",
        "scripted:make",
        "--port",
        str(port),
        "--log-dir",
        str(tmp_path / "log"),
        "--shutdown-grace",
        str(grace_s),
        "--log-level",
        "info",
    ]
    return server(
        argv, port, tmp_path / "server.out", dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    )


class Stream:
    """A streamed completion read on a thread of its own: :attr:`first` is set once its first event
    is in (the request is decoding), :attr:`events` and :attr:`ended_at` once it has ended."""

    def __init__(self, url: str, body: dict) -> None:
        self.first = threading.Event()
        self.events: list[dict] = []
        self.ended_at: float | None = None
        self.thread = threading.Thread(target=self._read, args=(url, {**body, "stream": True}), daemon=True)
        self.thread.start()

    def _read(self, url: str, body: dict) -> None:
        lines = []
        with httpx.Client(timeout=120) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                lines.append(line)
                self.first.set()
        self.ended_at = time.monotonic()
        self.events = sse("\n".join(lines))
        self.first.set()

    def result(self) -> list[dict]:
        self.thread.join(120)
        assert self.ended_at is not None, "the stream never ended"
        return self.events


def cut(error: dict, grace_s: float) -> bool:
    """Whether ``error`` is the 503 of a request cut when the grace ended."""
    return error["code"] == 503 and error["message"] == (
        f"the server is shutting down and this request did not finish within its {grace_s:g} s grace: retry"
    )


def sigterm(proc: subprocess.Popen) -> tuple[float, float]:
    """SIGTERM ``proc``: when it was sent and how long the process took to exit (monotonic seconds)."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    exit_s = time.monotonic() - sent
    assert code in (0, -signal.SIGTERM), code  # uvicorn re-raises the signal once it has shut down
    return sent, exit_s


def parts(log_dir: Path) -> dict[str, dict]:
    """The rows of the decision log's Parquet parts (journals left out: rolled at a clean close), by decision id."""
    return {r["decision_id"]: r for r in log_rows(log_dir, journals=False)}


# ============================================================================ one request at a time
@pytest.mark.slow
@pytest.mark.integration  # a server process
def test_a_decode_that_never_returns_is_answered_503_and_the_server_exits_within_its_grace(tmp_path):
    """A speculator of one's own whose decode never returns, SIGTERM while it decodes: the request
    is answered 503 with the reason when the 3 s grace ends, a request arriving meanwhile gets 503
    (not admitted), the process is gone within seconds (not at the 60 s stall watchdog), and the
    decision acknowledged before is in the log's parts."""
    grace = 3.0
    with own_speculator(tmp_path, grace) as (proc, url):
        ok = httpx.post(url + "/v1/completions", json={"prompt": "ok", "max_tokens": 6}, timeout=60)
        assert ok.status_code == 200, ok.text
        acknowledged = ok.json()["adaptspec"]["decision_id"]
        stuck = Stream(url, {"prompt": "hang", "max_tokens": 6})
        assert stuck.first.wait(60) and stuck.ended_at is None  # its first token is out: it is decoding
        port = int(url.rsplit(":", 1)[1])
        late = socket.create_connection(
            ("127.0.0.1", port), timeout=30
        )  # a request arriving during the grace
        body = json.dumps({"prompt": "late", "max_tokens": 4}).encode()
        late.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:5]
        )
        time.sleep(0.3)  # the server has its headers: a request under way, the rest of its body to come
        ended: list = []
        exiting = threading.Thread(target=lambda: ended.append(sigterm(proc)))
        exiting.start()
        time.sleep(0.5)  # the server is shutting down (uvicorn's tick is 0.1 s)
        late.sendall(body[5:])
        answer = b""
        while chunk := late.recv(65536):
            answer += chunk
        late.close()
        events = stuck.result()
        exiting.join(60)
        sent, exit_s = ended[0]
    print(
        f"\nnever-returning decode, grace {grace:g} s: answered {stuck.ended_at - sent:.2f} s after SIGTERM, "
        f"exited {exit_s:.2f} s after it"
    )
    assert answer.startswith(b"HTTP/1.1 503 ") and b'"message":"the server is shutting down"' in answer, (
        answer
    )
    assert events[-1].get("error") is not None and cut(events[-1]["error"], grace), events[-1]
    assert grace - 0.5 <= stuck.ended_at - sent <= exit_s  # when the grace ended, before the exit
    assert exit_s < grace + 7  # well within the 30 s orchestrators allow
    log = parts(tmp_path / "log")
    assert acknowledged in log and log[acknowledged]["reward"] is not None
    assert (
        len(log) == 2 and sum(r["reward"] is None for r in log.values()) == 1
    )  # the stuck one: logged, no reward
    out = (tmp_path / "server.out").read_text()
    assert "Application shutdown complete" in out and "shutting down without it" in out


@pytest.mark.slow
@pytest.mark.integration  # a server process
def test_an_honest_decode_within_the_grace_is_answered_200_and_one_past_it_503(tmp_path):
    """Two honest decodes when SIGTERM comes, one at a time: the one decoding ends 2 s later,
    within the 4 s grace, and is answered 200 (its decision acknowledged and in the log's parts);
    the one waiting behind it, whose decode takes 60 s, is answered 503 when the grace ends, not lost."""
    grace = 4.0
    with own_speculator(tmp_path, grace) as (proc, url):
        short = Stream(url, {"prompt": "sleep 2", "max_tokens": 6})
        assert short.first.wait(60) and short.ended_at is None  # decoding (sleeping) now
        long: list = []
        waiting = threading.Thread(
            target=lambda: long.append(
                httpx.post(url + "/v1/completions", json={"prompt": "sleep 60", "max_tokens": 6}, timeout=120)
            )
        )
        waiting.start()
        time.sleep(1.0)  # admitted: in the runner's queue behind the short one
        sent, exit_s = sigterm(proc)
        waiting.join(60)
        events = short.result()
    print(
        f"\nhonest decodes, grace {grace:g} s: the 2 s one answered {short.ended_at - sent:.2f} s after SIGTERM, "
        f"exited {exit_s:.2f} s after it"
    )
    assert "error" not in events[-1] and events[-1]["choices"][0]["finish_reason"] == "length", events[-1]
    assert short.ended_at - sent < grace
    assert long[0].status_code == 503 and cut(long[0].json()["error"], grace), long[0].text
    assert exit_s < grace + 7  # well within the 30 s orchestrators allow
    acknowledged = events[-1]["adaptspec"]["decision_id"]
    log = parts(tmp_path / "log")
    assert acknowledged in log and log[acknowledged]["reward"] is not None


# ============================================================================ the batched engine
@pytest.mark.slow
@pytest.mark.integration  # a server process
def test_the_engine_with_rows_in_flight_answers_them_and_exits_within_its_grace(tmp_path):
    """``adaptspec serve --tiny``: three rows of 500 tokens decoding when SIGTERM comes, a 0.5 s
    grace: each is answered 503 with the reason (its row dropped), the process exits within
    seconds, and the decision acknowledged before is in the log's parts."""
    grace = 0.5
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "adaptspec",
        "serve",
        "--tiny",
        "--threads",
        "1",
        "--port",
        str(port),
        "--log-dir",
        str(tmp_path / "log"),
        "--shutdown-grace",
        str(grace),
        "--log-level",
        "info",
    ]
    with server(argv, port, tmp_path / "server.out") as (proc, url):
        ok = httpx.post(url + "/v1/completions", json={"prompt": "ok", "max_tokens": 8}, timeout=60)
        assert ok.status_code == 200, ok.text
        acknowledged = ok.json()["adaptspec"]["decision_id"]
        rows = [Stream(url, {"prompt": f"r{i}", "max_tokens": 500}) for i in range(3)]
        assert all(r.first.wait(60) for r in rows) and all(r.ended_at is None for r in rows)
        sent, exit_s = sigterm(proc)
        events = [r.result() for r in rows]
    print(
        f"\nbatched engine, grace {grace:g} s: rows answered {max(r.ended_at for r in rows) - sent:.2f} s after "
        f"SIGTERM, exited {exit_s:.2f} s after it"
    )
    for ev in events:
        assert ev[-1].get("error") is not None and cut(ev[-1]["error"], grace), ev[-1]
    assert all(r.ended_at <= sent + exit_s for r in rows)
    assert exit_s < grace + 7  # well within the 30 s orchestrators allow
    log = parts(tmp_path / "log")
    assert acknowledged in log and log[acknowledged]["reward"] is not None
    assert len(log) == 4  # the three cut rows' decisions too, without a reward


@pytest.mark.slow
@pytest.mark.integration  # a server process
def test_the_engine_with_a_forward_that_never_returns_answers_503_and_exits_within_its_grace(tmp_path):
    """The batched engine whose target forward never returns (its watchdog at the default 60 s),
    served by ``adaptspec serve``'s server (GracefulServer): SIGTERM with a request in flight ends
    the process within seconds of its 2 s grace, the request answered 503 with the reason first,
    the decision acknowledged before in the log's parts."""
    grace = 2.0
    port = free_port()
    script = tmp_path / "stuck_engine.py"
    script.write_text(STUCK_ENGINE_SERVER.format(tests=Path(__file__).parent))
    argv = [sys.executable, str(script), str(port), str(tmp_path / "log"), str(grace)]
    out = tmp_path / "server.out"
    with server(argv, port, out) as (proc, url):
        stuck = Stream(url, {"prompt": "abc", "max_tokens": 6})  # its prefill's forward hangs
        time.sleep(1.0)  # submitted to the engine, whose thread is stuck in the forward
        assert stuck.ended_at is None
        sent, exit_s = sigterm(proc)
        events = stuck.result()
    print(
        f"\nengine forward that never returns, grace {grace:g} s: answered {stuck.ended_at - sent:.2f} s after "
        f"SIGTERM, exited {exit_s:.2f} s after it"
    )
    assert events[-1].get("error") is not None and cut(events[-1]["error"], grace), events[-1]
    assert grace - 0.5 <= stuck.ended_at - sent <= exit_s
    assert exit_s < grace + 7  # well within the 30 s orchestrators allow
    text = out.read_text()
    acknowledged = json.loads(text.split("acknowledged ", 1)[1].split("\n", 1)[0])
    assert acknowledged in parts(tmp_path / "log")
    assert "Application shutdown complete" in text and "shutting down without it" in text


# ============================================================================ the option
@pytest.mark.parametrize("value", ["25", "-1", "nan"])
def test_a_grace_that_would_outlast_the_orchestrators_bound_is_refused_in_one_line(value, capsys):
    from adaptspec.cli import main

    assert main(["serve", "--tiny", "--port", "0", "--shutdown-grace", value]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and f"argument --shutdown-grace: expected a number in [0, 20], got '{value}'" in err
    )


def test_serve_help_says_the_grace_and_its_bound(capsys):
    from adaptspec.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser("serve").parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "--shutdown-grace S" in text
        and "(default 15; at most 20, so that it is gone within 30 s of the signal)" in text
    )
