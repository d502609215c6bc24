"""A drafter of adaptspec's layout re-shaped into the DFlash v1 architecture, keeping its weights.

The bundled drafter (adaptspec's layout: a learned mask vector, no q/k norm) cannot run in
engines that load DFlash v1 drafters (vLLM's ``dflash`` method among them). Every other
tensor has the same shape in both architectures, so :func:`to_dflash_layout` builds a
DFlash-layout drafter for the same target and copies them; the per-head q/k RMS norms start
at ones and the mask becomes the target's embedding of ``mask_token_id``. Those two changes
alter every draft, so the result is a starting point for fine-tuning
(``adaptspec train-drafter --init-from DIR``), not a finished drafter.

:func:`qk_scales` and :func:`calibrate_qk_norms` start the norms closer: a per-head RMS norm
rescales every query (key) to the same length, so with its weight set to the mean length the
source drafter's queries and keys had (measured on training text), a head of typical length
comes out unchanged and the attention logits keep their scale. On the bundled drafter and the
first 60 benchmark prompts (B = 4) that took tau from 1.21 (norms at ones) to 1.43; the source
had 1.62.

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
        raise AdaptspecError(
            "normalize_context_layers=True has no DFlash v1 equivalent; cannot re-lay this drafter"
        )
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
        raise AdaptspecError(
            f"the drafter does not fit the DFlash layout: tensor {(mismatched + unplaced)[0]!r}"
        )
    with torch.no_grad():
        for name, value in source.items():
            mine[name].copy_(value.to(mine[name].dtype))
    return out.float(), sorted(set(mine) - set(source))


def qk_scales(drafter: BlockDiffusionDrafter, run) -> list[tuple[float, float]]:
    """Per layer, the mean RMS of one query head and of one key head (as the projections give
    them, before any q/k norm) over everything ``run()`` makes ``drafter`` compute."""
    hd = drafter.config.head_dim
    sums = [[0.0, 0, 0.0, 0] for _ in drafter.layers]

    def hook(i: int, slot: int):
        def record(module, inputs, out) -> None:
            rms = out.detach().float().reshape(-1, hd).pow(2).mean(-1).sqrt()
            sums[i][slot] += float(rms.sum())
            sums[i][slot + 1] += rms.numel()

        return record

    handles = [
        h
        for i, layer in enumerate(drafter.layers)
        for h in (
            layer.q_proj.register_forward_hook(hook(i, 0)),
            layer.k_proj.register_forward_hook(hook(i, 2)),
        )
    ]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    if any(nq == 0 or nk == 0 for _, nq, _, nk in sums):
        raise AdaptspecError("qk_scales: run() computed no queries or keys in some layer")
    return [(q / nq, k / nk) for q, nq, k, nk in sums]


def calibrate_qk_norms(drafter: BlockDiffusionDrafter, scales: list[tuple[float, float]]) -> None:
    """Set each layer's q/k norm weights to its ``(query, key)`` scale (:func:`qk_scales`)."""
    if not drafter.config.qk_norm or len(scales) != len(drafter.layers):
        raise AdaptspecError(
            f"calibrate_qk_norms: needs a drafter with q/k norms and {len(drafter.layers)} scales"
        )
    with torch.no_grad():
        for layer, (q, k) in zip(drafter.layers, scales):
            layer.q_norm.weight.fill_(q)
            layer.k_norm.weight.fill_(k)


__all__ = ["calibrate_qk_norms", "qk_scales", "to_dflash_layout"]
