"""``serve`` (the batched engine, the default): every request a row of one engine, decided by its variant's controller.

In process (FastAPI TestClient) over the tiny model in exact mode, so every output can be
checked against the model's own greedy decoding of that prompt alone (plain transformers,
computed here); then one real server on 127.0.0.1.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from _batching_helpers import one_thread  # noqa: F401  (autouse: one torch thread per module)
from adaptspec.cli import main
from adaptspec.serving import CompletionService, ServerLimits
from adaptspec.serving.app import create_app
from adaptspec.serving.codec import CharCodec
from adaptspec.serving.engine.batched import EngineSettings
from adaptspec.serving.tiny import tiny_model, tiny_speculator
from adaptspec.traces.log_writer import log_rows

CODEC = CharCodec()
PROMPTS = ["Hello there", "def f(x):", "1 + 1 =", "Once upon a time", "The quick brown fox", "Q: why?"]


_MODEL = {}


def alone(prompt: str, n: int) -> list[int]:
    """The reference: the tiny target's own greedy ``generate`` of the prompt alone (stops after EOS)."""
    model = _MODEL.setdefault(0, tiny_model(0))
    ids = CODEC.encode(prompt)
    return model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)[0, len(ids) :].tolist()


def batched_service(log_dir, max_rows=3, max_queue=8, variants=None):
    spec, codec = tiny_speculator(0, verification="exact")
    svc = CompletionService.build(
        spec,
        variants or {"A": "linucb", "B": "fixed:4"},
        codec=codec,
        log_dir=log_dir,
        limits=ServerLimits(max_context=512, vocab_size=128, max_tokens=400),
        arms=[1, 2, 4, 8],
        engine=EngineSettings(max_rows=max_rows, max_queue=max_queue),
    )
    return svc


