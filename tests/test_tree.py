"""Draft trees' parts against brute force: the best-first tree against every path enumerated, the
walk and the ancestor mask against the parents, the kept cache against a chain's, CaDDTree's
budget against the argmax of its ratio."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from adaptspec.decoding import TargetModel
from adaptspec.decoding.tree import DraftTree, build_tree, top_candidates
from adaptspec.decoding.tree_budget import DEFAULT_DEPTH, CostAwareTree, FixedTree
from adaptspec.decoding.tree_verify import keep_path, verify_tree
from adaptspec.errors import AdaptspecError
from decoding_helpers import ARCHS, tiny_target

torch.set_num_threads(1)


@st.composite
def candidates(draw, max_depth=4, max_k=4, ties=False):
    """Per-depth top-k log-probabilities (each row sorted, largest first) and distinct ids."""
    depth = draw(st.integers(1, max_depth))
    k = draw(st.integers(1, max_k))
    if ties:
        lp = np.full((depth, k), -np.log(k))
    else:
        cells = draw(st.lists(st.floats(-6.0, 0.0, allow_nan=False), min_size=depth * k, max_size=depth * k))
        lp = -np.sort(-np.array(cells).reshape(depth, k), axis=1)
    ids = [draw(st.permutations(range(40)))[:k] for _ in range(depth)]
    return torch.tensor(lp, dtype=torch.float64), torch.tensor(ids)


def every_path(lp: np.ndarray) -> dict[tuple[int, ...], float]:
    """Every rank path (r_1 .. r_d), d = 1..D, and its score, enumerated."""
    depth, k = lp.shape
    return {
        ranks: float(sum(lp[i, r] for i, r in enumerate(ranks)))
        for d in range(1, depth + 1)
        for ranks in itertools.product(range(k), repeat=d)
    }


def rank_path(tree: DraftTree, ids: np.ndarray, node: int) -> tuple[int, ...]:
    """Node ``node``'s (block index) path as ranks, read back through the parents."""
    out = []
    while node:
        out.append(int(np.flatnonzero(ids[tree.depths[node] - 1] == tree.tokens[node - 1])[0]))
        node = tree.parents[node]
    return tuple(reversed(out))


@settings(max_examples=150, deadline=None)
@given(cands=st.one_of(candidates(), candidates(ties=True)), nodes=st.integers(1, 90))
def test_build_tree_is_the_best_prefix_closed_set_of_paths(cands, nodes):
    lp, ids = cands
    tree = build_tree(lp, ids, nodes)
    paths = every_path(lp.numpy())
    assert tree.nodes == min(nodes, len(paths))
    assert tree.chain == ids[:, 0].tolist()
    assert (
        len(tree.parents) == len(tree.depths) == tree.nodes + 1
        and tree.parents[0] == -1
        and tree.depths[0] == 0
    )
    got = [rank_path(tree, ids.numpy(), i) for i in range(1, tree.nodes + 1)]
    assert len(set(got)) == tree.nodes  # distinct paths
    for i, ranks in enumerate(got, start=1):
        assert tree.parents[i] < i  # parents first: every prefix of the order is closed
        assert tree.depths[i] == len(ranks) == tree.depths[tree.parents[i]] + 1
        assert ranks[:-1] in got[: i - 1] or len(ranks) == 1  # prefix-closed
        assert tree.log_mass[i - 1] == pytest.approx(paths[ranks], abs=1e-9)
    assert all(a >= b - 1e-12 for a, b in zip(tree.log_mass, tree.log_mass[1:]))  # best-first
    best = sorted(paths.values(), reverse=True)[: tree.nodes]
    np.testing.assert_allclose(
        sorted(tree.log_mass, reverse=True), best, atol=1e-9
    )  # the N best (ties: any of them)
    for n in range(tree.nodes + 1):
        sub = tree.prefix(n)
        assert (
            sub.tokens == tree.tokens[:n] and sub.parents == tree.parents[: n + 1] and sub.chain == tree.chain
        )


def brute_walk(tree: DraftTree, choices: list[int]) -> list[int]:
    """The deepest node whose every token was the target's choice at its parent, and its ancestors."""

    def accepted(i: int) -> bool:
        while i:
            if tree.tokens[i - 1] != choices[tree.parents[i]]:
                return False
            i = tree.parents[i]
        return True

    ok = [i for i in range(1, tree.nodes + 1) if accepted(i)]
    if not ok:
        return []
    deepest = max(ok, key=lambda i: tree.depths[i])
    assert sum(tree.depths[i] == tree.depths[deepest] for i in ok) == 1  # siblings hold distinct tokens
    path = []
    while deepest:
        path.append(deepest)
        deepest = tree.parents[deepest]
    return path[::-1]


