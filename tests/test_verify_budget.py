"""Draft once, verify a prefix (``draft_length``): lossless, rounds as the prefix rule says,
batched rows as each row alone, and the prefix acceptance rule against a reference.

The references are independent of the code under test: the target's own one-token ``generate``
(tokens), a drafter whose right and wrong drafts are a known function of its context length,
block position and drafted length (rounds), and a plain-Python acceptance loop (the rule).
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from _batching_helpers import KnowingDrafter, one_thread  # noqa: F401  (one torch thread per module)
from adaptspec.batching import BatchEngine, accept
from adaptspec.costs.latency import get_profile
from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
from adaptspec.errors import AdaptspecError
from adaptspec.reward.counterfactual import from_outcome
from decoding_helpers import tiny_target

VOCAB = 96


def wrong(n: int, i: int, drafted: int) -> bool:
    """Whether the pattern drafter's draft at block position ``i`` (0-based) is wrong when the
    block sits after ``n`` context positions and ``drafted`` positions are drafted: it depends on
    the drafted length, as a bidirectional drafter's drafts do."""
    return (7 * n + 3 * i + 5 * drafted) % 4 == 0


class PatternDrafter(KnowingDrafter):
    """Drafts the known continuation, wrong exactly where :func:`wrong` says (the real pass runs)."""

    def __init__(self, base: BlockDiffusionDrafter):
        super().__init__(base, error_rate=0.0)
        self.calls: list[int] = []  # the drafted block sizes, in order

    def draft_logits(self, state, last_token, block_size):
        logits = BlockDiffusionDrafter.draft_logits(self, state, last_token, block_size)
        self.calls.append(block_size)
        n = state.length
        want = state.sequence[n + 1 : n + block_size]
        for i in range(block_size - 1):
            tok = want[i] if i < len(want) else 0
            if i >= len(want) or wrong(n, i, block_size):
                tok = (tok + 1) % VOCAB
            logits[i] = -1e4
            logits[i, tok] = 1e4
        return logits


@functools.lru_cache(maxsize=None)
def _setup():
    model = tiny_target("llama", vocab=VOCAB, eos=None)
    target = TargetModel(model, verification="exact")
    base = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=16)
    SpeculativeDecoder(target, base)  # the target now keeps the drafter's context at prefill
    return model, target, base


@functools.lru_cache(maxsize=None)
def _greedy(prompt: tuple[int, ...], n: int) -> list[int]:
    model = _setup()[0]
    out = model.generate(torch.tensor([list(prompt)]), do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, len(prompt) :].tolist()


def _drafter(prompts_and_lengths) -> PatternDrafter:
    _, target, base = _setup()
    d = PatternDrafter(base)
    for prompt, n in prompts_and_lengths:
        d.learn(target.prefill(prompt).context_hidden, list(prompt) + _greedy(tuple(prompt), n))
    return d


def _expected_rounds(
    prompt_len: int, n_new: int, block: int, drafted: int | None
) -> list[tuple[int, int, int]]:
    """(verified, tau, drafted) of every round, from the pattern alone (the decoder's end rule:
    a block is cut to the tokens left; a cut to 1 drafts nothing)."""
    out, made, n = [], 1, prompt_len
    while made < n_new:
        v = min(block, n_new - made)
        d = v if v == 1 or drafted is None else drafted
        a = 0
        while a < v - 1 and not wrong(n, a, d):
            a += 1
        out.append((v, a + 1, d))
        made += a + 1
        n += a + 1
    return out


prompts = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=prompts, draft_length=st.integers(2, 16), data=st.data(), n_new=st.integers(1, 30))
def test_draft_once_verify_prefix_is_greedy_and_rounds_follow_the_prefix_rule(
    prompt, draft_length, data, n_new
):
    block = data.draw(st.integers(1, draft_length))
    _, target, _ = _setup()
    drafter = _drafter([(prompt, n_new)])
    dec = SpeculativeDecoder(target, drafter, draft_length=draft_length)
    assert dec.prefix_drafts and dec.max_block_size == draft_length
    out = dec.generate(prompt, block, n_new)
    assert out.tokens == _greedy(tuple(prompt), n_new)  # bit-identical to the target's greedy
    got = [(r.block_size, r.tau, r.draft_size) for r in out.rounds]
    assert got == _expected_rounds(len(prompt), n_new, block, draft_length)
    assert all(r.drafted == (0 if r.draft_size == r.block_size else draft_length) for r in out.rounds)
    assert set(drafter.calls) <= {draft_length}


