"""Sampling at ``temperature > 0`` keyed by position: exact in distribution, and the same sample
whatever the block size, the round schedule or the batch.

The token at output position ``p`` (0: the token chosen at prefill) is
``argmax(logits_p / T + G_p)``, where ``G_p`` is a vector of independent standard Gumbel
variables drawn from a generator keyed by ``(seed, p)`` (:class:`SampleKeys`): the Gumbel-max
trick, so the token is distributed exactly as ``softmax(logits_p / T)``, and the keys of
different positions are independent, so the whole output is the target's own sampling.

Speculation uses the same noise (a coupling): the drafter proposes
``argmax(draft_logits / T + G_p)`` at position ``p`` (its vocabulary read through its target
ids), and a draft is accepted when it equals the target's keyed sample at its position
(:func:`accept_keyed`), as a greedy draft is accepted when it equals the target's argmax. The
committed tokens are then the target's keyed samples, the drafts decide only how many of them
one round commits. So a seed gives a request the same tokens at block size 1 or 16, under any
per-round rule, alone or batched with others, in the single-request decoder
(:mod:`adaptspec.decoding.decoder`) and in the batched engine (:mod:`adaptspec.batching`):
wherever the target's logits at each position are the same (``"exact"`` verification makes them
bit-identical; ``"fast"`` can move them by rounding, which flips a sample only where two
perturbed logits tie within it).

The cost against speculative sampling's accept/reject test (Leviathan et al. 2023): the chance
that a draft is accepted is that of the Gumbel coupling of ``q`` and ``p``, at least
``(1 - TV) / (1 + TV)`` with ``TV`` their total-variation distance, where accept/reject reaches
``1 - TV``: a little lower when the drafter is unsure, the same when drafter and target agree.
The noise costs one draw of ``V`` uniform numbers per output position (each position is drawn
once, a round's rejected tail kept for the next round): about 0.5 ms a token for SmolLM2's
49,152 ids on one shared CPU core, against 30-50 ms a round.

>>> import torch
>>> keys = SampleKeys(1234)
>>> logits = torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 9.0]])  # the target is sure: 1, then 2
>>> accept_keyed(logits, torch.tensor([1]), keys.noise(5, 2, 3, logits.device), temperature=1.0)
[1, 2]
>>> keys.noise(5, 2, 3, logits.device).equal(torch.cat([keys.noise(5, 1, 3, logits.device), keys.noise(6, 1, 3, logits.device)]))
True
"""

from __future__ import annotations

import secrets

import torch

__all__ = ["SampleKeys", "accept_keyed", "draft_keyed", "sample_keyed"]

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit ints that spreads every input bit."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class SampleKeys:
    """The Gumbel noise of one request's output positions, keyed by ``(seed, position)``.

    ``seed`` None draws a fresh 63-bit seed (an unseeded request: independent of every other)."""

    def __init__(self, seed: int | None) -> None:
        self.seed = secrets.randbits(63) if seed is None else int(seed)
        self._drawn: dict[
            int, torch.Tensor
        ] = {}  # positions drawn and not yet passed: a round's rejected tail

    def key(self, position: int) -> int:
        """The generator seed of output position ``position`` (a 64-bit int)."""
        return _mix(_mix(self.seed & _MASK) ^ int(position))

    def noise(self, start: int, count: int, vocab: int, device: torch.device) -> torch.Tensor:
        """Standard Gumbel noise ``[count, vocab]`` (float32) of positions ``start .. start + count - 1``.

        Positions asked again (a round's rejected tail, verified again next round) are drawn once:
        the noise of the positions from ``start`` on is kept until a later call starts past them."""
        rows = []
        for p in range(start, start + count):
            row = self._drawn.get(p)
            if row is None or row.shape[0] != vocab:
                g = torch.Generator(device=device)
                g.manual_seed(self.key(p))
                # u in [0, 1): -log(-log(u)) is standard Gumbel; u = 0 gives -inf (never the argmax)
                row = (
                    torch.rand(vocab, generator=g, device=device, dtype=torch.float32)
                    .log_()
                    .neg_()
                    .log_()
                    .neg_()
                )
            rows.append(row)
        self._drawn = {p: row for p, row in zip(range(start, start + count), rows)}
        return torch.stack(rows) if rows else torch.empty(0, vocab, dtype=torch.float32, device=device)


def sample_keyed(logits: torch.Tensor, noise: torch.Tensor, temperature: float) -> list[int]:
    """The keyed samples of ``logits[n, V]`` at ``temperature`` with their positions' ``noise[n, V]``."""
    return (logits.float() / temperature + noise).argmax(-1).tolist()


def draft_keyed(
    draft_logits: torch.Tensor,
    noise: torch.Tensor,
    temperature: float,
    target_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The drafter's proposals ``[n]`` (draft-vocabulary indices): ``argmax(draft_logits / T + G)``
    over ``draft_logits[n, V_draft]``, the noise ``[n, V]`` of the target's vocabulary read at
    ``target_ids[V_draft]`` (the drafter's vocabulary as target ids; None: the same vocabulary)."""
    if target_ids is not None:
        noise = noise[:, target_ids.to(noise.device)]
    return (draft_logits.float().to(noise.device) / temperature + noise).argmax(-1)


def accept_keyed(
    logits: torch.Tensor, drafts: torch.Tensor, noise: torch.Tensor, temperature: float
) -> list[int]:
    """Committed tokens of one verified block: ``logits[b, V]`` of its positions, ``drafts[b - 1]``
    (target ids) and the positions' ``noise[b, V]``: the drafts equal to the target's keyed samples,
    in order, then the target's keyed sample after them (1..b tokens)."""
    best = (logits.float() / temperature + noise).argmax(-1)
    j = int((best[:-1] == drafts).int().cumprod(0).sum()) if len(drafts) else 0
    return drafts[:j].tolist() + [int(best[j])]
