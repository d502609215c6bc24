"""One target pass carrying the running rows' blocks and joining prompts' chunks together.

A joining request's prompt is prefilled in chunks that ride in the rounds' target passes
(:class:`~adaptspec.batching.engine.BatchEngine`, ``chunk_tokens``), as vLLM's scheduler mixes
prefill chunks with decode rows, instead of a prefill alone while every row waits.

The pass is one sequence ``[1, R*T + c_1 + ... + c_k]``: the rows' blocks laid out as
:func:`~adaptspec.batching.target_pass.verify_rows` lays them (``[R, T]``, padded to the widest
block), then each chunk's tokens. Every linear layer runs once over all of it (one read of the
weights); attention runs per part, through the model's own attention function: the rows as one
batched call over their KV slots (the call ``verify_rows`` makes), each chunk over its own slot
of the fill store (:class:`~adaptspec.batching.kv_slots.SlotStore`), causal from the positions
that slot already holds. A chunk costs its own tokens only (not ``R x`` its length, as one more
padded row would), and the language-model head runs on the rows' positions and on the last
position of each prompt that ends in this pass only.

During the pass the model's attention implementation is :data:`ATTENTION_NAME` (the target's
attention configs are switched for the call and switched back), which splits the pass as above
and calls the model's own implementation on each part. In ``"exact"`` verification that is the
row-wise kernel of :mod:`adaptspec.decoding.batch_invariant` and its linear layers give every
token what it gets alone, so a row is bit-identical to its pass without chunks, and a prompt that
rides whole (one chunk from position 0: the causal kernel of a prefill, on the prompt alone) to
its prefill alone. A prompt cut into chunks is not bit-identical to its prefill in one piece (the
prefill kernel's reductions depend on the prompt's length), so the exact engine never cuts one.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from adaptspec.decoding import TargetModel
>>> from adaptspec.batching.target_pass import new_store
>>> torch.manual_seed(0) and None
>>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
...                                      num_attention_heads=4, num_key_value_heads=2)).eval()
>>> target = TargetModel(model)
>>> fill = new_store(target, 1, 16, 16)
>>> fill.open(0)
>>> packer = Packer(target)
>>> prompt = torch.tensor([5, 9, 2, 7, 1])
>>> first = packer.run(None, new_store(target, 1, 16, 16), fill, [Chunk(0, prompt[:3], False)], context_layers=None, chunk_layers=[])
>>> fill.commit([3])
>>> second = packer.run(None, new_store(target, 1, 16, 16), fill, [Chunk(0, prompt[3:], True)], context_layers=None, chunk_layers=[])
>>> whole = model(prompt[None]).logits[0, -1]
>>> torch.allclose(second.chunk_logits[0], whole, atol=1e-5)
True
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from ..decoding.target import TargetModel, cache_keyword
from ..decoding.tree import DraftTree
from ..errors import AdaptspecError
from .kv_slots import SlotStore

ATTENTION_NAME = "adaptspec_packed"


@dataclass(frozen=True)
class Chunk:
    """``ids`` of one prompt, written into slot ``slot`` of the fill store after the positions it holds;
    ``last``: the prompt ends here (its last position's logits are wanted)."""

    slot: int
    ids: torch.Tensor
    last: bool


@dataclass
class PackedOutput:
    """What one packed pass computed."""

    logits: torch.Tensor | None  # [R, T, V] of the rows (None without rows)
    context: torch.Tensor | None  # [R, T, k*H] the rows' drafter context, when asked
    chunk_logits: list[torch.Tensor | None]  # each chunk's last-position logits [V] (None unless ``last``)
    chunk_hidden: list[dict[int, torch.Tensor]]  # each chunk's hidden states [c, H] at the layers asked


def attention_configs(model: nn.Module) -> list[Any]:
    """The distinct configs of ``model``'s modules that name an attention implementation."""
    seen: dict[int, Any] = {}
    for sub in model.modules():
        cfg = getattr(sub, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            seen.setdefault(id(cfg), cfg)
    return list(seen.values())


def own_attention(model: nn.Module) -> Callable[..., Any]:
    """The model's registered attention function (what each part of a packed pass runs)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    AttentionInterface.register(ATTENTION_NAME, packed_attention)
    name = model.config._attn_implementation
    if name not in ALL_ATTENTION_FUNCTIONS or name == ATTENTION_NAME:
        raise AdaptspecError(
            f"joins sharing target passes need a registered attention implementation (sdpa, or exact "
            f"verification's), the target runs {name!r}: load it with attn_implementation='sdpa'"
        )
    return ALL_ATTENTION_FUNCTIONS[name]


@contextlib.contextmanager
def packed_attention_on(configs: list[Any]) -> Iterator[None]:
    """The model's attention is :func:`packed_attention` inside the block, its own again after it."""
    before = [cfg._attn_implementation for cfg in configs]
    try:
        for cfg in configs:
            cfg._attn_implementation = ATTENTION_NAME
        yield
    finally:
        for cfg, name in zip(configs, before):
            cfg._attn_implementation = name


class PackedCache:
    """The target's cache for one packed pass: the rows' part goes to their slots (a
    :class:`~adaptspec.batching.kv_slots.SlotCache`), each chunk's to its slot in the fill store."""

    def __init__(
        self,
        store: SlotStore,
        width: int,
        fill: SlotStore,
        chunks: list[Chunk],
        trees: Sequence[DraftTree | None] | None = None,
    ) -> None:
        self.rows = store.rows if width else 0
        self.width = width
        self.rows_cache = store.pass_cache(width, trees) if self.rows else None
        self.fill = fill
        self.chunks = chunks
        if chunks:
            fill.ensure(max(fill.lengths[c.slot] + len(c.ids) for c in chunks))
        self.starts = [fill.lengths[c.slot] for c in chunks]
        offsets, at = [], self.rows * width
        for c in chunks:
            offsets.append(at)
            at += len(c.ids)
        self.offsets = offsets
        self.tokens = at
        self.chunk_kv: list[
            tuple[torch.Tensor, torch.Tensor]
        ] = []  # this layer's keys/values of each chunk's slot

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the pass's ``[1, kv_heads, N, head_dim]`` keys/values where each part belongs; return the
        rows' keys/values (a view of the store; each chunk's are kept in :attr:`chunk_kv` for
        :func:`packed_attention`, which reads the rows' from its arguments)."""
        keys, values = self.fill.keys[layer_idx], self.fill.values[layer_idx]
        self.chunk_kv = []
        for c, start, at in zip(self.chunks, self.starts, self.offsets):
            end = start + len(c.ids)
            keys[c.slot, :, start:end] = key_states[0, :, at : at + len(c.ids)].to(keys.dtype)
            values[c.slot, :, start:end] = value_states[0, :, at : at + len(c.ids)].to(values.dtype)
            self.chunk_kv.append((keys[c.slot : c.slot + 1, :, :end], values[c.slot : c.slot + 1, :, :end]))
        if self.rows_cache is None:
            return key_states, value_states  # no rows: packed_attention reads the chunks' only
        split = self.rows * self.width
        return self.rows_cache.update(
            self.rows_part(key_states, split), self.rows_part(value_states, split), layer_idx
        )

    def rows_part(self, states: torch.Tensor, split: int) -> torch.Tensor:
        """``[1, heads, N, d]`` -> the rows' ``[R, heads, T, d]`` (a view)."""
        heads, dim = states.shape[1], states.shape[3]
        return states[0, :, :split].reshape(heads, self.rows, self.width, dim).transpose(0, 1)

    def chunk_masks(self) -> list[torch.Tensor | None]:
        """Each chunk's ``[1, 1, c, start + c]`` causal mask offset by ``start`` (None from position 0:
        the plain causal case, the kernel a whole prefill runs)."""
        out: list[torch.Tensor | None] = []
        for c, start in zip(self.chunks, self.starts):
            if start == 0:
                out.append(None)
                continue
            n = len(c.ids)
            keys = torch.arange(start + n, device=c.ids.device)
            out.append((keys[None, :] <= start + torch.arange(n, device=c.ids.device)[:, None])[None, None])
        return out


@dataclass
class Pack:
    """What :func:`packed_attention` needs to split a pass: the cache, the masks, the model's own function."""

    cache: PackedCache
    rows_mask: torch.Tensor | None
    chunk_masks: list[torch.Tensor | None]
    inner: Callable[..., Any]


def packed_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    adaptspec_pack: Pack | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention of a packed pass: the rows' part and each chunk through the model's own function."""
    if adaptspec_pack is None:
        raise AdaptspecError(
            "adaptspec_packed attention runs inside a packed pass only (adaptspec.batching.packed_pass)"
        )
    pack, cache = adaptspec_pack, adaptspec_pack.cache
    heads, dim = query.shape[1], query.shape[3]
    parts = []
    if cache.rows:
        split = cache.rows * cache.width
        q = cache.rows_part(query, split)
        out, _ = pack.inner(module, q, key, value, pack.rows_mask, dropout=dropout, scaling=scaling, **kwargs)
        parts.append(out.reshape(1, split, heads, dim))
    for c, at, (k, v), mask in zip(cache.chunks, cache.offsets, cache.chunk_kv, pack.chunk_masks):
        q = query[:, :, at : at + len(c.ids)]
        out, _ = pack.inner(module, q, k, v, mask, dropout=dropout, scaling=scaling, **kwargs)
        parts.append(out)
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0], None


class Packer:
    """Runs packed passes on ``target`` (its attention configs and its own attention function, found once)."""

    def __init__(self, target: TargetModel) -> None:
        self.target = target
        self.inner = own_attention(target.model)
        self.configs = attention_configs(target.model)

    @torch.inference_mode()
    def run(
        self,
        blocks: torch.Tensor | None,
        store: SlotStore,
        fill: SlotStore,
        chunks: list[Chunk],
        context_layers: list[int] | None,
        chunk_layers: list[int],
        trees: Sequence[DraftTree | None] | None = None,
    ) -> PackedOutput:
        """Run the rows' ``blocks[R, T]`` (None: no rows; row ``i`` after its ``store.lengths[i]``
        positions; ``trees[i]``, when given and not None: row ``i``'s block is that draft tree's,
        :class:`~adaptspec.batching.kv_slots.SlotCache`) and the ``chunks`` in one target pass.

        Writes every position to its slot; the caller commits what each row keeps and each chunk's
        positions (:meth:`SlotStore.commit` of ``store`` and of ``fill``). ``context_layers``: the
        hidden-state layers of the rows' drafter context (None: none); ``chunk_layers``: the layers
        whose hidden states are returned for every chunk's positions.
        """
        target, dev = self.target, self.target.device
        width = 0 if blocks is None else blocks.shape[1]
        cache = PackedCache(store, width, fill, chunks, trees)
        split = cache.rows * width
        ids = torch.cat(([] if blocks is None else [blocks.reshape(-1)]) + [c.ids.to(dev) for c in chunks])[
            None
        ]
        positions = [] if cache.rows_cache is None else [cache.rows_cache.positions.reshape(-1)]
        positions += [start + torch.arange(len(c.ids), device=dev) for c, start in zip(chunks, cache.starts)]
        ends = [at + len(c.ids) - 1 for c, at in zip(chunks, cache.offsets) if c.last]
        keep = torch.cat([torch.arange(split, device=dev), torch.tensor(ends, dtype=torch.long, device=dev)])
        rows_mask = None if cache.rows_cache is None else cache.rows_cache.attention_mask()
        pack = Pack(cache, rows_mask, cache.chunk_masks(), self.inner)
        context = context_layers is not None and cache.rows > 0
        want_hidden = context or bool(chunk_layers)
        with packed_attention_on(self.configs):
            out = target.model(
                input_ids=ids,
                # a prepared 4-D mask is taken as it is (packed_attention uses the pack's own masks)
                attention_mask=rows_mask
                if rows_mask is not None
                else torch.ones(1, 1, 1, 1, dtype=torch.bool, device=dev),
                position_ids=torch.cat(positions)[None],
                **{cache_keyword(): cache},
                use_cache=True,
                output_hidden_states=want_hidden,
                logits_to_keep=keep,
                adaptspec_pack=pack,
            )
        logits = out.logits[0]
        rows_logits = logits[:split].reshape(cache.rows, width, -1) if cache.rows else None
        last = iter(logits[split:])
        chunk_logits = [next(last) if c.last else None for c in chunks]
        hs = out.hidden_states if want_hidden else None
        rows_context = None
        if context:
            rows_context = torch.cat([hs[i][0, :split] for i in context_layers], dim=-1).reshape(
                cache.rows, width, -1
            )
        chunk_hidden = [
            {i: hs[i][0, at : at + len(c.ids)].clone() for i in chunk_layers}
            for c, at in zip(chunks, cache.offsets)
        ]
        return PackedOutput(rows_logits, rows_context, chunk_logits, chunk_hidden)
