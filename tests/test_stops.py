"""Stop sequences: the text scanner against str.find, and the server's generation against plain greedy decoding.

The reference for a request with stop strings is independent of the code under test: the tiny
model's greedy output from transformers' own ``generate``, decoded, cut at the first
occurrence of any stop string with ``str.find``.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from _serving_helpers import OwnSpeculator
from adaptspec.serving import CompletionService, ServerLimits
from adaptspec.serving.codec import CharCodec
from adaptspec.serving.stops import StopScanner, StopStream
from adaptspec.serving.streaming import generate


def first_stop(text: str, stops: list[str]) -> int | None:
    """Where the output ends: grow the text a character at a time until it ends with a stop string."""
    for e in range(1, len(text) + 1):
        done = [s for s in stops if text[:e].endswith(s)]
        if done:
            return e - max(map(len, done))
    return None


# ============================================================================ the scanner on text
_ALPHABET = "ab\n"


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(_ALPHABET, max_size=40),
    stops=st.lists(st.text(_ALPHABET, min_size=1, max_size=4), max_size=4),
    cuts=st.lists(st.integers(0, 40), max_size=12),
)
def test_scanner_sends_exactly_the_text_before_the_first_stop_however_it_arrives(text, stops, cuts):
    end = first_stop(text, stops)
    want = text if end is None else text[:end]
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    s = StopScanner(stops)
    sent = ""
    for a, b in zip(bounds, bounds[1:]):
        sent += s.push(text[a:b])
        assert want.startswith(sent)  # never a character of a stop string or beyond it
    sent += s.finish()
    assert sent == want == s.output and s.stopped == (end is not None)


def test_scanner_holds_back_only_what_could_start_a_stop():
    s = StopScanner(["###", "\n\n"])
    assert s.push("x #") == "x " and s.push("#") == "" and s.push("y\n") == "##y" and s.push("z") == "\nz"
    assert s.push("\n") == "" and s.push("\n") == "" and s.stopped and s.output == "x ##y\nz"
    # the stop string complete first ends the text, even if a longer one began earlier and completes later
    s = StopScanner(["abc", "b"])
    assert s.push("abc") == "a" and s.output == "a"


def test_stop_stream_cuts_the_ids_at_the_token_that_completes_the_stop():
    c = CharCodec()
    s = StopStream(c, ["lo w"])
    assert s.push(c.encode("Hel")) == ("He", c.encode("Hel"))  # "l" could begin "lo w"
    text, ids = s.push(c.encode("lo world"))
    assert (text, ids, s.stopped) == ("l", c.encode("lo w"), True)
    assert s.text == "Hel" and s.ids == c.encode("Hello w") and s.push([65]) == ("", [])


# ============================================================================ generation on the tiny model
PROMPTS = ["Hello", "Dear Sir,", "Once", "Tell me a story", "The quick brown fox"]  # the last one ends in EOS
MAX_TOKENS = 48
BLOCK_SIZES = range(1, 17)


@pytest.fixture(scope="module", params=["engine", "own"])
def served(request):
    """A service with one fixed-block variant per block size over the tiny model (exact verification),
    and the plain greedy continuation of each prompt from transformers' generate: on the batched
    engine (adaptspec's decoder), and one request at a time (the same decoder as a speculator of
    one's own, halted by ``serving.engine.halting``)."""
    import torch

    from adaptspec.serving.tiny import tiny_model, tiny_speculator

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine's cores are shared: one thread is faster here than two fighting
    spec = tiny_speculator(0, verification="exact")[0]
    svc = CompletionService.build(
        spec if request.param == "engine" else OwnSpeculator(spec),
        {f"b{b}": f"fixed:{b}" for b in BLOCK_SIZES},
        codec=CharCodec(),
        limits=ServerLimits(max_tokens=MAX_TOKENS, max_context=512, vocab_size=128),
        arms=list(BLOCK_SIZES),
        metrics=False,
    )
    model = tiny_model(0)
    ref = {}
    for p in PROMPTS:
        ids = CharCodec().encode(p)
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=MAX_TOKENS)
        ref[p] = out[0, len(ids) :].tolist()
    yield svc, ref, request.param
    svc.close()
    torch.set_num_threads(threads)


@st.composite
def stop_strings(draw, text: str):
    """1-4 stop strings: pieces of the reference text (they occur), short strings over its characters, or neither."""
    chars = sorted(set(text)) or ["x"]
    options = [
        st.text(st.sampled_from(chars), min_size=1, max_size=3),
        st.text(st.sampled_from("~|{"), min_size=1, max_size=3),
    ]
    if text:
        options.append(
            st.tuples(st.integers(0, len(text) - 1), st.integers(1, 6)).map(
                lambda t: text[t[0] : t[0] + t[1]]
            )
        )
    return draw(st.lists(st.one_of(options), min_size=1, max_size=4))


@pytest.mark.slow
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_generation_ends_at_the_first_stop_whatever_the_block_size(served, data):
    svc, ref, _ = served
    codec = CharCodec()
    prompt = data.draw(st.sampled_from(PROMPTS), label="prompt")
    block = data.draw(st.sampled_from(BLOCK_SIZES), label="block size")
    max_tokens = data.draw(st.integers(1, MAX_TOKENS), label="max_tokens")
    plain = ref[prompt][:max_tokens]
    plain_text = codec.decode(plain)
    stops = data.draw(stop_strings(plain_text), label="stop")
    end = first_stop(plain_text, stops)
    event("a stop string occurs" if end is not None else "no stop string occurs")

    body = {"prompt": prompt, "max_tokens": max_tokens, "variant": f"b{block}", "stop": stops}
    req = svc.parse(json.dumps(body).encode())
    pieces: list[str] = []
    gen, output = generate(svc, req, lambda text, ids: pieces.append(text))
    streamed = "".join(pieces)

    want_text = plain_text if end is None else plain_text[:end]
    assert output.text == want_text
    assert want_text.startswith(streamed) and not any(s in streamed for s in stops)
    if end is None:
        assert output.ids == plain
        assert output.finish_reason == ("stop" if codec.eos in plain else "length")
        return
    # the token that completed the first stop string, found by decoding the plain output's prefixes
    k = next(k for k in range(1, len(plain) + 1) if first_stop(codec.decode(plain[:k]), stops) is not None)
    assert output.ids == plain[:k] and output.finish_reason == "stop"
    out = gen.outcome  # what was decoded: no round after the one that completed the stop string
    assert out.tokens == plain[: len(out.tokens)]
    last = (
        out.rounds[-1].tau if out.rounds else 1
    )  # tokens of the last round (or the first token, from prefill)
    assert len(out.tokens) - last < k <= len(out.tokens)
    assert all(r.block_size <= block for r in out.rounds)


def test_a_stop_in_the_first_token_ends_before_any_round(served):
    svc, ref, _ = served
    plain = ref["Dear Sir,"]
    first = CharCodec().decode(plain[:1])
    assert first  # the first token is a printable character
    body = {"prompt": "Dear Sir,", "max_tokens": 16, "variant": "b4", "stop": first}
    gen, output = generate(svc, svc.parse(json.dumps(body).encode()))
    assert (output.text, output.ids, output.finish_reason) == ("", plain[:1], "stop")
    assert gen.outcome.rounds == [] and gen.decision.block_size == 4  # decided and logged, nothing decoded
