"""The decoder is lossless: greedy output equals the target's own, sampling keeps its distribution."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
from adaptspec.errors import AdaptspecError
from adaptspec.schedules import ConfidenceThreshold
from decoding_helpers import (
    ARCHS,
    PeekingDrafter,
    chi_square_p,
    make_decoder,
    model_and_decoder,
    reference_greedy,
    seeded_outcomes,
    tiny_target,
)

torch.set_num_threads(1)

target_for = functools.cache(model_and_decoder)  # one tiny target and exact decoder per architecture


prompts = st.lists(st.integers(6, 95), min_size=1, max_size=24)


@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=prompts, block_size=st.integers(1, 16), max_new=st.integers(1, 40))
def test_greedy_equals_target_generate_untrained_drafter(arch, prompt, block_size, max_new):
    model, decoder = target_for(arch)
    out = decoder.generate(prompt, block_size=block_size, max_new_tokens=max_new)
    assert out.tokens == reference_greedy(model, prompt, max_new)
    assert all(1 <= r.tau <= r.block_size <= block_size for r in out.rounds)


@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=prompts,
    block_size=st.integers(2, 16),
    error_rate=st.sampled_from([0.0, 0.1, 0.4]),
    seed=st.integers(0, 99),
)
def test_greedy_equals_target_generate_with_accepting_drafter(arch, prompt, block_size, error_rate, seed):
    """A drafter that is often right: rounds accept many drafts, the output must not change."""
    model, decoder = target_for(arch)
    max_new = 48
    ref = reference_greedy(model, prompt, max_new)
    peek = PeekingDrafter(decoder.drafter, prompt + ref, error_rate, seed)
    out = SpeculativeDecoder(decoder.target, peek).generate(
        prompt, block_size=block_size, max_new_tokens=max_new
    )
    assert out.tokens == ref
    if error_rate == 0.0 and len(ref) > block_size + 1:
        assert max(r.tau for r in out.rounds) > 1


@pytest.mark.parametrize("block_size", range(1, 17))
def test_every_block_size_with_a_perturbed_drafter(block_size):
    model, decoder = target_for("llama")
    perturbed = make_decoder(model, drafter_seed=block_size)
    with torch.no_grad():
        for p in perturbed.drafter.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    prompt = [7, 8, 9, 10, 11, 12]
    ref = reference_greedy(model, prompt, 30)
    assert perturbed.generate(prompt, block_size, 30).tokens == ref
    peek = PeekingDrafter(perturbed.drafter, prompt + ref, 0.2, block_size)
    assert SpeculativeDecoder(perturbed.target, peek).generate(prompt, block_size, 30).tokens == ref


def test_block_size_may_change_between_rounds():
    model, decoder = target_for("qwen3")
    prompt = [10, 20, 30, 40]
    ref = reference_greedy(model, prompt, 40)
    peek = PeekingDrafter(decoder.drafter, prompt + ref, 0.2, 1)
    schedule = lambda i, rounds: [1, 4, 16, 2, 8][i % 5]  # noqa: E731
    out = SpeculativeDecoder(decoder.target, peek).generate(prompt, schedule, 40)
    assert out.tokens == ref
    assert {r.block_size for r in out.rounds} >= {1, 4}


def test_stops_at_eos_and_at_max_tokens():
    model, decoder = target_for("llama")
    eos = 5
    for prompt in ([6, 7, 8], [9, 9, 9, 9], [40, 41], [60, 30, 20, 10]):
        ref = reference_greedy(model, prompt, 60)
        out = decoder.generate(prompt, 8, 60)
        assert out.tokens == ref
        if eos in ref:
            assert out.finish_reason == "eos" and out.tokens[-1] == eos
        else:
            assert out.finish_reason == "length" and out.new_tokens == 60


def test_on_round_streams_exactly_the_output():
    model, decoder = target_for("llama")
    prompt = [21, 22, 23]
    ref = reference_greedy(model, prompt, 33)
    peek = PeekingDrafter(decoder.drafter, prompt + ref, 0.3, 5)
    chunks, seen = [], []
    out = SpeculativeDecoder(decoder.target, peek).decode(
        decoder.prefill(prompt), 6, 33, on_round=lambda toks, r: (chunks.append(toks), seen.append(r))
    )
    assert [decoder.prefill(prompt).first_token] + [t for c in chunks for t in c] == out.tokens == ref
    assert seen == out.rounds and all(1 <= len(c) <= r.tau for c, r in zip(chunks, seen))


def test_prefill_is_reusable_across_block_sizes():
    model, decoder = target_for("llama")
    pre = decoder.prefill([11, 12, 13])
    outs = [decoder.decode(pre, b, 20).tokens for b in (1, 3, 7, 1)]
    assert all(o == outs[0] for o in outs)


# ---------------------------------------------------------------------- caches
@pytest.mark.parametrize("arch", ARCHS)
def test_cropped_cache_gives_the_logits_of_a_fresh_forward(arch):
    """Verify a block, keep a prefix, then the next step equals a full forward pass."""
    model, decoder = target_for(arch)
    target = decoder.target
    prompt = [12, 13, 14, 15, 16]
    rng = np.random.default_rng(0)
    for keep in range(1, 7):
        pre = target.prefill(prompt)
        block = torch.tensor(rng.integers(6, 96, size=6))
        target.verify(block, pre.cache)
        n = len(prompt) + keep
        target.crop(pre.cache, n)
        assert pre.cache.get_seq_length() == n
        nxt = torch.tensor([int(rng.integers(6, 96))])
        cached, _ = target.verify(nxt, pre.cache)
        full_ids = torch.tensor([prompt + block[:keep].tolist() + nxt.tolist()])
        with torch.no_grad():
            fresh = model(full_ids).logits[0, -1]
        torch.testing.assert_close(cached[-1], fresh, rtol=1e-4, atol=1e-4)


def test_draft_state_crop_matches_a_fresh_state():
    model, decoder = target_for("llama")
    drafter = decoder.drafter
    ctx = torch.randn(12, drafter.context_width)
    grown = drafter.new_state(ctx[:5])
    drafter.draft_logits(grown, 7, 4)  # project the first five
    grown.append(ctx[5:12])
    drafter.draft_logits(grown, 7, 4)
    grown.crop(8)
    fresh = drafter.new_state(ctx[:8])
    torch.testing.assert_close(drafter.draft_logits(grown, 9, 6), drafter.draft_logits(fresh, 9, 6))
    queued = drafter.new_state(ctx[:5])
    queued.append(ctx[5:12])
    queued.crop(8)  # crop inside the queue, before projection
    torch.testing.assert_close(drafter.draft_logits(queued, 9, 6), drafter.draft_logits(fresh, 9, 6))


# ---------------------------------------------------------------------- sampling
def _exact_second_third(model, prompt: list[int], temperature: float) -> np.ndarray:
    """Exact P(x2, x3 | prompt) of the target's own sampling, by enumeration."""
    v = model.config.vocab_size
    with torch.no_grad():
        p1 = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double() / temperature, -1)
        seqs = torch.tensor([prompt + [a] for a in range(v)])
        p2 = torch.softmax(model(seqs).logits[:, -1].double() / temperature, -1)  # [x1, x2]
        seqs3 = torch.tensor([prompt + [a, b] for a in range(v) for b in range(v)])
        p3 = torch.softmax(model(seqs3).logits[:, -1].double() / temperature, -1).view(v, v, v)
    joint = p1[:, None, None] * p2[:, :, None] * p3  # [x1, x2, x3]
    return joint.sum(0).numpy()


