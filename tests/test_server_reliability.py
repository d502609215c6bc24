"""The batched server under faults, bursts and misbehaving clients (issue 38: items 2, 4, 9, 10, 11, 12, 18).

Real servers on 127.0.0.1 over the tiny model: uvicorn on a thread of this process (with the
server's own HTTP protocol, serving.connections) where the test needs to reach inside (a fault
injected through a public parameter: a load rule whose feedback raises, as a latency profile of
zeros made the learned rule do), and the ``adaptspec serve`` process itself where the test
needs a process (SIGTERM, its log). Clients are httpx and raw sockets. Every wait is bounded.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from _batching_helpers import one_thread  # noqa: F401  (autouse: one torch thread per module)
from _redis import free_port
from _serving_helpers import OwnSpeculator, ThreadServer, post_all, sse, wait_up
from adaptspec.batching import BatchEngine
from adaptspec.load_rules.round_rule import make_load_rule
from adaptspec.serving import CompletionService, ServerLimits
from adaptspec.serving.app import create_app
from adaptspec.serving.codec import CharCodec
from adaptspec.serving.engine.batched import EngineSettings
from adaptspec.serving.engine.loop import EngineFailed, EngineLoop
from adaptspec.serving.tiny import tiny_model, tiny_speculator

pytestmark = pytest.mark.integration  # every test here starts a server on loopback

CODEC = CharCodec()
LIMITS = ServerLimits(max_context=512, vocab_size=128, max_tokens=200, body_timeout_s=1.0)
_MODEL: dict = {}


def alone(prompt: str, n: int) -> list[int]:
    """The tiny target's own greedy ``generate`` of the prompt alone (the reference of exact mode)."""
    model = _MODEL.setdefault(0, tiny_model(0))
    ids = CODEC.encode(prompt)
    return model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)[0, len(ids) :].tolist()


def thread_server(svc: CompletionService) -> ThreadServer:
    """``svc``'s app on a loopback port, on a thread of this process, logging at info."""
    return ThreadServer(create_app(svc), log_level="info")


class FaultyRule:
    """A per-round load rule whose feedback raises on the engine's thread, outside any round,
    its first ``times`` calls (ZeroDivisionError: what a latency profile of zeros made the learned
    rule raise)."""

    name = "faulty"

    def __init__(self, times: int) -> None:
        self.times, self.raised = times, 0

    def choose(self, rows, load):
        return [2] * len(rows)

    def feedback(self, views, asked, taus, shares, load):
        if self.raised < self.times:
            self.raised += 1
            raise ZeroDivisionError("float division by zero")


def service(variants=None, max_rows=2, max_queue=4, rule=None, verification="exact") -> CompletionService:
    spec, codec = tiny_speculator(0, verification=verification)
    return CompletionService.build(
        spec,
        variants or {"A": "fixed:4"},
        codec=codec,
        limits=LIMITS,
        arms=[1, 2, 4, 8],
        engine=EngineSettings(max_rows=max_rows, max_queue=max_queue, rule=rule),
    )


def tracebacks(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


# ============================================================================ item 2: a failing engine thread
def test_a_failure_outside_the_round_is_a_503_for_the_requests_in_flight_and_the_loop_restarts(caplog):
    caplog.set_level(logging.INFO)
    svc = service(rule=FaultyRule(times=2))
    with thread_server(svc) as s, httpx.Client(timeout=60) as c:
        t0 = time.time()
        streamed = c.post(
            s.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 12, "stream": True}
        )
        plain = c.post(s.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 12})
        assert time.time() - t0 < 30
        # the stream had started: it ends with an error event (503, the reason), then [DONE]
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        err = sse(streamed.text)[-1]["error"]
        # a reason, not the error's text (issue 46, item 11: it may carry a user's paths); the log has it
        assert err["code"] == 503 and "the engine failed" in err["message"] and "restarted" in err["message"]
        assert plain.status_code == 503 and "the engine failed" in plain.json()["error"]["message"]
        assert not any("division" in m for m in (err["message"], plain.json()["error"]["message"]))
        health = c.get(s.url + "/health").json()
        assert health["status"] == "degraded"
        assert health["engine"]["state"] == "degraded" and health["engine"]["failures"] == 2
        assert "ZeroDivisionError" in health["engine"]["last_error"]
        # restarted, with a clean engine: the next request is served exactly
        ok = c.post(s.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 12})
        assert ok.status_code == 200, ok.text
        assert ok.json()["choices"][0]["token_ids"] == alone("Hello", 12)
        assert svc.runner.loop.stats()["rows_in_flight"] == 0
        metrics = c.get(s.url + "/metrics").text
        assert "adaptspec_engine_failures_total 2.0" in metrics and "adaptspec_engine_up 1.0" in metrics
    # logged once with its traceback, then one line
    engine_logs = [r for r in caplog.records if "adaptspec-engine" in r.getMessage()]
    assert len(engine_logs) == 2 and [bool(r.exc_info) for r in engine_logs] == [True, False]


