"""Draft trees are lossless as chains are (docs/decoding.md, "Draft trees"), tested as stated:

- exact verification: the output is bit-identical to the target's own greedy ``generate``, at
  every budget (fixed sizes, top-k, depths, CaDDTree's rule), with drafters that are never, often
  and always right, EOS inside an accepted path and the last round cut by ``max_new_tokens``;
- fast verification: every committed token is the argmax of the tree pass that verified it, and
  that pass's logits along the accepted path are those of the chain ``[last, path]`` recomputed
  from scratch (within float32 rounding: the mask, the positions and the cache kept are right);
  the output equals plain greedy decoding except at near-ties;
- T > 0 with a seed: in exact verification the same tokens with a tree, a chain or none; in fast
  verification every committed token is the keyed sample of the tree pass that verified it.
"""

from __future__ import annotations

import functools
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import adaptspec.decoding.decoder as decoder_module
from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
from adaptspec.decoding.greedy import TIE_GAP, divergence, plain_greedy
from adaptspec.decoding.sampling import SampleKeys
from adaptspec.decoding.tree_budget import CostAwareTree, FixedTree, TreeBudget
from adaptspec.errors import AdaptspecError
from decoding_helpers import ARCHS, brute_path, model_and_decoder, reference_greedy, tiny_target

torch.set_num_threads(1)


class TreePeekingDrafter(BlockDiffusionDrafter):
    """Drafts from a known continuation with the right token at rank 0, 1, 2, 3 or nowhere among
    four decoys: best-first trees then accept along paths that leave rank 0, as a real drafter's do."""

    def __init__(
        self,
        base: BlockDiffusionDrafter,
        sequence: list[int],
        seed: int = 0,
        rank_probs: tuple[float, ...] = (0.5, 0.2, 0.1, 0.1, 0.1),
    ):
        super().__init__(base.config, base.draft_vocab)
        self.load_state_dict(base.state_dict())
        self.__dict__["_shared"] = base._shared
        self.sequence = sequence
        self.rank_probs = torch.tensor(rank_probs)
        self.seed = seed

    def draft_logits(self, state, last_token, block_size):
        """The same logits for the same context and block, however often asked."""
        logits = super().draft_logits(state, last_token, block_size)  # the real code path stays busy
        n, v = state.length, self.config.vocab_size
        self.gen = torch.Generator().manual_seed(self.seed * 1_000_003 + n * 1009 + last_token)
        want = self.sequence[n + 1 : n + block_size]
        logits.mul_(0.01).sub_(10.0)
        for i in range(block_size - 1):
            right = want[i] if i < len(want) else int(torch.randint(v, (1,), generator=self.gen))
            decoys = [t for t in torch.randperm(v, generator=self.gen)[:5].tolist() if t != right][:4]
            r = int(torch.multinomial(self.rank_probs, 1, generator=self.gen))
            order = decoys[:r] + [right] + decoys[r:] if r < 4 else decoys
            for slot, tok in enumerate(order):
                logits[i, tok] = 8.0 - 1.5 * slot
        return logits


exact_for = functools.cache(model_and_decoder)  # one tiny target and exact decoder per architecture


def convex_costs(a: float, b: float, c: float):
    return lambda m: a + b * m + c * m * m


budgets = st.one_of(
    st.builds(FixedTree, st.integers(1, 24), st.integers(0, 5), st.one_of(st.none(), st.integers(1, 8))),
    st.builds(
        lambda a, b, c, n, k: CostAwareTree(convex_costs(a, b, c), max_nodes=n, top_k=k),
        st.floats(0.5, 2.0),
        st.floats(0.0, 0.2),
        st.floats(0.0, 0.01),
        st.integers(1, 24),
        st.integers(0, 4),
    ),
)
prompts = st.lists(st.integers(6, 95), min_size=1, max_size=20)


