"""Draft trees in the batching engine: each row a chain or a tree of its own budget, one target pass a
round (docs/decoding.md, "Draft trees"; docs/batching.md), tested as the decoder's trees are:

- exact verification: every row, tree or chain, whatever joined beside it and whenever, is
  bit-identical to the target's own greedy ``generate`` of its prompt alone; a tree row's rounds are
  those the decoder runs alone with the same budget and drafter (the same trees, taus and outcomes);
- fast verification: every committed token is the argmax of the engine's pass that verified it (the
  accepted path walked here, independently, from that pass's logits), that pass's logits along the
  path are those of the chain recomputed from scratch (the mask, the positions and the compacted
  cache are right), and a tree row equals the decoder's tree decoding alone but at near-ties;
- T > 0 with a seed: in exact verification a tree row samples the tokens the decoder samples alone,
  with a tree or at B = 1; in fast verification every committed token is the keyed sample of the
  engine's pass at its node;
- the KV slots: a tree row's mask and positions, and the accepted path kept as a chain, against
  their definitions written out here;
- ``adaptspec serve``'s service with a ``fixed:-8`` variant: trees through the engine end to end.
"""

from __future__ import annotations

import functools
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import adaptspec.batching.engine as engine_module
from _batching_helpers import KnowingDrafter, one_thread  # noqa: F401  (autouse: one torch thread per module)
from adaptspec.batching import BatchEngine
from adaptspec.batching.kv_slots import SlotStore
from adaptspec.decoding import BlockDiffusionDrafter, FixedTree, SpeculativeDecoder, TargetModel
from adaptspec.decoding.greedy import TIE_GAP, divergence
from adaptspec.decoding.tree import build_tree
from adaptspec.errors import AdaptspecError
from adaptspec.speculator import tree_arm
from decoding_helpers import brute_path, model_and_decoder, reference_greedy, tiny_target

exact_for = functools.cache(model_and_decoder)  # one tiny target and exact decoder per architecture


class TreeKnowingDrafter(KnowingDrafter):
    """Knows each request's continuation (recognised by its prompt, as :class:`KnowingDrafter`) and puts
    the right token at rank 0, 1, 2, 3 or nowhere among four decoys: trees then accept along paths
    that leave rank 0. The same logits for the same context and block however often asked, so the
    engine's rows and the decoder alone get the same drafts."""

    def __init__(self, base: BlockDiffusionDrafter, seed: int = 0, rank_probs=(0.5, 0.2, 0.1, 0.1, 0.1)):
        super().__init__(base, error_rate=0.0, seed=seed)
        self.rank_probs = torch.tensor(rank_probs)
        self.seed = seed

    def draft_logits(self, state, last_token, block_size):
        logits = BlockDiffusionDrafter.draft_logits(self, state, last_token, block_size)  # the real pass runs
        n, v = state.length, self.config.vocab_size
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + n * 1009 + int(last_token))
        want = state.sequence[n + 1 : n + block_size]
        logits.mul_(0.01).sub_(10.0)
        for i in range(block_size - 1):
            right = want[i] if i < len(want) else int(torch.randint(v, (1,), generator=gen))
            decoys = [t for t in torch.randperm(v, generator=gen)[:5].tolist() if t != right][:4]
            r = int(torch.multinomial(self.rank_probs, 1, generator=gen))
            order = decoys[:r] + [right] + decoys[r:] if r < 4 else decoys
            for slot, tok in enumerate(order):
                logits[i, tok] = 8.0 - 1.5 * slot
        return logits


def knowing(
    drafter: TreeKnowingDrafter, target: TargetModel, prompt: list[int], continuation: list[int]
) -> None:
    drafter.learn(target.prefill(prompt).context_hidden, prompt + continuation)


