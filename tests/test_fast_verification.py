"""Fast verification (the model's own kernels): what it guarantees, tested as stated in docs/decoding.md.

- T=0: every committed token is the target's argmax in the pass that verified it;
- the output equals plain greedy decoding except where that pass and a one-token step round
  a near-tie differently;
- T>0: speculative sampling keeps the distribution of the verifying pass (chi-square);
- B=1 throughout is plain decoding: the model's own one-token step, no drafter pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
from adaptspec.decoding.greedy import TIE_GAP, divergence, plain_greedy
from adaptspec.errors import AdaptspecError
from decoding_helpers import (
    ARCHS,
    PeekingDrafter,
    chi_square_p,
    reference_greedy,
    seeded_outcomes,
    tiny_target,
)

torch.set_num_threads(1)


class RecordingTarget(TargetModel):
    """A fast-mode target that keeps every verify pass: its block and its logits."""

    def __init__(self, model, small_dtype=None) -> None:
        super().__init__(model, verification="fast", small_dtype=small_dtype)
        self.passes: list[tuple[list[int], torch.Tensor]] = []

    def verify(self, block, cache, context=True):
        logits, hidden = super().verify(block, cache, context)
        self.passes.append((block.tolist(), logits.float().clone()))
        return logits, hidden


_CACHE: dict = {}


def fast_decoder(arch: str, small_dtype=None):
    """A float32 tiny target (``small_dtype``: its one- and two-row products on a copy in that dtype,
    the dtype ``mixed``), recording its verify passes, and a drafter for it."""
    if (arch, small_dtype) not in _CACHE:
        model = tiny_target(arch)
        target = RecordingTarget(model, small_dtype)
        drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=16)
        _CACHE[arch, small_dtype] = (model, target, drafter)
    return _CACHE[arch, small_dtype]


@pytest.mark.parametrize("small_dtype", [None, torch.bfloat16], ids=["float32", "mixed"])
@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(6, 95), min_size=1, max_size=20),
    block_size=st.integers(2, 16),
    error_rate=st.sampled_from([0.0, 0.2, 0.6]),
    seed=st.integers(0, 99),
)
def test_every_committed_token_is_the_argmax_of_the_pass_that_verified_it(
    arch, small_dtype, prompt, block_size, error_rate, seed
):
    model, target, drafter = fast_decoder(arch, small_dtype)
    ref = reference_greedy(model, prompt, 40)
    peek = PeekingDrafter(drafter, prompt + ref, error_rate, seed)  # accepts 0..B-1 drafts per round
    decoder = SpeculativeDecoder(target, peek)
    pre = decoder.prefill(prompt)
    target.passes.clear()
    out = decoder.decode(pre, block_size, 40)
    assert len(target.passes) == len(out.rounds)
    committed = [out.tokens[0]]
    for (block, logits), r in zip(target.passes, out.rounds):
        assert block[0] == committed[-1]  # each pass starts from the last committed token
        best = logits.argmax(-1).tolist()
        new = out.tokens[len(committed) : len(committed) + r.tau]
        # position i of the block predicts the token after block[i]: the committed tokens are
        # the verify pass's argmaxes, and every accepted draft was one
        assert new == best[: len(new)]
        assert block[1 : len(new)] == new[: len(new) - 1]
        if len(new) == r.tau and r.tau < len(block):  # the first rejected draft was not the argmax
            assert block[r.tau] != best[r.tau - 1]
        committed += new
    assert committed == out.tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_output_equals_plain_greedy_except_at_near_ties(arch):
    model, target, drafter = fast_decoder(arch)
    rng = np.random.default_rng(1)
    for k in range(6):
        prompt = rng.integers(6, 96, size=int(rng.integers(2, 12))).tolist()
        plain, _ = plain_greedy(model, prompt, 40, eos=[5])
        peek = PeekingDrafter(drafter, prompt + plain, 0.2, k)
        out = SpeculativeDecoder(target, peek).generate(prompt, 8, 40)
        d = divergence(model, prompt, out.tokens, plain)
        assert out.tokens == plain or (d is not None and d[1] <= TIE_GAP), (prompt, d)


def test_block_size_one_is_the_models_own_step_and_never_drafts():
    model = tiny_target("qwen3")

    class NoDrafting(BlockDiffusionDrafter):
        def draft_logits(self, *a, **k):
            raise AssertionError("B=1 must not call the drafter")

        def new_state(self, *a, **k):
            raise AssertionError("B=1 must not build drafter state")

    base = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0)
    drafter = NoDrafting(base.config)
    drafter.attach(model)
    decoder = SpeculativeDecoder(TargetModel(model, verification="fast"), drafter)
    for prompt in ([6, 7, 8], [40, 41, 42, 43, 44]):
        out = decoder.generate(prompt, 1, 30)
        assert out.tokens == plain_greedy(model, prompt, 30, eos=[5])[0]  # bit for bit: the same kernels
        assert all(r.block_size == 1 and r.tau == 1 for r in out.rounds)


def test_sampling_keeps_the_verifying_pass_distribution():
    """Chi-square test of (x2, x3) at T=1 in fast mode (fixed seeds; false-alarm rate 0.1%)."""
    from test_decoding import _exact_second_third

    model = tiny_target("llama", vocab=12, eos=None, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.25)
    prompt = [1, 4, 2]
    exact = _exact_second_third(model, prompt, 1.0).ravel()
    decoder = SpeculativeDecoder(
        TargetModel(model, verification="fast"), BlockDiffusionDrafter.for_target(model, num_layers=1, seed=1)
    )
    n = 2000
    counts = np.zeros_like(exact)
    for out in seeded_outcomes(decoder, prompt, 4, 4, 1.0, n):  # generate(..., seed=i), i < n
        counts[out.tokens[1] * 12 + out.tokens[2]] += 1
    p = chi_square_p(counts, exact)  # rare cells pooled only where there are some
    assert p > 1e-3, p


def test_modes_are_checked_and_a_patched_model_is_not_silently_fast():
    model = tiny_target("llama")
    with pytest.raises(AdaptspecError, match="verification must be one of fast, exact"):
        TargetModel(model, verification="quick")
    TargetModel(model, verification="exact")  # patches in place
    with pytest.raises(AdaptspecError, match="patched for exact verification"):
        TargetModel(model, verification="fast")