def check_rounds(out, budget: TreeBudget) -> None:
    for r in out.rounds:
        assert r.tree or (r.block_size == 1 and not r.drafted)  # a tree, or the last token's plain step
        assert 1 <= r.tau <= r.block_size <= budget.max_nodes + 1
        assert r.block_size == 1 or r.tau <= r.drafted


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=prompts,
    budget=budgets,
    max_new=st.integers(1, 40),
    peek_seed=st.one_of(st.none(), st.integers(0, 99)),
)
def test_exact_trees_are_bit_identical_to_greedy(arch, prompt, budget, max_new, peek_seed):
    model, decoder = exact_for(arch)
    ref = reference_greedy(model, prompt, max_new)
    if peek_seed is not None:  # a drafter often right, at any rank
        decoder = SpeculativeDecoder(
            decoder.target, TreePeekingDrafter(decoder.drafter, prompt + ref, peek_seed)
        )
    out = decoder.generate(prompt, budget, max_new)
    assert out.tokens == ref
    check_rounds(out, budget)
    assert out.finish_reason == ("eos" if 5 in ref else "length")


@pytest.mark.slow
def test_exact_trees_accept_off_the_rank0_path_and_stop_at_eos_inside_a_path():
    model, decoder = exact_for("llama")
    eos_seen = off_rank0 = deepest = 0
    for prompt in ([6, 7, 8], [94, 84], [40, 41], [53, 28, 79, 52], [11, 12, 13]):  # two end at EOS
        ref = reference_greedy(model, prompt, 60)
        peek = TreePeekingDrafter(decoder.drafter, prompt + ref, 7, rank_probs=(0.3, 0.4, 0.3, 0.0, 0.0))
        passes, forwards = TreePasses(), []
        hook = model.register_forward_hook(lambda *_: forwards.append(1))  # the target's passes
        try:
            with mock.patch.object(decoder_module, "verify_tree", passes):
                out = SpeculativeDecoder(decoder.target, peek).generate(
                    prompt, FixedTree(32, top_k=4, depth=8), 60
                )
        finally:
            hook.remove()
        assert out.tokens == ref
        assert len(forwards) == 1 + len(
            out.rounds
        )  # the prefill, then one pass a round: no second pass for exactness
        deepest = max(deepest, *(r.tau for r in out.rounds))
        for tree, _, _, logits in passes.passes:
            path = brute_path(tree, logits.argmax(-1).tolist())
            off_rank0 += [tree.tokens[i - 1] for i in path] != tree.chain[: len(path)]
        if 5 in ref:
            eos_seen += 1
            assert out.finish_reason == "eos" and out.tokens[-1] == 5 and out.tokens.count(5) == 1
    assert eos_seen == 2 and deepest >= 5 and off_rank0 >= 10  # paths through ranks 1 and 2 were accepted


def test_the_last_rounds_are_cut_to_what_is_left():
    model, decoder = exact_for("qwen3")
    prompt = [21, 22, 23]
    ref = reference_greedy(model, prompt, 64)
    peek = TreePeekingDrafter(decoder.drafter, prompt + ref, 1, rank_probs=(1.0, 0, 0, 0, 0))  # always right
    for max_new in range(1, 20):
        out = SpeculativeDecoder(decoder.target, peek).generate(prompt, FixedTree(16, depth=6), max_new)
        assert out.tokens == ref[:max_new] and out.new_tokens == max_new
        assert all(r.tau <= r.drafted for r in out.rounds if r.block_size > 1)
        assert sum(r.tau for r in out.rounds) == max_new - 1  # no committed token thrown away


# ---------------------------------------------------------------------- fast verification
class TreePasses:
    """Records every tree pass the decoder runs: (tree, last, cached positions, logits)."""

    def __init__(self) -> None:
        self.passes: list = []
        self.real = decoder_module.verify_tree

    def __call__(self, target, tree, last, n, cache, context=True):
        logits, hidden = self.real(target, tree, last, n, cache, context)
        self.passes.append((tree, last, n, logits.float().clone()))
        return logits, hidden


_FAST: dict = {}