def run(engine: BatchEngine, requests: list[tuple[int, list[int], object, int]], **kw) -> dict:
    """Submit each ``(arrival round, prompt, arm, max_new_tokens)`` at its round; run until all are done."""
    handles = {}
    for rnd in range(2000):
        for i, (at, p, arm, n) in enumerate(requests):
            if at == rnd:
                handles[i] = engine.submit(p, block_size=arm, max_new_tokens=n, **kw)
        engine.step()
        if len(handles) == len(requests) and not engine.busy:
            return handles
    raise AssertionError("the engine did not finish")


ARMS = [tree_arm(8), 4, tree_arm(3), 1, FixedTree(12, top_k=3, depth=6), tree_arm(16), 2, tree_arm(1)]
PROMPTS = [
    [6, 7, 8],
    [40, 41, 42, 43],
    [70],
    [11, 12, 13, 14, 15],
    [94, 84],
    [53, 28, 79, 52],
    [21, 22, 23],
    [60, 9],
]


# ---------------------------------------------------------------------- exact verification
@pytest.mark.parametrize("chunk_tokens", [256, pytest.param(None, marks=pytest.mark.slow)])
def test_exact_rows_mixing_trees_and_chains_equal_greedy_alone(chunk_tokens):
    """Eight requests, four rows: trees of 1, 3, 8, 12 (top 3, depth 6) and 16 nodes beside chains of
    1, 2 and 4, joining at rounds 0-6 (some wait for a free row), ending at different rounds (lengths
    5-40, two at EOS). Each equals greedy decoding alone; each tree row's rounds are the decoder's."""
    model, decoder = exact_for("llama")
    drafter = TreeKnowingDrafter(decoder.drafter, seed=3)
    refs = [reference_greedy(model, p, 40) for p in PROMPTS]
    for p, ref in zip(PROMPTS, refs):
        knowing(drafter, decoder.target, p, ref)
    lengths = [40, 12, 30, 5, 40, 25, 17, 9]
    engine = BatchEngine(decoder.target, drafter, max_rows=4, token_budget=128, chunk_tokens=chunk_tokens)
    requests = [(at, p, arm, n) for at, p, arm, n in zip([0, 0, 0, 1, 2, 4, 5, 6], PROMPTS, ARMS, lengths)]
    handles = run(engine, requests)
    alone = SpeculativeDecoder(decoder.target, drafter)
    eos = tree_rounds = long_off_rank0 = 0
    for i, (_, p, arm, n) in enumerate(requests):
        out = handles[i].result()
        ref = reference_greedy(model, p, n)
        assert out.tokens == ref, (i, arm)
        eos += out.finish_reason == "eos"
        if arm in (1, 2, 4):
            assert not any(r.tree for r in out.rounds)
            continue
        mine = alone.generate(p, arm, n)
        assert [(r.block_size, r.tau, r.drafted, r.tree) for r in out.rounds] == [
            (r.block_size, r.tau, r.drafted, r.tree) for r in mine.rounds
        ]
        assert [r.tree_outcomes for r in out.rounds] == [r.tree_outcomes for r in mine.rounds]
        for r in out.rounds:
            tree_rounds += r.tree
            if r.tree:  # the controller's full information: this round's own tree is one of them
                assert r.tree_outcomes.tree(r.block_size - 1) == r.tau and r.rows >= 1
        long_off_rank0 += sum(r.tree and r.tau >= 3 for r in out.rounds)
    assert eos >= 1 and tree_rounds >= 20 and long_off_rank0 >= 5
    assert max(rec.rows for rec in engine.history) == 4


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(
        st.tuples(
            st.integers(0, 5),
            st.lists(st.integers(6, 95), min_size=1, max_size=16),
            st.sampled_from([-1, -2, -5, -8, -16, -24, 1, 2, 3, 8]),
            st.integers(1, 24),
        ),
        min_size=1,
        max_size=6,
    ),
    max_rows=st.integers(1, 4),
    budget=st.sampled_from([None, 6, 20]),
    chunk_tokens=st.sampled_from([None, 256]),
    arch=st.sampled_from(["llama", "qwen3"]),
    peek_seed=st.integers(0, 99),
)
def test_exact_rows_under_random_compositions_equal_greedy_alone(
    requests, max_rows, budget, chunk_tokens, arch, peek_seed
):
    """Arrivals, prompts, arms, lengths, row limits and token budgets (which cut the trees a round
    verifies) drawn at random: every row equals greedy decoding of its prompt alone."""
    model, decoder = exact_for(arch)
    drafter = TreeKnowingDrafter(decoder.drafter, seed=peek_seed)
    for _, p, _, n in requests:
        knowing(drafter, decoder.target, p, reference_greedy(model, p, n))
    engine = BatchEngine(
        decoder.target, drafter, max_rows=max_rows, token_budget=budget, chunk_tokens=chunk_tokens
    )
    handles = run(engine, requests)
    for i, (_, p, arm, n) in enumerate(requests):
        out = handles[i].result()
        assert out.tokens == reference_greedy(model, p, n)
        for r in out.rounds:
            assert r.tree == (arm < 0 and r.drafted > 0)
            assert r.block_size <= (-arm + 1 if arm < 0 else arm)
            cap = max(1, engine.token_budget // r.rows)
            assert r.block_size <= cap or r.block_size == 1


# ---------------------------------------------------------------------- fast verification
class Passes:
    """Records every rows pass the engine runs: the rows (handle ids), their trees, blocks and logits."""

    def __init__(self, engine: BatchEngine) -> None:
        self.engine = engine
        self.real = engine_module.verify_rows
        self.passes: list = []

    def __call__(self, target, store, blocks, context, trees=None):
        logits, hidden = self.real(target, store, blocks, context, trees=trees)
        ids = [row.handle.id for row in self.engine.rows]
        self.passes.append((ids, list(trees), blocks.clone(), logits.float().clone()))
        return logits, hidden


_FAST: dict = {}


def fast_setup():
    if not _FAST:
        model = tiny_target("llama")
        drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=16)
        _FAST["setup"] = (model, TargetModel(model, verification="fast"), drafter)
    return _FAST["setup"]


