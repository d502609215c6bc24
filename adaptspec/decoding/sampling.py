"""Speculative sampling for one verified block: exact in distribution at ``temperature > 0``.

Each draft ``d_i`` (drawn from the drafter's ``q``) is accepted with probability
``min(1, p(d_i) / q(d_i))`` in order; the first rejected position is resampled from
``normalise(max(0, p - q))``; when every draft is accepted the bonus token comes from ``p``.
The committed tokens are then distributed exactly as the target samples them (Leviathan et al.
2023; Chen et al. 2023). The single-request decoder (:mod:`adaptspec.decoding.decoder`) and the
batched engine (:mod:`adaptspec.batching`) both draw through this function, in the same order
from the request's own generator, so a seed gives a request the same tokens in either.

>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> logits = torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 9.0]])   # the target is sure: 1, then 2
>>> q = torch.tensor([[0.0, 1.0, 0.0]])                          # the drafter drafted 1, surely
>>> speculative_sample(logits, torch.tensor([1]), q, temperature=1.0, gen=g)
[1, 2]
"""

from __future__ import annotations

import torch


def speculative_sample(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor | None,
    temperature: float,
    gen: torch.Generator | None,
) -> list[int]:
    """Committed tokens of one block: ``logits[b, V]`` of its verified positions, ``drafts[b - 1]``
    and their draft probabilities ``q[b - 1, V]`` over the target's vocabulary (None when ``b == 1``)."""
    dev = logits.device
    b = logits.shape[0]
    p = torch.softmax(logits.float() / temperature, dim=-1)
    j = b - 1
    if b > 1:
        pos = torch.arange(b - 1, device=dev)
        ratio = p[pos, drafts] / q[pos, drafts]
        u = torch.rand(b - 1, generator=gen, device=dev)
        j = int((u < ratio).int().cumprod(0).sum())
    if j < b - 1:  # first rejection: resample from the residual
        resid = (p[j] - q[j]).clamp_min(0)
        dist = resid if float(resid.sum()) > 0 else p[j]
        nxt = int(torch.multinomial(dist / dist.sum(), 1, generator=gen))
    else:  # all accepted: the bonus token comes from the target
        nxt = int(torch.multinomial(p[b - 1], 1, generator=gen))
    return drafts[:j].tolist() + [nxt]
