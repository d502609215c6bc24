"""Plain greedy decoding of a transformers causal LM: the baseline speculation must beat.

No drafter, no block verification, transformers' own kernels and KV cache: the first token
comes from the prefill, every other one from one forward pass. Timing covers the decode
loop only (prefill excluded), like :attr:`adaptspec.speculator.Outcome.decode_s`.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
...                   num_attention_heads=4, num_key_value_heads=2)
>>> model = LlamaForCausalLM(cfg).eval()
>>> tokens, seconds = plain_greedy(model, [1, 2, 3], max_new_tokens=6)
>>> tokens == model.generate(torch.tensor([[1, 2, 3]]), do_sample=False, max_new_tokens=6)[0, 3:].tolist()
True
"""

from __future__ import annotations

import time
from typing import Iterable, Sequence

import torch


@torch.inference_mode()
def plain_greedy(model, prompt_ids: Sequence[int], max_new_tokens: int, eos: Iterable[int] = ()) -> tuple[list[int], float]:
    """Greedy tokens (at most ``max_new_tokens``, stopping after an EOS) and decode seconds."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    eos = set(eos)
    cache = DynamicCache()
    logits = model(torch.tensor([list(prompt_ids)], device=device), cache=cache, use_cache=True).logits
    tokens = [int(logits[0, -1].argmax())]
    _sync(device)
    start = time.perf_counter()
    while len(tokens) < max_new_tokens and tokens[-1] not in eos:
        logits = model(torch.tensor([[tokens[-1]]], device=device), cache=cache, use_cache=True).logits
        tokens.append(int(logits[0, -1].argmax()))
    _sync(device)
    return tokens, time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
