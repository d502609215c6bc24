"""Requests joining in chunks: which prompt tokens ride in the next pass, and what the passes left.

A joining request takes a slot of the fill store (a :class:`~adaptspec.batching.kv_slots.SlotStore`
of its own, slot ``i`` holding ``fills.fillings[i]``'s prompt) and a place among the engine's
rows. Each round :meth:`Fills.plan` gives the pass its chunks, first come first served, up to a
token budget; after the pass :meth:`Fills.absorb` commits each chunk's positions and keeps its
hidden states (those the request's drafter context and features need), and says which prompts
have ended: the engine then starts their rows from the fill store's slots.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from adaptspec.decoding import TargetModel
>>> from adaptspec.batching.rows import RequestHandle
>>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
...                                      num_attention_heads=4, num_key_value_heads=2)).eval()
>>> fills = Fills(TargetModel(model), max_rows=4, capacity=16, max_capacity=64)
>>> for rid, n in ((0, 7), (1, 3)):
...     fills.add(RequestHandle(rid, list(range(n)), 1, 4, 0.0, None), torch.arange(n))
>>> [(c.slot, len(c.ids), c.last) for c in fills.plan(budget=5, whole=False)]   # first come first served
[(0, 5, False)]
>>> [(c.slot, len(c.ids), c.last) for c in fills.plan(budget=None, whole=False)]
[(0, 7, True), (1, 3, True)]
"""

from __future__ import annotations

import torch

from ..decoding.target import TargetModel
from .packed_pass import Chunk, PackedOutput
from .rows import Filling, RequestHandle
from .target_pass import new_store


class Fills:
    """The prompts being prefilled in chunks and their keys/values (see the module docstring)."""

    def __init__(self, target: TargetModel, max_rows: int, capacity: int, max_capacity: int) -> None:
        self.store = new_store(target, max_rows, capacity, max_capacity)
        self.fillings: list[Filling] = []

    def __len__(self) -> int:
        return len(self.fillings)

    def add(self, handle: RequestHandle, ids: torch.Tensor) -> None:
        """``handle``'s checked prompt ``ids`` starts filling (in the next free slot)."""
        self.store.open(len(self.fillings))
        self.fillings.append(Filling(handle, ids))

    def remove(self, indices: list[int]) -> None:
        """Free the slots at ``indices`` (highest first: the last filling moves into each hole)."""
        for i in sorted(indices, reverse=True):
            self.store.remove(i)
            self.fillings[i] = self.fillings[-1]
            self.fillings.pop()

    def plan(self, budget: int | None, whole: bool) -> list[Chunk]:
        """The chunks of the next pass: prompts in the order they were submitted, ``budget`` prompt
        tokens in all (None: no limit); ``whole``: a prompt is never cut (then the budget bounds how
        many start; at least one does)."""
        chunks: list[Chunk] = []
        left = budget
        for i in sorted(range(len(self.fillings)), key=lambda i: self.fillings[i].handle.id):
            if left is not None and left <= 0:
                break
            f = self.fillings[i]
            n = f.left if whole or left is None else min(f.left, left)
            chunks.append(Chunk(i, f.ids[f.done : f.done + n], last=n == f.left))
            if left is not None:
                left -= n
        return chunks

    def absorb(self, chunks: list[Chunk], out: PackedOutput) -> list[tuple[int, torch.Tensor]]:
        """After the pass that ran ``chunks``: their positions committed, their hidden states kept; the
        slots whose prompts ended, with their last position's logits ``[V]``."""
        kept = [0] * len(self.fillings)
        ended = []
        for c, logits, hidden in zip(chunks, out.chunk_logits, out.chunk_hidden):
            f = self.fillings[c.slot]
            f.done += len(c.ids)
            kept[c.slot] = len(c.ids)
            for layer, h in hidden.items():
                f.hidden.setdefault(layer, []).append(h)
            if c.last:
                ended.append((c.slot, logits))
        self.store.commit(kept)
        return ended
