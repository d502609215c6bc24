"""The official OpenAI Python client against a real ``adaptspec serve --tiny`` on 127.0.0.1.

What a new user does: list the models, then completions and chat completions, streamed and not,
with stop sequences, and bad requests, whose exceptions must carry the server's one-line message.
Expected texts come from transformers' own greedy ``generate`` on the tiny model (the same
weights, built in this process), cut at the first stop string with ``str.find``.
"""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from adaptspec.serving.codec import CharCodec

openai = pytest.importorskip("openai")

from test_serving import Server, greedy_reference  # noqa: E402 - the real-server harness
from test_stops import first_stop  # noqa: E402 - the reference cut, a character at a time

pytestmark = pytest.mark.integration
MODEL = "adaptspec-tiny-0"
CODEC = CharCodec()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("openai")).start()
    yield s
    assert s.stop() in (0, -signal.SIGTERM)


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def greedy_text(prompt: str, max_tokens: int) -> tuple[str, list[int]]:
    ids = greedy_reference([CODEC.encode(prompt)], max_tokens)[0]
    return CODEC.decode(ids), ids


def cut(text: str, stops: list[str]) -> str:
    end = first_stop(text, stops)
    return text if end is None else text[:end]


def test_models_list(client):
    assert [m.id for m in client.models.list()] == [MODEL, f"{MODEL}:A", f"{MODEL}:B"]


def test_completions_plain_streamed_and_with_stop(client):
    prompt = "Dear Sir,"
    want, ids = greedy_text(prompt, 24)
    assert len(want) >= 8  # a long enough answer to cut
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, user="u-1")
    assert r.choices[0].text == want and r.usage.completion_tokens == len(ids)
    assert r.choices[0].finish_reason == ("stop" if CODEC.eos in ids else "length")
    streamed = client.completions.create(model=f"{MODEL}:B", prompt=prompt, max_tokens=24, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want
    stops = [want[5:7], "\t\t"]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, stop=stops)
    assert r.choices[0].text == cut(want, stops) and r.choices[0].finish_reason == "stop"
    pieces = list(
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, stop=stops, stream=True)
    )
    assert "".join(c.choices[0].text for c in pieces) == cut(want, stops)
    assert pieces[-1].choices[0].finish_reason == "stop"


def test_chat_completions_plain_streamed_and_with_stop(client):
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Why is the sky blue?"},
    ]
    want, ids = greedy_text("<system>Answer briefly.\n<user>Why is the sky blue?\n<assistant>", 24)
    r = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=24, temperature=0
    )
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want
    assert r.usage.completion_tokens == len(ids) and r.object == "chat.completion"
    chunks = list(
        client.chat.completions.create(
            model=f"{MODEL}:A",
            messages=messages,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason
    # the conversation goes on with the answer sent back as the client returned it
    more = client.chat.completions.create(
        model=MODEL,
        messages=[*messages, r.choices[0].message.model_dump(), {"role": "user", "content": "And?"}],
        max_tokens=4,
    )
    assert more.choices[0].message.content is not None
    stops = [want[3:5]]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, stop=stops)
    assert r.choices[0].message.content == cut(want, stops) and r.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=24, stop=stops[0], stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == cut(want, stops)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_concurrent_requests_each_stop_at_their_own_stop(client):
    prompts = ["Dear Sir,", "Once", "Tell me a story", "Hello", "print(", "Q: why?"]
    wants = [greedy_text(f"<user>{p}\n<assistant>", 20)[0] for p in prompts]
    stops = [[w[4:6]] if i % 2 else [w[2], "~|~"] for i, w in enumerate(wants)]

    def ask(i):
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompts[i]}],
            max_tokens=20,
            stop=stops[i],
            user=f"user-{i}",
        )
        return r.choices[0].message.content, r.choices[0].finish_reason

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(ask, range(len(prompts))))
    assert got == [
        (cut(w, s), "stop" if first_stop(w, s) is not None else "length") for w, s in zip(wants, stops)
    ]


@pytest.mark.parametrize(
    "call,error,param,needle",
    [
        (
            lambda c: c.completions.create(model=MODEL, prompt="hi", max_tokens=-4),
            "BadRequestError",
            "max_tokens",
            "max_tokens must be a positive integer, got -4",
        ),
        (
            lambda c: c.completions.create(model=MODEL, prompt="hi", stop=["a", "b", "c", "d", "e"]),
            "BadRequestError",
            "stop",
            "stop has 5 sequences; at most 4 are allowed",
        ),
        (
            lambda c: c.chat.completions.create(
                model=MODEL, messages=[{"role": "tool", "content": "1", "tool_call_id": "x"}]
            ),
            "BadRequestError",
            "messages",
            "messages.0.role: input should be 'system', 'developer', 'user' or 'assistant'",
        ),
        (
            lambda c: c.chat.completions.create(
                model=MODEL,
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                    }
                ],
            ),
            "BadRequestError",
            "messages",
            "content part 0 has type 'image_url': this model takes text parts only",
        ),
        (
            lambda c: c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]
            ),
            "BadRequestError",
            "messages",
            "chat template: a system message must come first",
        ),
        (
            lambda c: c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "a"}], n=2
            ),
            "BadRequestError",
            "n",
            "n=2 is not supported by this server",
        ),
        (
            lambda c: c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "a"}]),
            "NotFoundError",
            "model",
            f"model 'gpt-4o' is not served here; GET /v1/models lists {MODEL}, {MODEL}:A, {MODEL}:B",
        ),
    ],
    ids=["max-tokens", "five-stops", "tool-role", "image-part", "template-refuses", "n", "unknown-model"],
)
def test_bad_requests_raise_the_clients_exception_with_the_servers_line(client, call, error, param, needle):
    with pytest.raises(openai.APIStatusError) as e:
        call(client)
    assert type(e.value).__name__ == error
    assert needle in e.value.body["message"] and "\n" not in e.value.body["message"]
    assert e.value.param == param and needle in str(e.value)
