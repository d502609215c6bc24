"""The batching engine: KV slots, fast-mode argmax, exact sampling distribution, failing rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from _batching_helpers import KnowingDrafter, one_thread  # noqa: F401  (autouse: one torch thread per module)
from adaptspec.batching import BatchEngine
from adaptspec.batching.kv_slots import SlotStore
from adaptspec.decoding import BlockDiffusionDrafter, TargetModel
from adaptspec.errors import AdaptspecError
from decoding_helpers import chi_square_p, tiny_target

# ---------------------------------------------------------------------- KV slots
_op = st.one_of(
    st.tuples(st.just("join"), st.integers(1, 9)),
    st.tuples(st.just("pass"), st.integers(1, 5), st.integers(0, 2**16)),
    st.tuples(st.just("leave"), st.integers(0, 9)),
)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(_op, max_size=25))
def test_slot_store_matches_a_list_per_row(ops):
    """Joins, passes with per-row commits and leaves (with slot compaction and capacity growth):
    every row's keys equal a plain per-row list kept beside it."""
    store = SlotStore(num_layers=2, max_rows=4, kv_heads=2, head_dim=3, capacity=4, dtype=torch.float64)
    rows: list[list[torch.Tensor]] = []  # reference: per row, one [2 layers, kv, head_dim] tensor a position
    counter = [0.0]

    def fresh(*shape):
        counter[0] += 1
        return torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape) + 1000 * counter[0]

    for op in ops:
        if op[0] == "join" and store.rows < 4:
            kv = [(fresh(1, 2, op[1], 3), fresh(1, 2, op[1], 3)) for _ in range(2)]
            store.load(store.rows, kv)
            rows.append([torch.stack([kv[layer][0][0, :, t] for layer in range(2)]) for t in range(op[1])])
        elif op[0] == "pass" and store.rows:
            width, g = op[1], torch.Generator().manual_seed(op[2])
            cache = store.pass_cache(width)
            new = [fresh(store.rows, 2, width, 3) for _ in range(2)]
            for layer in range(2):
                k, v = cache.update(new[layer], new[layer] * -1, layer)
                assert k.shape[2] == max(store.lengths) + width
            kept = torch.randint(1, width + 1, (store.rows,), generator=g).tolist()
            for i, keep in enumerate(kept):
                rows[i] += [torch.stack([new[layer][i, :, t] for layer in range(2)]) for t in range(keep)]
            store.commit(kept)
        elif op[0] == "leave" and store.rows:
            i = op[1] % store.rows
            store.remove(i)
            rows[i] = rows[-1]
            rows.pop()
        assert store.lengths == [len(r) for r in rows]
        for i, r in enumerate(rows):
            if r:
                want = torch.stack(r, dim=2)  # [layers, kv, n, dim]
                got = torch.stack([store.keys[layer][i, :, : len(r)] for layer in range(2)])
                assert torch.equal(got, want)


# ---------------------------------------------------------------------- fast mode
def test_fast_mode_commits_the_argmax_of_the_target():
    """Fast verification: every committed token is the target's argmax after its prefix, recomputed
    independently (one causal pass over prompt + output, batch 1), to within rounding."""
    model = tiny_target("llama", vocab=96, eos=5)
    target = TargetModel(model, verification="fast")
    base = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8)
    drafter = KnowingDrafter(base, error_rate=0.3)
    engine = BatchEngine(target, drafter, max_rows=5, batched_draft=False)  # KnowingDrafter drafts row by row
    g = torch.Generator().manual_seed(3)
    handles = []
    for b in (1, 2, 3, 4, 6, 8, 5):
        p = torch.randint(96, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g).tolist()
        ref = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=24)[0, len(p) :].tolist()
        drafter.learn(target.prefill(p).context_hidden, p + ref)
        handles.append((p, engine.submit(p, block_size=b, max_new_tokens=24)))
        engine.step()
    engine.run_until_done()
    assert sum(r.tau - 1 for _, h in handles for r in h.rounds) > 20  # drafts were accepted
    checked = 0
    with torch.no_grad():
        for p, h in handles:
            seq = p + h.result().tokens
            logits = model(torch.tensor([seq])).logits[0].float()
            for pos in range(len(p), len(seq)):
                chosen, row = seq[pos], logits[pos - 1]
                assert float(row[chosen]) >= float(row.max()) - 1e-4, (pos, chosen, int(row.argmax()))
                checked += 1
    assert checked == sum(len(h.tokens) for _, h in handles)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(
        st.tuples(st.integers(1, 30), st.integers(2, 8), st.integers(0, 95)), min_size=1, max_size=5
    )
)
def test_one_drafter_pass_drafts_what_each_row_drafts_alone(rows):
    """The batched drafter pass: each row's logits equal its own single-row pass (to rounding)."""
    from adaptspec.batching.draft_pass import draft_logits_rows

    model = tiny_target("llama", vocab=96)
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=2, seed=0, max_block_size=8)
    g = torch.Generator().manual_seed(len(rows))
    states = [drafter.new_state(torch.randn(n, drafter.context_width, generator=g)) for n, _, _ in rows]
    for s in states[::2]:  # some rows with projected context and a queue of new positions
        drafter.draft_logits(s, 1, 2)
        s.append(torch.randn(2, drafter.context_width, generator=g))
    batched = draft_logits_rows(drafter, states, [t for _, _, t in rows], [b for _, b, _ in rows])
    for s, (_, b, t), got in zip(states, rows, batched):
        want = drafter.draft_logits(s, t, b)
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_fast_engine_with_one_drafter_pass_matches_row_by_row_drafting():
    model = tiny_target("llama", vocab=96, eos=5)
    target = TargetModel(model, verification="fast")
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8)
    outs = []
    for together in (True, False):
        engine = BatchEngine(target, drafter, max_rows=4, batched_draft=together)
        hs = [
            engine.submit([i + 1, 7, i * 3], block_size=b, max_new_tokens=16)
            for i, b in enumerate((2, 8, 1, 4, 6))
        ]
        engine.run_until_done()
        outs.append([(h.result().tokens, [r.tau for r in h.rounds]) for h in hs])
    assert outs[0] == outs[1]