def test_repeated_failures_stop_the_engine_every_request_gets_503_and_the_server_shuts_down(caplog):
    caplog.set_level(logging.INFO)
    svc = service(rule=FaultyRule(times=10**6))
    with thread_server(svc) as s, httpx.Client(timeout=60) as c:
        for _ in range(3):  # the default: 3 failures within a minute stop it
            r = c.post(s.url + "/v1/completions", json={"prompt": "abc", "max_tokens": 6})
            assert r.status_code == 503 and "the engine failed" in r.json()["error"]["message"]
        h = c.get(s.url + "/health")
        assert (
            h.status_code == 503
            and h.json()["status"] == "failed"
            and h.json()["engine"]["state"] == "failed"
        )
        assert "adaptspec_engine_up 0.0" in c.get(s.url + "/metrics").text
        t0 = time.time()
        for stream in (False, True):
            r = c.post(s.url + "/v1/completions", json={"prompt": "abc", "max_tokens": 6, "stream": stream})
            assert r.status_code == 503 and "stopped after repeated failures" in r.json()["error"]["message"]
        assert time.time() - t0 < 5
        t0 = time.time()
    assert time.time() - t0 < 10  # the shutdown does not wait for anything
    assert sum(bool(r.exc_info) for r in caplog.records) == 1  # one traceback for one distinct error


def test_no_wait_on_the_engine_is_unbounded():
    """A request the engine does not finish in time is cancelled with EngineFailed, not waited on forever."""
    spec, _ = tiny_speculator(0, verification="exact")
    hold = threading.Event()
    with EngineLoop(BatchEngine(spec.target, spec.drafter, max_rows=2), request_timeout_s=0.5) as loop:
        blocker = loop.submit(CODEC.encode("wait"), max_new_tokens=4, on_tokens=lambda ids: hold.wait(30))
        stuck = loop.submit(CODEC.encode("me"), max_new_tokens=4)
        t0 = time.time()
        with pytest.raises(EngineFailed, match="did not finish within 0.5 s"):
            loop.wait(stuck)
        assert time.time() - t0 < 3
        hold.set()
        loop.wait(blocker, timeout=60)


@pytest.mark.slow
def test_sigterm_stops_a_server_whose_engine_failed_within_seconds(tmp_path):
    """A real process (the server's app and uvicorn configuration, a faulty rule through its
    public parameter): after its engine stopped for good, SIGTERM ends it cleanly and fast."""
    script = tmp_path / "faulty_server.py"
    script.write_text(FAULTY_SERVER.format(tests=Path(__file__).parent))
    port = free_port()
    out = open(tmp_path / "server.out", "wb")
    proc = subprocess.Popen([sys.executable, str(script), str(port)], stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(proc, url, tmp_path / "server.out")
        with httpx.Client(timeout=30) as c:
            codes = [
                c.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 6}).status_code
                for _ in range(4)
            ]
            assert codes == [503] * 4
            assert c.get(url + "/health").json()["status"] == "failed"
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) in (
            0,
            -signal.SIGTERM,
        )  # uvicorn re-raises the signal once it has shut down
        assert time.time() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "server.out").read_text()
    assert "Application shutdown complete" in log  # a clean shutdown: the controllers were closed
    assert log.count("Traceback") == 1  # the first failure, once


FAULTY_SERVER = """
import logging, sys
sys.path.insert(0, "{tests}")
import uvicorn
from test_server_reliability import FaultyRule, service
from adaptspec.serving.app import create_app
from adaptspec.serving.connections import uvicorn_config

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
svc = service(rule=FaultyRule(times=10**6))
try:
    uvicorn.Server(uvicorn_config(create_app(svc), host="127.0.0.1", port=int(sys.argv[1]),
                                  timeout_graceful_shutdown=30)).run()
finally:
    svc.close()
"""


