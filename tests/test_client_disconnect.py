"""A client that goes away cancels its batched request: the row leaves the engine at the next round
boundary instead of decoding for nobody, and the server keeps serving.

A real uvicorn server on 127.0.0.1 (in a thread of this process, so the test can watch the
engine's rows) and a real HTTP client (httpx): a streamed request whose connection is closed
after its first chunk, a plain request whose client gives up (read timeout). A long request
(400 tokens, no EOS in the tiny target's greedy output) is slowed down by a neighbour row whose
stream callback sleeps 20 ms a round, so without the cancel it would decode for 8 s or more.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import pytest
import torch

from _batching_helpers import one_thread  # noqa: F401  (autouse: one torch thread per module)
from _serving_helpers import ThreadServer
from adaptspec.serving import CompletionService, ServerLimits
from adaptspec.serving.app import create_app
from adaptspec.serving.codec import CharCodec
from adaptspec.serving.engine.batched import EngineSettings
from adaptspec.serving.tiny import tiny_model, tiny_speculator
from adaptspec.traces.log_writer import log_rows

CODEC = CharCodec()
N = 400


def other_row(loop, blocker, timeout: float = 60.0):
    """The handle of the row decoding beside the blocker, once there is one."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        rows = [r.handle for r in list(loop.engine.rows) if r.handle is not blocker.handle]
        if rows:
            return rows[0]
        time.sleep(0.005)
    raise AssertionError("the request never joined the batch")


def until(cond, timeout: float = 10.0) -> float:
    """Seconds until ``cond()`` held (fails after ``timeout``)."""
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.005)
    return time.time() - t0


def test_a_client_that_goes_away_cancels_its_row_and_the_server_keeps_serving(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="adaptspec.serving")
    spec, codec = tiny_speculator(0, verification="exact")
    svc = CompletionService.build(
        spec,
        {"B": "fixed:4"},
        codec=codec,
        log_dir=tmp_path / "log",
        limits=ServerLimits(max_context=512, vocab_size=128, max_tokens=N),
        arms=[1, 2, 4, 8],
        engine=EngineSettings(max_rows=3, max_queue=8),
    )
    loop = svc.runner.loop
    with ThreadServer(create_app(svc)) as s:
        blocker = loop.submit(CODEC.encode("aaaa"), max_new_tokens=N, on_tokens=lambda ids: time.sleep(0.02))
        until(lambda: blocker.handle is not None)
        # 1. streamed: the connection is closed after the first chunk
        with httpx.Client(timeout=60) as c:
            with c.stream(
                "POST", s.url + "/v1/completions", json={"prompt": "1 + 1 =", "max_tokens": N, "stream": True}
            ) as r:
                assert r.status_code == 200
                first = next(line for line in r.iter_lines() if line.startswith("data: {"))
                assert json.loads(first[6:])["choices"][0]["token_ids"]
                streamed = other_row(loop, blocker)
        took = until(lambda: streamed.done)
        assert (
            streamed.error is not None
            and "cancelled" in str(streamed.error)
            and streamed.finish_reason is None
        )
        assert 1 <= len(streamed.tokens) < N / 4 and took < 5  # it stopped decoding: far from its 400 tokens

        # 2. plain: the client gives up waiting (its read times out, it closes the connection)
        def give_up():
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(s.url + "/v1/completions", json={"prompt": "abcabc", "max_tokens": N}, timeout=1.5)

        t = threading.Thread(target=give_up)
        t.start()
        plain = other_row(loop, blocker)
        t.join(30)
        assert not t.is_alive()
        until(lambda: plain.done)
        assert plain.error is not None and "cancelled" in str(plain.error) and len(plain.tokens) < N / 4

        # the cancelled rows are gone; the server answers the next request exactly
        blocker.cancel()
        until(lambda: loop.stats()["rows_in_flight"] == 0 and loop.queue_length == 0)
        r = httpx.post(
            s.url + "/v1/completions", json={"prompt": "Hello there", "max_tokens": 12}, timeout=60
        )
        assert r.status_code == 200, r.text
        ids = CODEC.encode("Hello there")
        want = (
            tiny_model(0)
            .generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12)[0, len(ids) :]
            .tolist()
        )
        assert r.json()["choices"][0]["token_ids"] == want
        served = r.json()["adaptspec"]["decision_id"]
        metrics = httpx.get(s.url + "/metrics", timeout=30).text
        assert 'adaptspec_requests_total{status="error",variant="B"} 2.0' in metrics  # as any failed request
    said = [rec.getMessage() for rec in caplog.records if "client went away" in rec.getMessage()]
    assert len(said) == 2
    # as for any request that failed after its decision: logged without a reward (dropped at shutdown)
    rows = log_rows(tmp_path / "log")
    assert len(rows) == 3
    assert [r["reward"] is None for r in rows if r["decision_id"] != served] == [True, True]
    assert [r["new_tokens"] for r in rows if r["decision_id"] == served] == [len(want)]
