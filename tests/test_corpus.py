"""The distillation corpus: token-id shards that grow across runs, resumable, decontaminated."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from adaptspec.decoding.loading import bundled_target_path
from adaptspec.errors import AdaptspecError
from adaptspec.models import corpus as C
from adaptspec.models.self_instruct import Decontaminator, distinct_ngrams, user_turn_prefix

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_lm():
    tok = AutoTokenizer.from_pretrained(bundled_target_path())
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=tok.eos_token_id,
    )
    return LlamaForCausalLM(cfg).eval(), tok


def test_user_turn_prefix_is_the_template_up_to_the_user_message(tiny_lm):
    _, tok = tiny_lm
    prefix = tok.decode(user_turn_prefix(tok))
    full = tok.apply_chat_template([{"role": "user", "content": "Hello there"}], tokenize=False)
    assert full.startswith(prefix) and prefix.endswith("<|im_start|>user\n") and "Hello" not in prefix


def test_corpus_grows_resumes_and_refuses_foreign_dirs(tmp_path, tiny_lm):
    model, tok = tiny_lm
    out = tmp_path / "corpus"
    c = C.create(out, "tiny", max_new_tokens=12, max_prompt_tokens=64)
    # a random model writes no usable instruction: its self-instruct shards are empty, and the
    # template shard (every fourth) still makes progress
    n = C.extend(c, model, tok, until_tokens=1, batch_size=8, instruction_tokens=8)
    first = c.shard_paths()
    assert [p.name for p in first] == [f"shard-{k:05d}.npz" for k in range(n)]
    stats = c.stats()
    assert 0 < stats["sequences"] <= n * C.PROMPTS_PER_SHARD and stats["response_tokens"] >= 1
    seqs = list(c.sequences())
    with np.load(first[-1]) as z:
        assert z["tokens"].dtype == np.uint16
    assert len(c.prompts()) == len(seqs)
    for s, p in zip(seqs, c.prompts()):  # each sequence is its prompt in the chat template + the answer
        ids = tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True
        )
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)[-64:]
        assert s.tokens[: s.prompt_len].tolist() == ids
        assert 1 <= len(s.tokens) - s.prompt_len <= 12
    # the budget is met: nothing more to do; a larger budget continues after the existing shard
    assert C.extend(C.Corpus(out), model, tok, until_tokens=1, instruction_tokens=8) == 0
    total = stats["response_tokens"]
    assert (
        C.extend(C.Corpus(out), model, tok, until_tokens=total + 1, batch_size=8, instruction_tokens=8) >= 1
    )
    assert [p.read_bytes() for p in C.Corpus(out).shard_paths()[:n]] == [
        p.read_bytes() for p in first
    ]  # untouched
    with pytest.raises(AdaptspecError, match="other settings"):
        C.create(out, "tiny", max_new_tokens=99, max_prompt_tokens=64)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    with pytest.raises(AdaptspecError, match="not a distillation corpus"):
        C.create(tmp_path / "notes", "tiny", 12, 64)
    assert (tmp_path / "notes" / "mine.txt").read_text() == "keep me"


def test_decontaminator_flags_benchmark_prompts_and_not_others():
    d = Decontaminator()
    row = json.loads(
        next(iter(open(C.Path(__file__).parents[1] / "adaptspec/data/eval-prompts/gsm8k.jsonl")))
    )
    assert row["prompt"] in d
    assert ("Please help me: " + row["prompt"].upper() + " Thanks!") in d  # case and framing do not hide it
    assert "Write a short poem about the sea and the wind in the evening." not in d


def test_distinct_ngrams_matches_a_count_by_hand():
    texts = ["the cat sat on the mat", "the cat sat on a hat"]
    # trigrams: (the cat sat) (cat sat on) (sat on the) (on the mat) | (the cat sat) (cat sat on) (sat on a) (on a hat)
    assert distinct_ngrams(texts, n=3) == 6 / 8