# ============================================================================ item 4: a controller's failure is a 503
def test_a_head_of_another_feature_width_is_refused_at_start_in_one_line(tmp_path):
    from adaptspec.paths import BUNDLED_HEAD

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "adaptspec",
            "serve",
            "--tiny",
            "--port",
            str(free_port()),
            "--variant",
            f"A=neural-linear:head={BUNDLED_HEAD}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and "1153" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("batched", [True, False])
def test_a_controller_that_fails_during_a_request_is_a_503_with_the_reason_never_a_500(batched, caplog):
    """A variant's controller that raises while deciding (here: closed under the server) answers 503
    naming the reason (the variant's controller; the error's text is in the log), streamed or not;
    the other variant keeps serving."""
    spec, codec = tiny_speculator(
        0, verification="exact"
    )  # batched: on the engine; else one's own, one at a time
    svc = CompletionService.build(
        spec if batched else OwnSpeculator(spec),
        {"A": "fixed:2", "B": "fixed:4"},
        codec=codec,
        limits=LIMITS,
        engine=EngineSettings(max_rows=2, max_queue=4) if batched else None,
    )
    svc.controllers["A"].close()
    with thread_server(svc) as s, httpx.Client(timeout=60) as c:
        for stream in (False, True):
            r = c.post(
                s.url + "/v1/completions",
                json={"prompt": "hi", "max_tokens": 4, "variant": "A", "stream": stream},
            )
            if stream:  # the stream had started: its error event
                assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
                err = sse(r.text)[-1]["error"]
            else:
                assert r.status_code == 503, r.text
                err = r.json()["error"]
            assert err["code"] == 503 and "variant A's controller could not" in err["message"], err
            assert "\n" not in err["message"]
            assert any("closed" in str(r.exc_info) for r in caplog.records if r.exc_info)
        ok = c.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4, "variant": "B"})
        assert ok.status_code == 200 and ok.json()["choices"][0]["token_ids"] == alone("hi", 4)


# ============================================================================ item 10: bursts of streams
def test_a_held_burst_of_streams_past_the_queue_gets_real_429s_and_the_rest_complete():
    svc = service(max_rows=2, max_queue=4)
    loop = svc.runner.loop
    with thread_server(svc) as s:
        hold = threading.Event()  # a row of its own, holding the engine's thread: the burst queues up
        blocker = loop.submit(CODEC.encode("hold"), max_new_tokens=3, on_tokens=lambda ids: hold.wait(60))
        deadline = time.time() + 30
        while loop.stats()["rows_in_flight"] == 0 and time.time() < deadline:
            time.sleep(0.005)
        results = burst(s.url, 10, release=hold)
        blocker.wait(60)
    refused = [r for r in results if r[0] == 429]
    # room: 4 queued + 1 free row (the blocker has the other)
    assert len(refused) == 5 and all(r[1] is not None and int(r[1]) >= 1 for r in refused)
    done = [r for r in results if r[0] == 200]
    assert len(done) == 5 and all(r[2] == alone(r[3], 16) for r in done)


def test_an_unheld_burst_of_forty_streams_gets_only_real_429s_and_complete_streams():
    svc = service(max_rows=2, max_queue=4)
    with thread_server(svc) as s:
        results = burst(s.url, 40)
    assert {r[0] for r in results} <= {200, 429} and any(r[0] == 429 for r in results)
    for code, retry, ids, prompt in results:
        if code == 429:
            assert retry is not None and int(retry) >= 1
        else:
            assert ids == alone(prompt, 16)  # no in-stream error: burst() fails on one


def burst(url: str, n: int, release: threading.Event | None = None) -> list[tuple]:
    """``n`` concurrent streamed requests: (status, Retry-After, the streamed ids, the prompt) each."""
    started = threading.Barrier(n + (release is not None))

    def one(i):
        prompt = f"burst {i}"
        with httpx.Client(timeout=120) as c:
            started.wait(30)
            with c.stream(
                "POST", url + "/v1/completions", json={"prompt": prompt, "max_tokens": 16, "stream": True}
            ) as r:
                if r.status_code != 200:
                    r.read()
                    assert r.status_code == 429 and "at capacity" in r.json()["error"]["message"]
                    return r.status_code, r.headers.get("retry-after"), None, prompt
                chunks = sse("\n".join(r.iter_lines()))
        assert all("error" not in ch for ch in chunks), chunks
        return 200, None, [t for ch in chunks for t in ch["choices"][0]["token_ids"]], prompt

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        if release is not None:
            started.wait(30)
            time.sleep(1.0)  # every request has been answered 429 or holds its place
            release.set()
        return [f.result(timeout=120) for f in futures]


