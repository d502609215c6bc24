"""How well a drafter predicts the target: exact T = 0 acceptance at every position of greedy text.

On text the target wrote greedily, a round of block size ``B`` whose last committed token is
position ``p`` accepts the longest prefix of its ``B - 1`` drafts that equals the text after
``p``: no decoding loop is needed. :func:`acceptance_everywhere` drafts at *every* position
of each answer (:func:`adaptspec.decoding.acceptance.draft_acceptance`, as a dense trace set is made), so
its figure is the mean of ``1 + accepted`` over positions, the per-position tau a dense
trace set records. A decode visits only the positions its rounds land on, so its own
tau can differ a little from this mean; the ranking of drafters does not.

The overall figure is the mean of the domains' means (each benchmark counts once, whatever
its number of prompts).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch


@torch.no_grad()
def acceptance_everywhere(drafter, data, block_sizes: Iterable[int] = (2, 4, 8, 16), max_seqs: int | None = None,
                          anchors_per_pass: int = 64) -> dict[int, dict[str, float]]:
    """Mean per-position tau by block size: ``{B: {"all": macro mean, domain: mean, ...}}``.

    ``data`` has ``tokens``, ``hidden``, ``prompt_lens`` and ``domains`` per sequence (a
    :class:`~adaptspec.models.train_drafter.ShardData`).
    """
    from ..decoding.acceptance import draft_acceptance

    block_sizes = sorted(block_sizes)
    taus: dict[int, dict[str, list[np.ndarray]]] = {b: {} for b in block_sizes}
    n = len(data.tokens) if max_seqs is None else min(max_seqs, len(data.tokens))
    for i in range(n):
        seq = torch.from_numpy(np.asarray(data.tokens[i], dtype=np.int64))
        hidden = torch.from_numpy(np.asarray(data.hidden[i], dtype=np.float32))
        accept, _, _ = draft_acceptance(drafter, hidden, seq, int(data.prompt_lens[i]), block_sizes, anchors_per_pass)
        for j, b in enumerate(block_sizes):
            taus[b].setdefault(str(data.domains[i]), []).append(1 + accept[:, j].astype(np.int64))
    out: dict[int, dict[str, float]] = {}
    for b, doms in taus.items():
        means = {d: float(np.concatenate(v).mean()) for d, v in sorted(doms.items())}
        out[b] = {"all": float(np.mean(list(means.values())))} | means
    return out