def sse_json(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_concurrent_requests_equal_decoding_alone_and_their_decisions_are_logged_with_rewards(tmp_path):
    from fastapi.testclient import TestClient

    svc = batched_service(tmp_path / "log")
    bodies = [
        {"prompt": p, "max_tokens": 10 + 3 * i, "user": f"u{i}", "stream": i % 2 == 1}
        for i, p in enumerate(PROMPTS)
    ]
    with TestClient(create_app(svc)) as client:

        def one(body):
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            if not body["stream"]:
                return r.json()["choices"][0]["token_ids"], r.json()["adaptspec"]
            chunks = sse_json(r.text)
            return [t for c in chunks for t in c["choices"][0]["token_ids"]], chunks[-1]["adaptspec"]

        loop = svc.runner.loop
        hold = (
            threading.Event()
        )  # hold the engine's thread until every request is queued, so they share rounds
        blocker = loop.submit(CODEC.encode("wait"), max_new_tokens=2, on_tokens=lambda ids: hold.wait(60))
        with ThreadPoolExecutor(len(bodies)) as pool:
            futures = [pool.submit(one, b) for b in bodies]
            deadline = time.time() + 60
            while loop.queue_length < len(bodies) and time.time() < deadline:
                time.sleep(0.005)
            hold.set()
            got = [f.result() for f in futures]
        blocker.wait(60)
        assert max(r.rows for r in loop.engine.history) == 3  # they really shared rounds (max_rows = 3)
        metrics = client.get("/metrics").text
    for body, (ids, info) in zip(bodies, got):
        assert ids == alone(body["prompt"], body["max_tokens"])
        assert info["block_size"] in (1, 2, 4, 8)
        assert (info["reward"] is None) == (
            info["rounds"] == 0
        )  # ended at its first token: no reward (one prompt does)
    assert sum(info["reward"] is not None for _, info in got) >= 4
    for name in (
        "adaptspec_rows_in_flight",
        "adaptspec_queue_length",
        "adaptspec_tokens_per_round",
        "adaptspec_batch_seconds",
        "adaptspec_batch_rounds_total",
    ):
        assert name in metrics
    rounds = float(
        next(x for x in metrics.splitlines() if x.startswith("adaptspec_batch_rounds_total")).split()[1]
    )
    assert rounds == len(loop.engine.history)
    # rounds by (rows, widest block), counted from the engine's own history
    from collections import Counter

    by_width = Counter((r.rows, r.width) for r in loop.engine.history)
    for (n, w), count in by_width.items():
        assert (
            f'adaptspec_batch_rounds_by_width_total{{block_size="{w}",rows="{n}"}} {float(count)}' in metrics
        )
    # every decision is in the log with the reward and the attributed decode time the client was told
    rows = {r["decision_id"]: r for r in log_rows(tmp_path / "log")}
    for _, info in got:
        row = rows[info["decision_id"]]
        assert row["reward"] == (None if info["reward"] is None else pytest.approx(info["reward"])) and row[
            "decode_ms"
        ] == pytest.approx(1000 * info["decode_s"], abs=1e-3)
    # attribution conserves time: the requests' decode times add up to the rounds' decode time (prefills excluded)
    total = sum(r.round_s - r.join_s for r in loop.engine.history)
    logged = (
        sum(r["decode_ms"] for r in rows.values()) + 1000 * blocker.attributed_s
    )  # the blocker is not a logged request
    assert logged == pytest.approx(1000 * total, rel=1e-6)


def test_a_stop_sequence_ends_the_row_early_as_stop_and_leaves_its_neighbours_alone(tmp_path):
    from fastapi.testclient import TestClient

    full = alone("Dear Sir,", 80)
    text = CODEC.decode(full)
    assert len(full) == 80 and len(text) > 30  # no EOS: without the stop it would run 80 tokens
    stop = text[21:23]
    cut = text[: text.find(stop)]  # the output ends before the first occurrence of the stop string
    k = next(k for k in range(1, 81) if stop in CODEC.decode(full[:k]))  # tokens until the stop is complete
    svc = batched_service(tmp_path / "log", variants={"B": "fixed:4"})
    with TestClient(create_app(svc)) as client:
        with ThreadPoolExecutor(3) as pool:
            plain = pool.submit(
                client.post, "/v1/completions", json={"prompt": "Hello there", "max_tokens": 40}
            )
            streamed = pool.submit(
                client.post,
                "/v1/completions",
                json={"prompt": "Dear Sir,", "max_tokens": 80, "stop": stop, "stream": True},
            )
            whole = pool.submit(
                client.post, "/v1/completions", json={"prompt": "Dear Sir,", "max_tokens": 80, "stop": [stop]}
            )
            plain, streamed, whole = plain.result(), streamed.result(), whole.result()
    body = whole.json()
    assert body["choices"][0]["text"] == cut and body["choices"][0]["finish_reason"] == "stop"
    # the row ended at the round boundary after the stop: at most a block (4) past the stop's last token
    committed = {r["decision_id"]: r["new_tokens"] for r in log_rows(tmp_path / "log")}
    assert k <= committed[body["adaptspec"]["decision_id"]] <= k + 3 < 80
    chunks = sse_json(streamed.text)
    assert (
        "".join(c["choices"][0]["text"] for c in chunks) == cut
        and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    )
    assert plain.json()["choices"][0]["token_ids"] == alone("Hello there", 40)


def test_a_full_queue_answers_429_with_retry_after_for_plain_and_streamed_requests(tmp_path):
    from fastapi.testclient import TestClient

    svc = batched_service(tmp_path / "log", max_rows=1, max_queue=0)
    loop = svc.runner.loop
    with TestClient(create_app(svc)) as client:
        hold = (
            threading.Event()
        )  # the first request's stream callback holds the engine's thread: its row stays taken
        first = loop.submit(CODEC.encode("long"), max_new_tokens=8, on_tokens=lambda ids: hold.wait(60))
        deadline = time.time() + 60
        while loop.stats()["rows_in_flight"] == 0 and time.time() < deadline:
            time.sleep(0.005)
        for stream in (False, True):
            r = client.post("/v1/completions", json={"prompt": "next", "max_tokens": 4, "stream": stream})
            assert r.status_code == 429, r.text
            assert int(r.headers["retry-after"]) >= 1
            msg = r.json()["error"]["message"]
            assert "at capacity" in msg and "\n" not in msg
        hold.set()
        assert first.wait(timeout=60).tokens == alone("long", 8)
        assert client.post("/v1/completions", json={"prompt": "next", "max_tokens": 4}).status_code == 200
        assert 'adaptspec_rejected_requests_total{code="429"} 2.0' in client.get("/metrics").text


def test_chat_completions_run_batched_too(tmp_path):
    from fastapi.testclient import TestClient

    svc = batched_service(tmp_path / "log", variants={"B": "fixed:4"})
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    want = alone("<system>Be brief.\n<user>Hi\n<assistant>", 20)  # the tiny codec's chat template, rendered
    with TestClient(create_app(svc)) as client:
        r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 20})
        streamed = client.post(
            "/v1/chat/completions", json={"messages": messages, "max_tokens": 20, "stream": True}
        )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == CODEC.decode(want)
    pieces = [
        c["choices"][0]["delta"].get("content") or "" for c in sse_json(streamed.text) if c.get("choices")
    ]
    assert "".join(pieces) == CODEC.decode(want)
    assert svc.runner.loop.rounds > 0  # decoded by the engine, not a per-request decode