_FAST = {}


def _fast_setup():
    if not _FAST:
        model = tiny_target("llama", vocab=96, eos=5)
        base = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8)
        _FAST.update(model=model, target=TargetModel(model, verification="fast"), base=base)
    return _FAST["model"], _FAST["target"], _FAST["base"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(
        st.tuples(
            st.integers(0, 4),
            st.lists(st.integers(0, 95), min_size=1, max_size=30),
            st.integers(1, 8),
            st.integers(1, 16),
        ),
        min_size=1,
        max_size=6,
    ),
    max_rows=st.integers(1, 4),
    budget=st.sampled_from([None, 4, 9]),
    chunk_tokens=st.sampled_from([None, 1, 5, 16]),
)
def test_fast_mode_argmax_under_random_compositions(requests, max_rows, budget, chunk_tokens):
    """Arrivals, prompts, blocks, lengths, row limits, budgets and prompt chunks drawn at random:
    every committed token (the first one too, from the prompt's last chunk) is the target's argmax
    after its prefix (recomputed in one causal pass, batch 1)."""
    model, target, base = _fast_setup()
    drafter = KnowingDrafter(base, error_rate=0.3)
    engine = BatchEngine(
        target,
        drafter,
        max_rows=max_rows,
        token_budget=budget,
        batched_draft=False,
        chunk_tokens=chunk_tokens,
    )
    handles = {}
    for rnd in range(300):
        for i, (at, p, b, n) in enumerate(requests):
            if at == rnd:
                ref = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=n)[
                    0, len(p) :
                ].tolist()
                drafter.learn(target.prefill(p).context_hidden, p + ref)
                handles[i] = (p, engine.submit(p, block_size=b, max_new_tokens=n))
        engine.step()
        if len(handles) == len(requests) and not engine.busy:
            break
    with torch.no_grad():
        for p, h in handles.values():
            seq = p + h.result().tokens
            logits = model(torch.tensor([seq])).logits[0].float()
            for pos in range(len(p), len(seq)):
                assert float(logits[pos - 1, seq[pos]]) >= float(logits[pos - 1].max()) - 1e-4


# ---------------------------------------------------------------------- sampling
@pytest.mark.slow
def test_sampling_is_exact_in_distribution():
    """T > 0, block 3 (cut to 2 by max_new_tokens), batched with others: the joint law of the
    2nd and 3rd new tokens (speculated: drafted and accepted, resampled, or a bonus) matches the
    target's, computed in closed form from its softmax; chi-square over the 64 cells."""
    vocab, temp, n = 8, 1.5, 3000
    model = tiny_target("llama", vocab=vocab, eos=None, seed=2)
    target = TargetModel(model, verification="fast")
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=1, max_block_size=4)
    prompt = [1, 4, 2]
    with torch.no_grad():

        def probs(seq):
            return torch.softmax(model(torch.tensor([seq])).logits[0, -1].double() / temp, -1)

        p1 = probs(prompt)
        joint = torch.zeros(vocab, vocab, dtype=torch.float64)  # (t2, t3) marginalised over t1
        for t1 in range(vocab):
            p2 = probs(prompt + [t1])
            for t2 in range(vocab):
                joint[t2] += p1[t1] * p2[t2] * probs(prompt + [t1, t2])
    engine = BatchEngine(target, drafter, max_rows=16)
    handles = []
    for seed in range(n):
        handles.append(engine.submit(prompt, block_size=3, max_new_tokens=3, temperature=temp, seed=seed))
        if seed % 7 == 0:  # other rows: greedy and sampled, other prompts and blocks
            engine.submit(
                [3, seed % vocab], block_size=4, max_new_tokens=5, temperature=0.0 if seed % 2 else 0.8
            )
    engine.run_until_done()
    counts = np.zeros((vocab, vocab))
    for h in handles:
        t = h.result().tokens
        counts[t[1], t[2]] += 1
    rounds = [r for h in handles for r in h.rounds]
    assert any(r.block_size == 2 and r.tau == 2 for r in rounds) and any(
        r.block_size == 2 and r.tau == 1 for r in rounds
    )
    assert chi_square_p(counts, joint.numpy()) > 1e-3  # rare cells pooled only where there are some


