"""Training a drafter from token ids: recomputed contexts, per-position evaluation, learning."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from adaptspec.decoding import BlockDiffusionDrafter
from adaptspec.errors import AdaptspecError
from adaptspec.models import corpus as C
from adaptspec.models.contexts import build_corpus_contexts, teacher_forced_hidden
from adaptspec.models.drafter_eval import acceptance_everywhere, drafter_figures
from adaptspec.models.prompts import Prompt
from adaptspec.models.train_drafter import ShardData, TrainConfig, export, train
from decoding_helpers import tiny_target

torch.set_num_threads(1)
LAYERS = [1, 3]


@pytest.fixture(scope="module")
def model():
    return tiny_target(vocab=96, eos=None)


def _alone(model, seq):
    with torch.no_grad():
        hs = model.model(input_ids=torch.as_tensor(seq)[None], output_hidden_states=True).hidden_states
    return torch.cat([hs[layer][0] for layer in LAYERS], -1).numpy()


def test_batched_right_padded_pass_equals_one_sequence_at_a_time(model):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 96, n) for n in (7, 30, 12, 30, 3, 21)]
    got = teacher_forced_hidden(model, seqs, LAYERS, max_batch_tokens=64)  # several batches of mixed lengths
    for s, h in zip(seqs, got):
        assert h.dtype == np.float16 and h.shape == (len(s), 2 * 64)
        np.testing.assert_allclose(h.astype(np.float32), _alone(model, s), rtol=2e-3, atol=2e-3)


def _corpus(tmp_path, n_shards, rng):
    c = C.create(tmp_path / "corpus", "tiny", max_new_tokens=40, max_prompt_tokens=16)
    for k in range(n_shards):
        prompts = [Prompt(f"p{k}-{i}", "chat") for i in range(3)]
        ids = [rng.integers(0, 96, 5).tolist() for _ in prompts]
        answers = [
            rng.integers(0, 96, n).tolist() for n in (20, 1, 33)
        ]  # the 1-token answer has no label to learn
        C._write_shard(c.path / f"shard-{k:05d}.npz", prompts, ids, answers, eos=set())
    return c


def test_contexts_resume_skip_short_answers_and_are_read_memory_mapped(tmp_path, model):
    rng = np.random.default_rng(1)
    c = _corpus(tmp_path, 2, rng)
    out = tmp_path / "ctx"
    assert build_corpus_contexts(c, model, out, LAYERS, progress=False) == 2
    assert build_corpus_contexts(c, model, out, LAYERS, progress=False) == 0  # nothing missing
    data = ShardData([out])
    want = [s for s in c.sequences() if len(s.tokens) - s.prompt_len >= 2]
    assert len(data) == len(want) == 4
    for tok, hid, pl, s in zip(data.tokens, data.hidden, data.prompt_lens, want):
        assert isinstance(hid, np.memmap)
        assert tok.tolist() == s.tokens.tolist() and pl == s.prompt_len
        np.testing.assert_allclose(np.asarray(hid, np.float32), _alone(model, s.tokens), rtol=2e-3, atol=2e-3)
    assert data.n_tokens() == 20 + 33 + 20 + 33
    assert len(ShardData([out], max_response_tokens=1)) == 2  # a data budget stops after the first shard
    C._write_shard(c.path / "shard-00002.npz", [Prompt("x", "chat")], [[1, 2]], [[3, 4, 5]], eos=set())
    assert build_corpus_contexts(C.Corpus(c.path), model, out, LAYERS, progress=False) == 1
    assert data.reload() == 1 and len(data) == 5


def _text_the_drafter_half_predicts(model, drafter, rng, n=40):
    """A sequence built one token at a time: with probability 0.7 the token the decoding path
    drafts first at that position, otherwise random; so acceptance is neither 0 nor total."""
    seq = rng.integers(0, 96, 4).tolist()
    while len(seq) < n:
        hid = torch.from_numpy(_alone(model, seq[:-1]))
        logits = drafter.draft_logits(drafter.new_state(hid), seq[-1], 3)
        first = int(drafter.to_target_ids(logits.argmax(-1))[0])
        seq.append(first if rng.random() < 0.7 else int(rng.integers(0, 96)))
    return np.asarray(seq)


def test_every_position_tau_equals_the_decoding_paths_drafts(tmp_path, model):
    drafter = BlockDiffusionDrafter.for_target(
        model, num_layers=1, target_layers=LAYERS, seed=3, max_block_size=8
    )
    rng = np.random.default_rng(2)
    seqs = [_text_the_drafter_half_predicts(model, drafter, rng) for _ in range(2)]

    class Data:  # what acceptance_everywhere reads
        tokens = seqs
        hidden = [_alone(model, s) for s in seqs]
        prompt_lens = [4, 4]
        domains = ["a", "b"]

    figures = drafter_figures(drafter, Data, block_sizes=(2, 3, 6), anchors_per_pass=7)
    got = acceptance_everywhere(drafter, Data, block_sizes=(2, 3, 6), anchors_per_pass=7)
    assert got == figures["tau"]
    for b in (2, 3, 6):  # reference: one draft_logits call (the decoder's path) per position
        per, first = {}, {}
        for s, dom in zip(seqs, ["a", "b"]):
            taus, firsts = [], []
            for p in range(4, len(s) - 1):
                state = drafter.new_state(torch.from_numpy(_alone(model, s[:p])))
                draft = drafter.to_target_ids(drafter.draft_logits(state, int(s[p]), b).argmax(-1)).tolist()
                n_ok = 0
                while n_ok < b - 1 and p + 1 + n_ok < len(s) and draft[n_ok] == s[p + 1 + n_ok]:
                    n_ok += 1
                taus.append(1 + n_ok)
                firsts.append(draft[0] == s[p + 1])  # a count of its own, not read off n_ok
            per[dom], first[dom] = np.mean(taus), np.mean(firsts)
        assert got[b]["a"] == pytest.approx(per["a"]) and got[b]["b"] == pytest.approx(per["b"])
        assert got[b]["all"] == pytest.approx((per["a"] + per["b"]) / 2)
        fd = figures["first_draft"][b]
        assert fd["a"] == pytest.approx(first["a"]) and fd["b"] == pytest.approx(first["b"])
        assert fd["all"] == pytest.approx((first["a"] + first["b"]) / 2)
    assert 1.3 < got[2]["all"] < 1.95  # the constructed text: about 70% of first drafts are right


def _counting_corpus(tmp_path, model) -> ShardData:
    rng = np.random.default_rng(4)
    c = C.create(tmp_path / "corpus", "tiny", max_new_tokens=64, max_prompt_tokens=16)
    # a learnable language: answers count up by a fixed step from a random start
    prompts = [Prompt(f"p{i}", "chat") for i in range(8)]
    ids = [rng.integers(0, 96, 4).tolist() for _ in prompts]
    answers = [[(int(s) + 3 * j) % 96 for j in range(48)] for s in rng.integers(0, 96, 8)]
    C._write_shard(c.path / "shard-00000.npz", prompts, ids, answers, eos=set())
    build_corpus_contexts(c, model, tmp_path / "ctx", LAYERS, progress=False)
    return ShardData([tmp_path / "ctx"])


def _tiny_config(**kw) -> TrainConfig:
    base = dict(
        num_layers=1,
        block_size=4,
        max_block_size=8,
        draft_vocab_size=None,
        seqs_per_step=4,
        anchors_per_seq=8,
        lr=3e-3,
        warmup_steps=10,
        total_steps=150,
        eval_every=10**9,
        checkpoint_every_s=10**9,
        bf16_autocast=False,
    )
    return TrainConfig(**(base | kw))


def test_training_on_recomputed_contexts_raises_acceptance(tmp_path, model):
    data = _counting_corpus(tmp_path, model)
    before = BlockDiffusionDrafter.for_target(
        model, num_layers=1, target_layers=LAYERS, seed=0, max_block_size=8
    )
    tau0 = acceptance_everywhere(before, data, (4,))[4]["all"]
    cpu0 = time.process_time()
    after = train(
        model,
        [tmp_path / "ctx"],
        [],
        tmp_path / "ckpt",
        _tiny_config(),
        log=lambda *_: None,
        target_layers=LAYERS,
    )
    cpu_spent = time.process_time() - cpu0
    tau1 = acceptance_everywhere(after, data, (4,))[4]["all"]
    assert tau0 < 1.3 and tau1 > 2.5, (tau0, tau1)
    # the log counts the CPU time of the steps: growing, within what the whole call took, and kept
    cpu = [
        json.loads(line)["cpu_s"] for line in (tmp_path / "ckpt" / "train_log.jsonl").read_text().splitlines()
    ]
    assert len(cpu) == 3 and 0 < cpu[0] < cpu[1] < cpu[2] <= cpu_spent
    assert torch.load(tmp_path / "ckpt" / "state.pt", weights_only=False)["train_cpu_s"] == cpu[-1]

    # a new run started from those weights (init_from): the same drafter at step 0, whatever the
    # new run's own layer count, and a fresh schedule after it
    quiet = dict(log=lambda *_: None, target_layers=LAYERS)
    same = train(
        model,
        [tmp_path / "ctx"],
        [],
        tmp_path / "warm0",
        _tiny_config(num_layers=2, total_steps=0, init_from=str(tmp_path / "ckpt")),
        **quiet,
    )
    assert same.state_dict().keys() == after.state_dict().keys()
    assert all(torch.equal(v, after.state_dict()[k]) for k, v in same.state_dict().items())
    warm0 = torch.load(tmp_path / "warm0" / "state.pt", weights_only=False)
    assert warm0["step"] == 0 and warm0["cfg"]["extra"]["steps_before"] == 150  # the source's steps
    fresh, warm = (
        train(
            model,
            [tmp_path / "ctx"],
            [],
            tmp_path / name,
            _tiny_config(total_steps=10, lr=1e-4, **kw),
            **quiet,
        )
        for name, kw in (("fresh", {}), ("warm", {"init_from": str(tmp_path / "ckpt")}))
    )
    tau_fresh, tau_warm = (acceptance_everywhere(d, data, (4,))[4]["all"] for d in (fresh, warm))
    assert tau_fresh < 1.3 and tau_warm > 2.5, (tau_fresh, tau_warm)


def test_a_run_can_start_from_exported_weights(tmp_path, model):
    _counting_corpus(tmp_path, model)
    src = BlockDiffusionDrafter.for_target(
        model, num_layers=1, target_layers=LAYERS, seed=7, max_block_size=8, draft_vocab=list(range(0, 96, 2))
    )
    export(src, tmp_path / "shipped", {"steps": 30, "steps_before": 12, "config": {"block_size": 4}})
    quiet = dict(log=lambda *_: None, target_layers=LAYERS)
    start = train(
        model,
        [tmp_path / "ctx"],
        [],
        tmp_path / "warm0",
        _tiny_config(num_layers=2, block_size=6, total_steps=0, init_from=str(tmp_path / "shipped")),
        **quiet,
    )
    # the exported weights are bfloat16: the run starts from the source's weights rounded to it
    want = {k: v.to(torch.bfloat16).float() for k, v in src.state_dict().items()}
    assert start.state_dict().keys() == want.keys()
    assert all(torch.equal(v, want[k]) for k, v in start.state_dict().items())
    assert torch.equal(start.draft_vocab, torch.arange(0, 96, 2))
    st = torch.load(tmp_path / "warm0" / "state.pt", weights_only=False)
    assert st["cfg"]["num_layers"] == 1 and st["cfg"]["block_size"] == 4  # the source's, from its card
    assert st["cfg"]["extra"]["steps_before"] == 42
    # the checkpoint it wrote records that architecture: a run started from it rebuilds the same drafter
    again = train(
        model,
        [tmp_path / "ctx"],
        [],
        tmp_path / "warm1",
        _tiny_config(num_layers=3, total_steps=0, init_from=str(tmp_path / "warm0")),
        **quiet,
    )
    assert all(torch.equal(v, want[k]) for k, v in again.state_dict().items())
    with pytest.raises(AdaptspecError, match="target layers"):
        train(
            model,
            [tmp_path / "ctx"],
            [],
            tmp_path / "other",
            _tiny_config(init_from=str(tmp_path / "shipped")),
            log=lambda *_: None,
            target_layers=[0, 2],
        )
    with pytest.raises(AdaptspecError, match="neither a training checkpoint"):
        train(
            model,
            [tmp_path / "ctx"],
            [],
            tmp_path / "none",
            _tiny_config(init_from=str(tmp_path / "ctx")),
            **quiet,
        )


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_drafter_layers_can_start_as_the_targets_last_layers(arch):
    from adaptspec.models.train_drafter import copy_target_layers

    target = tiny_target(arch, layers=4)
    kw = {"qk_norm": True} if arch == "qwen3" else {}
    drafter = BlockDiffusionDrafter.for_target(target, num_layers=2, target_layers=LAYERS, seed=0)
    if kw:  # a Qwen3 target's layers have per-head q/k norms: give the drafter some too
        from dataclasses import replace

        drafter = BlockDiffusionDrafter(replace(drafter.config, **kw)).attach(target)
    assert copy_target_layers(drafter, target) == [2, 3]
    for mine, theirs in zip(drafter.layers, target.model.layers[2:]):
        pairs = [
            (mine.q_proj, theirs.self_attn.q_proj),
            (mine.o_proj, theirs.self_attn.o_proj),
            (mine.down_proj, theirs.mlp.down_proj),
            (mine.input_norm, theirs.input_layernorm),
            (mine.post_norm, theirs.post_attention_layernorm),
        ]
        if kw:
            pairs.append((mine.k_norm, theirs.self_attn.k_norm))
        for a, b in pairs:
            assert torch.equal(a.weight, b.weight)


def test_reduced_vocabulary_head_rows_are_reused_and_follow_changes_to_the_target(model):
    target = tiny_target(vocab=96, eos=None, seed=5)
    vocab = [3, 7, 11, 50, 95]
    drafter = BlockDiffusionDrafter.for_target(
        target, num_layers=1, target_layers=LAYERS, seed=0, draft_vocab=vocab
    )
    head = target.get_output_embeddings().weight
    assert torch.equal(drafter.lm_weight(), head[vocab])
    assert drafter.lm_weight() is drafter.lm_weight()  # gathered once
    with torch.no_grad():
        head.mul_(2.0)  # an in-place change to the target's head is seen
    assert torch.equal(drafter.lm_weight(), head[vocab])
    drafter.attach(tiny_target(vocab=96, eos=None, seed=6))  # so is another target
    assert torch.equal(drafter.lm_weight(), drafter._shared[1][vocab])