# ============================================================================ item 11: seeds under the learned rule
def test_a_seeded_request_repeats_under_the_learned_rule_alone_and_in_a_batch():
    from adaptspec.decoding import SpeculativeDecoder

    rule = make_load_rule("learned", [1, 2, 3, 4, 6, 8], "cpu-smollm2-batched", prior=0.4)
    svc = service(max_rows=4, max_queue=8, rule=rule)
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.9, "seed": 1234}
    spec, _ = tiny_speculator(0, verification="exact")
    want = (
        SpeculativeDecoder(spec.target, spec.drafter)
        .generate(CODEC.encode(body["prompt"]), 3, 24, temperature=0.9, seed=1234)
        .tokens
    )
    with thread_server(svc) as s, httpx.Client(timeout=60) as c:
        alone_ids = [
            c.post(s.url + "/v1/completions", json=body).json()["choices"][0]["token_ids"] for _ in range(4)
        ]
        others = [{"prompt": f"other {i}", "max_tokens": 20, "temperature": 1.3 * (i % 2)} for i in range(5)]
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(c.post, s.url + "/v1/completions", json=b) for b in others + [body, body]]
            batched = [f.result().json()["choices"][0]["token_ids"] for f in futures[-2:]]
        assert max(r.rows for r in svc.runner.loop.engine.history) > 1  # it did share rounds
    assert alone_ids == [want] * 4 and batched == [want] * 2
    assert (
        SpeculativeDecoder(spec.target, spec.drafter)
        .generate(CODEC.encode(body["prompt"]), 3, 24, temperature=0.9, seed=1235)
        .tokens
        != want
    )


def test_a_seeded_request_gives_the_same_text_unbatched_and_batched():
    from fastapi.testclient import TestClient

    body = {"prompt": "The quick brown fox", "max_tokens": 30, "temperature": 1.1, "seed": 77, "variant": "A"}
    got = []
    for batched in (False, True):
        spec, codec = tiny_speculator(0, verification="exact")
        # unbatched: the same decoder as a speculator of one's own, decoded by its controller one request at a time
        svc = CompletionService.build(
            spec if batched else OwnSpeculator(spec),
            {"A": "linucb", "B": "fixed:8"},
            codec=codec,
            limits=LIMITS,
            arms=[1, 2, 4, 8],
            engine=EngineSettings(max_rows=2, max_queue=4) if batched else None,
        )
        with TestClient(create_app(svc)) as client:
            got += [
                client.post("/v1/completions", json=b).json()["choices"][0]["token_ids"]
                for b in (body, {**body, "variant": "B"})
            ]
    assert (
        len(got[0]) > 5 and got == [got[0]] * 4
    )  # block sizes chosen by linucb and fixed:8, one decoder or the engine


# ============================================================================ items 9 and 18: clients on raw sockets
def raw(
    port: int, data: bytes, *, close: bool = False, half_close: bool = False, read: float = 10.0
) -> bytes:
    """Send ``data``; then close, half-close (then read) or just read, for at most ``read`` seconds."""
    s = socket.create_connection(("127.0.0.1", port), timeout=read)
    try:
        s.sendall(data)
        if close:
            return b""
        if half_close:
            s.shutdown(socket.SHUT_WR)
        got = b""
        deadline = time.time() + read
        while time.time() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            got += chunk
        return got
    finally:
        s.close()


def head(body_len: int) -> bytes:
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {body_len}\r\n\r\n"
    ).encode()


BODY = json.dumps({"prompt": "Hello", "max_tokens": 8}).encode()


