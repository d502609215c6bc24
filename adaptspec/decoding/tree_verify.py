"""One target pass over a draft tree, and the cache of the accepted path.

The pass feeds ``[last, node_1 .. node_N]`` after ``n`` cached positions; node ``i`` sits at
position ``n + depth`` (the position it would have in a chain) and attends to the cache and to
its ancestors only (:meth:`~adaptspec.decoding.tree.DraftTree.ancestors`), so its logits are
those of the chain ``[last, its path]``, up to the rounding of a pass of another shape. The
model's own kernels take the mask (``"fast"`` verification: a boolean mask for ``sdpa``, an
additive one for ``eager``); a model patched for ``"exact"`` verification honours the boolean
one too (:func:`~adaptspec.decoding.batch_invariant.rowwise_attention`), one query at a time over
the keys it sees gathered in order, bit for bit as the chain of its path (so exact verification
of a tree is one pass, in :class:`~adaptspec.decoding.decoder.SpeculativeDecoder` and in the batching
engine's tree rows alike). After the walk,
:func:`keep_path` keeps only the root's and the accepted path's keys and values.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import AdaptspecError
from .batch_invariant import ATTENTION_NAME
from .target import TargetModel, cache_keyword
from .tree import DraftTree

#: Attention implementations that take a boolean ``[1, 1, q, kv]`` mask (True: may attend), and
#: those that add a float one; any other (flash attention, flex attention) cannot run a tree.
BOOLEAN_MASK = ("sdpa", ATTENTION_NAME)
ADDITIVE_MASK = ("eager",)


def tree_inputs(
    tree: DraftTree, last: int, n: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pass's ``input_ids[1, N + 1]``, ``position_ids[1, N + 1]`` and boolean
    ``attention_mask[1, 1, N + 1, n + N + 1]`` (every cached position, then the ancestors)."""
    ids = torch.tensor([[last, *tree.tokens]], device=device)
    positions = (n + torch.tensor(tree.depths, device=device))[None]
    anc = tree.ancestors().to(device)
    mask = torch.cat([anc.new_ones(anc.shape[0], n), anc], dim=1)[None, None]
    return ids, positions, mask


def tree_attention(target: TargetModel) -> bool:
    """Whether the target's attention takes a mask per query (a tree pass can run on it)."""
    return getattr(target.model.config, "_attn_implementation", None) in BOOLEAN_MASK + ADDITIVE_MASK


def check_tree_target(target: TargetModel, cache: Any) -> None:
    """Refuse a target whose attention takes no mask, or whose cache layers are not plain
    full-attention ones (a sliding window's or a compressed cache cannot drop positions from the
    middle): one line naming what it has."""
    from transformers.cache_utils import DynamicLayer

    attention = getattr(target.model.config, "_attn_implementation", None)
    if not tree_attention(target):
        raise AdaptspecError(
            f"draft trees need sdpa or eager attention (a mask per query); this target runs {attention!r}"
        )
    kinds = {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}
    if kinds:
        raise AdaptspecError(
            f"draft trees need a full-attention KV cache; this target's has {', '.join(sorted(kinds))} layers"
        )


@torch.inference_mode()
def verify_tree(
    target: TargetModel, tree: DraftTree, last: int, n: int, cache: Any, context: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the tree after the ``n`` positions of ``cache``: logits ``[N + 1, V]`` (row ``i``: the
    target's next-token logits after block index ``i``'s path) and, when ``context`` and the
    target feeds a drafter, the drafter's context ``[N + 1, k*H]``. Appends all ``N + 1``
    positions to ``cache``; :func:`keep_path` keeps the accepted ones. The pass runs on the target's
    prepacked weights, as its chain passes do (``TargetModel.prepacked``)."""
    ids, positions, mask = tree_inputs(tree, last, n, target.device)
    if target.model.config._attn_implementation in ADDITIVE_MASK:
        mask = torch.zeros(mask.shape, dtype=target.dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(target.dtype).min
        )
    context = context and target.context_layers is not None
    with target.prepacked.on():
        out = target.model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask,
            **{cache_keyword(): cache},
            use_cache=True,
            output_hidden_states=context,
        )
    hidden = torch.cat([out.hidden_states[i][0] for i in target.context_layers], dim=-1) if context else None
    return out.logits[0], hidden


@torch.inference_mode()
def keep_path(cache: Any, n: int, path: list[int]) -> None:
    """Keep the ``n`` positions before the tree, the root's and those of ``path`` (block indices,
    in order): ``n + 1 + len(path)`` positions, laid out as a chain that committed them (each
    accepted node's keys and values moved down to its depth's place, the rest cut)."""
    keep = n + 1 + len(path)
    moved = [(n + d, n + i) for d, i in path_moves(path)]
    for layer in cache.layers:
        if moved:
            dst = torch.tensor([d for d, _ in moved], device=layer.keys.device)
            src = torch.tensor([s for _, s in moved], device=layer.keys.device)
            layer.keys[..., dst, :] = layer.keys[..., src, :]
            layer.values[..., dst, :] = layer.values[..., src, :]
        layer.keys = layer.keys[..., :keep, :]
        layer.values = layer.values[..., :keep, :]


def path_moves(path: list[int]) -> list[tuple[int, int]]:
    """The moves that lay an accepted ``path`` (block indices, in order) out as a chain: ``(to, from)``
    block indices, each node from its block index to its depth's, in order (each ``to`` below every
    later ``from``, so they may be made one after another or all at once from a copy).

    >>> path_moves([1, 3, 6])
    [(2, 3), (3, 6)]
    """
    return [(d, i) for d, i in enumerate(path, start=1) if i != d]
