"""One drafter pass for every row that speculates.

Row ``i`` drafts ``B_i - 1`` tokens after its last committed token from its own context
(its :class:`~adaptspec.decoding.drafter.DraftState`). The rows' context keys/values are
zero-padded to the longest, the blocks to the widest; a ``[R, 1, T, K + T]`` mask lets row
``i``'s block see its ``K_i`` context positions and its own ``B_i`` block positions (the
block is bidirectional, as in :meth:`BlockDiffusionDrafter.draft_logits`). Each row's logits
equal its own single-row pass up to rounding; the engine uses this pass in fast verification
and one call per row where it promises bit-for-bit results (exact verification, sampling).

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from adaptspec.decoding import BlockDiffusionDrafter
>>> torch.manual_seed(0) and None
>>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
...                   num_attention_heads=4, num_key_value_heads=2)
>>> drafter = BlockDiffusionDrafter.for_target(LlamaForCausalLM(cfg), num_layers=2, seed=0)
>>> states = [drafter.new_state(torch.randn(n, drafter.context_width)) for n in (3, 7)]
>>> batched = draft_logits_rows(drafter, states, [5, 9], [4, 2])
>>> alone = [drafter.draft_logits(s, t, b) for s, t, b in zip(states, [5, 9], [4, 2])]
>>> [tuple(x.shape) for x in batched], all(torch.allclose(a, b, atol=1e-5) for a, b in zip(alone, batched))
([(3, 64), (1, 64)], True)
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..decoding.drafter import BlockDiffusionDrafter, DraftState


@torch.no_grad()
def draft_logits_rows(
    drafter: BlockDiffusionDrafter,
    states: Sequence[DraftState],
    last_tokens: Sequence[int],
    widths: Sequence[int],
) -> list[torch.Tensor]:
    """Logits ``[B_i - 1, V_draft]`` of every row's drafted positions, from one drafter pass."""
    for s in states:
        drafter._sync(s)
    rows, width = len(states), max(widths)
    p = drafter.mask_vector()
    dev = p.device
    ctx_len = torch.tensor([s.length for s in states], device=dev)
    keys = int(ctx_len.max()) if rows else 0
    tok = torch.tensor(list(last_tokens), device=drafter._embed.weight.device)[:, None]
    first = drafter._embed(tok).to(device=dev, dtype=p.dtype)  # [R, 1, H]
    x = torch.cat([first, p.expand(rows, width - 1, -1)], dim=1)
    pos = ctx_len[:, None] + torch.arange(width, device=dev)
    see_ctx = torch.arange(keys, device=dev)[None, :] < ctx_len[:, None]  # [R, K]
    see_blk = (
        torch.arange(width, device=dev)[None, :] < torch.tensor(list(widths), device=dev)[:, None]
    )  # [R, T]
    mask = torch.cat([see_ctx, see_blk], dim=1)[:, None, None, :].expand(rows, 1, width, keys + width)
    for layer_idx, layer in enumerate(drafter.layers):
        k = _padded([s.keys[layer_idx] for s in states], keys)
        v = _padded([s.values[layer_idx] for s in states], keys)
        x = layer(x, pos, k, v, mask)
    h = drafter.norm(x[:, 1:])
    w = drafter.lm_weight()
    logits = h.to(w.dtype) @ w.T  # [R, T - 1, V]
    return [logits[i, : b - 1] for i, b in enumerate(widths)]


def _padded(parts: list[torch.Tensor], length: int) -> torch.Tensor:
    """``[1, kv, n_i, d]`` tensors -> ``[R, kv, length, d]``, zero-padded."""
    first = parts[0]
    out = first.new_zeros(len(parts), first.shape[1], length, first.shape[3])
    for i, t in enumerate(parts):
        out[i, :, : t.shape[2]] = t[0]
    return out
