"""A seed gives a request the same tokens whatever the block sizes, the per-round rule and the batch (issue 38, item 11).

Sampling at T > 0 is keyed by position (adaptspec/decoding/sampling.py): the token at output
position p is argmax(logits_p / T + G(seed, p)). The reference here is independent of the
decoders: the tiny target's own one-token steps in plain transformers (a fresh, unpatched model
with its KV cache), each position's token drawn with that rule. Exact verification makes the
decoders' logits bit-identical to those steps, so every decoder, at every block size, alone or
batched, must give exactly the reference's tokens. That the samples follow the target's
distribution is tested by chi-square in test_decoding.py and test_batching.py.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from _batching_helpers import one_thread  # noqa: F401  (autouse: one torch thread per module)
from adaptspec.batching import BatchEngine
from adaptspec.decoding import SpeculativeDecoder
from adaptspec.decoding.sampling import SampleKeys
from adaptspec.serving.tiny import tiny_model, tiny_speculator

SPEC, CODEC = tiny_speculator(0, verification="exact")
MODEL = tiny_model(0)
N = 14


def reference(prompt: list[int], n: int, temperature: float, seed: int) -> list[int]:
    """The keyed samples of the tiny target, one token at a time in plain transformers (stops after EOS)."""
    keys, out = SampleKeys(seed), []
    with torch.no_grad():
        step = MODEL(torch.tensor([prompt]), use_cache=True)
        for p in range(n):
            logits = step.logits[0, -1].float()
            tok = int((logits / temperature + keys.noise(p, 1, logits.shape[-1], logits.device)[0]).argmax())
            out.append(tok)
            if tok == CODEC.eos:
                break
            step = MODEL(torch.tensor([[tok]]), cache=step.cache, use_cache=True)
    return out


def engine_tokens(prompt, seed, temperature, block_size=4, rule=None, others=()) -> list[int]:
    engine = BatchEngine(SPEC.target, SPEC.drafter, max_rows=4)
    if rule is not None:
        engine.round_block_sizes = rule
    for i, (p, b, t) in enumerate(others):
        engine.submit(p, block_size=b, max_new_tokens=N, temperature=t, seed=seed + 1 + i)
    h = engine.submit(prompt, block_size=block_size, max_new_tokens=N, temperature=temperature, seed=seed)
    engine.run_until_done()
    return h.result().tokens


PROMPT = CODEC.encode("Once upon a time")


@settings(max_examples=6, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**63 - 1), temperature=st.sampled_from([0.7, 1.0, 2.0]))
def test_the_decoder_gives_the_keyed_samples_at_every_block_size(seed, temperature):
    want = reference(PROMPT, N, temperature, seed)
    for b in (1, 2, 4, 8):
        assert SPEC.generate(PROMPT, b, N, temperature=temperature, seed=seed).tokens == want, b


@settings(max_examples=5, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**63 - 1), rule_seed=st.integers(0, 99))
def test_the_engine_gives_the_same_samples_whatever_the_rule_and_the_batch(seed, rule_seed):
    want = reference(PROMPT, N, 1.0, seed)
    for b in (1, 2, 4, 8):
        assert engine_tokens(PROMPT, seed, 1.0, block_size=b) == want, b
    rng = random.Random(rule_seed)  # a per-round rule that changes every row's block size every round
    assert (
        engine_tokens(
            PROMPT, seed, 1.0, block_size=8, rule=lambda rows: [rng.choice([1, 2, 3, 5, 8]) for _ in rows]
        )
        == want
    )
    others = [(CODEC.encode("abc"), 3, 0.0), (CODEC.encode("zz top"), 6, 1.5), (CODEC.encode("q"), 1, 0.8)]
    assert engine_tokens(PROMPT, seed, 1.0, block_size=5, others=others) == want


def test_the_seed_matters_and_an_unseeded_request_is_drawn_afresh():
    a = SPEC.generate(PROMPT, 4, 40, temperature=2.0, seed=1).tokens
    assert a == SPEC.generate(PROMPT, 3, 40, temperature=2.0, seed=1).tokens
    assert a != SPEC.generate(PROMPT, 4, 40, temperature=2.0, seed=2).tokens
    fresh = {tuple(SPEC.generate(PROMPT, 4, 40, temperature=2.0).tokens) for _ in range(3)}
    assert len(fresh) > 1


def test_keys_differ_by_seed_and_position_and_the_noise_is_standard_gumbel():
    keys = {SampleKeys(s).key(p) for s in range(50) for p in range(50)}
    assert len(keys) == 2500
    g = SampleKeys(7).noise(0, 64, 1000, torch.device("cpu")).double().flatten()
    # standard Gumbel: mean = Euler-Mascheroni constant, variance pi^2 / 6 (64,000 draws)
    assert abs(float(g.mean()) - 0.5772156649) < 0.02
    assert abs(float(g.var()) - torch.pi**2 / 6) < 0.05


@pytest.mark.parametrize("b", [2, 5])
def test_a_reduced_draft_vocabulary_keeps_the_samples(b):
    from adaptspec.decoding import BlockDiffusionDrafter

    drafter = BlockDiffusionDrafter.for_target(
        SPEC.target.model, num_layers=1, seed=3, max_block_size=8, draft_vocab=list(range(0, 128, 3))
    )
    dec = SpeculativeDecoder(SPEC.target, drafter)
    assert dec.generate(PROMPT, b, N, temperature=1.0, seed=99).tokens == reference(PROMPT, N, 1.0, 99)
