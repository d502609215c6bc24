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
- attention after a cache is two plain matrix products and a softmax, with the query rows
  padded to a multiple of 4 and the keys zero-padded to a multiple of 64 and masked, so a
  block's row is reduced exactly as a one-token step's (prefill keeps the standard causal
  kernel, which plain and speculative decoding share). Measured: as fast as the fused kernel
  (0.31 vs 0.25 ms a layer for a block of 16 after 300 tokens); calling the fused kernel once
  per row instead was 20 times slower.

Padding is enough where a product's kernel, once the row count is a multiple of 4, computes each
row as a call of 4 rows does: so on the AMD EPYC hosts this was built on. On an Intel Xeon with AMX
(2 threads) a row's float32 result changes with the row count up to 16 and past it (4 against 16
rows, 16 against 128), while within a call of a given row count each row is computed alike
whatever its place and whatever rows are beside it. :func:`padding_suffices` probes this host
once per dtype; where padding is not enough, every product (the linear layers' and attention's)
runs as calls of exactly 4 rows, which costs more calls at long blocks and keeps every row's bits.

The model then computes the same function, bit for bit, whatever the block size, and its
own ``generate`` (which uses the same patched layers) is the reference the tests compare to.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION_NAME = "adaptspec_rowwise"
ROW_MULTIPLE = 4
KEY_MULTIPLE = 64
#: layer shapes (in, out) and rows up to which :func:`padding_suffices` probes the host's products
PROBE_SHAPES = ((64, 64), (64, 192), (576, 576), (576, 1536), (1536, 576))
PROBE_ROWS = 64


@functools.cache
def padding_suffices(dtype: torch.dtype) -> bool:
    """Whether this host's matrix product computes each row of a call of any multiple of
    :data:`ROW_MULTIPLE` rows (up to :data:`PROBE_ROWS`) as a call of :data:`ROW_MULTIPLE` rows does,
    on a few layer shapes (probed once per dtype; see the module docstring)."""
    g = torch.Generator().manual_seed(0)
    for k, n in PROBE_SHAPES:
        w = torch.randn(n, k, generator=g).to(dtype)
        x = torch.randn(PROBE_ROWS, k, generator=g).to(dtype)
        unit = torch.cat([F.linear(part, w) for part in x.split(ROW_MULTIPLE)])
        for m in range(2 * ROW_MULTIPLE, PROBE_ROWS + 1, ROW_MULTIPLE):
            if not torch.equal(F.linear(x[:m], w), unit[:m]):
                return False
    return True


def _by_units(product, rows: torch.Tensor, dim: int) -> torch.Tensor:
    """``product(rows)`` for ``rows`` whose size along ``dim`` is a multiple of :data:`ROW_MULTIPLE`:
    one call where padding suffices on this host, else one call of :data:`ROW_MULTIPLE` rows at a time."""
    if rows.shape[dim] == ROW_MULTIPLE or padding_suffices(rows.dtype):
        return product(rows)
    return torch.cat([product(part) for part in rows.split(ROW_MULTIPLE, dim=dim)], dim=dim)