def test_clients_that_leave_mid_body_log_no_traceback_and_stalled_bodies_get_408(caplog):
    caplog.set_level(logging.DEBUG)
    svc = service()
    with thread_server(svc) as s:
        for _ in range(20):  # half a body, then gone
            raw(s.port, head(len(BODY)) + BODY[: len(BODY) // 2], close=True)
        t0 = time.time()
        with ThreadPoolExecutor(20) as pool:  # half a body, then nothing: each is answered 408 and closed
            stalled = list(pool.map(lambda _: raw(s.port, head(len(BODY)) + BODY[:10], read=10), range(20)))
        assert time.time() - t0 < 8  # the body timeout is 1 s
        for got in stalled:
            assert got.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 1 s" in got
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 8}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == alone("Hello", 8)
    assert not tracebacks(caplog), [r.getMessage() for r in tracebacks(caplog)]
    said = [
        r for r in caplog.records if "disconnected before sending its whole request body" in r.getMessage()
    ]
    assert 1 <= len(said) <= 20


def test_a_client_that_half_closes_after_its_request_gets_its_answer():
    svc = service()
    with thread_server(svc) as s:
        for body, stream in (
            (BODY, False),
            (json.dumps({"prompt": "Hello", "max_tokens": 8, "stream": True}).encode(), True),
        ):
            got = raw(s.port, head(len(body)) + body, half_close=True, read=30)
            final = got[got.rfind(b"HTTP/1.1 ") :]  # after the interim 100 Continue responses
            assert final.startswith(b"HTTP/1.1 200 "), got[:300]
            payload = final.split(b"\r\n\r\n", 1)[1]
            if stream:
                ids = [
                    t
                    for line in payload.decode().splitlines()
                    if line.startswith("data: {")
                    for t in json.loads(line[6:])["choices"][0]["token_ids"]
                ]
            else:
                ids = json.loads(payload)["choices"][0]["token_ids"]
            assert ids == alone("Hello", 8)


def test_a_client_that_closes_while_waiting_still_cancels_its_row():
    """The half-close probe tells a closed client from a half-closed one: the row leaves early."""
    svc = service(max_rows=2)
    loop = svc.runner.loop
    with thread_server(svc) as s:
        blocker = loop.submit(
            CODEC.encode("aaaa"), max_new_tokens=200, on_tokens=lambda ids: time.sleep(0.02)
        )
        body = json.dumps({"prompt": "abcabc", "max_tokens": 200}).encode()
        client = threading.Thread(target=raw, args=(s.port, head(len(body)) + body), kwargs={"read": 1.0})
        client.start()  # waits 1 s for the answer, then closes its connection
        deadline, row = time.time() + 30, None
        while row is None and time.time() < deadline:
            row = next((r.handle for r in list(loop.engine.rows) if r.handle is not blocker.handle), None)
            time.sleep(0.005)
        client.join(30)
        deadline = time.time() + 10
        while not row.done and time.time() < deadline:
            time.sleep(0.01)
        assert row.error is not None and "cancelled" in str(row.error) and len(row.tokens) < 200
        blocker.cancel()


# ============================================================================ the `adaptspec serve` process itself
@pytest.fixture(scope="module")
def cli_server(tmp_path_factory):
    """``adaptspec serve --tiny`` with its defaults (the batched engine, the learned load rule) and exact
    verification: a seed's tokens are then the same bit for bit whatever the block sizes and the batch
    (in fast verification the pass's rounding may flip a sample where two perturbed logits tie within
    it: adaptspec/decoding/sampling.py), the guarantee this process's seeded test holds it to."""
    root = tmp_path_factory.mktemp("cli")
    port = free_port()
    out = root / "server.out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "adaptspec",
            "serve",
            "--tiny",
            "--threads",
            "1",
            "--verification",
            "exact",
            "--port",
            str(port),
            "--log-level",
            "info",
        ],
        stdout=open(out, "wb"),
        stderr=subprocess.STDOUT,
        cwd=root,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(proc, url, out)
        yield proc, port, url, out
    finally:
        if proc.poll() is None:
            proc.kill()


def test_cli_server_repeats_a_seeded_request_under_its_default_learned_rule(cli_server):
    _, _, url, out = cli_server
    assert "load rule learned" in out.read_text()
    body = {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0.9, "seed": 1234}
    with httpx.Client(timeout=120) as c:
        texts = [c.post(url + "/v1/completions", json=body).json()["choices"][0]["text"] for _ in range(4)]
        with ThreadPoolExecutor(4) as pool:
            others = [
                pool.submit(c.post, url + "/v1/completions", json={"prompt": f"x{i}", "max_tokens": 30})
                for i in range(3)
            ]
            texts.append(
                pool.submit(c.post, url + "/v1/completions", json=body).result().json()["choices"][0]["text"]
            )
            [f.result() for f in others]
    assert len(texts[0]) > 10 and texts == [texts[0]] * 5


