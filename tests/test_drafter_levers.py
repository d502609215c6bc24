"""Training levers of the drafter (issue 29): sequences per step, a response crop, soft targets.

Expected values come from the stored data (token ids, the target's own full forward pass),
never from the batch or loss code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import adaptspec.models.train_drafter as T
from adaptspec.cli import main
from adaptspec.decoding import BlockDiffusionDrafter
from adaptspec.decoding.drafter import block_position_weights
from adaptspec.errors import AdaptspecError
from adaptspec.models import corpus as C
from adaptspec.models.contexts import build_corpus_contexts
from adaptspec.models.prompts import Prompt
from adaptspec.models.train_drafter import ShardData, TrainConfig, block_loss, make_batch, train, vocab_index
from decoding_helpers import tiny_target

torch.set_num_threads(1)
LAYERS = [1, 3]
ANSWERS = (20, 33, 9, 40)  # response lengths: some longer than the crop, one shorter


@pytest.fixture(scope="module")
def model():
    return tiny_target(vocab=96, eos=None)


@pytest.fixture(scope="module")
def contexts(tmp_path_factory, model):
    """Context shards of a two-shard corpus with the target's top 4 next tokens stored."""
    tmp = tmp_path_factory.mktemp("levers")
    rng = np.random.default_rng(5)
    c = C.create(tmp / "corpus", "tiny", max_new_tokens=40, max_prompt_tokens=16)
    for k in range(2):
        prompts = [Prompt(f"p{k}-{i}", "chat") for i in range(len(ANSWERS))]
        ids = [rng.integers(0, 96, int(n)).tolist() for n in rng.integers(3, 9, len(prompts))]
        answers = [rng.integers(0, 96, n).tolist() for n in ANSWERS]
        C._write_shard(c.path / f"shard-{k:05d}.npz", prompts, ids, answers, eos=set())
    assert build_corpus_contexts(c, model, tmp / "ctx", LAYERS, progress=False, top_k=4) == 2
    build_corpus_contexts(c, model, tmp / "plain", LAYERS, progress=False)
    return tmp


def _cfg(**kw) -> TrainConfig:
    base = dict(
        num_layers=1,
        block_size=6,
        max_block_size=8,
        draft_vocab_size=None,
        seqs_per_step=3,
        anchors_per_seq=12,
        lr=3e-3,
        warmup_steps=2,
        total_steps=6,
        eval_every=10**9,
        checkpoint_every_s=10**9,
        bf16_autocast=False,
    )
    return TrainConfig(**(base | kw))


# ---------------------------------------------------------------------- the response crop
def test_a_cropped_batch_never_reaches_past_the_responses_first_tokens(contexts):
    data = ShardData([contexts / "ctx"])
    crop, b = 10, 6
    idx = np.arange(len(data))
    got = make_batch(data, idx, _cfg(max_response_len=crop), np.random.default_rng(0), None)
    whole = make_batch(data, idx, _cfg(), np.random.default_rng(0), None)
    assert got["tokens"].shape[1] == max(
        pl + min(crop, len(t) - pl) for t, pl in zip(data.tokens, data.prompt_lens)
    )
    reached_past = False
    for r, i in enumerate(idx):
        tok, pl = np.asarray(data.tokens[i]), data.prompt_lens[i]
        end = min(len(tok), pl + crop)  # the cropped sequence: prompt and the response's first `crop` tokens
        assert got["tokens"][r, :end].tolist() == tok[:end].tolist()
        assert not got["tokens"][r, end:].any() and not got["hidden"][r, end:].any()
        np.testing.assert_array_equal(
            got["hidden"][r, :end].numpy(), np.asarray(data.hidden[i][:end], np.float32)
        )
        for a, anchor in enumerate(got["anchors"][r].tolist()):
            assert pl <= anchor <= end - 2  # an anchor with at least one label inside the crop
            for k in range(b - 1):
                t = anchor + 1 + k
                assert got["labels"][r, a, k] == (tok[t] if t < end else -100)
        reached_past |= bool((whole["anchors"][r] + b - 1 >= pl + crop).any()) and len(tok) > pl + crop
    assert reached_past  # without the crop the same draw labels positions past it