def run_fast_checked(model, target, drafter, requests, **engine_kw) -> dict:
    """``requests`` through a fast engine (one drafter pass a row), each row's drafter knowing its greedy
    continuation, every pass recorded and every row checked by :func:`check_fast_rows`; the handles."""
    engine = BatchEngine(target, drafter, chunk_tokens=None, batched_draft=False, **engine_kw)
    for _, p, _, n in requests:
        knowing(drafter, target, p, reference_greedy(model, p, n))
    passes = Passes(engine)
    with mock.patch.object(engine_module, "verify_rows", passes):
        handles = run(engine, requests)
    check_fast_rows(model, handles, requests, passes.passes)
    return handles


def check_fast_rows(model, handles: dict, requests, passes) -> None:
    """Every round of every row, from the engine's own pass: a tree row commits its accepted path (walked
    here by :func:`brute_path` from that pass's argmax) and the argmax after it, a chain row its drafts
    up to the first the argmax rejects and the argmax there; the tree's logits along the path are the
    chain's, recomputed by a full forward without a cache."""
    for i, (_, p, _, _) in enumerate(requests):
        h = handles[i]
        mine = [(k, ids.index(h.id)) for k, (ids, *_rest) in enumerate(passes) if h.id in ids]
        assert len(mine) == len(h.rounds)
        committed = [h.tokens[0]]
        for (k, row), r in zip(mine, h.rounds):
            _, trees, blocks, logits = passes[k]
            tree, n = trees[row], len(p) + len(committed) - 1
            choices = logits[row].argmax(-1).tolist()
            if tree is not None:
                path = brute_path(tree, choices)
                new = [tree.tokens[j - 1] for j in path] + [choices[path[-1] if path else 0]]
                on_path = [0, *path]
            else:
                drafts = blocks[row, 1 : r.block_size].tolist()
                a = next((j for j, d in enumerate(drafts) if d != choices[j]), len(drafts))
                new = drafts[:a] + [choices[a]]
                on_path = list(range(a + 1))
            got = h.tokens[len(committed) : len(committed) + r.tau]
            assert r.tau == len(new) and got == new[: len(got)] and r.tree == (tree is not None)
            with torch.no_grad():
                full = model(torch.tensor([p + committed + new[:-1]])).logits[0, n:].float()
            torch.testing.assert_close(logits[row, on_path], full, rtol=1e-4, atol=1e-4)
            committed += new
        assert committed[: len(h.tokens)] == h.tokens