class RowPaddedLinear(nn.Linear):
    """``nn.Linear`` whose kernel never sees a row count that is not a multiple of 4."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        pad = -rows % ROW_MULTIPLE
        flat = x.reshape(rows, x.shape[-1])
        if pad:
            flat = torch.cat([flat, flat[-1:].expand(pad, -1)])
        out = _by_units(lambda part: F.linear(part, self.weight, self.bias), flat, 0)
        return out[:rows].reshape(*x.shape[:-1], -1)


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
    """Causal attention for one unpadded sequence; query i sees keys ``[: kv - q + i + 1]``.
    A boolean ``attention_mask[R, 1, q, kv]`` after a cache (the batching engine's rows, a draft
    tree's ancestors: :mod:`adaptspec.decoding.tree_verify`) is honoured query by query
    (:func:`_each_row`).

    After a cache (decoding steps and verified blocks) every query row is computed by the
    same kernels whatever the number of queries: plain matrix products whose row count is
    padded to a multiple of 4, over keys zero-padded to a multiple of 64 and masked, so a
    row's reductions do not depend on how many rows or keys came with it.
    """
    rows_mask = (
        attention_mask is not None and attention_mask.dim() == 4 and attention_mask.dtype == torch.bool
    )
    if rows_mask and (query.shape[0] != 1 or query.shape[2] != key.shape[2]):
        return _each_row(
            module, query, key, value, attention_mask, scaling
        )  # adaptspec.batching's rows, a tree's
    if query.shape[0] != 1:
        raise ValueError(
            "this model was patched by adaptspec for batch-invariant decoding of one sequence at a "
            "time (TargetModel(verification='exact')); use an unpatched copy for batched work"
        )
    n_heads, q_len, dim = query.shape[1:]
    kv_heads, kv_len = key.shape[1], key.shape[2]
    scale = dim**-0.5 if scaling is None else scaling
    if q_len == kv_len:  # prefill: the standard causal kernel (the same for every block size)
        out = F.scaled_dot_product_attention(
            query, key, value, scale=scale, is_causal=q_len > 1, enable_gqa=n_heads != kv_heads
        )
        return out.transpose(1, 2).contiguous(), None
    group = n_heads // kv_heads
    padded = -(-kv_len // KEY_MULTIPLE) * KEY_MULTIPLE
    k, v = key[0], value[0]
    if padded > kv_len:
        k = torch.cat([k, k.new_zeros(kv_heads, padded - kv_len, dim)], dim=1)
        v = torch.cat([v, v.new_zeros(kv_heads, padded - kv_len, dim)], dim=1)
    rows = group * q_len  # the queries of each key/value head, (head in group, position) order
    q = query[0].reshape(kv_heads, rows, dim)
    extra = -rows % ROW_MULTIPLE
    if extra:
        q = torch.cat([q, q[:, -1:].expand(kv_heads, extra, dim)], dim=1)
    scores = _by_units(lambda part: torch.matmul(part, k.transpose(1, 2)), q, 1).float() * scale
    pos = torch.arange(q_len, device=q.device).repeat(group)
    if extra:
        pos = torch.cat([pos, pos[-1:].expand(extra)])
    hidden = torch.arange(padded, device=q.device)[None, :] > (kv_len - q_len + pos)[:, None]
    probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1).to(v.dtype)
    out = _by_units(lambda part: torch.matmul(part, v), probs, 1)[:, :rows].reshape(1, n_heads, q_len, dim)
    return out.transpose(1, 2).contiguous(), None


def _each_row(module, query, key, value, mask, scaling):
    """Sequences of different lengths in one pass (:mod:`adaptspec.batching`), each query seeing the
    keys ``mask[r, 0, q]`` marks: a row whose every query sees a prefix of its keys, one longer per
    query (a chain), through the one-sequence kernel above over the keys its last query sees, made
    contiguous; any other row (a draft tree's: :mod:`adaptspec.decoding.tree_verify`), one query at
    a time over the keys it sees, gathered in order. A tree node's keys are then laid out as the
    chain of its path lays them out, so it computes what that chain computes, bit for bit. Every
    row computes what it computes alone."""
    q_len, kv_len = mask.shape[2], mask.shape[3]
    sees = mask[:, 0]
    counts = sees.sum(-1)  # [R, q]
    chain = (
        torch.arange(kv_len, device=mask.device)
        < (counts[:, -1:] - q_len + 1 + torch.arange(q_len, device=mask.device))[..., None]
    )
    lengths, is_chain = torch.stack(
        [counts[:, -1], (chain == sees).all(-1).all(-1).long()]
    ).tolist()  # one host sync
    out = []
    for r, (n, plain) in enumerate(zip(lengths, is_chain)):
        if plain:
            out.append(
                rowwise_attention(
                    module,
                    query[r : r + 1],
                    key[r : r + 1, :, :n].contiguous(),
                    value[r : r + 1, :, :n].contiguous(),
                    None,
                    scaling=scaling,
                )[0]
            )
            continue
        seen = sees[r].nonzero()[:, 1].split(counts[r].tolist())  # each query's keys, in order
        each = [
            rowwise_attention(
                module,
                query[r : r + 1, :, q : q + 1],
                key[r : r + 1][:, :, idx],
                value[r : r + 1][:, :, idx],
                None,
                scaling=scaling,
            )[0]
            for q, idx in enumerate(seen)
        ]
        out.append(torch.cat(each, dim=1))
    return torch.cat(out), None


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


def standard_copy(model: nn.Module, attn_implementation: str = "sdpa") -> nn.Module:
    """A deep copy of a patched model with the standard kernels back: what plain decoding of the
    same weights runs (baselines in the demo and the benchmarks)."""
    import copy

    out = copy.deepcopy(model)
    for sub in out.modules():
        if type(sub) is RowPaddedLinear:
            sub.__class__ = nn.Linear
        cfg = getattr(sub, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", None) == ATTENTION_NAME:
            cfg._attn_implementation = attn_implementation
    return out
