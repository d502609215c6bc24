"""vLLM's own ``dflash`` method loads a drafter exported by adaptspec (``export_drafter``) as it is,
with a Llama target (the bundled target's architecture), and stays lossless; its drafts are
adaptspec's: vLLM accepts as many drafted tokens as adaptspec's decoder does with the same drafter
on the same prompts (both greedy, float32, the same verify length).

A tiny random Llama (head_dim 64, a vocabulary of 64 so that an untrained drafter's guesses are
sometimes right) and a random DFlash-layout drafter with a reduced draft vocabulary (written in
vLLM's form: ``draft_vocab_size``, ``lm_head`` rows, ``d2t``), built here.
"""

from __future__ import annotations

import pytest

from conftest import make_llm

K = 3  # drafts verified per step: block size 4
VOCAB = 64


def prompts(n: int, seed: int):
    import numpy as np
    from vllm.inputs import TokensPrompt

    rng = np.random.default_rng(seed)
    return [
        TokensPrompt(prompt_token_ids=rng.integers(1, VOCAB - 1, int(rng.integers(8, 30))).tolist())
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from adaptspec.decoding import BlockDiffusionDrafter, dflash_format
    from adaptspec.models.vllm_export import export_drafter

    root = tmp_path_factory.mktemp("dflash-llama")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=VOCAB - 1,
        bos_token_id=0,
    )
    target = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # peaked logits: a repetitive greedy text a drafter can partly guess
        for p in target.parameters():
            p.mul_(3.0)
    target.save_pretrained(root / "target", safe_serialization=True)
    drafter = BlockDiffusionDrafter.for_target(
        target,
        num_layers=1,
        target_layers=[1, 3],
        max_block_size=8,
        draft_vocab=list(range(0, VOCAB, 2)),
        layout="dflash",
        mask_token_id=VOCAB - 2,
        seed=0,
    )
    dflash_format.save(drafter, root / "dflash", dtype=torch.float32)
    export_drafter(root / "dflash", root / "target", root / "vllm", dtype=torch.float32)
    return {"target": root / "target", "dflash": root / "dflash", "vllm": root / "vllm"}


def generate(llm, ps, n: int = 32) -> list[list[int]]:
    from vllm import SamplingParams

    return [
        list(o.outputs[0].token_ids) for o in llm.generate(ps, SamplingParams(temperature=0.0, max_tokens=n))
    ]


def counter(llm, name: str) -> float:
    return next(m.value for m in llm.get_metrics() if m.name == name)


def test_vllm_dflash_loads_the_export_lossless_and_drafts_as_adaptspec(pair):
    import torch

    from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
    from adaptspec.decoding.loading import load_target

    ps = prompts(12, seed=3)
    llm = make_llm(
        pair["target"],
        {"method": "dflash", "model": str(pair["vllm"]), "num_speculative_tokens": K},
        plugin=False,
    )
    spec = generate(llm, ps)
    drafts = counter(llm, "vllm:spec_decode_num_drafts")
    accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
    llm.llm_engine.engine_core.shutdown()
    plain_llm = make_llm(pair["target"], plugin=False)
    plain = generate(plain_llm, ps)
    plain_llm.llm_engine.engine_core.shutdown()
    assert spec == plain
    assert drafts > 0
    # the same drafter in adaptspec's decoder, the same prompts and lengths, verify length K + 1
    model, _ = load_target(pair["target"], dtype="float32")
    dec = SpeculativeDecoder(
        TargetModel(model, None, verification="exact"),
        BlockDiffusionDrafter.from_pretrained(pair["dflash"], model, dtype=torch.float32),
    )
    rounds = mine = 0
    for p, out in zip(ps, plain):
        o = dec.generate(p["prompt_token_ids"], block_size=K + 1, max_new_tokens=len(out))
        assert o.tokens == out
        rounds += len(o.rounds)
        mine += sum(r.tau - 1 for r in o.rounds)
    assert (drafts, accepted) == (rounds, mine)
    assert accepted > 0, "no draft accepted: the equality above would not show the drafts are the same"
