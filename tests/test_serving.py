"""Serving: router and request checks in-process; then a real server on loopback in a subprocess.

The server runs the tiny random model (``adaptspec serve --tiny``, character tokenizer, built
offline), so its greedy output can be recomputed here with the same weights.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from _threads import torch_threads
from adaptspec import AdaptspecError
from adaptspec.ab.router import ABRouter
from adaptspec.control.policy_checkpoint import state_digest
from adaptspec.policies import make_policy
from adaptspec.serving import CompletionService, RequestError, ServerLimits
from adaptspec.serving.codec import CharCodec, TextStream
from adaptspec.serving.engine.sequential import SequentialRunner
from adaptspec.serving.responses import completion_body, error_body
from adaptspec.traces import DecisionLog
from adaptspec.traces.log_writer import journal_rows, log_rows

TINY_ARMS = (1, 2, 4, 6, 8, 10, 12, 16)


# ============================================================================ in-process pieces
def test_router_is_stable_and_follows_the_weights():
    r = ABRouter({"A": 70, "B": 30})
    keys = [f"user-{i}" for i in range(20000)]
    got = [r.assign(k) for k in keys]
    assert got == [
        ABRouter({"A": 70, "B": 30}).assign(k) for k in keys
    ]  # same key, same variant, any instance
    assert abs(got.count("A") / len(got) - 0.7) < 0.015
    assert {r.assign(None) for _ in range(200)} == {"A", "B"}
    assert ABRouter({"A": 1, "B": 0}).assign("anyone") == "A"
    salted = ABRouter({"A": 50, "B": 50}, salt="experiment-2")
    assert [salted.assign(k) for k in keys[:200]] != [
        ABRouter({"A": 50, "B": 50}).assign(k) for k in keys[:200]
    ]
    for bad, msg in (
        (["A=fixed:4", "A=ucb"], "twice"),
        (["A"], "expected NAME=SPEC, e.g. A=fixed:16"),
        (["A=fixed:4"], "weights"),
    ):
        with pytest.raises(AdaptspecError, match=msg):
            ABRouter.parse(bad, "1,1" if msg == "weights" else None)
    with pytest.raises(AdaptspecError, match="variant name"):
        ABRouter({"A B": 1})
    with pytest.raises(AdaptspecError, match="weights must be"):
        ABRouter({"A": -1, "B": 2})
    with pytest.raises(AdaptspecError, match="unknown variant 'C'"):
        r.check("C")


class _NoController:
    def stats(self):  # pragma: no cover - not called by parse
        return {}


def service(**limits) -> CompletionService:
    lim = ServerLimits(
        **{
            "max_prompt_tokens": 64,
            "max_tokens": 100,
            "max_context": 128,
            "vocab_size": 128,
            "max_body_bytes": 4096,
            **limits,
        }
    )
    ctrls = {"A": _NoController(), "B": _NoController()}
    return CompletionService(ctrls, ABRouter({"A": 1, "B": 1}), SequentialRunner(ctrls), CharCodec(), lim)


@pytest.mark.parametrize(
    "body,status,needle",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"max_tokens": 4}', 400, "prompt is required"),
        (b'{"prompt": ""}', 400, "prompt is empty"),
        (b'{"prompt": ["a", "b"]}', 400, "one prompt per request"),
        (b'{"prompt": [1, "x"]}', 400, "integer token ids"),
        (b'{"prompt": [1, 999]}', 400, "outside the vocabulary"),
        (b'{"prompt": 42}', 400, "string or a list"),
        (b'{"prompt": "hi", "max_tokens": -1}', 400, "max_tokens must be a positive integer"),
        (b'{"prompt": "hi", "max_tokens": 2.5}', 400, "max_tokens must be a positive integer"),
        (b'{"prompt": "hi", "max_tokens": 101}', 400, "limit of 100"),
        (b'{"prompt": "' + b"x" * 65 + b'"}', 400, "prompt has 65 tokens; this server accepts at most 64"),
        (b'{"prompt": "' + b"x" * 60 + b'", "max_tokens": 80}', 400, "exceeds the model's context of 128"),
        (b'{"prompt": "hi", "temperature": -0.5}', 400, "temperature"),
        (b'{"prompt": "hi", "seed": "x"}', 400, "seed"),
        (b'{"prompt": "hi", "stream": "yes"}', 400, "stream must be true or false"),
        (b'{"prompt": "hi", "variant": "C"}', 400, "unknown variant 'C': this server has A, B"),
        (b'{"prompt": "hi", "n": 2}', 400, "n=2 is not supported"),
        (b'{"prompt": "hi", "user": 5}', 400, "user must be a string"),
        (b'{"prompt": "' + b"x" * 5000 + b'"}', 413, "limit is 4096"),
    ],
)
def test_malformed_requests_are_rejected_with_a_clear_message(body, status, needle):
    with pytest.raises(RequestError) as e:
        service().parse(body)
    assert e.value.status == status and needle in str(e.value)
    assert error_body(e.value)["error"] == {
        "message": str(e.value),
        "type": "invalid_request_error",
        "param": e.value.param,
        "code": status,
    }


def test_a_good_request_is_parsed():
    s = service()
    r = s.parse(b'{"prompt": "Hi", "max_tokens": 5, "user": "u1", "stream": true, "n": 1, "stop": null}')
    assert r.prompt_ids == [72, 105] and r.max_tokens == 5 and r.stream and r.temperature == 0.0
    assert r.variant == s.router.assign("u1")
    assert s.parse(b'{"prompt": [[1, 2, 3]]}').prompt_ids == [1, 2, 3]
    assert s.parse(b'{"prompt": [1]}', variant_header="B").variant == "B"
    assert s.parse(b'{"prompt": "x"}').max_tokens == 16
    no_tok = CompletionService(
        {"A": _NoController()}, ABRouter({"A": 1}), SequentialRunner({"A": _NoController()}), None
    )
    with pytest.raises(RequestError, match="no tokenizer"):
        no_tok.parse(b'{"prompt": "text"}')


def test_the_service_runs_requests_and_maps_a_refused_prompt_to_400(tmp_path):
    from _controller_helpers import FakeSpeculator

    spec = FakeSpeculator()
    svc = CompletionService.build(
        spec, {"A": "fixed:4", "B": "fixed:8"}, "1,0", log_dir=tmp_path, metrics=False
    )
    try:
        req = svc.parse(b'{"prompt": [1, 2, 3], "max_tokens": 6, "user": "anyone"}')
        assert req.variant == "A"  # weight 0 for B: reachable only by name
        gen = svc.run(req)
        body = completion_body(svc.model_name, req, gen, svc.output(gen))
        assert body["choices"][0]["token_ids"] == gen.outcome.tokens and body["adaptspec"]["block_size"] == 4
        assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}

        def refuse(prompt_ids, **kw):
            raise AdaptspecError("prompt has token ids outside 0..95")

        spec.prefill = refuse
        with pytest.raises(RequestError) as e:
            svc.run(svc.parse(b'{"prompt": [500], "variant": "B"}'))
        assert e.value.status == 400 and "outside 0..95" in str(e.value)
        assert svc.health()["variants"]["A"]["decisions"] == 1
    finally:
        svc.close()


def test_text_stream_adds_up_to_the_decoded_text():
    codec = CharCodec()
    s = TextStream(codec)
    ids = codec.encode("Hello, world!\n")
    assert "".join(s.push([i]) for i in ids) + s.flush() == codec.decode(ids)
    assert TextStream(None).push([1, 2]) == ""

    class Bytes:  # a byte-level tokenizer: multi-byte characters arrive split over tokens
        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    s = TextStream(Bytes())
    parts = [s.push([b]) for b in "héllo ✓".encode()]
    assert "".join(parts) + s.flush() == "héllo ✓" and "\ufffd" not in "".join(parts)


# ============================================================================ a real server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, root: Path, *extra: str) -> None:
        self.root = root
        self.log, self.ck = root / "log", root / "ck"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            "serve",
            "--tiny",
            "--threads",
            "1",
            "--variant",
            "A=linucb",
            "--variant",
            "B=fixed:4",
            "--split",
            "50,50",
            "--log-dir",
            str(self.log),
            "--checkpoint-dir",
            str(self.ck),
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            *extra,
        ]
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Server":
        return self.launch().ready()

    def launch(self) -> "Server":
        """Start the process and return at once (then :meth:`ready`): servers launched together load side by side."""
        out = open(self.root / "server.out", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "adaptspec", *self.args], stdout=out, stderr=out)
        return self

    def ready(self) -> "Server":
        """Wait until /health answers 200 (at most 120 s)."""
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {(self.root / 'server.out').read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not start")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(
        tmp_path_factory.mktemp("serve"), "--max-prompt-tokens", "256", "--checkpoint-every", "5"
    ).start()
    yield s
    assert s.stop() in (0, -signal.SIGTERM)


def complete(url: str, body: dict, client: httpx.Client | None = None) -> dict:
    """One completion; a streamed one is reassembled into the non-streamed shape."""
    c = client or httpx.Client(timeout=120)
    if not body.get("stream"):
        r = c.post(url + "/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()
    text, ids, final, n_chunks = "", [], None, 0
    with c.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            n_chunks += 1
            ch = chunk["choices"][0]
            text += ch["text"]
            ids += ch["token_ids"]
            if ch["finish_reason"] is not None:
                final = chunk
    assert final is not None and n_chunks >= 2
    final["choices"][0].update(text=text, token_ids=ids)
    return final


def greedy_reference(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """What the tiny model generates greedily, recomputed in this process with plain transformers."""
    import torch

    from adaptspec.serving.tiny import tiny_model

    with torch_threads(1):
        model = tiny_model(0)
        out = []
        for p in prompts:
            g = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=max_tokens)
            out.append(g[0, len(p) :].tolist())
        return out


PROMPTS = [
    "Hello there",
    "def f(x):",
    "1 + 1 =",
    "Once upon a time",
    "The quick brown fox",
    "import numpy",
    "Q: why?",
    "Dear Sir,",
]


def request(i: int, stream: bool) -> dict:
    p = PROMPTS[i % len(PROMPTS)] + f" #{i // len(PROMPTS)}"
    prompt = p if i % 3 else CharCodec().encode(p)  # text and token-id prompts
    return {
        "prompt": prompt,
        "max_tokens": 12 + i % 5,
        "temperature": 0,
        "stream": stream,
        "user": f"user-{i}",
    }


def test_concurrent_clients_get_the_sequential_and_greedy_outputs(server):
    reqs = [request(i, stream=i % 2 == 0) for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        concurrent = list(pool.map(lambda b: complete(server.url, b), reqs))
    with httpx.Client(timeout=120) as c:
        sequential = [complete(server.url, {**b, "stream": False}, c) for b in reqs]
    for a, b, body in zip(concurrent, sequential, reqs):
        assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
        assert a["choices"][0]["text"] == b["choices"][0]["text"]
        assert a["adaptspec"]["variant"] == b["adaptspec"]["variant"]  # the user key routes the same way
        assert len(a["choices"][0]["token_ids"]) <= body["max_tokens"]
    variants = {r["adaptspec"]["variant"] for r in concurrent}
    assert variants == {"A", "B"}
    prompts = [
        b["prompt"] if isinstance(b["prompt"], list) else CharCodec().encode(b["prompt"]) for b in reqs[:4]
    ]
    ref = greedy_reference(prompts, 16)
    for r, want, b in zip(concurrent[:4], ref, reqs[:4]):
        got = r["choices"][0]["token_ids"]
        assert got == want[: len(got)] and (len(got) == b["max_tokens"] or got[-1] == CharCodec.eos)
    # every completion was decided, logged with its variant and propensity
    ids = [r["adaptspec"]["decision_id"] for r in concurrent + sequential]
    rows = {r["decision_id"]: r for r in log_rows(server.log)}
    assert set(ids) <= set(rows)
    for r in concurrent:
        row = rows[r["adaptspec"]["decision_id"]]
        assert (
            row["variant"] == r["adaptspec"]["variant"] and row["propensity"] == r["adaptspec"]["propensity"]
        )
        assert row["block_size"] == r["adaptspec"]["block_size"]


def test_malformed_requests_get_4xx_and_do_not_disturb_others(server):
    good = [request(i, stream=i % 2 == 1) for i in range(8)]
    with httpx.Client(timeout=120) as c:
        want = [complete(server.url, {**b, "stream": False}, c)["choices"][0]["token_ids"] for b in good]
    bad = [
        (b"{oops", "not valid JSON"),
        (json.dumps({"prompt": "hi", "max_tokens": -4}).encode(), "max_tokens must be a positive integer"),
        (json.dumps({"prompt": "hi", "variant": "Z"}).encode(), "unknown variant 'Z'"),
        (
            json.dumps({"prompt": "x" * 300}).encode(),
            "prompt has 300 tokens; this server accepts at most 256",
        ),
        (json.dumps({"prompt": [1, 2, 500]}).encode(), "outside the vocabulary"),
        (json.dumps({"prompt": "x" * 200, "max_tokens": 400}).encode(), "context of 512"),
        (b"x" * (2 << 20), "limit is"),
    ]

    def send_bad(item):
        body, needle = item
        r = httpx.post(
            server.url + "/v1/completions",
            content=body,
            timeout=60,
            headers={"content-type": "application/json"},
        )
        return r.status_code, r.json()["error"]["message"], needle

    with ThreadPoolExecutor(16) as pool:
        goods = [pool.submit(complete, server.url, b) for b in good]
        bads = [pool.submit(send_bad, item) for item in bad * 2]
        got = [f.result()["choices"][0]["token_ids"] for f in goods]
        results = [f.result() for f in bads]
    assert got == want
    for status, message, needle in results:
        assert 400 <= status < 500 and needle in message, (status, message)
    assert sorted({s for s, _, _ in results}) == [400, 413]
    metrics = httpx.get(server.url + "/metrics").text
    assert 'adaptspec_rejected_requests_total{code="400"}' in metrics
    assert 'adaptspec_rejected_requests_total{code="413"}' in metrics


def test_metrics_ab_and_health(server):
    with httpx.Client(timeout=120) as c:
        for i in range(24):
            complete(server.url, {"prompt": f"warm {i}", "max_tokens": 8, "variant": "AB"[i % 2]}, c)
        m = c.get(server.url + "/metrics")
        h = c.get(server.url + "/health").json()
        ab = c.get(server.url + "/ab").json()
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    text = m.text
    for needle in (
        'adaptspec_requests_total{status="ok",variant="A"}',
        'adaptspec_generated_tokens_total{variant="B"}',
        'adaptspec_mean_tau_count{variant="A"}',
        "adaptspec_decode_tokens_per_second_bucket",
        'adaptspec_block_size_chosen_total{block_size="4",variant="B"}',
        'adaptspec_fallbacks_total{reason="timeout",variant="A"}',
        "adaptspec_policy_updates_total",
        "adaptspec_time_to_first_token_seconds_count",
    ):
        assert needle in text, needle
    assert (
        h["status"] == "ok" and set(h["variants"]) == {"A", "B"} and h["variants"]["B"]["spec"] == "fixed:4"
    )
    assert h["variants"]["A"]["updates"] >= 12
    assert set(ab["variants"]) == {"A", "B"} and ab["variants"]["B"]["block_sizes"].keys() == {"4"}
    (t,) = ab["sequential"]["tests"]
    assert t["n"]["A"] >= 12 and t["n"]["B"] >= 12 and t["p_value"] is not None
    assert {(e["target"], e["logged_by"]) for e in ab["off_policy"]} == {("A", "B"), ("B", "A")}
    assert ab["router"]["variants"]["A"]["weight"] == 0.5


def logged_digest(log: Path, variant: str, spec: str) -> tuple[str, int]:
    """A fresh policy fed every logged reward of ``variant``, in log order."""
    pol = make_policy(spec, TINY_ARMS, seed=0)
    n = 0
    for r in log_rows(log, ["variant", "block_size", "reward", "features"]):
        if r["variant"] == variant and r["reward"] is not None:
            pol.update(np.asarray(r["features"], np.float32).astype(np.float64), r["block_size"], r["reward"])
            n += 1
    return state_digest(pol), n


def test_sigkill_mid_stream_then_restart_loses_nothing_acknowledged(tmp_path):
    srv = Server(tmp_path, "--checkpoint-every", "4", "--roll-rows", "5").start()
    acked = []
    with httpx.Client(timeout=120) as c:
        for i in range(11):
            r = complete(
                srv.url, {"prompt": f"before the crash {i}", "max_tokens": 10, "variant": "AB"[i % 3 == 0]}, c
            )
            acked.append(r["adaptspec"]["decision_id"])
    got_first = threading.Event()
    stream_result: dict = {}

    def long_stream():
        try:
            with httpx.stream(
                "POST",
                srv.url + "/v1/completions",
                timeout=120,
                json={"prompt": "a long one", "max_tokens": 480, "stream": True, "variant": "A"},
            ) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        got_first.set()
            stream_result["ended"] = "cleanly"
        except httpx.HTTPError as e:
            stream_result["ended"] = repr(e)
            got_first.set()

    t = threading.Thread(target=long_stream)
    t.start()
    assert got_first.wait(60)
    assert srv.stop(signal.SIGKILL) == -signal.SIGKILL  # mid-stream
    t.join(30)
    assert stream_result["ended"] != "cleanly"  # the client saw the connection drop
    assert journal_rows(srv.log)  # acknowledged rows not yet rolled into a part

    srv.start()  # same directories
    try:
        ids = set(DecisionLog.read(srv.log).table.column("decision_id").to_pylist())
        assert set(acked) <= ids
        assert not journal_rows(srv.log)  # the dead server's journal became a part at start
        health = httpx.get(srv.url + "/health?digest=1", timeout=60).json()
        a = health["variants"]["A"]
        digest, n = logged_digest(srv.log, "A", "linucb")
        assert a["resumed"]["checkpoint"] is not None
        assert a["resumed"]["updates_at_checkpoint"] + a["resumed"]["replayed"] == n == a["updates"]
        assert a["policy_digest"] == digest  # exactly the state after every acknowledged feedback
        # it goes on serving and learning
        more = complete(srv.url, {"prompt": "after the restart", "max_tokens": 6, "variant": "A"})
        assert more["adaptspec"]["policy_version"] >= n
    finally:
        # graceful (uvicorn re-raises SIGTERM once it has shut down): log rolled, final checkpoint
        assert srv.stop() in (0, -signal.SIGTERM)
    assert not list(srv.log.glob(".journal-*"))
    rows = DecisionLog.read(srv.log).table.to_pylist()
    n_a = sum(r["variant"] == "A" and r["reward"] is not None for r in rows)
    from adaptspec.control.policy_checkpoint import latest_checkpoint, read_checkpoint

    assert read_checkpoint(latest_checkpoint(srv.ck / "A"))["updates"] == n_a
