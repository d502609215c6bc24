"""Tiny randomly initialised targets and drafters for the decoding tests."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from scipy import stats
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
from adaptspec.decoding.decoder import first_token
from adaptspec.decoding.sampling import SampleKeys

ARCHS = ("llama", "qwen3")


def tiny_target(arch: str = "llama", vocab: int = 96, eos: int | None = 5, seed: int = 0, layers: int = 4):
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=eos,
        bos_token_id=None,
        pad_token_id=None,
    )
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    else:
        raise ValueError(arch)
    # sharper logits: fewer near-ties, longer repeated patterns, like a trained model
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def reference_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(prompt) :].tolist()


class PeekingDrafter(BlockDiffusionDrafter):
    """Test drafter that drafts from a known continuation, with some positions corrupted.

    Its drafts are right for a while and then wrong, so rounds accept 0..B-1 drafts and the
    loop's acceptance, cropping and EOS handling are all exercised.
    """

    def __init__(self, base: BlockDiffusionDrafter, sequence: list[int], error_rate: float, seed: int = 0):
        super().__init__(base.config, base.draft_vocab)
        self.load_state_dict(base.state_dict())
        self.__dict__["_shared"] = base._shared
        self.sequence = sequence
        self.error_rate = error_rate
        self.gen = torch.Generator().manual_seed(seed)

    def draft_logits(self, state, last_token, block_size):
        logits = super().draft_logits(state, last_token, block_size)  # keeps the real code path busy
        n = state.length
        want = self.sequence[n + 1 : n + block_size]
        v = self.config.vocab_size
        for i in range(block_size - 1):
            bad = i >= len(want) or float(torch.rand(1, generator=self.gen)) < self.error_rate
            tok = int(torch.randint(v, (1,), generator=self.gen)) if bad else want[i]
            logits[i] = -1e4
            logits[i, tok] = 1e4
        return logits


def make_decoder(model, drafter_seed: int = 0, max_block_size: int = 32, **kw) -> SpeculativeDecoder:
    target = TargetModel(model, verification="exact")
    drafter = BlockDiffusionDrafter.for_target(
        model, num_layers=1, seed=drafter_seed, max_block_size=max_block_size, **kw
    )
    return SpeculativeDecoder(target, drafter)


def model_and_decoder(arch: str):
    """A tiny target of ``arch`` and an exact decoder over it (a test module caches it:
    ``target_for = functools.cache(model_and_decoder)``)."""
    model = tiny_target(arch)
    return model, make_decoder(model)


def brute_path(tree, choices: list[int]) -> list[int]:
    """The accepted path of a draft tree found by scanning every node for a child of the current one
    holding the target's choice there (an independent walk, against the decoder's own)."""
    path, node = [], 0
    for _ in range(tree.nodes):
        kids = [
            i
            for i in range(1, tree.nodes + 1)
            if tree.parents[i] == node and tree.tokens[i - 1] == choices[node]
        ]
        if not kids:
            break
        node = kids[0]
        path.append(node)
    return path


def seeded_outcomes(
    decoder: SpeculativeDecoder,
    prompt: list[int],
    block_size,
    max_new_tokens: int,
    temperature: float,
    n: int,
    checked: int = 20,
) -> list:
    """``decoder.generate(prompt, block_size, max_new_tokens, temperature, seed=s)`` for the seeds
    ``s = 0 .. n-1``, with the target's pass over the prompt run once instead of ``n`` times.

    ``generate`` is ``prefill`` (the target's pass over the prompt, then the first token: the keyed
    sample of output position 0 under the seed) and ``decode``, which does not consume its prefill
    and keys positions 1.. by the seed it is given. So each seed's outcome is ``decode`` of one
    prefill with that seed's first token. The first ``checked`` seeds are run through ``generate``
    as well and must agree token for token and round for round."""
    pre = decoder.prefill(prompt)  # the cache and the drafter's context; its first token is replaced
    logits = decoder.target.prefill(prompt).logits
    outs = []
    for seed in range(n):
        first = first_token(logits, temperature, SampleKeys(seed), decoder.target.vocab_size)
        outs.append(
            decoder.decode(
                dataclasses.replace(pre, first_token=first),
                block_size,
                max_new_tokens,
                temperature=temperature,
                seed=seed,
            )
        )
    for seed in range(min(checked, n)):
        ref = decoder.generate(prompt, block_size, max_new_tokens, temperature=temperature, seed=seed)
        untimed = [
            [dataclasses.replace(r, draft_s=0.0, verify_s=0.0) for r in o.rounds] for o in (outs[seed], ref)
        ]
        assert outs[seed].tokens == ref.tokens and untimed[0] == untimed[1], seed
    return outs


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of Pearson's chi-square test of ``counts`` against the cell probabilities ``probs``
    (same shape, summing to 1); cells expecting fewer than 5 are pooled into one, when there are any."""
    counts, expected = counts.ravel(), probs.ravel() * counts.sum()
    big = expected >= 5
    obs, exp = counts[big], expected[big]
    if (~big).any():
        obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, expected[~big].sum())
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)