def fast_for(arch: str, attention: str = "sdpa"):
    if (arch, attention) not in _FAST:
        model = tiny_target(arch)
        if attention != "sdpa":
            model.set_attn_implementation(attention)
        drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=16)
        _FAST[arch, attention] = (model, TargetModel(model, verification="fast"), drafter)
    return _FAST[arch, attention]


def check_fast_rounds(model, prompt, out, passes, temperature=0.0, seed=None):
    """Every committed token is the argmax (or keyed sample) of its tree pass along the walk, and
    that pass's logits on the path are the chain's, recomputed by a full forward without a cache.
    A round that is not a tree (the last token's plain step) commits the full forward's choice."""
    assert len(passes) == sum(r.tree for r in out.rounds)
    passes = iter(passes)
    committed = [out.tokens[0]]
    keys = SampleKeys(seed) if temperature > 0 else None
    for r in out.rounds:
        n = len(prompt) + len(committed) - 1
        pos = len(committed)  # output position of the first token this round commits
        if not r.tree:
            with torch.no_grad():
                full = model(torch.tensor([prompt + committed])).logits[0, -1].float()
            if temperature > 0:
                full = full / temperature + keys.noise(pos, 1, full.shape[-1], full.device)[0]
            assert full[out.tokens[pos]] >= full.max() - 1e-4
            committed.append(out.tokens[pos])
            continue
        tree, last, at, logits = next(passes)
        assert last == committed[-1] and at == n
        if temperature == 0:
            choices = logits.argmax(-1).tolist()
        else:
            noise = torch.stack(
                [keys.noise(pos + d, 1, logits.shape[-1], logits.device)[0] for d in tree.depths]
            )
            choices = (logits / temperature + noise).argmax(-1).tolist()
        path = brute_path(tree, choices)
        new = [tree.tokens[i - 1] for i in path] + [choices[path[-1] if path else 0]]
        got = out.tokens[pos : pos + r.tau]
        assert r.tau == len(new) and got == new[: len(got)]
        with torch.no_grad():
            full = model(torch.tensor([prompt + committed + new[:-1]])).logits[0, n:].float()
        torch.testing.assert_close(logits[[0, *path]], full, rtol=1e-4, atol=1e-4)
        committed += new
    assert committed[: len(out.tokens)] == out.tokens


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=prompts,
    budget=budgets,
    max_new=st.integers(1, 40),
    peek_seed=st.one_of(st.none(), st.integers(0, 99)),
)
def test_fast_trees_commit_the_argmax_of_the_pass_that_verified_them(
    arch, prompt, budget, max_new, peek_seed
):
    model, target, drafter = fast_for(arch)
    if peek_seed is not None:
        drafter = TreePeekingDrafter(drafter, prompt + reference_greedy(model, prompt, max_new), peek_seed)
    decoder = SpeculativeDecoder(target, drafter)
    passes = TreePasses()
    with mock.patch.object(decoder_module, "verify_tree", passes):
        out = decoder.generate(prompt, budget, max_new)
    check_fast_rounds(model, prompt, out, passes.passes)
    check_rounds(out, budget)


@pytest.mark.parametrize("attention", ["sdpa", pytest.param("eager", marks=pytest.mark.slow)])
def test_fast_trees_equal_plain_greedy_except_at_near_ties(attention):
    model, target, drafter = fast_for("llama", attention)
    rng = np.random.default_rng(1)
    differ = 0
    for k in range(6):
        prompt = rng.integers(6, 96, size=int(rng.integers(2, 12))).tolist()
        plain, _ = plain_greedy(model, prompt, 40, eos=[5])
        peek = TreePeekingDrafter(drafter, prompt + plain, k)
        passes = TreePasses()
        with mock.patch.object(decoder_module, "verify_tree", passes):
            out = SpeculativeDecoder(target, peek).generate(prompt, FixedTree(12, top_k=3, depth=6), 40)
        check_fast_rounds(model, prompt, out, passes.passes)
        d = divergence(model, prompt, out.tokens, plain)
        assert out.tokens == plain or (d is not None and d[1] <= TIE_GAP), (prompt, d)
        differ += out.tokens != plain
        assert max(r.tau for r in out.rounds) > 2
    assert differ <= 1  # float32 tiny models: near-ties are rare


