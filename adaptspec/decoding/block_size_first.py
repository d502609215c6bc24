"""A speculator over a decode loop that must know its block size before it prefills.

Many reference loops (DFlash's among them) are one function, ``generate(prompt_ids, block_size,
max_new_tokens)``: it sizes its buffers from the block size, prefills, then drafts and verifies.
:class:`~adaptspec.speculator.BlockSpeculator` asks the other way round: ``prefill`` first (its
features are what the policy decides the block size from), then ``decode`` at the decided size.
:class:`BlockSizeFirst` bridges the two without splitting the loop:

- ``look(prompt_ids, temperature=0.0, seed=None) -> Prefill``: one pass of the target over the
  prompt, giving the first token and the features (its ``state`` is not used);
- ``generate(prompt_ids, block_size, max_new_tokens, temperature=0.0, seed=None) -> Outcome``:
  your loop as it is, its own prefill included, at one block size for the whole request.

``prefill`` runs ``look`` and keeps the prompt; ``decode`` runs ``generate`` at the decided block
size. The price: the prompt is prefilled twice (by ``look``, then inside the loop). When that
matters, split the loop instead: size its buffers for ``max_block_size`` in ``prefill`` and take
the block size in ``decode`` (docs/bring-your-own.md, "Loops that take the block size first").

The loop's first token must be ``look``'s (same greedy argmax, or the same ``seed`` at T > 0:
``decode`` passes the loop the seed ``prefill`` had, a fresh random one when it had none);
a different one is refused in one line, since ``generate``'s caller may already have streamed
``look``'s. A per-round schedule is asked once, before the loop runs (the loop keeps one block
size), and ``on_round`` is called for every round when the loop returns, with the tokens that
round committed.

>>> from adaptspec.speculator import Outcome, Prefill, Round
>>> def look(ids, temperature=0.0, seed=None):            # the target's pass over the prompt
...     return Prefill(first_token=7, prompt_tokens=len(ids), features=np.ones(4, np.float32))
>>> def generate(ids, block_size, max_new_tokens, temperature=0.0, seed=None):
...     rounds = [Round(block_size, 1, 0.001, 0.002)] * (max_new_tokens - 1)   # never accepts a draft
...     return Outcome([7] * max_new_tokens, rounds, decode_s=0.003 * len(rounds))
>>> spec = BlockSizeFirst(look, generate, max_block_size=8)
>>> pre = spec.prefill([1, 2, 3])
>>> out = spec.decode(pre, 4, 5, on_round=lambda tokens, r: print(tokens, r.block_size))
[7] 4
[7] 4
[7] 4
[7] 4
>>> out.new_tokens, spec.per_round, spec.feature_dim
(5, False, None)
"""

from __future__ import annotations

import secrets
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import AdaptspecError
from ..schedules.fixed import as_schedule
from ..speculator import Outcome, Prefill, Round, RoundSchedule

__all__ = ["BlockSizeFirst"]


class BlockSizeFirst:
    """A :class:`~adaptspec.speculator.BlockSpeculator` over ``look`` and a whole-request
    ``generate`` loop (see the module docstring). ``max_block_size`` is the largest block the
    loop can draft; ``feature_dim``, when given, the length of ``look``'s features."""

    #: the protocol's declaration: the loop keeps one block size for a whole request, so the
    #: controller refuses per-round options (``redecide_every``, ``round_rule``)
    per_round = False

    def __init__(
        self,
        look: Callable[..., Prefill],
        generate: Callable[..., Outcome],
        max_block_size: int,
        feature_dim: int | None = None,
    ) -> None:
        for name, fn in (("look", look), ("generate", generate)):
            if not callable(fn):
                raise AdaptspecError(f"BlockSizeFirst: {name} must be callable, got {fn!r}")
        if (
            isinstance(max_block_size, bool)
            or not isinstance(max_block_size, (int, np.integer))
            or max_block_size < 1
        ):
            raise AdaptspecError(
                f"BlockSizeFirst: max_block_size must be an integer >= 1, got {max_block_size!r}"
            )
        self.look = look
        self.generate = generate
        if feature_dim is not None and (
            isinstance(feature_dim, bool) or not isinstance(feature_dim, (int, np.integer)) or feature_dim < 1
        ):
            raise AdaptspecError(
                f"BlockSizeFirst: feature_dim must be an integer >= 1 or None, got {feature_dim!r}"
            )
        self.max_block_size = int(max_block_size)
        #: the length of look's features (the protocol's declaration; None: the first request fixes it)
        self.feature_dim = None if feature_dim is None else int(feature_dim)

    def prefill(
        self, prompt_ids: Sequence[int], temperature: float = 0.0, seed: int | None = None
    ) -> Prefill:
        ids = [int(i) for i in prompt_ids]
        if seed is None and temperature > 0:
            seed = secrets.randbits(31)  # look and the loop must sample the first token alike
        pre = self.look(ids, temperature=temperature, seed=seed)
        if not isinstance(pre, Prefill):
            raise AdaptspecError(f"BlockSizeFirst: look returned {type(pre).__name__}, not a Prefill")
        return Prefill(pre.first_token, pre.prompt_tokens, pre.features, state=(ids, seed))

    def decode(
        self,
        prefill: Prefill,
        block_size: "int | RoundSchedule",
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        on_round: Callable[[list[int], Round], None] | None = None,
    ) -> Outcome:
        ids, prefill_seed = prefill.state
        b = as_schedule(block_size).draft_size([])  # asked once: the loop keeps it for the whole request
        if not 1 <= b <= self.max_block_size:
            raise AdaptspecError(f"BlockSizeFirst: block size {b} outside 1..{self.max_block_size}")
        out = self.generate(
            ids, b, max_new_tokens, temperature=temperature, seed=prefill_seed if seed is None else seed
        )
        if not isinstance(out, Outcome):
            raise AdaptspecError(f"BlockSizeFirst: generate returned {type(out).__name__}, not an Outcome")
        if out.tokens[:1] != [prefill.first_token]:
            raise AdaptspecError(
                f"BlockSizeFirst: the loop's first token {out.tokens[:1]} is not look's "
                f"{prefill.first_token}: both must choose it alike (at T > 0, from the same seed)"
            )
        if on_round is not None:
            _replay_rounds(out, on_round)
        return out


def _replay_rounds(out: Outcome, on_round: Callable[[list[int], Round], Any]) -> None:
    """``on_round(tokens, round)`` for each round of a finished outcome, in order (the first token,
    chosen at prefill, is in no round)."""
    at = 1
    for r in out.rounds:
        on_round(list(out.tokens[at : at + r.tau]), r)
        at += r.tau