def test_fast_rows_commit_the_argmax_of_the_pass_that_verified_them_and_trees_equal_the_decoder_alone():
    model, target, base = fast_setup()
    drafter = TreeKnowingDrafter(base, seed=5)
    lengths = [30, 12, 24, 6, 30, 20, 14, 9]
    requests = [(at, p, arm, n) for at, p, arm, n in zip([0, 0, 0, 1, 2, 3, 5, 6], PROMPTS, ARMS, lengths)]
    handles = run_fast_checked(model, target, drafter, requests, max_rows=4, token_budget=64)
    alone = SpeculativeDecoder(target, drafter)
    long_paths = 0
    for i, (_, p, arm, n) in enumerate(requests):
        out = handles[i].result()
        long_paths += sum(r.tree and r.tau >= 3 for r in out.rounds)
        if arm in (1, 2, 4):
            continue
        mine = alone.generate(p, arm, n).tokens
        d = divergence(model, p, out.tokens, mine)
        assert out.tokens == mine or (d is not None and d[1] <= TIE_GAP), (i, d)
    assert long_paths >= 5


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(
        st.tuples(
            st.integers(0, 4),
            st.lists(st.integers(6, 95), min_size=1, max_size=16),
            st.sampled_from([-1, -3, -8, -20, 1, 3, 6]),
            st.integers(1, 20),
        ),
        min_size=1,
        max_size=6,
    ),
    max_rows=st.integers(1, 4),
    budget=st.sampled_from([None, 5, 16]),
    peek_seed=st.integers(0, 99),
)
def test_fast_rows_under_random_compositions_commit_their_passes_argmax(
    requests, max_rows, budget, peek_seed
):
    model, target, base = fast_setup()
    drafter = TreeKnowingDrafter(base, seed=peek_seed)
    run_fast_checked(model, target, drafter, requests, max_rows=max_rows, token_budget=budget)


def test_fast_tree_rows_share_the_batched_drafter_pass_and_the_packed_pass():
    """The untrained drafter through the engine's one drafter pass for greedy rows and prompts riding in
    the rounds' passes in chunks: every committed token is still the argmax after its prefix."""
    model, target, drafter = fast_setup()
    requests = [
        (at, p, arm, 16)
        for at, p, arm in zip([0, 0, 1, 2, 3], PROMPTS, [tree_arm(8), 3, tree_arm(4), 1, tree_arm(16)])
    ]
    engine = BatchEngine(target, drafter, max_rows=3, chunk_tokens=2)
    handles = run(engine, requests)
    assert engine.batched_draft and any(r.tree for h in handles.values() for r in h.rounds)
    with torch.no_grad():
        for i, (_, p, _, _) in enumerate(requests):
            seq = p + handles[i].result().tokens
            logits = model(torch.tensor([seq])).logits[0].float()
            for pos in range(len(p), len(seq)):
                assert float(logits[pos - 1, seq[pos]]) >= float(logits[pos - 1].max()) - 1e-4


