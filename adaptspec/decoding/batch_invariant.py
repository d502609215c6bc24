"""Batch-invariant target: verifying a block computes each row exactly as decoding it alone.

Lossless speculative decoding needs the target's logits at every block position to be the
logits that plain decoding computes there. Fast CPU kernels do not promise that. Measured
here (torch 2.13, x86-64): a bfloat16 matrix product with one row takes another kernel
than with two or more rows, and float32 ones differ unless the row count is a multiple of
four; fused attention tiles masked keys differently for a block than for one query. The
last-bit differences flip greedy choices within a few dozen tokens in bfloat16.

:func:`make_batch_invariant` fixes both on a transformers model:

- every ``nn.Linear`` pads its rows to a multiple of 4 (one decoding step then runs the
  same kernel as a block; the padding rows cost little as a single row is memory-bound);
- attention computes each query of a block against exactly the keys it may see, with the
  call a one-token step makes (prefill keeps the standard causal kernel).

The model then computes the same function, bit for bit, whatever the block size, and its
own ``generate`` (which uses the same patched layers) is the reference the tests compare to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION_NAME = "adaptspec_rowwise"
ROW_MULTIPLE = 4


class RowPaddedLinear(nn.Linear):
    """``nn.Linear`` whose kernel never sees a row count that is not a multiple of 4."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        pad = -rows % ROW_MULTIPLE
        if pad == 0:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, x.shape[-1])
        flat = torch.cat([flat, flat[-1:].expand(pad, -1)])
        return F.linear(flat, self.weight, self.bias)[:rows].reshape(*x.shape[:-1], -1)


def rowwise_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal attention for one unpadded sequence; query i sees keys ``[: kv - q + i + 1]``."""
    if query.shape[0] != 1:
        raise ValueError(
            "this model was patched by adaptspec for batch-invariant decoding of one sequence at a "
            "time (TargetModel(batch_invariant=True)); use an unpatched copy for batched work"
        )
    gqa = query.shape[1] != key.shape[1]
    q_len, kv_len = query.shape[2], key.shape[2]
    if q_len == kv_len:  # prefill: the standard causal kernel
        out = F.scaled_dot_product_attention(query, key, value, scale=scaling, is_causal=q_len > 1, enable_gqa=gqa)
    else:
        past = kv_len - q_len
        out = torch.cat(
            [
                F.scaled_dot_product_attention(
                    query[:, :, i : i + 1],
                    key[:, :, : past + i + 1],
                    value[:, :, : past + i + 1],
                    scale=scaling,
                    enable_gqa=gqa,
                )
                for i in range(q_len)
            ],
            dim=2,
        )
    return out.transpose(1, 2).contiguous(), None


def make_batch_invariant(model: nn.Module) -> nn.Module:
    """Patch a transformers causal LM in place (see the module docstring); returns it."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, rowwise_attention)
    for sub in model.modules():
        if type(sub) is nn.Linear:
            sub.__class__ = RowPaddedLinear
        cfg = getattr(sub, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = ATTENTION_NAME
    return model


def is_batch_invariant(model: nn.Module) -> bool:
    return getattr(model.config, "_attn_implementation", None) == ATTENTION_NAME
