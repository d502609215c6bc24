"""Exact verification in the batching engine: every row bit-identical to decoding it alone.

The references are independent of the engine: the patched target's own one-token
``generate`` (greedy) and :class:`SpeculativeDecoder` at batch 1 with the same seed (sampling).
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from _batching_helpers import KnowingDrafter, one_thread  # noqa: F401  (autouse: one torch thread per module)
from adaptspec.batching import BatchEngine
from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
from adaptspec.decoding.batch_invariant import RowPaddedLinear
from decoding_helpers import tiny_target

VOCAB = 96


@functools.lru_cache(maxsize=None)
def _setup(arch: str = "llama", dtype: torch.dtype = torch.float32):
    model = tiny_target(arch, vocab=VOCAB, eos=5).to(dtype)
    target = TargetModel(model, verification="exact")
    base = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8).to(dtype)
    return model, target, base


@functools.lru_cache(maxsize=None)
def _reference(arch: str, prompt: tuple[int, ...], n: int, dtype: torch.dtype = torch.float32) -> list[int]:
    model = _setup(arch, dtype)[0]
    out = model.generate(torch.tensor([list(prompt)]), do_sample=False, max_new_tokens=n)
    return out[0, len(prompt) :].tolist()


def _engine(
    arch: str,
    max_rows: int,
    error_rate: float = 0.3,
    token_budget: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    chunk_tokens: int | None = 64,
):
    model, target, base = _setup(arch, dtype)
    drafter = KnowingDrafter(base, error_rate=error_rate, seed=seed)
    engine = BatchEngine(
        target, drafter, max_rows=max_rows, token_budget=token_budget, chunk_tokens=chunk_tokens
    )
    return engine, drafter


def _teach(
    engine: BatchEngine,
    drafter: KnowingDrafter,
    arch: str,
    prompt: list[int],
    n: int,
    dtype: torch.dtype = torch.float32,
) -> None:
    ref = _reference(arch, tuple(prompt), n, dtype)
    drafter.learn(engine.target.prefill(prompt).context_hidden, prompt + ref)


_request = st.tuples(
    st.integers(0, 5),  # the round it arrives at
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),  # prompt
    st.integers(1, 8),  # block size
    st.integers(1, 14),  # max new tokens
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(_request, min_size=1, max_size=6),
    max_rows=st.integers(1, 4),
    changes=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 5), st.integers(1, 8)), max_size=4),
    error_rate=st.sampled_from([0.0, 0.3, 1.0]),
    chunk_tokens=st.sampled_from([None, 1, 4, 64]),
)
def test_greedy_rows_equal_the_target_alone(requests, max_rows, changes, error_rate, chunk_tokens):
    """Whatever arrives when, with whatever block sizes (changed between rounds too), joining alone
    or in the rounds' passes under any prompt budget, every row's tokens are the patched target's
    own greedy tokens for that prompt alone."""
    arch = "llama"
    engine, drafter = _engine(arch, max_rows, error_rate, chunk_tokens=chunk_tokens)
    handles = {}
    for rnd in range(400):
        for i, (at, prompt, b, n) in enumerate(requests):
            if at == rnd:
                _teach(engine, drafter, arch, prompt, n)
                handles[i] = engine.submit(prompt, block_size=b, max_new_tokens=n)
        for at, which, b in changes:
            if at == rnd and which in handles and not handles[which].done:
                engine.set_block_size(handles[which], b)
        engine.step()
        if len(handles) == len(requests) and not engine.busy:
            break
    for i, (_, prompt, _, n) in enumerate(requests):
        assert handles[i].result().tokens == _reference(arch, tuple(prompt), n), (i, requests)


@pytest.mark.parametrize(
    "arch, dtype", [("llama", torch.float32), ("qwen3", torch.float32), ("llama", torch.bfloat16)]
)
def test_staggered_joins_with_accepted_drafts(arch, dtype):
    """Six requests joining at different rounds into four rows, blocks 1..8, drafts mostly right;
    contexts up to ~90 positions (past the attention kernel's 64-key padding step)."""
    engine, drafter = _engine(arch, max_rows=4, error_rate=0.2, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    reqs = [
        (torch.randint(VOCAB, (int(torch.randint(1, 70, (1,), generator=g)),), generator=g).tolist(), b, 20)
        for b in (1, 2, 4, 8, 3, 6)
    ]
    handles = []
    for k, (p, b, n) in enumerate(reqs):
        _teach(engine, drafter, arch, p, n, dtype)
        handles.append(engine.submit(p, block_size=b, max_new_tokens=n))
        engine.step()
    engine.run_until_done()
    accepted = sum(r.tau - 1 for h in handles for r in h.rounds)
    assert accepted > 10  # the rounds did accept drafts: the rollback paths ran
    for h, (p, _, n) in zip(handles, reqs):
        assert h.result().tokens == _reference(arch, tuple(p), n, dtype)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10),
    block=st.integers(1, 6),
    others=st.lists(
        st.tuples(
            st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10),
            st.integers(1, 6),
            st.sampled_from([0.0, 0.7, 1.3]),
        ),
        max_size=3,
    ),
    late=st.booleans(),
)
def test_sampled_row_equals_speculative_decoder_with_its_seed(seed, prompt, block, others, late):
    """At T > 0 a request's seed gives the tokens SpeculativeDecoder gives alone (same seed),
    whatever it is batched with and whenever it joins."""
    model, target, base = _setup("llama")
    alone = SpeculativeDecoder(target, base).generate(prompt, block, 12, temperature=0.9, seed=seed).tokens
    engine = BatchEngine(target, base, max_rows=4)
    for p, b, t in others:
        engine.submit(p, block_size=b, max_new_tokens=10, temperature=t, seed=seed + 1)
    if late:
        engine.step()
        engine.step()
    h = engine.submit(prompt, block_size=block, max_new_tokens=12, temperature=0.9, seed=seed)
    engine.run_until_done()
    assert h.result().tokens == alone


def test_row_padded_linear_rows_do_not_depend_on_the_batch():
    """A row through the patched linear layer is bit-identical whatever number of rows come with it."""
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        lin = torch.nn.Linear(64, 96).to(dtype)
        lin.__class__ = RowPaddedLinear
        x = torch.randn(7, 5, 64).to(dtype)
        alone = [lin(x[r : r + 1, :t]) for r in range(7) for t in (1, 3, 5)]
        for rows in range(1, 8):
            out = lin(x[:rows])
            for r in range(rows):
                for k, t in enumerate((1, 3, 5)):
                    assert torch.equal(out[r, :t], alone[r * 3 + k][0]), (dtype, rows, r, t)


def test_budget_cuts_blocks_and_rows_still_exact():
    """token_budget 6 over 3 rows: no row verifies more than 2 positions; outputs unchanged."""
    engine, drafter = _engine("llama", max_rows=3, token_budget=6, error_rate=0.0)
    prompts = [[1, 2, 3], [7, 8], [9, 10, 11, 12]]
    handles = []
    for p in prompts:
        _teach(engine, drafter, "llama", p, 15)
        handles.append(engine.submit(p, block_size=8, max_new_tokens=15))
    engine.run_until_done()
    assert all(r.rows * r.width <= 6 for r in engine.history)
    assert max(r.width for r in engine.history if r.rows == 3) == 2
    for h, p in zip(handles, prompts):
        assert h.result().tokens == _reference("llama", tuple(p), 15)
