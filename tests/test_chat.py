"""/v1/chat/completions and /v1/models in-process (FastAPI's test client over the tiny model).

The expected answers come from transformers' own greedy ``generate`` on the prompt as the tiny
model's chat template renders it, written out here by hand (``<role>content\\n`` per message,
then ``<assistant>``). The same endpoints with the official OpenAI client against a real server
are in test_openai_client.py.
"""

from __future__ import annotations

import json

import pytest

from adaptspec.serving import CompletionService, ServerLimits, create_app
from adaptspec.serving.codec import CharCodec
from test_stops import first_stop

fastapi_testclient = pytest.importorskip("fastapi.testclient")
LIMITS = ServerLimits(
    max_prompt_tokens=128, max_tokens=32, default_max_tokens=8, max_context=512, vocab_size=128
)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    import torch

    from adaptspec.serving.tiny import tiny_speculator

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine's cores are shared: one thread is faster here than two fighting
    spec = tiny_speculator(0, verification="exact")[0]
    svc = CompletionService.build(
        spec,
        {"A": "ucb", "B": "fixed:4"},
        codec=CharCodec(),
        limits=LIMITS,
        model_name="tiny",
        log_dir=tmp_path_factory.mktemp("chat") / "log",
    )
    with fastapi_testclient.TestClient(create_app(svc)) as c:
        yield c
    torch.set_num_threads(threads)


def greedy(prompt: str, max_tokens: int) -> list[int]:
    import torch

    from adaptspec.serving.tiny import tiny_model

    ids = CharCodec().encode(prompt)
    out = tiny_model(0).generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_tokens)
    return out[0, len(ids) :].tolist()


def stream(client, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_models_lists_the_model_and_one_entry_per_variant(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["tiny", "tiny:A", "tiny:B"]
    assert all(m["object"] == "model" and m["owned_by"] == "adaptspec" for m in body["data"])


def test_chat_renders_the_template_and_answers_the_greedy_continuation(client):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "text", "text": "more"}]},
    ]
    rendered = "<system>Be brief.\n<user>Hi\n<assistant>Hello\n<user>and\nmore\n<assistant>"
    want = greedy(rendered, 20)
    r = client.post("/v1/chat/completions", json={"model": "tiny:B", "messages": messages, "max_tokens": 20})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": CharCodec().decode(want)}
    assert choice["finish_reason"] == ("stop" if CharCodec.eos in want else "length")
    assert body["usage"]["completion_tokens"] == len(want) and body["usage"]["prompt_tokens"] == len(rendered)
    assert body["adaptspec"]["variant"] == "B" and body["adaptspec"]["block_size"] == 4
    # developer is the newer name of system; max_completion_tokens of max_tokens
    again = client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "developer", "content": "Be brief."}, *messages[1:]],
            "max_completion_tokens": 20,
            "variant": "A",
        },
    ).json()
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]
    assert again["adaptspec"]["variant"] == "A"