# ---------------------------------------------------------------------- T > 0
@pytest.mark.parametrize("arch", ["llama", pytest.param("qwen3", marks=pytest.mark.slow)])
def test_seeded_tree_rows_sample_what_the_decoder_samples_alone(arch):
    model, decoder = exact_for(arch)
    requests = [
        (0, [6, 7, 8], tree_arm(8), 24, 0.8, 11),
        (0, [40, 41], 3, 16, 1.2, 12),
        (1, [70, 71, 72], FixedTree(10, top_k=3, depth=5), 20, 1.0, 13),
        (2, [11, 12], tree_arm(2), 12, 0.0, None),
        (2, [30], tree_arm(16), 24, 1.5, 14),
    ]
    plain = [decoder.generate(p, 1, n, temperature=t, seed=s).tokens for _, p, _, n, t, s in requests]
    drafter = TreeKnowingDrafter(decoder.drafter, seed=2)
    for (_, p, *_), ref in zip(requests, plain):
        knowing(drafter, decoder.target, p, ref)
    engine = BatchEngine(decoder.target, drafter, max_rows=3)
    handles = {}
    for rnd in range(500):
        for i, (at, p, arm, n, t, s) in enumerate(requests):
            if at == rnd:
                handles[i] = engine.submit(p, block_size=arm, max_new_tokens=n, temperature=t, seed=s)
        engine.step()
        if len(handles) == len(requests) and not engine.busy:
            break
    alone = SpeculativeDecoder(decoder.target, drafter)
    for i, (_, p, arm, n, t, s) in enumerate(requests):
        out = handles[i].result()
        assert out.tokens == plain[i] == alone.generate(p, arm, n, temperature=t, seed=s).tokens
    assert max(r.tau for i in (0, 4) for r in handles[i].rounds if r.tree) >= 3


# ---------------------------------------------------------------------- KV slots
@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    nodes=st.integers(0, 9),
    seed=st.integers(0, 10**6),
    row=st.integers(0, 2),
    pad=st.integers(0, 3),
)
def test_a_tree_rows_mask_positions_and_kept_path_follow_their_definitions(lengths, nodes, seed, row, pad):
    row = row % len(lengths)
    g = torch.Generator().manual_seed(seed)
    depth, k = 4, 3
    logp = torch.log_softmax(torch.randn(depth, k, generator=g), -1).sort(-1, descending=True).values
    ids = torch.stack([torch.randperm(50, generator=g)[:k] for _ in range(depth)])
    tree = build_tree(logp, ids, max(1, nodes)).prefix(nodes)
    width = tree.nodes + 1 + pad
    store = SlotStore(num_layers=1, max_rows=3, kv_heads=1, head_dim=1, capacity=4)
    for i, n in enumerate(lengths):
        store.load(i, [(torch.full((1, 1, n, 1), -1.0), torch.full((1, 1, n, 1), -1.0))])
    trees = [tree if i == row else None for i in range(len(lengths))]
    cache = store.pass_cache(width, trees)
    mask = cache.attention_mask()[:, 0]
    for i, n in enumerate(lengths):
        for q in range(width):
            if i != row:  # a chain row: its committed keys and its block up to q
                sees, pos = set(range(n + q + 1)), n + q
            elif q <= tree.nodes:  # q and its ancestors, by the parents
                chain, a = set(), q
                while a >= 0:
                    chain.add(n + a)
                    a = tree.parents[a]
                sees, pos = set(range(n)) | chain, n + tree.depths[q]
            else:  # padding: the root and itself
                sees, pos = set(range(n)) | {n, n + q}, n
            assert set(torch.nonzero(mask[i, q])[:, 0].tolist()) == sees
            assert int(cache.positions[i, q]) == pos
    # the pass writes position j of each row as the value 100 * row + j; the row keeps the root and a path
    written = (100 * torch.arange(len(lengths))[:, None] + torch.arange(width)).float()[:, None, :, None]
    cache.update(written, written, 0)
    leaves = [b for b in range(tree.nodes + 1) if b not in tree.parents]
    leaf = leaves[seed % len(leaves)]
    path = []
    while leaf > 0:
        path.insert(0, leaf)
        leaf = tree.parents[leaf]
    path = path[: seed % (len(path) + 1)]
    kept = [1 + len(path) if i == row else 1 for i in range(len(lengths))]
    store.keep_path(row, path)
    store.commit(kept)
    for i, n in enumerate(lengths):
        got = store.layers(i)[0][0][0, 0, :, 0].tolist()
        want = [-1.0] * n + [100.0 * i] + ([100.0 * i + b for b in path] if i == row else [])
        assert got == want