def test_without_draft_length_each_block_is_drafted_alone():
    prompt, n_new = [3, 1, 4, 1, 5], 40
    _, target, _ = _setup()
    drafter = _drafter([(prompt, n_new)])
    dec = SpeculativeDecoder(target, drafter)
    assert not dec.prefix_drafts
    out = dec.generate(prompt, 4, n_new)
    assert [(r.block_size, r.tau, r.draft_size) for r in out.rounds] == _expected_rounds(
        len(prompt), n_new, 4, None
    )
    # and the pattern does tell the two apart: drafting 16 and verifying 4 makes other rounds
    assert _expected_rounds(len(prompt), n_new, 4, 16) != _expected_rounds(len(prompt), n_new, 4, None)


def test_a_schedule_verifies_prefixes_of_one_drafted_length():
    prompt, n_new = [9, 8, 7], 36
    _, target, _ = _setup()
    drafter = _drafter([(prompt, n_new)])
    sizes = [1, 4, 8, 2, 3]
    out = SpeculativeDecoder(target, drafter, draft_length=8).generate(
        prompt, lambda i, r: sizes[i % 5], n_new
    )
    assert out.tokens == _greedy(tuple(prompt), n_new)
    assert {r.draft_size for r in out.rounds} <= {1, 8} and set(drafter.calls) == {8}
    assert {r.block_size for r in out.rounds} >= {1, 2, 4}


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_engine_rows_with_different_prefixes_equal_each_row_alone(temperature):
    """Rows verifying 1, 2, 3, 5 and 8 positions of one drafted length in the same passes: each
    row's tokens and rounds are those of the single-request decoder run on it alone."""
    _, target, _ = _setup()
    reqs = [
        ([5, 6, 7], 1, 20),
        ([11, 2], 2, 24),
        ([40, 41, 42, 43], 3, 17),
        ([1], 5, 30),
        ([77, 3, 9], 8, 26),
    ]
    drafter = _drafter([(p, n) for p, _, n in reqs])
    engine = BatchEngine(target, drafter, max_rows=5, draft_length=8)
    assert engine.prefix_drafts and engine.max_block_size == 8
    handles = [
        engine.submit(p, block_size=b, max_new_tokens=n, temperature=temperature, seed=17 + k)
        for k, (p, b, n) in enumerate(reqs)
    ]
    engine.run_until_done()
    assert any(len(set(r.block_sizes)) >= 4 for r in engine.history)  # mixed prefixes in one pass
    for k, (h, (p, b, n)) in enumerate(zip(handles, reqs)):
        alone = SpeculativeDecoder(target, drafter, draft_length=8).generate(
            p, b, n, temperature=temperature, seed=17 + k
        )
        res = h.result()
        assert res.tokens == alone.tokens
        assert [(r.block_size, r.tau, r.drafted) for r in res.rounds] == [
            (r.block_size, r.tau, r.drafted) for r in alone.rounds
        ]
        if temperature == 0:
            assert res.tokens == _greedy(tuple(p), n)
            assert [(r.block_size, r.tau, r.draft_size) for r in res.rounds] == _expected_rounds(
                len(p), n, b, 8
            )
        else:  # a seed gives the same tokens whatever is drafted (keyed sampling)
            assert (
                res.tokens
                == SpeculativeDecoder(target, _setup()[2])
                .generate(p, b, n, temperature=temperature, seed=17 + k)
                .tokens
            )


def test_engine_per_round_rule_verifies_prefixes_of_one_draft():
    """Under a per-round rule (load) each row verifies a prefix that changes every round; every
    speculating round still drafts the draft length, and the tokens stay the target's greedy."""
    _, target, _ = _setup()
    reqs = [([5, 6, 7], 8, 22), ([11, 2], 6, 25), ([40, 41, 42, 43], 8, 19)]
    drafter = _drafter([(p, n) for p, _, n in reqs])
    engine = BatchEngine(target, drafter, max_rows=3, draft_length=8)
    turn = iter(range(10**6))
    engine.round_block_sizes = lambda rows: [(next(turn) % 8) + 1 for _ in rows]
    handles = [engine.submit(p, block_size=b, max_new_tokens=n) for p, b, n in reqs]
    engine.run_until_done()
    for h, (p, b, n) in zip(handles, reqs):
        res = h.result()
        assert res.tokens == _greedy(tuple(p), n)
        assert len({r.block_size for r in res.rounds}) >= 4
        assert all(r.draft_size == (8 if r.block_size > 1 else 1) for r in res.rounds)
        assert all(r.block_size <= b for r in res.rounds)
        starts = [len(p) + sum(r.tau for r in res.rounds[:k]) for k in range(len(res.rounds))]
        assert [r.tau for r in res.rounds] == [_tau(m, r.block_size, 8) for m, r in zip(starts, res.rounds)]
    assert set(drafter.calls) == {8}


