"""How many drafts the target would accept at every position of a known text.

The drafter's side of dense traces (:mod:`adaptspec.collect.dense`) and of drafter evaluation
(:mod:`adaptspec.models.drafter_eval`): one drafter pass per block size over many anchor
positions at once, drafts computed as decoding computes them.
"""

from __future__ import annotations

import numpy as np
import torch


@torch.inference_mode()
def draft_acceptance(
    drafter,
    context: torch.Tensor,
    seq: torch.Tensor,
    start: int,
    block_sizes,
    chunk: int = 128,
    confidences: bool = False,
):
    """Drafts the target would accept at every position of the text ``seq[start:]``.

    ``context[i]`` is the target's hidden state at position ``i`` (at least up to
    ``len(seq) - 2``). A round whose last committed token is ``seq[p]``, ``p`` in
    ``start .. len(seq) - 2``, reads the context before ``p``; ``accept[p - start, j]`` is the
    longest prefix of its ``block_sizes[j] - 1`` drafts equal to ``seq[p + 1 :]`` (uint8).
    With ``confidences``, also the drafter's top-1 probability and entropy (nats) of every
    draft of the largest block, ``[n, max - 1]`` each; else ``None`` for both. Batched over
    ``chunk`` positions, one drafter pass per block size, drafts computed as decoding does.
    """
    block_sizes = list(block_sizes)
    bmax = max(block_sizes)
    n = len(seq) - 1 - start
    accept = np.zeros((n, len(block_sizes)), dtype=np.uint8)
    top1 = np.zeros((n, bmax - 1), dtype=np.float32) if confidences else None
    entropy = np.zeros((n, bmax - 1), dtype=np.float32) if confidences else None
    labels = torch.full((n, bmax - 1), -1, dtype=torch.long)
    for p in range(n):
        nxt = seq[start + p + 1 : start + p + bmax]
        labels[p, : len(nxt)] = nxt
    w = drafter.lm_weight()
    context, seq_on = context.to(w.device), seq.to(w.device)  # the drafter's device (a GPU, say)
    for first in range(0, n, chunk):
        rows = torch.arange(first, min(n, first + chunk))
        anchors = (start + rows)[None].to(w.device)
        end = start + int(rows[-1]) + 1  # a block at anchor a reads context positions < a only
        ctx, tok = context[None, :end], seq_on[None, :end]
        for j, b in enumerate(block_sizes):
            h = drafter.forward_train(ctx, tok, anchors, b)[0]  # [A, b - 1, H]
            logits = (h.to(w.dtype) @ w.T).float()
            drafts = drafter.to_target_ids(logits.argmax(-1)).cpu()
            accept[rows.numpy(), j] = (drafts == labels[rows, : b - 1]).int().cumprod(1).sum(1).numpy()
            if confidences and b == bmax:
                logp = torch.log_softmax(logits, -1)
                top1[rows.numpy()] = logp.max(-1).values.exp().cpu().numpy()
                entropy[rows.numpy()] = -(logp.exp() * logp).sum(-1).cpu().numpy()
    return accept, top1, entropy
