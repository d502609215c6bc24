"""Joins that share target passes: joining prompts prefilled in chunks inside the rounds' passes.

Expected values come from elsewhere: the model's own forward over the whole prompt (float64, so
only rounding separates the two), the target's own prefill, its own greedy ``generate``, and
the target's argmax recomputed in one causal pass.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from _batching_helpers import KnowingDrafter, one_thread  # noqa: F401  (autouse: one torch thread per module)
from adaptspec.batching import BatchEngine
from adaptspec.batching.packed_pass import Chunk, Packer
from adaptspec.batching.target_pass import new_store, prefill_layers, verify_rows
from adaptspec.decoding import BlockDiffusionDrafter, TargetModel
from adaptspec.errors import AdaptspecError
from decoding_helpers import tiny_target

VOCAB = 96
_MODELS: dict = {}


def _model(dtype: torch.dtype):
    if dtype not in _MODELS:
        _MODELS[dtype] = tiny_target("llama", vocab=VOCAB, eos=None).to(dtype)
    return _MODELS[dtype]


def _argmax_holds(model, prompt: list[int], tokens: list[int], tol: float = 1e-4) -> None:
    """Every committed token is the target's argmax after its prefix (one causal pass, batch 1)."""
    seq = prompt + tokens
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].float()
    for pos in range(len(prompt), len(seq)):
        assert float(logits[pos - 1, seq[pos]]) >= float(logits[pos - 1].max()) - tol, (pos, seq[pos])


# ---------------------------------------------------------------------- the packed pass
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40),
    cuts=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    rows=st.lists(
        st.tuples(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20), st.integers(1, 4)), max_size=3
    ),
    seed=st.integers(0, 2**16),
)
def test_a_prompt_in_chunks_beside_rows_computes_what_it_computes_whole(prompt, cuts, rows, seed):
    """A prompt run in chunks (sizes ``cuts``, repeated), each pass also carrying decoding rows: its
    last logits, its hidden states and its keys/values equal the model's own forward over the whole
    prompt, and the rows' logits equal their pass without chunks (float64: to rounding)."""
    model = _model(torch.float64)
    target = TargetModel(model)
    packer = Packer(target)
    store, fill = new_store(target, 3, 8, 128), new_store(target, 1, 4, 64)
    for i, (p, _) in enumerate(rows):
        store.load(i, prefill_layers(target.prefill(p).cache))
    fill.open(0)
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor(prompt)
    width = max((w for _, w in rows), default=0)
    done, k, hidden, last = 0, 0, {1: [], 4: []}, None
    while done < len(prompt):
        n = min(cuts[k % len(cuts)], len(prompt) - done)
        k += 1
        blocks = torch.randint(VOCAB, (len(rows), width), generator=g) if rows else None
        out = packer.run(
            blocks,
            store,
            fill,
            [Chunk(0, ids[done : done + n], done + n == len(prompt))],
            context_layers=None,
            chunk_layers=[1, 4],
        )
        if rows:
            alone, _ = verify_rows(target, store, blocks, context=False)
            assert torch.allclose(out.logits, alone, atol=1e-9, rtol=0)
            store.commit(torch.randint(1, width + 1, (len(rows),), generator=g).tolist())
        fill.commit([n])
        for layer in hidden:
            hidden[layer].append(out.chunk_hidden[0][layer])
        last = out.chunk_logits[0]
        done += n
    with torch.no_grad():
        whole = model(ids[None], output_hidden_states=True, use_cache=True)
    assert torch.allclose(last, whole.logits[0, -1], atol=1e-9, rtol=0)
    for layer, parts in hidden.items():
        assert torch.allclose(torch.cat(parts), whole.hidden_states[layer][0], atol=1e-9, rtol=0)
    for (k_got, v_got), layer in zip(fill.layers(0), whole.past_key_values.layers):
        assert torch.allclose(k_got, layer.keys, atol=1e-9, rtol=0)
        assert torch.allclose(v_got, layer.values, atol=1e-9, rtol=0)


# ---------------------------------------------------------------------- the engine
def test_rows_keep_decoding_in_every_pass_that_carries_a_chunk():
    """Two rows decode while a 30-token prompt joins at 4 tokens a pass: 8 passes carry its chunks
    (4 tokens each, 2 in the last) and every row commits tokens in each; the new row's first token
    comes after the eighth, and every token of every row is the target's argmax."""
    model = _model(torch.float32)
    target = TargetModel(model)
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8)
    engine = BatchEngine(target, drafter, max_rows=3, chunk_tokens=4)
    first = [
        engine.submit([3, 1, 4], block_size=2, max_new_tokens=40),
        engine.submit([2, 7], block_size=1, max_new_tokens=40),
    ]
    engine.step()  # their prompts, whole: no row was decoding
    assert len(engine.rows) == 2
    prompt = torch.randint(VOCAB, (30,), generator=torch.Generator().manual_seed(5)).tolist()
    late = engine.submit(prompt, block_size=3, max_new_tokens=12)
    records = [engine.step() for _ in range(8)]
    assert [r.prompt_tokens for r in records] == [4] * 7 + [2]
    assert all(r.rows == 2 and min(r.taus) >= 1 for r in records)
    assert [r.joined for r in records] == [0] * 7 + [1] and len(late.tokens) == 1 and len(engine.rows) == 3
    engine.run_until_done()
    assert all(r.prompt_tokens == 0 for r in engine.history if r.rows == 3)
    for h, p in zip(first + [late], ([3, 1, 4], [2, 7], prompt)):
        _argmax_holds(model, p, h.result().tokens)