@settings(max_examples=150, deadline=None)
@given(cands=candidates(max_depth=5, max_k=3), nodes=st.integers(0, 60), data=st.data())
def test_walk_follows_the_targets_choices_as_far_as_the_tree_holds_them(cands, nodes, data):
    lp, ids = cands
    tree = build_tree(lp, ids, max(nodes, 1)).prefix(nodes)
    choices = []
    for i in range(tree.nodes + 1):  # mostly a child's token, so walks go deep
        kids = [tree.tokens[j - 1] for j in range(1, tree.nodes + 1) if tree.parents[j] == i]
        pool = kids + [data.draw(st.integers(0, 45))]
        choices.append(data.draw(st.sampled_from(pool)))
    assert tree.walk(choices) == brute_walk(tree, choices)


@settings(max_examples=60, deadline=None)
@given(cands=candidates(max_depth=5, max_k=3), nodes=st.integers(0, 60))
def test_ancestor_mask_is_each_rows_parent_chain(cands, nodes):
    lp, ids = cands
    tree = build_tree(lp, ids, max(nodes, 1)).prefix(nodes)
    anc = tree.ancestors().numpy()
    for i in range(tree.nodes + 1):
        chain, j = set(), i
        while j >= 0:
            chain.add(j)
            j = tree.parents[j]
        assert set(np.flatnonzero(anc[i])) == chain


def test_top_candidates_are_sorted_and_capped_by_the_vocabulary():
    lp = torch.log_softmax(torch.randn(3, 5), -1)
    values, idx = top_candidates(lp, 9)
    assert values.shape == idx.shape == (3, 5)
    assert (values[:, :-1] >= values[:, 1:]).all() and torch.equal(lp.gather(1, idx), values)


def test_bad_candidates_and_sizes_are_refused():
    lp, ids = torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(AdaptspecError, match="must be \\[depth, k\\] alike"):
        build_tree(lp, ids[:1], 4)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(AdaptspecError, match="number of nodes >= 1"):
            build_tree(lp, ids, bad)


# ---------------------------------------------------------------------- the kept cache
def _eager(model):
    model.set_attn_implementation("eager")
    return model


