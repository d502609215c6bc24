"""How well a drafter predicts the target: exact T = 0 acceptance at every position of greedy text.

On text the target wrote greedily, a round of block size ``B`` whose last committed token is
position ``p`` accepts the longest prefix of its ``B - 1`` drafts that equals the text after
``p``: no decoding loop is needed. :func:`acceptance_everywhere` drafts at *every* position
of each answer (:func:`adaptspec.decoding.acceptance.draft_acceptance`, as a dense trace set is made), so
its figure is the mean of ``1 + accepted`` over positions, the per-position tau a dense
trace set records. A decode visits only the positions its rounds land on, so its own
tau can differ a little from this mean; the ranking of drafters does not.

:func:`drafter_figures` adds first-draft acceptance, the fraction of those positions whose
first drafted token is accepted. The overall figure is the mean of the domains' means (each benchmark counts once, whatever
its number of prompts).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch


@torch.no_grad()
def acceptance_everywhere(
    drafter,
    data,
    block_sizes: Iterable[int] = (2, 4, 8, 16),
    max_seqs: int | None = None,
    anchors_per_pass: int = 64,
) -> dict[int, dict[str, float]]:
    """Mean per-position tau by block size: ``{B: {"all": macro mean, domain: mean, ...}}``.

    ``data`` has ``tokens``, ``hidden``, ``prompt_lens`` and ``domains`` per sequence (a
    :class:`~adaptspec.models.train_drafter.ShardData`).
    """
    return drafter_figures(drafter, data, block_sizes, max_seqs, anchors_per_pass)["tau"]


@torch.no_grad()
def drafter_figures(
    drafter,
    data,
    block_sizes: Iterable[int] = (2, 4, 8, 16),
    max_seqs: int | None = None,
    anchors_per_pass: int = 64,
) -> dict[str, dict[int, dict[str, float]]]:
    """Per-position tau and first-draft acceptance by block size, as :func:`acceptance_everywhere`.

    ``{"tau": {B: {...}}, "first_draft": {B: {...}}}``: the first is the mean of ``1 + accepted``,
    the second the fraction of positions whose first drafted token is accepted (``accepted >= 1``),
    what a round opening there earns at least one extra token from; each as ``{"all": macro
    mean, domain: mean, ...}``.
    """
    from ..decoding.acceptance import draft_acceptance

    block_sizes = sorted(block_sizes)
    accepted: dict[int, dict[str, list[np.ndarray]]] = {b: {} for b in block_sizes}
    n = len(data.tokens) if max_seqs is None else min(max_seqs, len(data.tokens))
    for i in range(n):
        seq = torch.from_numpy(np.asarray(data.tokens[i], dtype=np.int64))
        hidden = torch.from_numpy(np.asarray(data.hidden[i], dtype=np.float32))
        accept, _, _ = draft_acceptance(
            drafter, hidden, seq, int(data.prompt_lens[i]), block_sizes, anchors_per_pass
        )
        for j, b in enumerate(block_sizes):
            accepted[b].setdefault(str(data.domains[i]), []).append(accept[:, j].astype(np.int64))
    return {"tau": _macro(accepted, lambda a: 1 + a), "first_draft": _macro(accepted, lambda a: a >= 1)}


def _macro(accepted: dict[int, dict[str, list[np.ndarray]]], value) -> dict[int, dict[str, float]]:
    """Per block size, the mean of ``value(accepted)`` per domain and the mean of those means."""
    out: dict[int, dict[str, float]] = {}
    for b, doms in accepted.items():
        means = {d: float(np.mean(value(np.concatenate(v)))) for d, v in sorted(doms.items())}
        out[b] = {"all": float(np.mean(list(means.values())))} | means
    return out
