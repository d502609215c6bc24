"""``serve --speculator`` with a speculator that claims ``max_block_size`` 1000 but drafts 8 at
most (issue 46, item 4: "... and `serve` accepts it").

The server cannot know a claim is false before a request asks for a block its loop cannot draft:
then that request is one 503 with a reason (no traceback, no 500, neither the speculator's
exception text nor a path in the body), the server's log keeps the error, and the server goes on
answering (``/health`` answers, the next request gets the same clean 503). A real server on
127.0.0.1 (uvicorn on a thread, the server's own HTTP configuration), the factory a module in
``tmp_path`` loaded as ``serve --speculator MODULE:FACTORY`` loads it.
"""

from __future__ import annotations

import logging
import sys

import httpx
import pytest

from _serving_helpers import ThreadServer
from adaptspec.cli import build_parser
from adaptspec.cli.serve import build
from adaptspec.serving.app import create_app

pytestmark = pytest.mark.integration  # starts a server on loopback

#: a speculator of a user's own whose loop has a block buffer of 8, but which declares 1000
CLAIMS = """
import numpy as np

from adaptspec import Outcome, Prefill, Round

V, EOS = 41, 0


def nxt(seq):
    return (seq[-1] * 7 + len(seq) * 3) % (V - 1) + 1  # never EOS: every request runs its max_tokens


class Codec:
    def encode(self, text):
        return [ord(c) % (V - 1) + 1 for c in text] or [1]

    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)


class Claims1000:
    max_block_size, feature_dim, vocab_size, codec = 1000, 2, V, Codec()

    def prefill(self, prompt_ids, temperature=0.0, seed=None):
        ids = list(prompt_ids)
        return Prefill(nxt(ids), len(ids), np.asarray([len(ids), 1.0], np.float32), state=ids)

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        block = [0] * 8  # the loop's block buffer: 8 at most, whatever it declares
        seq, n0, rounds = list(prefill.state) + [prefill.first_token], len(prefill.state), []
        while len(seq) - n0 < max_new_tokens:
            block[block_size - 1] = 1  # IndexError for a block past 8
            tau = min(2, block_size, max_new_tokens - (len(seq) - n0))
            seq += [nxt(seq + [i]) for i in range(tau)]
            rounds.append(Round(block_size, tau, 0.001, 0.002))
        return Outcome(seq[n0:], rounds, 0.003 * len(rounds) + 0.001)


def make():
    return Claims1000()
"""


@pytest.fixture
def claims_module(tmp_path, monkeypatch):
    (tmp_path / "claims1000.py").write_text(CLAIMS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "claims1000:make"
    sys.modules.pop("claims1000", None)


def _serve(factory: str, tmp_path, *argv: str):
    args = build_parser("serve").parse_args(
        ["serve", "--speculator", factory, "--port", "0", "--log-dir", str(tmp_path / "log"), *argv]
    )
    return build(args)


def test_a_request_at_a_block_its_loop_cannot_draft_is_one_503_with_a_reason_and_the_server_serves_on(
    claims_module, tmp_path, caplog
):
    caplog.set_level(logging.ERROR, logger="adaptspec.serving")
    svc = _serve(claims_module, tmp_path, "--variant", "A=fixed:12")  # every request asks for a block of 12
    try:
        with ThreadServer(create_app(svc)) as s, httpx.Client(timeout=60) as c:
            for _ in range(2):
                r = c.post(s.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 6})
                assert r.status_code == 503, r.text
                message = r.json()["error"]["message"]
                assert message.startswith("the speculator could not decode this request"), message
                assert "IndexError" not in message and str(tmp_path) not in message and "\n" not in message
            assert c.get(s.url + "/health").status_code == 200
    finally:
        svc.close()
    assert "IndexError" in caplog.text  # the detail is in the server's log, not in the client's body


def test_the_same_speculator_asked_for_blocks_it_can_draft_answers_200(claims_module, tmp_path):
    # the neighbour that shows the 503 above is the false claim's: asked for 8, the same loop decodes
    svc = _serve(claims_module, tmp_path, "--variant", "A=fixed:8")
    try:
        with ThreadServer(create_app(svc)) as s, httpx.Client(timeout=60) as c:
            r = c.post(s.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 6})
            assert r.status_code == 200, r.text
            assert len(r.json()["choices"][0]["token_ids"]) == 6
    finally:
        svc.close()