def test_engine_batched_draft_pass_drafts_the_draft_length():
    """Fast verification's one drafter pass for all greedy rows drafts ``draft_length`` for each."""
    model = tiny_target("llama", vocab=VOCAB, eos=None)  # a fresh copy: the other is patched for exact
    target = TargetModel(model, verification="fast")
    base = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=16)
    engine = BatchEngine(target, base, max_rows=3, draft_length=6)
    hs = [engine.submit([4, 5, 6], block_size=b, max_new_tokens=9) for b in (2, 4, 6)]
    engine.run_until_done()
    for h in hs:
        assert all(r.draft_size == 6 for r in h.result().rounds if r.block_size > 1)


def _tau(n: int, verified: int, drafted: int) -> int:
    a = 0
    while a < verified - 1 and not wrong(n, a, drafted):
        a += 1
    return a + 1


def test_prefix_drafts_make_the_counterfactuals_exact():
    """With a draft length, ``min(tau, B')`` of every round is what a round verifying ``B'`` of the
    same drafted length commits there; drafting each block alone it is not (approximate)."""
    prompt, n_new = [3, 1, 4], 40
    _, target, _ = _setup()
    dec = SpeculativeDecoder(target, _drafter([(prompt, n_new)]), draft_length=8)
    out = dec.generate(prompt, 4, n_new)
    cf = from_outcome(
        out, 4, [1, 2, 3, 4], len(prompt), get_profile("cpu-smollm2-fast"), prefix_drafts=dec.prefix_drafts
    )
    assert not cf.approximate.any() and not cf.censored[:3].any()
    starts = [len(prompt) + sum(r.tau for r in out.rounds[:k]) for k in range(len(out.rounds))]
    for b in (2, 3):
        truth = [_tau(n, min(b, r.block_size), 8) for n, r in zip(starts, out.rounds)]
        assert cf.tokens[b - 1] == sum(truth) == sum(min(r.tau, b) for r in out.rounds)
    alone = [
        [_tau(n, min(b, r.block_size), min(b, r.block_size)) for n, r in zip(starts, out.rounds)]
        for b in (2, 3)
    ]
    prefix = [[min(r.tau, b) for r in out.rounds] for b in (2, 3)]
    assert alone != prefix  # blocks drafted alone commit otherwise


def test_bad_draft_lengths_are_one_line():
    _, target, base = _setup()
    for bad in (1, 17, 2.5, True):
        with pytest.raises(AdaptspecError, match="draft_length must be an int in 2..16"):
            SpeculativeDecoder(target, base, draft_length=bad)
        with pytest.raises(AdaptspecError, match="draft_length must be an int in 2..16"):
            BatchEngine(target, base, draft_length=bad)
    with pytest.raises(AdaptspecError, match="draft_length needs a drafter"):
        SpeculativeDecoder(target, None, draft_length=4)
    with pytest.raises(AdaptspecError, match="block size 9 outside 1..8"):
        SpeculativeDecoder(target, base, draft_length=8).generate([1, 2], 9, 4)
    with pytest.raises(AdaptspecError, match="block size 9 outside 1..8"):
        BatchEngine(target, base, draft_length=8).submit([1, 2], block_size=9)


def _reference_accept(best: list[int], drafts: list[int], width: int) -> list[int]:
    j = 0
    while j < width - 1 and drafts[j] == best[j]:
        j += 1
    return drafts[:j] + [best[j]]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), rows=st.integers(1, 4), drafted=st.integers(1, 9), vocab=st.integers(2, 4))
def test_prefix_acceptance_rule_matches_a_reference(data, rows, drafted, vocab):
    """Every row's committed tokens for its verify width: the reference loop's; and a prefix of
    width ``B`` of one draft commits ``min(tau_D, B)`` tokens, ``tau_D`` the whole draft's."""
    best = [
        data.draw(st.lists(st.integers(0, vocab - 1), min_size=drafted, max_size=drafted))
        for _ in range(rows)
    ]
    drafts = [
        data.draw(st.lists(st.integers(0, vocab - 1), min_size=drafted - 1, max_size=drafted - 1))
        for _ in range(rows)
    ]
    widths = [data.draw(st.integers(1, drafted)) for _ in range(rows)]
    logits = torch.zeros(rows, drafted, vocab)
    for i in range(rows):
        logits[i, torch.arange(drafted), torch.tensor(best[i])] = 1.0
    d = torch.tensor(drafts, dtype=torch.long).reshape(rows, drafted - 1)
    got = accept.greedy(logits, d, widths)
    assert got == [_reference_accept(best[i], drafts[i], widths[i]) for i in range(rows)]
    full = accept.greedy(logits, d, [drafted] * rows)
    assert [len(g) for g in got] == [min(len(f), w) for f, w in zip(full, widths)]
