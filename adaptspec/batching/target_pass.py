"""One target forward pass over every active row, each row at its own position.

Row ``i`` feeds ``T`` tokens (its block, padded to the round's widest with copies of its
last token) at positions ``lengths[i] .. lengths[i] + T - 1``; its keys/values go to its own
slot (:mod:`adaptspec.batching.kv_slots`) and a ``[R, 1, T, K]`` mask lets query ``q`` of row
``i`` see keys ``j <= lengths[i] + q`` only. Padded positions are computed and ignored. A row
verifying a draft tree feeds its root and nodes instead, each node at its depth's position and
seeing the row's cache and its own ancestors only (:class:`~adaptspec.batching.kv_slots.SlotCache`).

The model's own attention kernels take the mask (``"fast"`` verification). A model patched
for ``"exact"`` verification (:mod:`adaptspec.decoding.batch_invariant`) computes each row
through its one-sequence kernel over that row's own keys, and its row-padded linear layers
give every row what it gets alone: each row is then bit-identical to decoding it alone.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..decoding.target import TargetModel, cache_keyword
from ..decoding.tree import DraftTree
from .kv_slots import SlotStore


def prefill_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer ``(keys, values)`` of a transformers cache holding one sequence."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def new_store(target: TargetModel, max_rows: int, capacity: int, max_capacity: int) -> SlotStore:
    """An empty :class:`SlotStore` shaped for ``target``'s attention layers."""
    cfg = target.model.config
    heads = cfg.num_attention_heads
    return SlotStore(
        num_layers=cfg.num_hidden_layers,
        max_rows=max_rows,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        capacity=capacity,
        max_capacity=max_capacity,
        dtype=target.dtype,
        device=target.device,
    )


@torch.inference_mode()
def verify_rows(
    target: TargetModel,
    store: SlotStore,
    blocks: torch.Tensor,
    context: bool,
    trees: Sequence[DraftTree | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``blocks[R, T]`` (row ``i`` after its ``store.lengths[i]`` cached positions; ``trees[i]``,
    when given and not None: row ``i``'s block is that draft tree's root and nodes,
    :class:`~adaptspec.batching.kv_slots.SlotCache`).

    Returns logits ``[R, T, V]`` and, when ``context`` and the target feeds a drafter, the
    drafter's context ``[R, T, k*H]``. Writes all ``T`` positions of every row to the store;
    the caller commits what each row keeps (:meth:`SlotStore.commit`).
    """
    cache = store.pass_cache(blocks.shape[1], trees)
    context = context and target.context_layers is not None
    out = target.model(
        input_ids=blocks,
        attention_mask=cache.attention_mask(),
        position_ids=cache.positions,
        **{cache_keyword(): cache},
        use_cache=True,
        output_hidden_states=context,
    )
    hidden = torch.cat([out.hidden_states[i] for i in target.context_layers], dim=-1) if context else None
    return out.logits, hidden