@pytest.mark.parametrize(
    "flags, rule",
    [
        (["--variant", "P=fixed:1"], "none"),  # plain everywhere: no block for a rule to cut
        (["--variant", "P=fixed:1", "--variant", "Q=fixed:1"], "none"),
        (["--variant", "P=fixed:1", "--variant", "Q=fixed:3"], "learned"),  # one variant speculates
        (["--variant", "P=fixed:3"], "learned"),
        (["--variant", "P=fixed:1", "--load-rule", "learned"], "learned"),  # asked for: kept
        (["--variant", "P=fixed:1", "--load-rule", "fixed:2"], "fixed:2"),
    ],
)
def test_a_server_whose_variants_all_decode_plainly_runs_no_load_rule_unless_asked(tmp_path, flags, rule):
    """The default on a host where speculation cannot pay is plain decoding (``fixed:1``); a per-round
    rule there would only add its bookkeeping to every round (BENCHMARKS.md, the served default)."""
    from adaptspec.cli import build_parser
    from adaptspec.cli.serve import build

    args = build_parser("serve").parse_args(["serve", "--tiny", "--port", "0", "--arms", "1,2,3", *flags])
    service = build(args)
    try:
        described = service.runner.describe()
        assert described.split("load rule ")[1].startswith(rule), described
    finally:
        service.close()


def test_cli_server_logs_no_traceback_for_clients_that_leave_mid_body_and_answers_half_closed_ones(
    cli_server,
):
    _, port, _, out = cli_server
    for _ in range(30):
        raw(port, head(len(BODY)) + BODY[: len(BODY) // 2], close=True)
    got = raw(port, head(len(BODY)) + BODY, half_close=True, read=60)
    assert got[got.rfind(b"HTTP/1.1 ") :].startswith(b"HTTP/1.1 200 ")
    time.sleep(0.5)
    log = out.read_text()
    assert "Traceback" not in log and "ClientDisconnect" not in log
    assert log.count("disconnected before sending its whole request body") >= 1


def test_cli_server_exits_on_sigterm_within_seconds(cli_server):
    proc, _, url, out = cli_server
    assert httpx.get(url + "/health", timeout=30).json()["status"] == "ok"
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    assert time.time() - t0 < 5
    assert "Traceback" not in out.read_text()


# ============================================================================ issue 46, items 2, 3, 11: nothing hangs, no text leaks
class ForwardGate:
    """Blocks every forward pass of a real torch module while armed, until released: a target
    forward that never returns, as a stuck kernel would (a forward pre-hook, torch's public API)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.armed, self.release = threading.Event(), threading.Event()
        module.register_forward_pre_hook(self.hook)

    def hook(self, module, args):
        if self.armed.is_set():
            self.release.wait(300)


class StuckDecode(OwnSpeculator):
    """A speculator of one's own whose decode blocks while ``armed`` (until ``release``) and raises
    a RuntimeError naming a secret path while ``boom``."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.armed, self.release, self.boom = threading.Event(), threading.Event(), False

    def decode(self, *args, **kwargs):
        if self.boom:
            raise RuntimeError("decode boom at /home/user/secret.txt")
        if self.armed.is_set():
            self.release.wait(300)
        return super().decode(*args, **kwargs)


#: the stall bound of the in-process tests: well above a tiny model's round however busy the host is
STALL_TEST_S = 3.0


def stalled_service(own: bool) -> tuple[CompletionService, "ForwardGate | StuckDecode"]:
    spec, codec = tiny_speculator(0, verification="exact")
    if own:
        stuck = StuckDecode(spec)
        return CompletionService.build(
            stuck, {"A": "fixed:4"}, codec=codec, limits=LIMITS, stall_s=STALL_TEST_S
        ), stuck
    svc = CompletionService.build(
        spec,
        {"A": "fixed:4"},
        codec=codec,
        limits=LIMITS,
        stall_s=STALL_TEST_S,
        engine=EngineSettings(max_rows=2, max_queue=4),
    )
    return svc, ForwardGate(spec.target.model)


@pytest.mark.parametrize("own", [False, True], ids=["engine-target-forward", "own-speculator-decode"])
def test_a_decode_that_never_returns_answers_503_health_says_stalled_and_it_serves_again_after(own, caplog):
    """The engine with a target forward that hangs, and a speculator of one's own whose decode
    hangs: the request decoding and the ones waiting get 503 with a reason once nothing progressed
    for stall_s (3 s here), new ones at once, /health is 503 "stalled"; the log shows where it is
    stuck. Released, the server decodes again, exactly."""
    caplog.set_level(logging.INFO)
    svc, gate = stalled_service(own)
    with thread_server(svc) as s, httpx.Client(timeout=120) as c:
        gate.armed.set()
        got = post_all(
            s.url,
            [
                {"prompt": "abc", "max_tokens": 6, "stream": True},
                {"prompt": "xyz", "max_tokens": 6},
                {"prompt": "hi", "max_tokens": 6},
            ],
        )
        for r in got:
            err = (
                sse(r.text)[-1]["error"]
                if r.headers["content-type"].startswith("text/event-stream")
                else r.json()["error"]
            )
            assert (
                err["code"] == 503
                and ("no progress for 3 s" if own else "no round for 3 s") in err["message"]
            ), err
            assert "stalled" in err["message"] and "\n" not in err["message"]
        h = c.get(s.url + "/health")
        assert (
            h.status_code == 503
            and h.json()["status"] == "stalled"
            and h.json()["engine"]["state"] == "stalled"
        )
        refused = c.post(s.url + "/v1/completions", json={"prompt": "later", "max_tokens": 4})
        assert refused.status_code == 503 and "stalled" in refused.json()["error"]["message"]
        gate.armed.clear()
        gate.release.set()
        deadline = time.time() + 120
        while c.get(s.url + "/health").json()["status"] == "stalled":
            assert time.time() < deadline, "it never moved again"
            time.sleep(0.1)
        ok = c.post(s.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 12})
        while (
            ok.status_code == 503 and time.time() < deadline
        ):  # a host so busy a round outlived 3 s: once more
            ok = c.post(s.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 12})
        assert ok.status_code == 200, ok.text
        assert ok.json()["choices"][0]["token_ids"] == alone("Hello", 12)
        assert c.get(s.url + "/health").json()["engine"]["failures"] >= 1  # the stall, counted
    stalls = [r.getMessage() for r in caplog.records if " stalled: " in r.getMessage()]
    assert (
        len(stalls) >= 1
        and ("in decode" if own else "in hook") in stalls[0]
        and "release.wait(300)" in stalls[0]
    )