# ---------------------------------------------------------------------- refusals
def test_trees_are_refused_where_the_engine_cannot_run_them():
    model, decoder = exact_for("llama")
    plain = BatchEngine(decoder.target, None, max_rows=2)
    assert not plain.draft_trees
    with pytest.raises(AdaptspecError, match="draft trees need a drafter .* this engine has no drafter"):
        plain.submit([6, 7], block_size=tree_arm(4))
    engine = BatchEngine(decoder.target, decoder.drafter, max_rows=2)
    assert engine.draft_trees
    with pytest.raises(AdaptspecError, match="at most 256 nodes"):
        engine.submit([6, 7], block_size=tree_arm(300))
    h = plain.submit(
        [6, 7], block_size=lambda features: tree_arm(4), max_new_tokens=4
    )  # a chooser's tree: refused at join
    plain.run_until_done()
    with pytest.raises(AdaptspecError, match="draft trees need a drafter"):
        h.result()
    other = tiny_target("llama")
    other.set_attn_implementation("eager")  # adds a float mask: the engine's boolean one cannot run a tree
    eager = BatchEngine(
        TargetModel(other, verification="fast"),
        BlockDiffusionDrafter.for_target(other, num_layers=1, seed=0),
        max_rows=2,
        chunk_tokens=None,
    )
    with pytest.raises(AdaptspecError, match="this engine has 'eager' attention"):
        eager.submit([6, 7], block_size=tree_arm(4))


# ---------------------------------------------------------------------- serving
def test_serve_runs_a_fixed_tree_variant_through_the_engine(tmp_path):
    """``adaptspec serve``'s service (the batched engine, exact verification) with a ``fixed:-8`` variant
    beside a chain one: every completion equals the tiny target's greedy decoding alone, the tree
    variant's rounds were trees and its decisions are logged as the arm -8 with their rewards."""
    from fastapi.testclient import TestClient

    from adaptspec.serving import CompletionService, ServerLimits
    from adaptspec.serving.app import create_app
    from adaptspec.serving.codec import CharCodec
    from adaptspec.serving.engine.batched import EngineSettings
    from adaptspec.serving.tiny import tiny_model, tiny_speculator
    from adaptspec.traces.log_writer import log_rows

    codec = CharCodec()
    spec, _ = tiny_speculator(0, verification="exact")
    svc = CompletionService.build(
        spec,
        {"T": "fixed:-8", "C": "fixed:4", "F": "fi-ucb"},
        codec=codec,
        log_dir=tmp_path / "log",
        limits=ServerLimits(max_context=512, vocab_size=128, max_tokens=400),
        arms=[1, 2, 4, tree_arm(8)],
        engine=EngineSettings(max_rows=3, max_queue=8),
        latency="cpu-smollm2-fast",
    )
    model = tiny_model(0)
    prompts = ["Hello there", "def f(x):", "Once upon a time", "The quick brown fox", "Hello there"]
    with TestClient(create_app(svc)) as client:
        got = []
        for i, prompt in enumerate(prompts):
            variant = "TCTCF"[i]
            r = client.post(
                "/v1/completions",
                json={"prompt": prompt, "max_tokens": 24, "user": f"u{i}"},
                headers={"X-Adaptspec-Variant": variant},
            )
            assert r.status_code == 200, r.text
            got.append((prompt, r.json()["choices"][0]["token_ids"], r.json()["adaptspec"]))
        history = list(svc.runner.loop.engine.history)
    for prompt, ids, info in got:
        p = codec.encode(prompt)
        assert (
            ids == model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=24)[0, len(p) :].tolist()
        )
    assert [info["block_size"] for _, _, info in got] == [
        -8,
        4,
        -8,
        4,
        -8,
    ]  # fi-ucb starts from the largest tree
    assert any(w > 4 for rec in history for w in rec.block_sizes)  # tree rows verified up to 9 positions
    rows = {r["decision_id"]: r for r in log_rows(tmp_path / "log")}
    for _, _, info in got:
        assert rows[info["decision_id"]]["block_size"] == info["block_size"]
        assert (rows[info["decision_id"]]["reward"] is None) == (
            info["rounds"] == 0
        )  # no reward: ended at its first token
    assert all(info["rounds"] > 0 for _, _, info in got if info["block_size"] == -8)
    # full information from the engine's tree rounds: every arm observed, the tree and plain steps uncensored
    fi = rows[got[-1][2]["decision_id"]]
    assert fi["arms"] == [-8, 1, 2, 4] and fi["cf_censored"][:2] == [False, False]
    assert all(r is not None for r in fi["cf_rewards"]) and fi["cf_rewards"][0] == pytest.approx(fi["reward"])