@pytest.mark.parametrize(
    "arch, attention", [(a, "sdpa") for a in ARCHS] + [("llama", "eager"), ("qwen3", "exact")]
)
def test_keep_path_leaves_the_cache_a_chain_of_the_path_would(arch, attention):
    """The tree pass's logits along a path are the chain's, and the cache kept is the chain's:
    with the model's sdpa and eager kernels, and with exact verification's row-wise kernel."""
    model = tiny_target(arch)
    if attention == "eager":
        _eager(model)
    target = TargetModel(model, verification="exact" if attention == "exact" else "fast")
    prompt = [12, 13, 14, 15, 16, 17, 18]
    gen = torch.Generator().manual_seed(3)
    lp = (
        torch.log_softmax(torch.randn(4, 3, generator=gen, dtype=torch.float64), -1)
        .sort(-1, descending=True)
        .values
    )
    ids = torch.stack([torch.randperm(90, generator=gen)[:3] + 6 for _ in range(4)])
    tree = build_tree(lp, ids, 14)
    n, last = len(prompt), 40
    deepest = max(range(tree.nodes + 1), key=lambda i: tree.depths[i])
    for node in sorted({0, 1, 2, 5, 9, deepest}):  # the paths to these nodes in turn
        path = []
        j = node
        while j:
            path.append(j)
            j = tree.parents[j]
        path.reverse()
        cache = target.prefill(prompt).cache
        tree_logits, _ = verify_tree(target, tree, last, n, cache)
        keep_path(cache, n, path)
        chain = target.prefill(prompt).cache
        chain_logits, _ = target.verify(torch.tensor([last, *(tree.tokens[i - 1] for i in path)]), chain)
        assert cache.get_seq_length() == chain.get_seq_length() == n + 1 + len(path)
        for a, b in zip(cache.layers, chain.layers):
            torch.testing.assert_close(a.keys, b.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(a.values, b.values, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(tree_logits[[0, *path]], chain_logits, rtol=1e-4, atol=1e-4)
        nxt = torch.tensor([int(tree_logits[path[-1] if path else 0].argmax())])
        torch.testing.assert_close(
            target.verify(nxt, cache)[0], target.verify(nxt, chain)[0], rtol=1e-4, atol=1e-4
        )


# ---------------------------------------------------------------------- budgets
def brute_best(masses: list[float], cost) -> int:
    """argmax over m of (1 + the first m masses) / cost(m), the first of equal maxima, by a loop."""
    best, arg = -1.0, -1
    for m in range(len(masses) + 1):
        r = (1.0 + sum(masses[:m])) / cost(m)
        if r > best * (1 + 1e-12):
            best, arg = r, m
    return arg


def grow_while_rising(masses: list[float], cost) -> int:
    """CaDDTree's stop: add a node while the ratio still rises."""
    m = 0
    while m < len(masses) and (1 + sum(masses[: m + 1])) / cost(m + 1) > (1 + sum(masses[:m])) / cost(m):
        m += 1
    return m


@settings(max_examples=200, deadline=None)
@given(
    masses=st.lists(st.floats(1e-4, 1.0), min_size=0, max_size=40),
    a=st.floats(0.05, 5.0),
    b=st.floats(0.0, 1.0),
    c=st.floats(0.0, 0.05),
    max_nodes=st.integers(1, 48),
)
def test_cost_aware_budget_is_the_argmax_of_its_ratio_under_convex_costs(masses, a, b, c, max_nodes):
    masses = sorted(masses, reverse=True)  # best-first: path masses never rise
    cost = lambda m: a + b * m + c * m * m  # noqa: E731  convex, rising
    rule = CostAwareTree(cost, max_nodes=max_nodes)
    got = rule.nodes(np.log(masses))
    usable = masses[:max_nodes]
    assert got == brute_best(usable, cost) == grow_while_rising(usable, cost)


def test_cost_aware_budget_does_not_stop_at_a_local_maximum_of_a_measured_curve():
    costs = [1.0, 1.6, 1.6, 1.6, 1.6]  # a flat piece after a step, as a fitted CPU curve has
    rule = CostAwareTree(lambda m: costs[m], max_nodes=4)
    masses = [0.5, 0.5, 0.5, 0.5]
    assert grow_while_rising(masses, lambda m: costs[m]) == 0
    assert rule.nodes(np.log(masses)) == brute_best(masses, lambda m: costs[m]) == 4


def test_cost_aware_budget_priced_by_a_profile_pays_the_draft_every_round():
    from adaptspec.costs.latency import CostCurve, LatencyProfile

    profile = LatencyProfile(
        "t", draft=CostCurve((2, 16), (0.004, 0.006)), verify=CostCurve((1, 65), (0.05, 0.114))
    )
    rule = CostAwareTree.from_profile(profile, max_nodes=32, depth=7)
    for m in (0, 1, 31):  # draft of 8 positions: 0.004 + 0.002 * 6 / 14; verify of m + 1: 0.05 + 0.001 * m
        assert rule.costs[m] == pytest.approx(0.004 + 0.002 * 6 / 14 + 0.05 + 0.001 * m)
    assert CostAwareTree.from_profile(profile, max_nodes=4).costs[0] == pytest.approx(
        0.006 + 0.05
    )  # depth 15: 16 drafted
    assert DEFAULT_DEPTH == 15


def test_fixed_budget_and_bad_budgets():
    assert FixedTree(8).nodes(np.zeros(20)) == 8 and FixedTree(8).nodes(np.zeros(3)) == 3
    assert FixedTree(8).top_k == 8 and FixedTree(64).top_k == 16 and FixedTree(64, top_k=4).top_k == 4
    assert str(FixedTree(32)) == "tree:32"
    for kw in (
        {"max_nodes": 0},
        {"max_nodes": True},
        {"max_nodes": 4, "top_k": -2},
        {"max_nodes": 4, "depth": 0},
        {"max_nodes": 4.0},
    ):
        with pytest.raises(AdaptspecError, match="a draft tree's"):
            FixedTree(**kw)
    with pytest.raises(AdaptspecError, match="finite and > 0"):
        CostAwareTree(lambda m: 0.0 if m else 1.0, max_nodes=3)
    with pytest.raises(AdaptspecError, match="finite and > 0"):
        CostAwareTree(lambda m: float("nan"), max_nodes=3)


def test_a_tree_round_may_verify_more_positions_than_it_drafted_but_never_commit_deeper():
    from adaptspec.speculator import Round

    r = Round(
        block_size=33, tau=4, draft_s=0.0, verify_s=0.0, drafted=16, tree=True
    )  # 32 nodes of depth <= 15
    assert r.draft_size == 16 and r.tree
    with pytest.raises(ValueError, match="smaller than the verified block_size"):
        Round(block_size=33, tau=4, draft_s=0.0, verify_s=0.0, drafted=16)  # a chain cannot
    with pytest.raises(ValueError, match="deeper than a tree drafted at 4 positions"):
        Round(block_size=9, tau=5, draft_s=0.0, verify_s=0.0, drafted=4, tree=True)
    assert not Round(block_size=4, tau=2, draft_s=0.0, verify_s=0.0).tree  # chains as before