@pytest.mark.parametrize(
    "draft_vocab, schedule",
    [
        (None, 4),
        (list(range(0, 12, 2)), 4),
        (None, ConfidenceThreshold(0.0248, block_size=3, backoff=False)),  # both drafts or one, by context
    ],
)
def test_sampling_keeps_the_target_distribution(draft_vocab, schedule):
    """Chi-square test of (x2, x3), the first tokens drafted and verified, at T=1.

    The seeds are fixed, so the test is deterministic; with fresh seeds its false-alarm
    rate would be the significance level, 0.1%.
    """
    model = tiny_target("llama", vocab=12, eos=None, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.25)  # back to a spread-out distribution
    prompt = [1, 4, 2]
    exact = _exact_second_third(model, prompt, 1.0).ravel()  # batched: before the one-sequence patch
    target = TargetModel(model, verification="exact")
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=1, draft_vocab=draft_vocab)
    decoder = SpeculativeDecoder(target, drafter)
    n = 3000
    counts = np.zeros_like(exact)
    accepted = prefixes = 0
    for out in seeded_outcomes(decoder, prompt, schedule, 4, 1.0, n):  # generate(..., seed=i), i < n
        counts[out.tokens[1] * 12 + out.tokens[2]] += 1
        accepted += out.rounds[0].tau - 1
        prefixes += out.rounds[0].block_size < out.rounds[0].draft_size
    assert 0 < accepted < 2 * n  # both acceptance and rejection happened
    if not isinstance(schedule, int):
        assert 0 < prefixes < n  # some rounds verified the whole block, some a prefix
    p = chi_square_p(counts, exact)
    assert p > 1e-3, p