# ---------------------------------------------------------------------- the exact kernel
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_exact_kernel_computes_every_tree_node_bit_for_bit_as_the_chain_of_its_path(arch):
    """One tree pass after a prompt, against one chain pass per leaf (``[last, the leaf's path]``):
    each node's logits and hidden states are the chain's at its depth, bit for bit."""
    import copy

    from adaptspec.decoding.tree_verify import verify_tree

    model, decoder = exact_for(arch)
    target = decoder.target
    g = torch.Generator().manual_seed(7)
    logp = torch.log_softmax(torch.randn(5, 3, generator=g), -1).sort(-1, descending=True).values
    tree = build_tree(logp, torch.stack([torch.randperm(90, generator=g)[:3] + 6 for _ in range(5)]), 14)
    pre = target.prefill(torch.tensor([9, 31, 44, 17, 60, 2, 75]))
    n, last = 7, 33
    logits, hidden = verify_tree(target, tree, last, n, copy.deepcopy(pre.cache))
    for leaf in (b for b in range(1, tree.nodes + 1) if b not in tree.parents):
        path, b = [], leaf
        while b > 0:
            path.insert(0, b)
            b = tree.parents[b]
        chain_logits, chain_hidden = target.verify(
            torch.tensor([last, *(tree.tokens[i - 1] for i in path)]), copy.deepcopy(pre.cache)
        )
        assert torch.equal(logits[[0, *path]], chain_logits)
        assert torch.equal(hidden[[0, *path]], chain_hidden)


