"""A drafter of adaptspec's layout re-shaped into the DFlash v1 architecture, keeping its weights.

The bundled drafter (adaptspec's layout: a learned mask vector, no q/k norm) cannot run in
engines that load DFlash v1 drafters (vLLM's ``dflash`` method among them). Every other
tensor has the same shape in both architectures, so :func:`to_dflash_layout` builds a
DFlash-layout drafter for the same target and copies them; the per-head q/k RMS norms start
at ones and the mask becomes the target's embedding of ``mask_token_id``. Those two changes
alter every draft, so the result is a starting point for fine-tuning
(``adaptspec train-drafter --init-from DIR``), not a finished drafter.

>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> import torch
>>> torch.manual_seed(0) and None
>>> target = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
...     num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, pad_token_id=0))
>>> from adaptspec.decoding import BlockDiffusionDrafter
>>> src = BlockDiffusionDrafter.for_target(target, num_layers=1, target_layers=[1, 3], draft_vocab=range(16))
>>> out, fresh = to_dflash_layout(src, target, mask_token_id=5, max_block_size=8)
>>> out.config.qk_norm, out.config.mask_token_id, out.max_block_size, fresh
(True, 5, 8, ['layers.0.k_norm.weight', 'layers.0.q_norm.weight'])
>>> bool(torch.equal(out.fc.weight, src.fc.weight)), out.draft_vocab.tolist() == list(range(16))
(True, True)
"""

from __future__ import annotations

import torch

from ..decoding import BlockDiffusionDrafter
from ..errors import AdaptspecError

#: the adaptspec layout's learned mask, which the DFlash layout replaces by a token's embedding
_MASK_VECTOR = "mask_embedding"


def to_dflash_layout(
    drafter: BlockDiffusionDrafter,
    target,
    mask_token_id: int,
    max_block_size: int | None = None,
) -> tuple[BlockDiffusionDrafter, list[str]]:
    """``(drafter in the DFlash layout, names of its tensors that start fresh)``.

    Same target layers, depth and draft vocabulary as ``drafter``; every tensor present in
    both with the same shape is copied. ``max_block_size`` (default: ``drafter``'s) is the
    DFlash ``block_size`` the result declares (its trained block size). Refused with one
    line: a drafter whose context layers are normalised (no DFlash v1 equivalent).
    """
    c = drafter.config
    if c.normalize_context_layers:
        raise AdaptspecError("normalize_context_layers=True has no DFlash v1 equivalent; cannot re-lay this drafter")
    out = BlockDiffusionDrafter.for_target(
        target,
        num_layers=c.num_layers,
        target_layers=c.target_layers,
        max_block_size=max_block_size or c.max_block_size,
        draft_vocab=None if drafter.draft_vocab is None else drafter.draft_vocab.tolist(),
        layout="dflash",
        mask_token_id=mask_token_id,
    )
    source = {k: v for k, v in drafter.state_dict().items() if k != _MASK_VECTOR}
    mine = out.state_dict()
    mismatched = sorted(k for k, v in source.items() if k in mine and mine[k].shape != v.shape)
    unplaced = sorted(set(source) - set(mine))
    if mismatched or unplaced:
        raise AdaptspecError(f"the drafter does not fit the DFlash layout: tensor {(mismatched + unplaced)[0]!r}")
    with torch.no_grad():
        for name, value in source.items():
            mine[name].copy_(value.to(mine[name].dtype))
    return out.float(), sorted(set(mine) - set(source))


__all__ = ["to_dflash_layout"]
