"""One verified tree tells what every smaller tree and every chain of the same drafter pass would have
committed (adaptspec.decoding.tree_outcomes): checked against actually running them from the same
prefill, in both verification modes, at T = 0 and under a seed at T > 0."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import adaptspec.decoding.decoder as decoder_module
from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
from adaptspec.decoding.sampling import SampleKeys
from adaptspec.decoding.tree import build_tree
from adaptspec.decoding.tree_budget import FixedTree
from adaptspec.decoding.tree_outcomes import round_outcomes
from adaptspec.errors import AdaptspecError
from decoding_helpers import reference_greedy, tiny_target
from test_tree_decoding import TreePasses, TreePeekingDrafter

torch.set_num_threads(1)

_MODELS: dict = {}


def models(verification: str):
    if verification not in _MODELS:
        model = tiny_target("llama", seed=2)
        target = TargetModel(model, verification=verification)
        drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=16)
        _MODELS[verification] = (model, target, drafter)
    return _MODELS[verification]


def first_round_tau(decoder, pre, budget, max_new, temperature):
    return decoder.decode(pre, budget, max_new, temperature=temperature).rounds[0].tau


@pytest.mark.slow
@pytest.mark.parametrize("verification", ["fast", "exact"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(6, 95), min_size=1, max_size=12),
    nodes=st.integers(1, 20),
    top_k=st.integers(1, 4),
    depth=st.integers(1, 6),
    peek_seed=st.integers(0, 99),
    temperature=st.sampled_from([0.0, 0.0, 0.9]),
    seed=st.integers(0, 2**31),
)
def test_outcomes_are_what_running_the_smaller_trees_and_the_chains_gives(
    verification, prompt, nodes, top_k, depth, peek_seed, temperature, seed
):
    model, target, drafter = models(verification)
    if temperature == 0:
        continuation = reference_greedy(model, prompt, 24)
    else:
        continuation = (
            SpeculativeDecoder(target, drafter).generate(prompt, 1, 24, temperature, seed=seed).tokens
        )
    peek = TreePeekingDrafter(drafter, prompt + continuation, peek_seed)
    decoder = SpeculativeDecoder(target, peek)
    pre = decoder.prefill(prompt, temperature=temperature, seed=seed)
    max_new = depth + 2  # the first round drafts depth + 1 positions
    passes = TreePasses()
    with mock.patch.object(decoder_module, "verify_tree", passes):
        rounds = decoder.decode(pre, FixedTree(nodes, top_k, depth), max_new, temperature=temperature).rounds
    assume(
        rounds
    )  # an output that ends at its prefill's token (an end token drawn there) has no round to compare
    tau = rounds[0].tau
    tree, _, _, logits = passes.passes[0]
    if temperature == 0:
        choices = logits.argmax(-1).tolist()
    else:
        keys = SampleKeys(seed)
        noise = torch.stack([keys.noise(1 + d, 1, logits.shape[-1], logits.device)[0] for d in tree.depths])
        choices = (logits / temperature + noise).argmax(-1).tolist()
    out = round_outcomes(tree, choices)
    assert len(out.tree_tau) == tree.nodes + 1 and len(out.chain_tau) == depth + 1
    assert out.tree_tau[-1] == tau and out.tree(10**6) == tau
    for n in range(1, tree.nodes):
        assert out.tree(n) == first_round_tau(
            decoder, pre, FixedTree(n, top_k, depth), max_new, temperature
        ), n
    chains = SpeculativeDecoder(target, peek, draft_length=depth + 1)  # a prefix of the same drafter pass
    for b in range(1, depth + 2):
        if out.chain(b) is not None:
            assert out.chain(b) == first_round_tau(chains, pre, b, max_new, temperature), b
    assert out.chain(1) == 1 and all(t is None or t <= b for b, t in enumerate(out.chain_tau, start=1))


def test_every_chain_is_determined_by_a_tree_holding_the_rank0_path_and_none_past_a_missing_node():
    logp = torch.log_softmax(torch.tensor([[3.0, 1.0, 0.0]] * 4), -1)
    ids = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32], [40, 41, 42]])
    tree = build_tree(logp, ids, 40)
    chain_nodes = [0]
    for tok in tree.chain:
        chain_nodes.append(tree.child(chain_nodes[-1], tok))
    choices = [0] * (tree.nodes + 1)
    for node, tok in zip(chain_nodes, tree.chain):  # the target agrees with every rank-0 draft
        choices[node] = tok
    assert round_outcomes(tree, choices).chain_tau == (1, 2, 3, 4, 5)
    depth3 = chain_nodes[3]  # leave out the rank-0 node of depth 3 and every node after it
    out = round_outcomes(tree.prefix(depth3 - 1), choices[:depth3])
    assert out.chain_tau == (
        1,
        2,
        3,
        4,
        None,
    )  # depth 3's draft accepted at depth 2's node; depth 4's unknown
    choices[chain_nodes[1]] = 99  # the target rejects the second draft: every longer chain stops there
    assert round_outcomes(tree.prefix(depth3 - 1), choices[:depth3]).chain_tau == (1, 2, 2, 2, 2)


def test_smaller_trees_stop_where_the_path_leaves_them():
    logp = torch.log_softmax(torch.tensor([[2.0, 1.5], [2.0, 1.5]]), -1)
    tree = build_tree(logp, torch.tensor([[5, 6], [7, 8]]), 6)  # order: 5, 6?, 5-7, ...
    path_to = {tuple(tree.tokens[i - 1] for i in _path(tree, i)): i for i in range(1, tree.nodes + 1)}
    deep = path_to[(6, 8)]
    choices = [0] * (tree.nodes + 1)
    choices[0], choices[path_to[(6,)]], choices[deep] = 6, 8, 1
    out = round_outcomes(tree, choices)
    assert out.tree_tau == tuple(1 + (n >= path_to[(6,)]) + (n >= deep) for n in range(tree.nodes + 1))
    with pytest.raises(AdaptspecError, match="needs 7 choices, got 3"):
        round_outcomes(tree, [1, 2, 3])


def _path(tree, i):
    out = []
    while i:
        out.append(i)
        i = tree.parents[i]
    return out[::-1]