# ---------------------------------------------------------------------- T > 0
@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=prompts,
    budget=budgets,
    seed=st.integers(0, 2**32),
    temperature=st.sampled_from([0.5, 1.0, 1.5]),
    peek=st.booleans(),
)
def test_exact_trees_sample_the_same_tokens_as_plain_decoding_under_a_seed(
    arch, prompt, budget, seed, temperature, peek
):
    model, decoder = exact_for(arch)
    plain = decoder.generate(prompt, 1, 32, temperature=temperature, seed=seed).tokens
    tree_decoder = decoder
    if peek:  # a drafter that knows the sampled continuation: long paths accepted
        tree_decoder = SpeculativeDecoder(
            decoder.target, TreePeekingDrafter(decoder.drafter, prompt + plain, seed % 97)
        )
    out = tree_decoder.generate(prompt, budget, 32, temperature=temperature, seed=seed)
    assert out.tokens == plain == decoder.generate(prompt, 4, 32, temperature=temperature, seed=seed).tokens
    check_rounds(out, budget)
    if peek and len(plain) > 8 and budget.max_nodes >= 8:
        assert max(r.tau for r in out.rounds) > 1


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_trees_commit_the_keyed_sample_of_the_pass_that_verified_them(arch):
    model, target, drafter = fast_for(arch)
    for seed, prompt in enumerate(([6, 7, 8], [40, 41, 42, 43], [70])):
        plain = SpeculativeDecoder(target, drafter).generate(prompt, 1, 30, temperature=0.8, seed=seed).tokens
        peek = TreePeekingDrafter(drafter, prompt + plain, seed)
        passes = TreePasses()
        with mock.patch.object(decoder_module, "verify_tree", passes):
            out = SpeculativeDecoder(target, peek).generate(
                prompt, FixedTree(10, top_k=3, depth=5), 30, temperature=0.8, seed=seed
            )
        check_fast_rounds(model, prompt, out, passes.passes, temperature=0.8, seed=seed)
        assert max(r.tau for r in out.rounds) > 2


# ---------------------------------------------------------------------- refusals
def test_trees_are_refused_where_they_cannot_run():
    model, decoder = exact_for("llama")
    with pytest.raises(AdaptspecError, match="draft trees need a drafter"):
        SpeculativeDecoder(decoder.target).generate([6, 7], FixedTree(4), 5)

    class Broken(FixedTree):
        def nodes(self, log_mass):
            return len(log_mass) + 1

    with pytest.raises(AdaptspecError, match="nodes gave .* outside 0"):
        decoder.generate([6, 7], Broken(4), 5)
    other = tiny_target("llama")
    target = TargetModel(other, verification="fast")
    spec = SpeculativeDecoder(target, BlockDiffusionDrafter.for_target(other, num_layers=1, seed=0))
    pre = spec.prefill([6, 7])
    other.config._attn_implementation = "flash_attention_2"  # takes no mask per query
    with pytest.raises(
        AdaptspecError,
        match=r"draft trees need sdpa or eager attention \(a mask per query\); this target runs 'flash_attention_2'",
    ):
        spec.decode(pre, FixedTree(4), 5)


def test_a_cache_that_cannot_drop_positions_is_refused():
    from transformers import DynamicCache, MistralConfig

    from adaptspec.decoding.tree_verify import check_tree_target

    _, decoder = exact_for("llama")
    windowed = DynamicCache(config=MistralConfig(num_hidden_layers=2, sliding_window=8))
    with pytest.raises(
        AdaptspecError, match="full-attention KV cache; this target's has DynamicSlidingWindowLayer"
    ):
        check_tree_target(decoder.target, windowed)