# ---------------------------------------------------------------------- the command line
def test_the_flags_reach_the_training_config(tmp_path):
    import argparse

    from adaptspec.cli.train_drafter import _train_config, add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = _train_config(
        p.parse_args(["--seqs-per-step", "16", "--max-seq-len", "128", "--soft-targets", "8", "--seed", "3"])
    )
    assert (cfg.seqs_per_step, cfg.max_response_len, cfg.soft_targets, cfg.seed) == (16, 128, 8, 3)
    cfg = _train_config(p.parse_args([]))
    assert (cfg.seqs_per_step, cfg.max_response_len, cfg.soft_targets, cfg.seed) == (4, None, 0, 0)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--seqs-per-step", "0"], "--seqs-per-step: expected an integer >= 1, got '0'"),
        (["--max-seq-len", "1"], "--max-seq-len: expected an integer >= 2, got '1'"),
        (["--soft-targets", "65"], "--soft-targets: expected an integer in 1..64, got '65'"),
        (["--soft-targets", "4", "--stage", "train"], "--soft-targets: needs --corpus"),
    ],
)
def test_bad_values_are_one_line(tmp_path, capsys, argv, needle):
    assert main(["train-drafter", "--work", str(tmp_path / "w"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and needle in err, err


def test_training_takes_that_many_sequences_a_step_within_the_crop(contexts, model, monkeypatch):
    seen = []

    def spy(data, idx, cfg, rng, vmap, device="cpu"):
        batch = make_batch(data, idx, cfg, rng, vmap, device)
        ends = torch.tensor([data.prompt_lens[i] + 7 for i in idx])
        seen.append((len(idx), bool((batch["anchors"] + 1 <= ends[:, None] - 1).all())))
        return batch

    monkeypatch.setattr(T, "make_batch", spy)
    train(
        model,
        [contexts / "ctx"],
        [],
        contexts / "ckpt-spy",
        _cfg(seqs_per_step=5, max_response_len=7),
        log=lambda *_: None,
        target_layers=LAYERS,
    )
    assert seen == [(5, True)] * 6


def test_more_sequences_a_step_than_the_data_holds_is_one_line(contexts, model):
    with pytest.raises(AdaptspecError, match="^9 sequences a step, but the training data holds 8$"):
        train(
            model,
            [contexts / "ctx"],
            [],
            contexts / "ckpt-big",
            _cfg(seqs_per_step=9),
            log=lambda *_: None,
            target_layers=LAYERS,
        )


# ---------------------------------------------------------------------- soft targets
def test_stored_top_k_is_the_targets_own_next_token_distribution(contexts, model):
    data = ShardData([contexts / "ctx"])
    assert data.top_k() == 4 and ShardData([contexts / "plain"]).top_k() == 0
    for tok, (ids, probs) in zip(data.tokens, data.top):
        with torch.no_grad():  # the reference: the model's whole forward, one sequence alone
            ref = torch.softmax(
                model(input_ids=torch.as_tensor(np.asarray(tok, np.int64))[None]).logits[0], -1
            )
        p, i = ref.topk(4, dim=-1)
        assert ids.dtype == np.int32 and probs.dtype == np.float16 and ids.shape == (len(tok), 4)
        np.testing.assert_array_equal(ids, i.numpy())
        np.testing.assert_allclose(probs.astype(np.float32), p.numpy(), rtol=2e-3, atol=1e-3)


def test_soft_batch_holds_the_renormalised_in_vocabulary_part_of_the_stored_distribution(contexts):
    data = ShardData([contexts / "ctx"])
    draft_vocab = torch.arange(0, 96, 2)  # even ids only: some of the top tokens cannot be drafted
    vmap = vocab_index(draft_vocab, 96)
    idx = np.arange(len(data))
    k, b = 3, 6
    got = make_batch(data, idx, _cfg(soft_targets=k, max_response_len=15), np.random.default_rng(1), vmap)
    for r, i in enumerate(idx):
        tok, pl = np.asarray(data.tokens[i]), data.prompt_lens[i]
        ids, probs = data.top[i]
        end = min(len(tok), pl + 15)
        for a, anchor in enumerate(got["anchors"][r].tolist()):
            for j in range(b - 1):
                t = anchor + 1 + j
                want = {}
                if t < end:
                    for tid, pr in zip(ids[t - 1, :k].tolist(), probs[t - 1, :k].tolist()):
                        if tid % 2 == 0 and pr > 0:  # a probability float16 rounds to 0 carries no mass
                            want[tid // 2] = want.get(tid // 2, 0.0) + pr
                total = sum(want.values())
                have = {}
                for sid, pr in zip(got["soft_ids"][r, a, j].tolist(), got["soft_probs"][r, a, j].tolist()):
                    if pr > 0:
                        have[sid] = have.get(sid, 0.0) + pr
                assert have.keys() == want.keys()
                for key in want:
                    assert have[key] == pytest.approx(want[key] / total, rel=1e-5)


def test_soft_loss_on_one_hot_targets_is_the_greedy_cross_entropy(contexts, model):
    data = ShardData([contexts / "ctx"])
    drafter = BlockDiffusionDrafter.for_target(
        model, num_layers=1, target_layers=LAYERS, seed=0, max_block_size=8
    )
    batch = make_batch(data, np.arange(4), _cfg(), np.random.default_rng(2), None)
    weights = block_position_weights(6, None)
    with torch.no_grad():
        hard, acc = block_loss(drafter, batch, weights)
        labels = batch["labels"]
        one_hot = batch | {
            "soft_ids": labels.clamp_min(0)[..., None],
            "soft_probs": (labels >= 0).float()[..., None],
        }
        soft, acc2 = block_loss(drafter, one_hot, weights)
    assert float(soft) == pytest.approx(float(hard), rel=1e-5) and acc == acc2


def test_soft_targets_train_and_refuse_contexts_without_them(contexts, model):
    quiet = dict(log=lambda *_: None, target_layers=LAYERS)
    with pytest.raises(AdaptspecError, match="store no top-k distribution"):
        train(model, [contexts / "plain"], [], contexts / "ckpt-plain", _cfg(soft_targets=2), **quiet)
    with pytest.raises(AdaptspecError, match="^soft targets of 5 tokens, but the training contexts store 4$"):
        train(model, [contexts / "ctx"], [], contexts / "ckpt-5", _cfg(soft_targets=5), **quiet)
    data = ShardData([contexts / "ctx"])
    batch = make_batch(data, np.arange(8), _cfg(soft_targets=4), np.random.default_rng(3), None)
    weights = block_position_weights(6, None)
    start = BlockDiffusionDrafter.for_target(
        model, num_layers=1, target_layers=LAYERS, seed=0, max_block_size=8
    )
    trained = train(
        model,
        [contexts / "ctx"],
        [],
        contexts / "ckpt-soft",
        _cfg(soft_targets=4, total_steps=40, seqs_per_step=8),
        **quiet,
    )
    with torch.no_grad():
        before, after = (float(block_loss(d, batch, weights)[0]) for d in (start, trained))
    assert after < 0.8 * before, (before, after)
