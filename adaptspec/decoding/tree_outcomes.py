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
  does not hold, so the target's choice there is unknown.

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
>>> round_outcomes(tree, [5, 8, 4, 0]).chain_tau   # 5, then 8 accepted: a chain of 3 commits 3
(1, 2, 3)
>>> round_outcomes(tree.prefix(0), [5]).chain_tau   # 5 accepted, its node not verified: then unknown
(1, 2, None)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import AdaptspecError
from .tree import DraftTree


@dataclass(frozen=True)
class TreeOutcomes:
    """Tokens each smaller tree and each chain would have committed (module docstring)."""

    tree_tau: tuple[int, ...]  # [n], n = 0 .. the tree's nodes
    chain_tau: tuple[int | None, ...]  # [B - 1], B = 1 .. drafted depth + 1; None: not determined

    def tree(self, nodes: int) -> int:
        """Tokens the best tree of ``nodes`` nodes commits (larger than the tree: the whole tree's)."""
        return self.tree_tau[min(nodes, len(self.tree_tau) - 1)]

    def chain(self, block_size: int) -> int | None:
        """Tokens a chain of ``block_size`` commits; None where the tree does not tell (a chain
        longer than the drafter pass included)."""
        return self.chain_tau[block_size - 1] if block_size <= len(self.chain_tau) else None


def round_outcomes(tree: DraftTree, choices: Sequence[int]) -> TreeOutcomes:
    """The outcomes of every smaller tree and every chain (module docstring) from ``tree`` and the
    target's ``choices[i]`` at block index ``i`` (the root 0, node ``i`` at ``i``)."""
    if len(choices) != tree.nodes + 1:
        raise AdaptspecError(f"a tree of {tree.nodes} nodes needs {tree.nodes + 1} choices, got {len(choices)}")
    path = tree.walk(list(choices))
    tree_tau, on = [1], 0
    for n in range(1, tree.nodes + 1):
        on += on < len(path) and path[on] == n
        tree_tau.append(1 + on)
    chain_tau: list[int | None] = [1]
    for b in range(2, len(tree.chain) + 2):
        chain_tau.append(_chain_tau(tree, choices, b))
    return TreeOutcomes(tuple(tree_tau), tuple(chain_tau))


def _chain_tau(tree: DraftTree, choices: Sequence[int], block_size: int) -> int | None:
    node: int | None = 0  # the chain's node at depth d - 1 (its rank-0 path), None once the tree lacks it
    for d in range(1, block_size):
        if node is None:
            return None
        if choices[node] != tree.chain[d - 1]:
            return d
        node = tree.child(node, tree.chain[d - 1])
    return block_size