def test_sampling_is_deterministic_under_a_seed():
    model, decoder = target_for("llama")
    a = decoder.generate([6, 7, 8], 6, 30, temperature=0.8, seed=42).tokens
    b = decoder.generate([6, 7, 8], 6, 30, temperature=0.8, seed=42).tokens
    c = decoder.generate([6, 7, 8], 6, 30, temperature=0.8, seed=43).tokens
    assert a == b and a != c


# ---------------------------------------------------------------------- bad input
def test_bad_input_is_a_clear_error():
    model, decoder = target_for("llama")
    with pytest.raises(AdaptspecError, match="block size 0 outside 1..32"):
        decoder.generate([6, 7], 0, 5)
    with pytest.raises(AdaptspecError, match="block size 33 outside"):
        decoder.generate([6, 7], 33, 5)
    with pytest.raises(AdaptspecError, match="empty prompt"):
        decoder.generate([], 4, 5)
    with pytest.raises(AdaptspecError, match="max_new_tokens"):
        decoder.generate([6, 7], 4, 0)
    with pytest.raises(AdaptspecError, match="temperature"):
        decoder.generate([6, 7], 4, 5, temperature=-1)
    with pytest.raises(AdaptspecError, match="token ids outside"):
        decoder.generate([6, 700], 4, 5)
    plain = SpeculativeDecoder(TargetModel(tiny_target("llama")))
    with pytest.raises(AdaptspecError, match="no drafter"):
        plain.generate([6, 7], 2, 5)
    other = tiny_target("llama", vocab=80)
    with pytest.raises(AdaptspecError, match="vocabulary of 96 tokens, the target has 80"):
        decoder.drafter.attach(other)


def test_save_and_load_round_trip(tmp_path):
    model, decoder = target_for("qwen3")
    decoder.drafter.save_pretrained(tmp_path, dtype=torch.float32)
    loaded = BlockDiffusionDrafter.from_pretrained(tmp_path, target=model)
    ctx = torch.randn(6, loaded.context_width)
    torch.testing.assert_close(
        loaded.draft_logits(loaded.new_state(ctx), 8, 5),
        decoder.drafter.draft_logits(decoder.drafter.new_state(ctx), 8, 5),
    )
    with pytest.raises(AdaptspecError, match="not a drafter"):
        BlockDiffusionDrafter.from_pretrained(tmp_path / "nope")


def test_standard_copy_restores_the_standard_kernels_and_plain_greedy_matches_generate():
    from adaptspec.decoding.batch_invariant import is_batch_invariant, standard_copy
    from adaptspec.decoding.greedy import plain_greedy

    model = tiny_target("llama")
    plain_ref = model.generate(torch.tensor([[3, 9, 4]]), do_sample=False, max_new_tokens=12)[0, 3:].tolist()
    TargetModel(model, verification="exact")  # patches in place
    assert is_batch_invariant(model)
    std = standard_copy(model)
    assert is_batch_invariant(model) and not is_batch_invariant(std)
    assert not any(type(m).__name__ == "RowPaddedLinear" for m in std.modules())
    tokens, seconds = plain_greedy(std, [3, 9, 4], 12, eos=[5])
    assert seconds >= 0 and tokens == plain_ref[: len(tokens)] and (len(tokens) == 12 or tokens[-1] == 5)


def test_plain_greedy_baseline_checks_losslessness_against_the_exact_kernels():
    from adaptspec.decoding.greedy import PlainGreedy

    model = tiny_target("llama")
    target = TargetModel(model, verification="exact")
    base = PlainGreedy(target)
    assert base.model is not model  # a standard-kernel copy; the target keeps its exact kernels
    ids = [3, 9, 4]
    plain, _ = base(ids, 12)
    exact = SpeculativeDecoder(target, None).generate(ids, 1, 12).tokens
    assert base.verdict(plain, plain, ids, 12) == "yes"
    assert (
        base.verdict(exact, exact[:-1] + [(exact[-1] + 1) % 96], ids, 12) == "yes*"
    )  # plain drifted, exact holds
    assert base.verdict([t + 1 for t in exact], plain, ids, 12) == "NO"
