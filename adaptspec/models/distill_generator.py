"""Batched generation with row retirement: the cheap way to make distillation data on a CPU.

``generate`` runs many prompts at once (left-padded, one forward pass per step for the
whole batch) and drops a row from the batch, KV cache included, as soon as it ends, so no
step is spent on a finished answer. Greedy at ``temperature=0`` (the target's own output,
what a drafter is trained to predict), sampled otherwise (self-generated prompts).

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> torch.manual_seed(0) and None
>>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
...                   num_attention_heads=4, num_key_value_heads=2, eos_token_id=None)
>>> model = LlamaForCausalLM(cfg).eval()
>>> prompts = [[3, 14, 15], [9, 2, 6, 5, 3, 5]]
>>> out = generate(model, prompts, max_new_tokens=8, eos=())
>>> out[1] == model.generate(torch.tensor([prompts[1]]), do_sample=False, max_new_tokens=8)[0, 6:].tolist()
True
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch


@torch.inference_mode()
def generate(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos: Iterable[int],
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    pad_id: int = 0,
) -> list[list[int]]:
    """New tokens for every prompt (an EOS, when reached, is the last one)."""
    from transformers import DynamicCache

    from ..decoding.target import cache_keyword

    eos_t = torch.tensor(sorted(set(eos)), dtype=torch.long)
    n, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :] = torch.as_tensor(list(p))
        mask[r, width - len(p) :] = 1
    rows = torch.arange(n)  # which prompt each batch row answers
    out: list[list[int]] = [[] for _ in prompts]
    cache = DynamicCache(config=model.config)
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    logits = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        **{cache_keyword(): cache},
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    for _ in range(max_new_tokens):
        nxt = _choose(logits, temperature, generator)
        for r, t in zip(rows.tolist(), nxt.tolist()):
            out[r].append(t)
        done = torch.isin(nxt, eos_t)
        if len(out[int(rows[0])]) >= max_new_tokens or bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero()[:, 0]
            cache.batch_select_indices(keep)
            rows, mask, nxt = rows[keep], mask[keep], nxt[keep]
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
        pos = mask.sum(1, keepdim=True) - 1
        logits = model(
            input_ids=nxt[:, None],
            attention_mask=mask,
            position_ids=pos,
            **{cache_keyword(): cache},
            use_cache=True,
        ).logits[:, -1]
    return out


def _choose(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
