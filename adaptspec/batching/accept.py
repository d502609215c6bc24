"""Per-row acceptance after a batched verification pass.

Greedy (``temperature == 0``): row ``i`` keeps the longest prefix of its drafts equal to the
target's argmax, plus the target's token after it; all rows at once, one host sync.

>>> import torch
>>> logits = torch.zeros(2, 3, 5)
>>> logits[0, [0, 1, 2], [4, 2, 1]] = 1.0      # row 0: the target's choices are 4, 2, 1
>>> logits[1, [0, 1, 2], [3, 3, 3]] = 1.0      # row 1: 3 (a plain step: width 1)
>>> drafts = torch.tensor([[4, 0], [-1, -1]])  # row 0 drafted 4, 0
>>> greedy(logits, drafts, widths=[3, 1])
[[4, 2], [3]]

Sampled rows (``temperature > 0``) go through :func:`~adaptspec.decoding.sampling.accept_keyed`
with the noise keyed by the row's seed and positions, the single-request decoder's own rule (so
a seed gives a request the same tokens whatever it is batched with and whatever its block sizes).
"""

from __future__ import annotations

import torch


def greedy(logits: torch.Tensor, drafts: torch.Tensor, widths: list[int]) -> list[list[int]]:
    """Committed tokens of every row: ``logits[R, T, V]``, ``drafts[R, T - 1]`` (padding
    ignored), row ``i`` verified ``widths[i]`` positions."""
    r, t = logits.shape[:2]
    best = logits.argmax(-1)  # [R, T]
    if t > 1:
        valid = (
            torch.arange(t - 1, device=best.device)[None, :]
            < (torch.tensor(widths, device=best.device) - 1)[:, None]
        )
        ok = (best[:, :-1] == drafts) & valid
        accepted = ok.int().cumprod(1).sum(1)
    else:
        accepted = best.new_zeros(r)
    host = torch.cat([accepted[:, None], best], dim=1).tolist()  # the one host sync
    return [row[1 : row[0] + 2] for row in host]