def test_a_speculators_exception_text_never_reaches_a_client_and_the_log_keeps_it(caplog):
    """A decode raising ``RuntimeError("decode boom at /home/user/secret.txt")``: 503 with a reason
    and the request's id, streamed or not; the text and its traceback are in the server's log."""
    caplog.set_level(logging.INFO)
    spec, codec = tiny_speculator(0, verification="exact")
    own = StuckDecode(spec)
    own.boom = True
    svc = CompletionService.build(own, {"A": "fixed:4"}, codec=codec, limits=LIMITS)
    with thread_server(svc) as s, httpx.Client(timeout=60) as c:
        for stream in (False, True):
            r = c.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4, "stream": stream})
            err = sse(r.text)[-1]["error"] if stream else r.json()["error"]
            assert err["code"] == 503 and err["message"].startswith(
                "the speculator could not decode this request"
            )
            for secret in ("secret", "/home", "boom", "RuntimeError"):
                assert secret not in r.text
        own.boom = False
        assert c.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}).status_code == 200
    logged = [
        r
        for r in caplog.records
        if r.exc_info and "decode boom at /home/user/secret.txt" in str(r.exc_info[1])
    ]
    assert len(logged) == 2 and all(
        "the speculator could not decode this request" in r.getMessage() for r in logged
    )