@pytest.mark.parametrize("chunk_tokens", [1, 5])
def test_a_chunked_join_gives_the_chooser_the_prefill_features_and_the_drafter_its_context(chunk_tokens):
    """The block-size chooser gets the features of the prompt's prefill alone, and the new row's
    drafter context is the prefill's (fast verification: to rounding), though the prompt ran in
    chunks beside a decoding row."""
    model = _model(torch.float32)
    target = TargetModel(model)
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8)
    engine = BatchEngine(target, drafter, max_rows=2, chunk_tokens=chunk_tokens)
    engine.submit([9, 9, 1], block_size=4, max_new_tokens=60)
    engine.step()
    prompt = list(range(5, 28))
    seen = []
    late = engine.submit(prompt, block_size=lambda f: seen.append(f) or 3, max_new_tokens=20)
    while len(engine.rows) < 2:
        engine.step()
    alone = target.prefill(prompt)
    assert len(seen) == 1 and late.block_size == 3
    torch.testing.assert_close(
        torch.as_tensor(seen[0]), torch.as_tensor(alone.features), atol=1e-4, rtol=1e-4
    )
    row = engine.rows[1]
    assert row.handle is late and row.draft.length == len(prompt)
    torch.testing.assert_close(torch.cat(row.draft.pending), alone.context_hidden, atol=1e-4, rtol=1e-4)
    assert late.tokens == [int(alone.logits.argmax())]
    engine.run_until_done()
    _argmax_holds(model, prompt, late.result().tokens)


def test_exact_verification_runs_a_joining_prompt_whole_whatever_the_budget():
    """Exact verification never cuts a prompt (a prompt's prefill kernel depends on its length): with
    a budget of 2 tokens, each joining prompt rides whole in one pass (one a pass while rows decode),
    and every row equals the patched target's own greedy decoding alone."""
    model = tiny_target("llama", vocab=VOCAB, eos=None)
    target = TargetModel(model, verification="exact")
    base = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8)
    engine = BatchEngine(target, KnowingDrafter(base, error_rate=0.3), max_rows=4, chunk_tokens=2)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(VOCAB, (n,), generator=g).tolist() for n in (5, 17, 9, 23)]
    handles = [engine.submit(prompts[0], block_size=3, max_new_tokens=30)]
    engine.step()
    handles += [engine.submit(p, block_size=b, max_new_tokens=18) for p, b in zip(prompts[1:], (1, 4, 2))]
    engine.run_until_done()
    assert [r.prompt_tokens for r in engine.history if r.prompt_tokens] == [17, 9, 23]
    for h, p in zip(handles, prompts):
        n = h.max_new_tokens
        ref = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=n, min_new_tokens=n)[
            0, len(p) :
        ]
        assert h.result().tokens == ref.tolist()


def test_requests_ending_while_they_join_end_alone():
    """A request cancelled between two of its chunks, one cancelled before its first chunk, one
    finished ("stop") while joining, a bad prompt and a failing chooser among joining prompts: each
    ends on its own handle, its fill slot is freed (later requests still join), and the others
    decode as usual (every token the target's argmax)."""
    model = _model(torch.float32)
    target = TargetModel(model)
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8)
    engine = BatchEngine(target, drafter, max_rows=6, chunk_tokens=3)
    row = engine.submit([1, 2, 3], block_size=2, max_new_tokens=50)
    engine.step()
    mid = engine.submit(list(range(20)), block_size=2, max_new_tokens=10)
    before = engine.submit(list(range(30, 50)), block_size=1, max_new_tokens=10)
    stopped = engine.submit(list(range(60, 75)), block_size=1, max_new_tokens=10)
    bad = engine.submit([4, 5, VOCAB + 3], block_size=1, max_new_tokens=10)
    chooser = engine.submit([8, 8, 8, 8], block_size=lambda f: 1 / 0, max_new_tokens=10)
    good = engine.submit([6, 1, 6], block_size=3, max_new_tokens=12)
    engine.step()
    engine.step()
    assert engine.joining == 5 and 0 < engine.fills.fillings[0].done < 20  # mid is between chunks
    mid.cancel()
    before.cancel()
    stopped.finish("stop")
    engine.run_until_done()
    for h, word in [
        (mid, "cancelled"),
        (before, "cancelled"),
        (bad, "outside"),
        (chooser, "ZeroDivisionError"),
    ]:
        with pytest.raises(AdaptspecError, match=word):
            h.result()
        assert f"request {h.id}" in str(h.error)
    assert stopped.result().finish_reason == "stop" and stopped.result().tokens == []
    assert engine.joining == 0 and engine.fills.store.rows == 0
    later = engine.submit([7, 7, 2, 9, 4, 4, 1], block_size=2, max_new_tokens=8)
    engine.run_until_done()
    for h, p in [(row, [1, 2, 3]), (good, [6, 1, 6]), (later, [7, 7, 2, 9, 4, 4, 1])]:
        assert len(h.result().tokens) == h.max_new_tokens
        _argmax_holds(model, p, h.result().tokens)


def test_chunk_tokens_is_checked():
    target = TargetModel(_model(torch.float32))
    for bad in (0, -3, 2.5, True, "64"):
        with pytest.raises(AdaptspecError, match="chunk_tokens"):
            BatchEngine(target, None, chunk_tokens=bad)


def test_a_target_without_a_registered_attention_cannot_share_passes():
    model = tiny_target("llama", vocab=VOCAB)
    model.config._attn_implementation = "eager"
    with pytest.raises(AdaptspecError, match="registered attention"):
        BatchEngine(TargetModel(model), None)
    engine = BatchEngine(TargetModel(model), None, chunk_tokens=None)  # joins alone: any attention
    h = engine.submit([1, 2, 3], max_new_tokens=5)
    engine.run_until_done()
    assert len(h.result().tokens) == 5
