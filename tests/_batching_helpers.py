"""Helpers for the batching tests: a drafter that knows every request's continuation."""

from __future__ import annotations

import pytest
import torch

from _threads import torch_threads
from adaptspec.decoding import BlockDiffusionDrafter
from adaptspec.decoding.drafter import DraftState


class _TaggedState(DraftState):
    sequence: list[int] | None = None


class KnowingDrafter(BlockDiffusionDrafter):
    """Drafts from each request's known continuation (prompt + reference output), with some
    positions corrupted, so rounds accept anywhere from 0 to B - 1 drafts.

    A request is recognised by its prompt's drafter context (the target's hidden states at the
    prefill, which depend on the prompt only). The real drafter pass still runs.
    """

    def __init__(self, base: BlockDiffusionDrafter, error_rate: float, seed: int = 0):
        super().__init__(base.config, base.draft_vocab)
        self.load_state_dict(base.state_dict())
        self.__dict__["_shared"] = base._shared
        self.sequences: dict[tuple, list[int]] = {}
        self.error_rate = error_rate
        self.gen = torch.Generator().manual_seed(seed)

    @staticmethod
    def key(context_hidden: torch.Tensor) -> tuple:
        return (context_hidden.shape[0], *[round(x, 3) for x in context_hidden.float().sum(0)[:4].tolist()])

    def learn(self, context_hidden: torch.Tensor, sequence: list[int]) -> None:
        self.sequences[self.key(context_hidden)] = sequence

    def new_state(self, context_hidden=None):
        state = _TaggedState(context_hidden)
        state.sequence = self.sequences.get(self.key(context_hidden), [])
        return state

    def draft_logits(self, state, last_token, block_size):
        logits = super().draft_logits(state, last_token, block_size)
        n = state.length
        want = state.sequence[n + 1 : n + block_size]
        v = self.config.vocab_size
        for i in range(block_size - 1):
            bad = i >= len(want) or float(torch.rand(1, generator=self.gen)) < self.error_rate
            tok = int(torch.randint(v, (1,), generator=self.gen)) if bad else want[i]
            logits[i] = -1e4
            logits[i, tok] = 1e4
        return logits


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Import into a test module to run its tests on one torch thread (autouse, per module)."""
    with torch_threads(1):  # the machine's cores are shared
        yield