STALLED_ENGINE_SERVER = """
import logging, sys, threading
sys.path.insert(0, "{tests}")
import uvicorn
from test_server_reliability import ForwardGate, LIMITS
from adaptspec.serving import CompletionService
from adaptspec.serving.app import create_app
from adaptspec.serving.connections import uvicorn_config
from adaptspec.serving.engine.batched import EngineSettings
from adaptspec.serving.tiny import tiny_speculator

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
spec, codec = tiny_speculator(0, verification="exact")
svc = CompletionService.build(spec, {{"A": "fixed:4"}}, codec=codec, limits=LIMITS, stall_s=1.0,
                              engine=EngineSettings(max_rows=2, max_queue=4))
ForwardGate(spec.target.model).armed.set()  # never released: the target's forward hangs for good
try:
    uvicorn.Server(uvicorn_config(create_app(svc), host="127.0.0.1", port=int(sys.argv[1]),
                                  timeout_graceful_shutdown=30)).run()
finally:
    svc.close()
"""

HANGING_FACTORY = """
import threading
from examples.byo_dflash import TinyDFlash

class HangingLoop(TinyDFlash):
    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        threading.Event().wait()  # never returns

def make():
    return HangingLoop(max_block_size=8)
"""


@pytest.mark.slow
@pytest.mark.parametrize("own", [False, True], ids=["engine-target-forward", "serve-speculator-factory"])
def test_sigterm_stops_a_server_whose_decode_never_returns(tmp_path, own):
    """A real process whose decode never returns (the engine's target forward, or ``adaptspec serve
    --speculator`` with a factory whose decode blocks forever): its requests get 503 once it is
    stalled, /health is 503, and SIGTERM ends the process though the stuck thread never returns."""
    port = free_port()
    out_path = tmp_path / "server.out"
    if own:
        (tmp_path / "hangmod.py").write_text(HANGING_FACTORY)
        argv = [
            sys.executable,
            "-m",
            "adaptspec",
            "serve",
            "--speculator",
            "hangmod:make",
            "--stall-timeout",
            "1",
            "--port",
            str(port),
            "--log-level",
            "info",
        ]
        env = dict(__import__("os").environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    else:
        script = tmp_path / "stalled_server.py"
        script.write_text(STALLED_ENGINE_SERVER.format(tests=Path(__file__).parent))
        argv, env = [sys.executable, str(script), str(port)], None
    proc = subprocess.Popen(
        argv, stdout=open(out_path, "wb"), stderr=subprocess.STDOUT, cwd=tmp_path, env=env
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(proc, url, out_path)
        got = post_all(url, [{"prompt": "abc", "max_tokens": 6}, {"prompt": "xyz", "max_tokens": 6}])
        assert [r.status_code for r in got] == [503, 503] and all(
            "stalled" in r.json()["error"]["message"] for r in got
        )
        with httpx.Client(timeout=30) as c:
            assert (
                c.post(url + "/v1/completions", json={"prompt": "later", "max_tokens": 4}).status_code == 503
            )
            h = c.get(url + "/health")
            assert h.status_code == 503 and h.json()["status"] == "stalled"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) in (0, -signal.SIGTERM)  # bounded: the stuck thread is not waited for
    finally:
        if proc.poll() is None:
            proc.kill()
    log = out_path.read_text()
    assert "Application shutdown complete" in log and "shutting down without it" in log


def test_one_at_a_time_a_request_cancelled_while_it_waits_its_turn_is_skipped_undecided():
    """The speculator of one's own decodes one request at a time from a queue: a request whose
    client went away before its turn is answered without being decided or decoded."""
    from adaptspec.serving.cancelling import Cancellation
    from adaptspec.serving.request_error import RequestError

    spec, codec = tiny_speculator(0, verification="exact")
    stuck = StuckDecode(spec)
    svc = CompletionService.build(stuck, {"A": "fixed:4"}, codec=codec, limits=LIMITS)
    try:
        stuck.armed.set()  # the first request holds the speculator until released
        got: dict = {}
        done = threading.Event()
        svc.runner.submit(
            svc.parse(b'{"prompt": "hi", "max_tokens": 4}'),
            None,
            None,
            None,
            lambda r: got.setdefault("first", r),
        )
        cancel = Cancellation()
        svc.runner.submit(
            svc.parse(b'{"prompt": "yo", "max_tokens": 4}'),
            None,
            None,
            cancel,
            lambda r: (got.setdefault("second", r), done.set()),
        )
        cancel.cancel()
        stuck.armed.clear()
        stuck.release.set()
        assert done.wait(60)
        assert isinstance(got["second"], RequestError) and got["second"].status == 499
        assert got["first"].outcome.tokens == alone("hi", 4)
        assert svc.controllers["A"].stats()["decisions"] == 1
    finally:
        svc.close()
