"""The batched engine's hooks for serving: a block size chosen at join from the prefill's
features, a per-round rule, and finishing a row early as "stop" (not as an error)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from _batching_helpers import one_thread  # noqa: F401  (autouse: one torch thread per module)
from adaptspec.batching import BatchEngine
from adaptspec.errors import AdaptspecError
from adaptspec.serving.tiny import tiny_model, tiny_speculator

SPEC, CODEC = tiny_speculator(seed=0, verification="exact")


MODEL = tiny_model(0)


def alone(prompt: str, n: int) -> list[int]:
    ids = CODEC.encode(prompt)
    return MODEL.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)[0, len(ids) :].tolist()


def test_a_chooser_gets_the_prefill_features_at_join_and_its_block_size_is_verified():
    seen = {}

    def choose(prompt):
        def f(features):
            seen[prompt] = np.asarray(features)
            return 3

        return f

    engine = BatchEngine(SPEC.target, SPEC.drafter, max_rows=4)
    prompts = ["1 + 1 =", "import numpy"]
    handles = [engine.submit(CODEC.encode(p), block_size=choose(p), max_new_tokens=20) for p in prompts]
    engine.run_until_done()
    for p, h in zip(prompts, handles):
        want = SPEC.target.prefill(torch.tensor(CODEC.encode(p))).features  # the prefill, run again alone
        np.testing.assert_allclose(seen[p], want, rtol=1e-5, atol=1e-6)
        out = h.result()
        assert out.tokens == alone(p, 20)
        committed = 1
        for r in out.rounds:
            assert r.block_size == min(3, 20 - committed)
            committed += r.tau


def test_a_failing_chooser_fails_its_request_alone():
    engine = BatchEngine(SPEC.target, SPEC.drafter, max_rows=4)
    good = engine.submit(CODEC.encode("abc"), block_size=4, max_new_tokens=10)
    bad = engine.submit(CODEC.encode("abc"), block_size=lambda f: 1 / 0, max_new_tokens=10)
    big = engine.submit(CODEC.encode("abc"), block_size=lambda f: 99, max_new_tokens=10)
    engine.run_until_done()
    assert good.result().tokens == alone("abc", 10)
    with pytest.raises(AdaptspecError, match="choosing the block size failed: ZeroDivisionError"):
        bad.result()
    with pytest.raises(AdaptspecError, match="block size 99 outside 1..16"):
        big.result()


def test_finish_ends_a_row_at_the_next_round_as_stop_with_the_tokens_so_far():
    engine = BatchEngine(SPEC.target, SPEC.drafter, max_rows=2)
    h = engine.submit(CODEC.encode("abc"), block_size=2, max_new_tokens=40)
    other = engine.submit(CODEC.encode("Dear Sir,"), block_size=4, max_new_tokens=30)
    for _ in range(3):
        engine.step()
    h.finish("stop")
    n = len(h.tokens)
    engine.run_until_done()
    out = h.result()  # no error
    assert out.finish_reason == "stop" and out.tokens == alone("abc", 40)[:n] and n < 40
    assert other.result().tokens == alone("Dear Sir,", 30)
    waiting = engine.submit(CODEC.encode("x"), max_new_tokens=5)
    waiting.finish("stop")  # before it joined: it ends with nothing decoded, still not an error
    engine.run_until_done()
    assert waiting.result().tokens == [] and waiting.result().finish_reason == "stop"


def test_a_round_rule_sets_every_rows_block_size_capped_by_the_requests_own():
    engine = BatchEngine(SPEC.target, SPEC.drafter, max_rows=3)
    asked = []

    def rule(rows):
        asked.append(len(rows))
        return [3] * len(rows)

    engine.round_block_sizes = rule
    hs = [
        engine.submit(CODEC.encode(p), block_size=b, max_new_tokens=12)
        for p, b in (("abc", 2), ("zebra", 8), ("Q: why?", 1))
    ]
    engine.run_until_done()
    assert len(asked) == len(engine.history)
    for rec in engine.history:
        own = {h.id: b for h, b in zip(hs, (2, 8, 1))}
        for rid, b in zip(rec.requests, rec.block_sizes):
            assert b <= min(3, own[rid])
    assert {b for rec in engine.history for b in rec.block_sizes} >= {2, 3}
    for h, p in zip(hs, ("abc", "zebra", "Q: why?")):
        assert h.result().tokens == alone(p, 12)
