"""A tiny random Llama target and drafter with a character tokenizer, for tests and development.

Built in well under a second, offline, deterministic under ``seed``: two processes that call
:func:`tiny_speculator` with the same seed hold the same weights, so a test can compute the
reference greedy output in-process and compare it with what a server returned.
Its drafts are mostly rejected (the drafter is untrained); it exercises the whole path, not
the speed-up.

>>> spec, codec = tiny_speculator(seed=0)
>>> spec.max_block_size, codec.vocab_size, spec.target.eos_token_ids
(16, 128, {3})
"""

from __future__ import annotations

from typing import Any

from .codec import CharCodec

__all__ = ["tiny_model", "tiny_speculator", "TINY_MAX_BLOCK_SIZE", "TINY_MAX_POSITIONS"]

TINY_MAX_POSITIONS = 512
TINY_MAX_BLOCK_SIZE = 16


def tiny_model(seed: int = 0) -> Any:
    """The tiny target: a 4-layer Llama (hidden 64) over :class:`CharCodec`'s 128 ids, eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    codec = CharCodec()
    cfg = LlamaConfig(
        vocab_size=codec.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_MAX_POSITIONS,
        eos_token_id=codec.eos,
        bos_token_id=None,
        pad_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():  # sharper logits: fewer near-ties, as in a trained model
            model.lm_head.weight.mul_(8.0)
    return model.eval()


def tiny_speculator(
    seed: int = 0, max_block_size: int = TINY_MAX_BLOCK_SIZE, verification: str = "fast"
) -> tuple[Any, CharCodec]:
    """``(SpeculativeDecoder, CharCodec)`` over :func:`tiny_model` and a fresh 1-layer drafter."""
    import torch

    from ..decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel

    model = tiny_model(seed)
    with torch.random.fork_rng(devices=[]):
        drafter = BlockDiffusionDrafter.for_target(
            model, num_layers=1, seed=seed + 1, max_block_size=max_block_size
        )
    return SpeculativeDecoder(TargetModel(model, verification=verification), drafter), CharCodec()
