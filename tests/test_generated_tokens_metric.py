"""``adaptspec_generated_tokens_total`` counts what clients received (``usage.completion_tokens``),
not the tokens decoded past a stop sequence, with and without the batched engine, plain and streamed.

The decision log's ``new_tokens`` (what the decoder committed) is the second source: it must be
larger than what was sent, else the test could not tell the two counts apart.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from _batching_helpers import one_thread  # noqa: F401  (autouse: one torch thread per module)
from _serving_helpers import OwnSpeculator
from adaptspec.serving import CompletionService, ServerLimits
from adaptspec.serving.app import create_app
from adaptspec.serving.codec import CharCodec
from adaptspec.serving.engine.batched import EngineSettings
from adaptspec.serving.tiny import tiny_model, tiny_speculator
from adaptspec.traces.log_writer import log_rows

CODEC = CharCodec()
PROMPT = "Q: why?"  # the tiny drafter's drafts are mostly rejected; here two rounds of 4 are accepted


@pytest.fixture(scope="module")
def stop() -> str:
    """The 2nd and 3rd characters of the tiny target's own greedy continuation of PROMPT: the stop
    completes at the first token of a round that commits 4 (block size 4), so 3 are decoded past it."""
    ids = CODEC.encode(PROMPT)
    full = (
        tiny_model(0)
        .generate(torch.tensor([ids]), do_sample=False, max_new_tokens=60)[0, len(ids) :]
        .tolist()
    )
    text = CODEC.decode(full)
    assert len(text) == 60 and text[1:3] not in text[:2]
    return text[1:3]


def generated(client, variant: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        m = re.match(r'^adaptspec_generated_tokens_total\{variant="(\w+)"\} (\S+)$', line)
        if m and m.group(1) == variant:
            return float(m.group(2))
    return 0.0


def usage_of(r, stream: bool) -> tuple[dict, str]:
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["usage"], r.json()["adaptspec"]["decision_id"]
    chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    return chunks[-1]["usage"], chunks[-1]["adaptspec"]["decision_id"]


@pytest.mark.parametrize("batched", [False, True])
def test_generated_tokens_count_the_completion_tokens_the_client_got(tmp_path, stop, batched):
    from fastapi.testclient import TestClient

    spec, codec = tiny_speculator(0, verification="exact")
    # batched: adaptspec's decoder on the engine; else the same decoder as a speculator of one's own,
    # served one request at a time through its controller
    svc = CompletionService.build(
        spec if batched else OwnSpeculator(spec),
        {"B": "fixed:4"},
        codec=codec,
        log_dir=tmp_path / "log",
        limits=ServerLimits(max_context=512, vocab_size=128, max_tokens=400),
        arms=[1, 2, 4, 8],
        engine=EngineSettings(max_rows=2, max_queue=4) if batched else None,
    )
    with TestClient(create_app(svc)) as client:
        for stream in (False, True):
            before = generated(client, "B")
            r = client.post(
                "/v1/completions", json={"prompt": PROMPT, "max_tokens": 60, "stop": stop, "stream": stream}
            )
            usage, decision_id = usage_of(r, stream)
            after = generated(client, "B")
            committed = {x["decision_id"]: x["new_tokens"] for x in log_rows(tmp_path / "log")}[decision_id]
            assert usage["completion_tokens"] < committed  # tokens were decoded past the stop sequence
            assert after - before == usage["completion_tokens"]
        # a request without a stop sequence counts every token it got
        before = generated(client, "B")
        r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12})
        assert generated(client, "B") - before == r.json()["usage"]["completion_tokens"] == 12