def test_seeded_rows_repeat_whatever_the_batch():
    """Exact mode: a sampled request's tokens depend on its seed (another seed gives others), not
    on how many rows it is batched with."""
    model = tiny_target("llama", vocab=96, eos=None)
    target = TargetModel(model, verification="exact")
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8)
    outs = []
    for others in (0, 1, 3):
        engine = BatchEngine(target, drafter, max_rows=4)
        for k in range(others):
            engine.submit([7, k, 9], block_size=k + 2, max_new_tokens=9, temperature=1.0, seed=100 + k)
        h = engine.submit([2, 3, 5, 7], block_size=3, max_new_tokens=15, temperature=1.0, seed=42)
        engine.run_until_done()
        outs.append(h.result().tokens)
    assert outs[0] == outs[1] == outs[2]
    engine = BatchEngine(target, drafter, max_rows=4)
    other_seed = engine.submit([2, 3, 5, 7], block_size=3, max_new_tokens=15, temperature=1.0, seed=43)
    engine.run_until_done()
    assert other_seed.result().tokens != outs[0]  # the seed does matter


# ---------------------------------------------------------------------- failures
def test_a_failing_row_fails_alone():
    """Bad prompts, a too-long request and cancellations each end with their own AdaptspecError;
    the good rows finish with the tokens they have alone (the patched target's own greedy)."""
    model = tiny_target("llama", vocab=96, eos=None)
    target = TargetModel(model, verification="exact")
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8)
    engine = BatchEngine(target, drafter, max_rows=3, max_context=64)
    good = [([4, 8, 15, 16], 4, 20), ([23, 42], 1, 25)]
    handles = [engine.submit(p, block_size=b, max_new_tokens=n) for p, b, n in good]
    bad_token = engine.submit([1, 2, 500], block_size=2, max_new_tokens=5)
    empty = engine.submit([], block_size=2, max_new_tokens=5)
    too_long = engine.submit(list(range(60)), block_size=2, max_new_tokens=10)
    not_ids = engine.submit(["a", "b"], block_size=2, max_new_tokens=5)
    running = engine.submit([9, 9, 9], block_size=3, max_new_tokens=30)
    waiting = engine.submit([5, 6], block_size=2, max_new_tokens=30)
    for _ in range(3):
        engine.step()
    running.cancel()
    waiting.cancel()
    engine.run_until_done()
    for h, word in [
        (bad_token, "outside"),
        (empty, "empty"),
        (too_long, "exceeds the context"),
        (not_ids, "token ids"),
        (running, "cancelled"),
        (waiting, "cancelled"),
    ]:
        with pytest.raises(AdaptspecError, match=word):
            h.result()
        assert f"request {h.id}" in str(h.error)
    assert len(running.tokens) >= 3  # it was decoding when it was cancelled
    for h, (p, _, n) in zip(handles, good):
        ref = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=n, min_new_tokens=n)
        assert h.result().tokens == ref[0, len(p) :].tolist()


def test_settings_are_checked_at_submit():
    model = tiny_target("llama", vocab=96)
    engine = BatchEngine(TargetModel(model), None, max_rows=2)
    for kw, word in [
        (dict(block_size=2), "no drafter"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(block_size=True), "int"),
    ]:
        with pytest.raises(AdaptspecError, match=word):
            engine.submit([1, 2], **kw)
    with pytest.raises(AdaptspecError, match="max_rows"):
        BatchEngine(TargetModel(model), None, max_rows=0)


# ---------------------------------------------------------------------- records
def test_outcome_and_round_records_add_up():
    """Per request: an Outcome whose rounds' taus plus the prefill token are its tokens (cut at
    max_new_tokens); per round: rows, blocks and taus consistent with the requests' rounds."""
    model = tiny_target("llama", vocab=96, eos=None)
    target = TargetModel(model)
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8)
    engine = BatchEngine(target, drafter, max_rows=3)
    handles = [
        engine.submit([i + 1, 2 * i + 3], block_size=b, max_new_tokens=n)
        for i, (b, n) in enumerate([(1, 10), (4, 17), (8, 9), (2, 12)])
    ]
    engine.run_until_done()
    for h in handles:
        out = h.result()
        assert out.finish_reason == "length" and len(out.tokens) == h.max_new_tokens
        assert 1 + sum(r.tau for r in out.rounds) >= len(out.tokens) > sum(r.tau for r in out.rounds)
        assert h.first_token_at <= h.finished_at
    per_request = {h.id: [] for h in handles}
    for rec in engine.history:
        assert 1 <= rec.rows <= 3 and rec.round_s >= rec.draft_s + rec.verify_s
        for rid, b, tau in zip(rec.requests, rec.block_sizes, rec.taus):
            per_request[rid].append((b, tau))
    for h in handles:
        assert per_request[h.id] == [(r.block_size, r.tau) for r in h.rounds]
