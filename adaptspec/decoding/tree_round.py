"""The steps of one draft-tree round that do not depend on who runs the target pass.

:class:`~adaptspec.decoding.decoder.SpeculativeDecoder` runs a tree round on one sequence and
:class:`~adaptspec.batching.engine.BatchEngine` runs one per tree row inside its batched pass;
both take these steps from here (docs/decoding.md, "Draft trees"):

1. :func:`tree_depth`: how deep the round drafts (the budget's depth, cut to the drafter's block
   and to the tokens left);
2. :func:`draft_tree`: the best-first tree the budget allows, from the drafter's logits of the
   ``depth`` drafted positions (at T > 0 perturbed by the request's keyed noise, so rank 0 is the
   chain's keyed proposal: :mod:`adaptspec.decoding.sampling`);
3. :func:`target_choices`: the target's choice at every node from the verifying pass's logits
   (the argmax at T = 0, else the keyed sample of the node's output position);
4. :func:`committed`: the accepted path (:meth:`~adaptspec.decoding.tree.DraftTree.walk`) and the
   tokens the round commits (the path's, then the target's choice after it).

>>> import torch
>>> from adaptspec.decoding.tree_budget import FixedTree
>>> scores = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.9, 0.05, 0.05]]))  # 2 drafted positions, 3 tokens
>>> tree = draft_tree(scores, FixedTree(3, top_k=2), to_target=lambda idx: idx + 10)
>>> tree.tokens, tree.parents
([10, 10, 11], [-1, 0, 1, 0])
>>> logits = torch.zeros(4, 16); logits[0, 10] = logits[1, 12] = 1.0  # the target: 10, then 12
>>> choices = target_choices(logits, tree)
>>> committed(tree, choices)
([1], [10, 12])
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..errors import AdaptspecError
from .tree import DraftTree, build_tree, top_candidates
from .tree_budget import DEFAULT_DEPTH, TreeBudget


def tree_depth(budget: TreeBudget, max_block_size: int, room: int) -> int:
    """The deepest node of a round with ``room`` tokens left to commit: the budget's depth (default
    :data:`~adaptspec.decoding.tree_budget.DEFAULT_DEPTH`), at most the drafter's largest block minus
    one and ``room - 1``. Below 1 the round is a plain step (one token left)."""
    return min(budget.depth or DEFAULT_DEPTH, max_block_size - 1, room - 1)


def draft_tree(
    scores: torch.Tensor,
    budget: TreeBudget,
    to_target: Callable[[torch.Tensor], torch.Tensor],
    temperature: float = 0.0,
    noise: torch.Tensor | None = None,
    draft_vocab: torch.Tensor | None = None,
    max_nodes: int | None = None,
) -> DraftTree:
    """The round's tree: the best-first tree of up to ``budget.max_nodes`` nodes built from the top
    ``budget.top_k`` of the drafter's ``scores[depth, V_draft]`` (float), cut to the nodes
    ``budget.nodes`` asks for (and to ``max_nodes``, an engine's per-row cap). At ``temperature > 0``
    the scores are ``scores / T`` plus ``noise[:depth]`` (the request's keyed noise of the drafted
    positions, over the target's vocabulary; ``draft_vocab`` maps the drafter's ids into it).
    ``to_target`` maps the drafter's ids to the target's."""
    depth = scores.shape[0]
    if temperature > 0:  # the coupling's proposals (decoding.sampling): rank 0 is draft_keyed's
        g = noise[:depth] if draft_vocab is None else noise[:depth, draft_vocab.to(noise.device)]
        scores = scores / temperature + g.to(scores.device)
    values, idx = top_candidates(torch.log_softmax(scores, dim=-1), budget.top_k)
    tree = build_tree(values, to_target(idx), budget.max_nodes)
    m = budget.nodes(np.asarray(tree.log_mass))
    if isinstance(m, (bool, np.bool_)) or not isinstance(m, (int, np.integer)) or not 0 <= m <= tree.nodes:
        raise AdaptspecError(f"{budget!r}.nodes gave {m!r}, outside 0..{tree.nodes}")
    return tree.prefix(int(m) if max_nodes is None else min(int(m), max_nodes))


def target_choices(
    logits: torch.Tensor, tree: DraftTree, temperature: float = 0.0, noise: torch.Tensor | None = None
) -> list[int]:
    """The target's choice after every block index of ``tree`` from the pass's ``logits[N + 1, V]``:
    the argmax at ``temperature`` 0, else the keyed sample of the node's output position (``noise``
    of the round's positions, row ``d`` the position at depth ``d``)."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1).tolist()
    return (logits / temperature + noise[tree.depths].to(logits.device)).argmax(-1).tolist()


def committed(tree: DraftTree, choices: list[int]) -> tuple[list[int], list[int]]:
    """The accepted path (block indices) and the tokens the round commits: the path's tokens, then
    the target's choice after its last node (after the root when nothing was accepted)."""
    path = tree.walk(choices)
    return path, [tree.tokens[i - 1] for i in path] + [choices[path[-1] if path else 0]]
