"""How well a drafter predicts the target: exact T = 0 acceptance at every position of greedy text.

On text the target wrote greedily, a round of block size ``B`` whose last committed token is
position ``p`` accepts the longest prefix of its ``B - 1`` drafts that equals the text after
``p``: no decoding loop is needed. :func:`acceptance_everywhere` drafts at *every* position
of each answer (all blocks of a sequence in one training-style pass), so its figure is the
mean of ``1 + accepted`` over positions, the per-position tau a dense trace set records
(:mod:`adaptspec.dense`). A decode visits only the positions its rounds land on, so its own
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
    block_sizes = sorted(block_sizes)
    bmax = max(block_sizes)
    taus: dict[int, dict[str, list[np.ndarray]]] = {b: {} for b in block_sizes}
    n = len(data.tokens) if max_seqs is None else min(max_seqs, len(data.tokens))
    for i in range(n):
        tok = np.asarray(data.tokens[i], dtype=np.int64)
        pl, dom = int(data.prompt_lens[i]), str(data.domains[i])
        tokens = torch.from_numpy(tok)[None]
        hidden = torch.from_numpy(np.asarray(data.hidden[i], dtype=np.float32))[None]
        positions = np.arange(pl, len(tok) - 1)
        # labels[p, k]: the text k + 1 tokens after p (-1 past the end: never equal to a draft)
        idx = positions[:, None] + np.arange(1, bmax)[None, :]
        labels = np.where(idx < len(tok), tok[np.minimum(idx, len(tok) - 1)], -1)
        for b in block_sizes:  # a pass per block size: the masks of a block attend to each other
            pred = np.empty((len(positions), b - 1), dtype=np.int64)
            for s in range(0, len(positions), anchors_per_pass):
                anchors = torch.from_numpy(positions[s : s + anchors_per_pass])[None]
                h = drafter.forward_train(hidden, tokens, anchors, b)
                logits = h @ drafter.lm_weight().T.to(h.dtype)
                pred[s : s + anchors.shape[1]] = drafter.to_target_ids(logits.argmax(-1))[0].numpy()
            ok = pred == labels[:, : b - 1]
            taus[b].setdefault(dom, []).append(1 + np.cumprod(ok, axis=1).sum(1))
    out: dict[int, dict[str, float]] = {}
    for b, doms in taus.items():
        means = {d: float(np.concatenate(v).mean()) for d, v in sorted(doms.items())}
        out[b] = {"all": float(np.mean(list(means.values())))} | means
    return out
