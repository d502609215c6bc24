"""What one verified draft tree tells about every smaller tree and every chain of the same round.

A round drafts one block, builds the best-first tree (:mod:`adaptspec.decoding.tree`) and the
target chooses a token at each node (its argmax at T = 0, its keyed sample at T > 0). A node's
choice depends only on its path, so it is the choice that node would get in any tree or chain
holding it. From the tree and those choices, :func:`round_outcomes` gives exactly:

- ``tree_tau[n]``: what the best tree of ``n`` nodes (the first ``n`` of best-first order,
  :meth:`~adaptspec.decoding.tree.DraftTree.prefix`; ``n = 0`` a plain step) would have
  committed: 1 + the accepted path's nodes among the first ``n`` (a path's block indices rise,
  parents come first, so the smaller tree's walk stops where the path leaves it);
- ``chain_tau[B - 1]``: what a chain of ``B`` positions verifying a prefix of the same drafter
  pass would have committed (the rank-0 candidate at each depth, :attr:`DraftTree.chain`: what
  :class:`~adaptspec.decoding.decoder.SpeculativeDecoder` with ``draft_length`` = the tree's
  drafted positions verifies), for ``B = 1 .. depth + 1``; ``None`` where the tree does not
  determine it: the chain's drafts were all accepted up to a depth whose rank-0 node the tree
  does not hold, so the target's choice there is unknown (``chain_floor`` then holds the
  lower bound: every draft down to that depth was accepted).

That is full information over tree and chain arms from one round: the basis of learning the
budget (:mod:`adaptspec.control`). "Exactly" holds as far as a node's choice is the same in
another pass shape: bit for bit with exact kernels; in fast verification a pass of another shape
may round a near-tie the other way, as it may for chains.

>>> import torch
>>> from adaptspec.decoding.tree import build_tree
>>> logp = torch.log(torch.tensor([[0.6, 0.3], [0.9, 0.1]]))
>>> tree = build_tree(logp, torch.tensor([[5, 7], [8, 9]]), nodes=3)   # nodes 5, 5-8, 7
>>> out = round_outcomes(tree, [7, 8, 0, 2])   # the target chose 7 (rank 1), then 2
>>> out.tree_tau, out.chain_tau
((1, 1, 1, 2), (1, 1, 1))
>>> out.tree(2), out.chain(2)
(1, 1)
>>> round_outcomes(tree, [5, 8, 4, 0]).chain_tau   # 5, then 8 accepted: a chain of 3 commits 3
(1, 2, 3)
>>> out = round_outcomes(tree.prefix(0), [5])   # 5 accepted, its node not verified: then unknown
>>> out.chain_tau, out.chain_floor
((1, 2, None), (1, 2, 2))
"""

from __future__ import annotations

from typing import Sequence

from ..errors import AdaptspecError
from ..speculator import TreeOutcomes
from .tree import DraftTree

__all__ = ["TreeOutcomes", "round_outcomes"]


def round_outcomes(tree: DraftTree, choices: Sequence[int]) -> TreeOutcomes:
    """The outcomes of every smaller tree and every chain (module docstring) from ``tree`` and the
    target's ``choices[i]`` at block index ``i`` (the root 0, node ``i`` at ``i``)."""
    if len(choices) != tree.nodes + 1:
        raise AdaptspecError(
            f"a tree of {tree.nodes} nodes needs {tree.nodes + 1} choices, got {len(choices)}"
        )
    path = tree.walk(list(choices))
    tree_tau, on = [1], 0
    for n in range(1, tree.nodes + 1):
        on += on < len(path) and path[on] == n
        tree_tau.append(1 + on)
    chains = [_chain_tau(tree, choices, b) for b in range(1, len(tree.chain) + 2)]
    return TreeOutcomes(tuple(tree_tau), tuple(t for t, _ in chains), tuple(f for _, f in chains))


def _chain_tau(tree: DraftTree, choices: Sequence[int], block_size: int) -> tuple[int | None, int]:
    """(the chain's tokens or None, a lower bound): walk its rank-0 path while the tree holds it."""
    node: int | None = 0  # the chain's node at depth d - 1 (its rank-0 path), None once the tree lacks it
    for d in range(1, block_size):
        if node is None:
            return None, d  # drafts 1 .. d - 1 accepted: at least d tokens
        if choices[node] != tree.chain[d - 1]:
            return d, d
        node = tree.child(node, tree.chain[d - 1])
    return block_size, block_size
