"""Per-row KV storage for continuous batching: one preallocated slot per active request.

Every layer keeps keys and values in ``[max_rows, kv_heads, capacity, head_dim]`` tensors;
row ``i`` holds ``lengths[i]`` committed positions. The active rows are always slots
``0 .. rows - 1`` (a leaving row's slot is filled by the last row), so a round reads the
store as a view, without copies. A round writes row ``i``'s ``T`` new positions at
``lengths[i] .. lengths[i] + T - 1``, whatever the other rows' lengths; committing ``tau_i``
of them is ``lengths[i] += tau_i``: the rejected tail is overwritten by the next round, so
rollback costs nothing and leaves no holes.

:class:`SlotCache` is what the target model sees as its cache during a batched pass (it
implements the one method transformers' attention layers call, ``update``).

>>> import torch
>>> store = SlotStore(num_layers=1, max_rows=2, kv_heads=1, head_dim=2, capacity=8, dtype=torch.float32)
>>> store.load(0, [(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))])  # a 3-token prefill
>>> store.load(1, [(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))])
>>> store.lengths
[3, 5]
>>> cache = store.pass_cache(width=2)          # a round verifying 2 positions a row
>>> k, v = cache.update(torch.full((2, 1, 2, 2), 7.0), torch.full((2, 1, 2, 2), 7.0), 0)
>>> k.shape                                    # keys up to the longest row's new end
torch.Size([2, 1, 7, 2])
>>> k[0, 0, :, 0].tolist()                     # row 0: its 3 keys, then the 2 new ones
[1.0, 1.0, 1.0, 7.0, 7.0, 0.0, 0.0]
>>> store.commit([1, 2])                       # row 0 keeps 1 new position, row 1 both
>>> store.lengths
[4, 7]
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..decoding.tree import DraftTree
from ..decoding.tree_verify import path_moves
from ..errors import AdaptspecError


class SlotStore:
    """Keys and values of up to ``max_rows`` sequences, each in its own slot (see the module docstring).

    ``capacity`` grows (doubling, a copy) up to ``max_capacity`` as rows get longer.
    """

    def __init__(
        self,
        num_layers: int,
        max_rows: int,
        kv_heads: int,
        head_dim: int,
        capacity: int = 256,
        max_capacity: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.max_rows = max_rows
        self.max_capacity = max_capacity or 1 << 62
        self.capacity = min(capacity, self.max_capacity)
        shape = (max_rows, kv_heads, self.capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lengths: list[int] = []  # committed positions of each active row (slot i = row i)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def ensure(self, length: int) -> None:
        """Make room for ``length`` positions in every slot."""
        if length <= self.capacity:
            return
        if length > self.max_capacity:
            raise AdaptspecError(f"{length} positions exceed the KV store's capacity of {self.max_capacity}")
        new = self.capacity
        while new < length:
            new *= 2
        new = min(new, self.max_capacity)
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                grown = t.new_zeros(t.shape[0], t.shape[1], new, t.shape[3])
                grown[:, :, : self.capacity] = t
                store[i] = grown
        self.capacity = new

    def open(self, slot: int) -> None:
        """Start an empty sequence in ``slot``, which must be the next free one (passes fill it)."""
        if slot != self.rows or slot >= self.max_rows:
            raise AdaptspecError(
                f"slot {slot} is not the next free slot ({self.rows} of {self.max_rows} used)"
            )
        self.lengths.append(0)

    def load(self, slot: int, layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put one sequence's cache (per layer ``(keys, values)``, each ``[1, kv_heads, n, head_dim]``)
        into ``slot``, which must be the next free one."""
        n = layers[0][0].shape[2]
        self.ensure(n)
        self.open(slot)
        for (k, v), ks, vs in zip(layers, self.keys, self.values):
            ks[slot, :, :n] = k[0]
            vs[slot, :, :n] = v[0]
        self.lengths[slot] = n

    def layers(self, slot: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer ``(keys, values)`` of ``slot``'s committed positions, ``[1, kv_heads, n, head_dim]``
        views (what :meth:`load` takes)."""
        n = self.lengths[slot]
        return [
            (k[slot : slot + 1, :, :n], v[slot : slot + 1, :, :n]) for k, v in zip(self.keys, self.values)
        ]

    def remove(self, slot: int) -> None:
        """Free ``slot``; the last row moves into it (so rows stay ``0 .. rows - 1``)."""
        last = self.rows - 1
        if slot != last:
            n = self.lengths[last]
            for store in (self.keys, self.values):
                for t in store:
                    t[slot, :, :n] = t[last, :, :n]
            self.lengths[slot] = n
        self.lengths.pop()

    def pass_cache(self, width: int, trees: Sequence[DraftTree | None] | None = None) -> "SlotCache":
        """The cache for one batched pass writing ``width`` positions in every active row; ``trees[i]``
        (when given and not None): row ``i``'s positions are that draft tree's root and nodes."""
        self.ensure(max(self.lengths) + width)
        return SlotCache(self, width, trees)

    def keep_path(self, slot: int, path: list[int]) -> None:
        """After a tree pass, before :meth:`commit`: move the accepted ``path``'s positions (block indices
        of the tree ``slot`` verified after its committed ones) to a chain's places, so that committing
        ``1 + len(path)`` positions keeps the root's and the path's (as
        :func:`~adaptspec.decoding.tree_verify.keep_path` does to a sequence's cache)."""
        moves = path_moves(path)
        if not moves:
            return
        n = self.lengths[slot]
        dst = torch.tensor([n + d for d, _ in moves], device=self.keys[0].device)
        src = torch.tensor([n + i for _, i in moves], device=self.keys[0].device)
        for store in (self.keys, self.values):
            for t in store:
                t[slot, :, dst] = t[slot, :, src]

    def commit(self, kept: Sequence[int]) -> None:
        """After a pass: row ``i`` keeps the first ``kept[i]`` positions it wrote."""
        self.lengths = [n + k for n, k in zip(self.lengths, kept)]


class SlotCache:
    """The target's cache for one batched pass (transformers calls ``update`` once per layer).

    Row ``i`` writes its ``T`` positions at ``lengths[i] .. lengths[i] + T - 1`` (:attr:`slots`). A
    chain row's position ids are those places and its query ``q`` sees keys up to its own; a draft
    tree row's (``trees[i]``, :mod:`adaptspec.decoding.tree`) block index ``b`` has position id
    ``lengths[i] + depth(b)`` and sees the row's committed keys and its ancestors' only (the places
    past the tree's nodes, padding, see the root and themselves)."""

    def __init__(self, store: SlotStore, width: int, trees: Sequence[DraftTree | None] | None = None) -> None:
        self.store = store
        self.width = width
        rows = store.rows
        device = store.keys[0].device
        self.starts = torch.tensor(store.lengths, device=device)  # [R], one host -> device copy a pass
        self.slots = self.starts[:, None] + torch.arange(
            width, device=device
        )  # [R, T] where each position is written
        self.rows = torch.arange(rows, device=device)[:, None]
        self.key_length = max(store.lengths) + width
        self.blocks = None  # [R, T, T] which of its row's block positions each query sees (trees only)
        if trees is None or all(t is None for t in trees):
            self.positions = self.slots  # [R, T] position ids
        else:
            offsets, self.blocks = block_layout(trees, width, device)
            self.positions = self.starts[:, None] + offsets

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the pass's ``[R, kv_heads, T, head_dim]`` keys/values at each row's own places;
        return every row's keys/values up to the longest row's end (a view of the store)."""
        s, r = self.store, self.store.rows
        keys, values = s.keys[layer_idx], s.values[layer_idx]
        keys[self.rows, :, self.slots] = key_states.transpose(1, 2).to(keys.dtype)
        values[self.rows, :, self.slots] = value_states.transpose(1, 2).to(values.dtype)
        return keys[:r, :, : self.key_length], values[:r, :, : self.key_length]

    def attention_mask(self) -> torch.Tensor:
        """``[R, 1, T, K]`` booleans: query ``q`` of a chain row ``i`` sees keys ``j <= lengths[i] + q``;
        a tree row's, its committed keys and the block positions :func:`block_layout` gives it."""
        keys = torch.arange(self.key_length, device=self.slots.device)
        if self.blocks is None:
            return (keys[None, None, :] <= self.slots[:, :, None])[:, None]
        rel = keys[None, :] - self.starts[:, None]  # [R, K]: the key's place in its row's block
        inside = (rel >= 0) & (rel < self.width)
        at = rel.clamp(0, self.width - 1)[:, None, :].expand(-1, self.width, -1)
        sees = self.blocks.gather(2, at) & inside[:, None, :]
        return (sees | (rel < 0)[:, None, :])[:, None]


def block_layout(
    trees: Sequence[DraftTree | None], width: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's position offsets ``[R, T]`` and which of its block positions each query sees
    ``[R, T, T]``: a chain row (None) ``q`` and the positions up to ``q``; a tree row its block indices'
    depths and ancestors (:meth:`~adaptspec.decoding.tree.DraftTree.ancestors`), the padding after its
    nodes at depth 0, seeing the root and itself."""
    offsets = torch.arange(width).repeat(len(trees), 1)
    blocks = torch.ones(width, width, dtype=torch.bool).tril().repeat(len(trees), 1, 1)
    for i, tree in enumerate(trees):
        if tree is None:
            continue
        k = tree.nodes + 1
        offsets[i, :k] = torch.tensor(tree.depths)
        offsets[i, k:] = 0
        blocks[i] = torch.eye(width, dtype=torch.bool)
        blocks[i, :k, :k] = tree.ancestors()
        blocks[i, k:, 0] = True
    return offsets.to(device), blocks.to(device)
