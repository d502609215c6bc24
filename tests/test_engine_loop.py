"""The engine loop (adaptspec/serving/engine/loop.py): many threads, one batched engine."""

from __future__ import annotations

import threading

import pytest

from adaptspec.batching import BatchEngine
from adaptspec.errors import AdaptspecError
from adaptspec.serving.engine.loop import EngineLoop, QueueFull
from adaptspec.serving.tiny import tiny_speculator

SPEC, CODEC = tiny_speculator(seed=1, verification="exact")
PROMPTS = ["the cat", "a", "speculative decoding", "zz", "batch me", "hello world"]


def _alone(prompt: str, n: int) -> list[int]:
    """The reference: one-token greedy decoding of the request alone (exact mode)."""
    return SPEC.generate(CODEC.encode(prompt), 1, n).tokens


def test_concurrent_requests_each_decode_as_alone_and_stream_what_they_return():
    results, streamed = {}, {p: [] for p in PROMPTS}
    with EngineLoop(BatchEngine(SPEC.target, SPEC.drafter, max_rows=3), max_queue=16) as loop:

        def client(i, p):
            t = loop.submit(
                CODEC.encode(p), block_size=1 + i % 4, max_new_tokens=10, on_tokens=streamed[p].extend
            )
            results[p] = t.wait(timeout=120).tokens

        threads = [threading.Thread(target=client, args=(i, p)) for i, p in enumerate(PROMPTS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert loop.rounds > 0 and loop.stats()["rows_in_flight"] == 0
    for p in PROMPTS:
        assert results[p] == _alone(p, 10) == streamed[p]


def test_a_full_queue_is_refused_at_once_with_a_retry_hint():
    with EngineLoop(BatchEngine(SPEC.target, SPEC.drafter, max_rows=1), max_queue=0) as loop:
        first = loop.submit(CODEC.encode("long one"), max_new_tokens=40)
        with pytest.raises(QueueFull, match="at capacity") as e:
            loop.submit(CODEC.encode("second"), max_new_tokens=4)
        assert e.value.retry_after_s >= 1
        first.wait(timeout=120)


def test_a_bad_request_fails_alone():
    with EngineLoop(BatchEngine(SPEC.target, SPEC.drafter, max_rows=4)) as loop:
        good = loop.submit(CODEC.encode("fine"), block_size=4, max_new_tokens=8)
        bad = loop.submit([10_000], max_new_tokens=8)  # outside the vocabulary
        worse = loop.submit(CODEC.encode("x"), block_size=99, max_new_tokens=8)  # no such block size
        assert good.wait(timeout=120).tokens == _alone("fine", 8)
        for t in (bad, worse):
            with pytest.raises(AdaptspecError):
                t.wait(timeout=120)


def test_the_loop_thread_runs_with_its_own_torch_threads_and_leaves_the_callers_alone():
    import torch

    before, seen = torch.get_num_threads(), []
    with EngineLoop(BatchEngine(SPEC.target, SPEC.drafter, max_rows=2), threads=3) as loop:
        t = loop.submit(
            CODEC.encode("the cat"),
            max_new_tokens=3,
            on_tokens=lambda new: seen.append((threading.current_thread().name, torch.get_num_threads())),
        )
        assert t.wait(timeout=120).tokens == _alone("the cat", 3)
    assert seen and all(s == ("adaptspec-engine", 3) for s in seen)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("threads", [0, -1, 1.5, "2"])
def test_a_bad_thread_count_is_refused_in_one_line(threads):
    with pytest.raises(AdaptspecError, match="threads must be an int >= 1"):
        EngineLoop(BatchEngine(SPEC.target, SPEC.drafter, max_rows=1), threads=threads)