@pytest.mark.parametrize(
    "argv,needle",
    [
        (
            ["--tiny", "--load-rule", "fastest"],
            "--load-rule 'fastest': expected one of fixed:B, goodput, learned",
        ),
        (
            ["--tiny", "--batched", "--load-rule", "fixed:0"],
            "--load-rule 'fixed:0': the block size must be >= 1",
        ),
        (["--tiny", "--load-rule", "table:1=3,4"], "--load-rule 'table:1=3,4': expected table:ROWS=BLOCK"),
        (
            ["--tiny", "--redecide-every", "4"],
            "--redecide-every needs --speculator: the batched engine decides once",
        ),
        # with --speculator a bad rule is refused before the factory runs (whether the engine's options apply at all
        # is decided by what it returns: tests/test_byo_toolchain.py)
        (
            ["--speculator", "nosuchmod:make", "--load-rule", "fastest"],
            "--load-rule 'fastest': expected one of",
        ),
    ],
)
def test_engine_options_are_checked_in_one_line_before_a_model_loads(capsys, argv, needle):
    assert main(["serve", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


@pytest.mark.integration
def test_a_real_batched_server_serves_concurrent_clients_exactly(tmp_path):
    from test_serving import Server

    s = Server(tmp_path, "--verification", "exact", "--max-rows", "4", "--max-queue", "16").start()
    try:
        bodies = [
            {"prompt": p, "max_tokens": 16, "user": f"u{i}", "stream": i % 2 == 0}
            for i, p in enumerate(PROMPTS)
        ]

        def one(body):
            with httpx.Client(timeout=120) as c:
                r = c.post(s.url + "/v1/completions", json=body)
                assert r.status_code == 200, r.text
                if body["stream"]:
                    return [t for ch in sse_json(r.text) for t in ch["choices"][0]["token_ids"]]
                return r.json()["choices"][0]["token_ids"]

        with ThreadPoolExecutor(len(bodies)) as pool:
            got = list(pool.map(one, bodies))
        for body, ids in zip(bodies, got):
            assert ids == alone(body["prompt"], 16)
        metrics = httpx.get(s.url + "/metrics", timeout=30).text
        assert "adaptspec_rows_in_flight 0.0" in metrics and "adaptspec_batch_seconds" in metrics
    finally:
        assert s.stop() in (0, -signal.SIGTERM)
    logged = log_rows(s.log)
    assert len(logged) == len(PROMPTS) and sum(r["reward"] is not None for r in logged) >= len(PROMPTS) - 1


class Recording:
    """A load rule's choices, as it made them, for the test to compare with what was verified."""

    def __init__(self, rule):
        self.rule, self.name, self.chosen = rule, rule.name, []

    def choose(self, rows, load):
        out = self.rule.choose(rows, load)
        self.chosen.append((load.rows, list(out)))
        return out

    def feedback(self, *args):
        self.rule.feedback(*args)


@pytest.mark.parametrize("spec", ["fixed:3", "goodput", "learned"])
def test_a_load_rule_chooses_every_round_capped_by_each_requests_own_block_size(tmp_path, spec):
    from fastapi.testclient import TestClient

    from adaptspec.load_rules.round_rule import make_load_rule

    rule = Recording(make_load_rule(spec, [1, 2, 3, 4, 6, 8], "cpu-smollm2-bf16", prior=0.4))
    tiny, codec = tiny_speculator(0, verification="exact")
    svc = CompletionService.build(
        tiny,
        {"A": "fixed:4"},
        codec=codec,
        log_dir=tmp_path / "log",
        limits=ServerLimits(max_context=512, vocab_size=128),
        arms=[1, 2, 4, 8],
        engine=EngineSettings(max_rows=4, max_queue=8, rule=rule),
    )
    n = 24
    with TestClient(create_app(svc)) as client:
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = list(
                pool.map(
                    lambda p: client.post("/v1/completions", json={"prompt": p, "max_tokens": n}).json(),
                    PROMPTS,
                )
            )
        loop = svc.runner.loop
        history = list(loop.engine.history)
        stats = loop.stats()
    for p, r in zip(PROMPTS, got):
        assert r["choices"][0]["token_ids"] == alone(p, n)  # exact, whatever the rule verified
    assert len(rule.chosen) == len(history) and max(rec.rows for rec in history) > 1
    committed: dict[int, int] = {}
    for (rows, chosen), rec in zip(rule.chosen, history):
        assert rows == rec.rows == len(chosen)
        for rid, c, b, tau in zip(rec.requests, chosen, rec.block_sizes, rec.taus):
            m = committed.get(rid, 1)  # the prefill's token
            assert b == min(
                c, 4, n - m
            )  # the rule's choice, capped by the request's own (fixed:4) and its room
            committed[rid] = m + tau
    if spec == "fixed:3":
        assert {c for _, cs in rule.chosen for c in cs} == {3}
    assert loop.rule.row_rounds == sum(rec.rows for rec in history)  # every row's round went back to the rule
    assert 0 < stats["rule_s"] < stats["decode_s"]


def test_the_engine_decides_on_its_own_thread_no_decision_thread(tmp_path):
    """A request served by the engine is decided on the engine's thread: no decision thread exists
    (one hand-off fewer per request, docs/architecture.md)."""
    from fastapi.testclient import TestClient

    svc = batched_service(tmp_path / "log")
    with TestClient(create_app(svc)) as client:
        assert (
            client.post(
                "/v1/completions", json={"prompt": "hello", "max_tokens": 4, "user": "u1"}
            ).status_code
            == 200
        )
        names = [t.name for t in threading.enumerate()]
    assert not [n for n in names if n.startswith("adaptspec-decide")], names
    assert sum(c.stats()["decisions"] for c in svc.controllers.values()) == 1
    assert all(c.config.decide_on_caller for c in svc.controllers.values())
    svc.close()