def test_a_load_rule_sets_chains_only_and_learns_from_them_only():
    """A per-round rule asking B = 1 of every row: the chain rows run plain steps, the tree row its
    tree; the rule's feedback holds the chain rows' rounds alone (the tree row ran no size it asked)."""
    from adaptspec.load_rules.round_rule import RoundRule

    class AskOne:
        name = "ask-one"

        def __init__(self):
            self.fed = []

        def choose(self, views, load):
            return [1] * len(views)

        def feedback(self, views, block_sizes, taus, attributed_s, load):
            self.fed.append((list(block_sizes), list(taus), load.rows))

    model, decoder = exact_for("llama")
    drafter = TreeKnowingDrafter(decoder.drafter, seed=1)
    prompts = [[6, 7, 8], [40, 41, 42, 43], [70, 71]]
    for p in prompts:
        knowing(drafter, decoder.target, p, reference_greedy(model, p, 20))
    engine = BatchEngine(decoder.target, drafter, max_rows=3)
    rule = RoundRule(AskOne(), lambda: 0)
    engine.round_block_sizes = rule.choose
    handles = [
        engine.submit(p, block_size=b, max_new_tokens=20) for p, b in zip(prompts, [4, tree_arm(8), 2])
    ]
    by_id = {h.id: h for h in handles}
    while engine.busy:
        record = engine.step()
        if record is not None:
            rule.feedback(record, [0.01] * len(record.taus), [by_id[i] for i in record.requests])
    for p, h in zip(prompts, handles):
        assert h.result().tokens == reference_greedy(model, p, 20)
    assert all(r.block_size == 1 for h in (handles[0], handles[2]) for r in h.rounds)
    assert sum(r.tree for r in handles[1].rounds) >= 3 and max(r.tau for r in handles[1].rounds) >= 3
    chain_rounds = len(handles[0].rounds) + len(handles[2].rounds)
    assert sum(len(b) for b, _, _ in rule.rule.fed) == chain_rounds  # the tree row's rounds left out
    assert all(b == [1] * len(b) and t == [1] * len(t) for b, t, _ in rule.rule.fed)


@pytest.mark.slow
def test_fast_sampled_tree_rows_commit_the_keyed_samples_of_the_pass_that_verified_them():
    """T > 0 in fast verification: every round of a tree row commits its accepted path and the sample
    after it, walked here from the engine's own pass with the row's keyed noise at each node's output
    position (decoding/sampling.py), beside a greedy chain row."""
    from adaptspec.decoding.sampling import SampleKeys

    model, target, base = fast_setup()
    drafter = TreeKnowingDrafter(base, seed=4)
    engine = BatchEngine(target, drafter, max_rows=3, chunk_tokens=None, batched_draft=False)
    requests = [
        ([6, 7, 8], tree_arm(8), 0.8, 3),
        ([40, 41, 42], 3, 0.0, None),
        ([70], FixedTree(10, top_k=3, depth=5), 1.2, 9),
    ]
    alone = SpeculativeDecoder(target, base)
    for p, _, t, s in requests:  # the drafter knows each sampled continuation: long paths accepted
        knowing(
            drafter,
            target,
            p,
            alone.generate(p, 1, 24, temperature=t, seed=s).tokens if t else reference_greedy(model, p, 24),
        )
    passes = Passes(engine)
    with mock.patch.object(engine_module, "verify_rows", passes):
        handles = [
            engine.submit(p, block_size=a, max_new_tokens=24, temperature=t, seed=s)
            for p, a, t, s in requests
        ]
        engine.run_until_done()
    long_paths = 0
    for (p, arm, t, s), h in zip(requests, handles):
        if t == 0:
            continue
        keys = SampleKeys(s)
        mine = [(k, ids.index(h.id)) for k, (ids, *_rest) in enumerate(passes.passes) if h.id in ids]
        committed = [h.tokens[0]]
        for (k, row), r in zip(mine, h.rounds):
            _, trees, _, logits = passes.passes[k]
            tree, pos = trees[row], len(committed)
            if tree is None:  # the last token's plain step
                noise = keys.noise(pos, 1, logits.shape[-1], logits.device)[0]
                new = [int((logits[row, 0] / t + noise).argmax())]
            else:
                noise = torch.stack(
                    [keys.noise(pos + d, 1, logits.shape[-1], logits.device)[0] for d in tree.depths]
                )
                choices = (logits[row, : tree.nodes + 1] / t + noise).argmax(-1).tolist()
                path = brute_path(tree, choices)
                new = [tree.tokens[j - 1] for j in path] + [choices[path[-1] if path else 0]]
                long_paths += len(new) >= 3
            assert h.tokens[pos : pos + r.tau] == new[: len(h.tokens) - pos] and r.tau == len(new)
            committed += new
        assert committed[: len(h.tokens)] == h.tokens
    assert long_paths >= 3
