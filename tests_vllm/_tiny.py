"""Tiny random models for the vLLM tests, built locally (nothing from a hub).

A Qwen3 target (head_dim 64: vLLM's CPU attention refuses 16) saved as a Hugging Face folder
with its config and safetensors; vLLM is started with ``skip_tokenizer_init`` and fed token ids,
so no tokenizer is needed and outputs are compared token for token.
"""

from __future__ import annotations

from pathlib import Path

VOCAB = 512


def tiny_qwen3(path: Path, seed: int = 0, layers: int = 2, noise: float = 0.0) -> Path:
    """A random Qwen3 causal LM at ``path`` (made once; the same ``seed`` gives the same weights).
    ``noise``: then every weight is moved by that fraction of its own spread, drawn with seed
    ``seed + 1``: a drafter that agrees with the ``seed`` model on some tokens and not on others."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        torch_dtype="float32",
        eos_token_id=VOCAB - 1,
        bos_token_id=0,
    )
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # larger logits than the default init: a peaked, repetitive greedy text
        for p in model.parameters():
            p.mul_(3.0)
        if noise:
            g = torch.Generator().manual_seed(seed + 1)
            for p in model.parameters():
                p.add_(noise * p.std().clamp_min(1e-3) * torch.randn(p.shape, generator=g))
    model.save_pretrained(path, safe_serialization=True)
    return path