def test_streamed_chat_adds_up_to_the_plain_answer(client):
    body = {"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 24, "variant": "B"}
    plain = client.post("/v1/chat/completions", json=body).json()
    chunks = stream(client, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    *content, last, usage = chunks
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in content + [last])
    assert text == plain["choices"][0]["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * len(content)
    assert last["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"] and "adaptspec" in last
    assert usage["choices"] == [] and usage["usage"] == plain["usage"]
    assert all(c["usage"] is None for c in content + [last])
    without = stream(client, "/v1/chat/completions", body)  # no stream_options: no usage anywhere
    assert all("usage" not in c for c in without) and without[-1]["choices"][0]["finish_reason"] is not None


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stop_ends_both_endpoints_streamed_or_not(client, path):
    prompt = "<user>Dear Sir,\n<assistant>"
    plain = CharCodec().decode(greedy(prompt, 32))
    stops = [plain[7:9], "~~~"]
    want = plain[: first_stop(plain, stops)]
    body = {"max_tokens": 32, "stop": stops, "variant": "A"}
    body.update(
        {"messages": [{"role": "user", "content": "Dear Sir,"}]} if "chat" in path else {"prompt": prompt}
    )
    r = client.post(path, json=body).json()
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert (choice["message"]["content"] if "chat" in path else choice["text"]) == want
    chunks = stream(client, path, body)
    if "chat" in path:
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    else:
        text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == want and chunks[-1]["choices"][0]["finish_reason"] == "stop"


USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "body,status,param,needle",
    [
        ({}, 400, "messages", "messages is required"),
        ({"messages": []}, 400, "messages", "messages: list should have at least 1 item"),
        ({"messages": "hi"}, 400, "messages", "messages: input should be a valid list, got 'hi'"),
        (
            {"messages": [{"role": "tool", "content": "42"}]},
            400,
            "messages",
            "messages.0.role: input should be",
        ),
        ({"messages": [{"role": "user"}]}, 400, "messages", "messages.0.content is required"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            400,
            "messages",
            "content part 0 has type 'image_url': this model takes text parts only",
        ),
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
            400,
            "messages",
            "messages.0.content: content is required",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "1"}]}]},
            400,
            "messages",
            "tool_calls is not supported",
        ),
        (
            {"messages": [*USER, {"role": "system", "content": "late"}]},
            400,
            "messages",
            "messages cannot be rendered with this model's chat template: a system message must come first",
        ),
        (
            {"messages": USER, "tools": [{"type": "function"}]},
            400,
            "tools",
            "tools=[{'type': 'function'}] is not supported",
        ),
        ({"messages": USER, "n": 3}, 400, "n", "n=3 is not supported"),
        (
            {"messages": USER, "response_format": {"type": "json_object"}},
            400,
            "response_format",
            "is not supported",
        ),
        (
            {"messages": USER, "stop": ["a", "b", "c", "d", "e"]},
            400,
            "stop",
            "stop has 5 sequences; at most 4",
        ),
        (
            {"messages": USER, "stop": ["a", ""]},
            400,
            "stop",
            "each stop sequence must have 1..256 characters",
        ),
        ({"messages": USER, "stop": 7}, 400, "stop", "stop must be a string or a list of strings, got 7"),
        (
            {"messages": USER, "stream_options": {"include_usage": "yes"}},
            400,
            "stream_options",
            "stream_options.include_usage: input should be a valid boolean",
        ),
        (
            {"messages": USER, "max_completion_tokens": 0},
            400,
            "max_completion_tokens",
            "max_completion_tokens: input should be greater than or equal to 1",
        ),
        (
            {"messages": USER, "max_tokens": 99},
            400,
            "max_tokens",
            "max_tokens=99 exceeds this server's limit of 32",
        ),
        ({"messages": USER, "temperature": -1}, 400, "temperature", "temperature must be 0"),
        ({"messages": [{"role": "user", "content": "x" * 200}]}, 400, "prompt", "accepts at most 128"),
        (
            {"messages": USER, "model": "gpt-4o"},
            404,
            "model",
            "model 'gpt-4o' is not served here; GET /v1/models lists tiny, tiny:A, tiny:B",
        ),
        (
            {"messages": USER, "model": "tiny:A", "variant": "B"},
            400,
            "variant",
            "model 'tiny:A' is variant 'A' but variant",
        ),
    ],
)
def test_bad_chat_requests_get_one_line_naming_the_field(client, body, status, param, needle):
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["param"] == param and "\n" not in err["message"], err
    assert client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2}).status_code == 200


def test_an_echoed_assistant_message_with_null_fields_is_taken(client):
    echoed = {
        "role": "assistant",
        "content": "yo",
        "refusal": None,
        "tool_calls": None,
        "function_call": None,
        "audio": None,
        "annotations": [],
    }
    r = client.post("/v1/chat/completions", json={"messages": [*USER, echoed, *USER], "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len("<user>hi\n<assistant>yo\n<user>hi\n<assistant>")
