"""Draft trees from one drafter pass (DDTree): the best-first prefix-closed tree of N nodes.

The block-diffusion drafter gives, in one pass, a distribution over the token at every block
position (:meth:`~adaptspec.decoding.drafter.BlockDiffusionDrafter.draft_logits`). Taking the
top ``K`` candidates at each depth ``d`` with their log-probabilities ``log q_d``, a path of
ranks ``(r_1 .. r_d)`` scores ``log q_1[r_1] + .. + log q_d[r_d]`` (the product of per-position
marginals). A child scores no more than its parent and a lower rank no more than a higher one,
so the ``N`` best paths form a prefix-closed tree, and a heap finds them best-first: pop the
best candidate, make it a node, push its first child (rank 0 one level deeper) and its next
sibling (the next rank under the same parent). Nodes come out parent before child, so every
prefix of the pop order is itself the best prefix-closed tree of its size
(:meth:`DraftTree.prefix`: what a per-round budget rule cuts, :mod:`adaptspec.decoding.tree_budget`).

Block index 0 is the root (the last committed token, not part of the tree built here); node
``i`` of the pop order sits at block index ``i + 1``, at depth ``depths[i + 1]``. ``chain`` keeps
each depth's rank-0 token: the drafts a chain verifying a prefix of the same drafter pass holds
(what :mod:`adaptspec.decoding.tree_outcomes` needs to tell a chain's outcome from the tree's).

>>> import torch
>>> logp = torch.log(torch.tensor([[0.6, 0.3], [0.9, 0.1]]))  # two depths, top 2 each
>>> tree = build_tree(logp, torch.tensor([[5, 7], [8, 9]]), nodes=3)
>>> tree.tokens, tree.parents, tree.depths, tree.chain
([5, 8, 7], [-1, 0, 1, 0], [0, 1, 2, 1], [5, 8])
>>> tree.child(0, 7), tree.child(1, 9)
(3, None)
>>> tree.walk([5, 8, 2, 0])   # the target chose 5 at the root, then 8: nodes 1 and 2 accepted
[1, 2]
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import AdaptspecError


@dataclass
class DraftTree:
    """A prefix-closed draft tree, nodes in best-first order.

    ``tokens[i]`` and ``log_mass[i]`` (the path's summed log-probability) are node ``i``'s;
    ``parents`` and ``depths`` are by block index (0: the root, -1 its parent, depth 0);
    ``chain[d - 1]`` is the rank-0 candidate at depth ``d`` of the drafter pass it was built from.
    """

    tokens: list[int]
    log_mass: list[float]
    parents: list[int]
    depths: list[int]
    chain: list[int] = field(default_factory=list)
    _children: dict[tuple[int, int], int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._children = {(p, t): i + 1 for i, (p, t) in enumerate(zip(self.parents[1:], self.tokens))}

    @property
    def nodes(self) -> int:
        """Nodes in the tree (the root excluded)."""
        return len(self.tokens)

    @property
    def depth(self) -> int:
        """The deepest node's depth (0 for an empty tree)."""
        return max(self.depths)

    def child(self, parent: int, token: int) -> int | None:
        """The block index of ``parent``'s child holding ``token``, or None."""
        return self._children.get((parent, token))

    def prefix(self, n: int) -> "DraftTree":
        """The first ``n`` nodes: the best prefix-closed tree of ``n`` nodes (parents come first)."""
        return DraftTree(
            self.tokens[:n], self.log_mass[:n], self.parents[: n + 1], self.depths[: n + 1], self.chain
        )

    def ancestors(self) -> torch.Tensor:
        """``[N + 1, N + 1]`` booleans: ``[i, j]`` when block index ``j`` is ``i`` or one of its
        ancestors (the root included): what row ``i`` may attend to inside the block."""
        n = self.nodes + 1
        anc = np.zeros((n, n), dtype=bool)
        anc[0, 0] = True
        for i in range(1, n):
            anc[i] = anc[self.parents[i]]
            anc[i, i] = True
        return torch.from_numpy(anc)

    def walk(self, choices: list[int]) -> list[int]:
        """The accepted path (block indices, root excluded): from the root, move to the child
        holding the target's choice at the current node (``choices[block index]``) while there is one."""
        node, path = 0, []
        while (nxt := self.child(node, choices[node])) is not None:
            path.append(nxt)
            node = nxt
        return path


def build_tree(log_probs: torch.Tensor, ids: torch.Tensor, nodes: int) -> DraftTree:
    """The best-first prefix-closed tree of at most ``nodes`` nodes (module docstring).

    ``log_probs[D, K]`` are the top-``K`` log-probabilities at depths ``1..D``, each row sorted
    from the largest; ``ids[D, K]`` their tokens (distinct within a row). Fewer nodes only when
    the ``D x K`` candidates run out (``K + K^2 + .. + K^D`` paths)."""
    if log_probs.dim() != 2 or log_probs.shape != ids.shape:
        raise AdaptspecError(
            f"log_probs and ids must be [depth, k] alike, got {tuple(log_probs.shape)} and {tuple(ids.shape)}"
        )
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise AdaptspecError(f"a draft tree needs an int number of nodes >= 1, got {nodes!r}")
    lp = log_probs.double().cpu().tolist()
    tok = ids.cpu().tolist()
    depth, k = len(lp), len(lp[0]) if lp else 0
    tokens: list[int] = []
    mass: list[float] = []
    parents, depths = [-1], [0]
    # candidates: (-score, order pushed, parent block index, parent's score, depth, rank)
    heap = [(-lp[0][0], 0, 0, 0.0, 1, 0)] if depth and k else []
    pushed = 1
    while heap and len(tokens) < nodes:
        neg, _, parent, base, d, r = heapq.heappop(heap)
        tokens.append(tok[d - 1][r])
        mass.append(-neg)
        parents.append(parent)
        depths.append(d)
        me = len(tokens)  # this node's block index
        if d < depth:
            heapq.heappush(heap, (-(-neg + lp[d][0]), pushed, me, -neg, d + 1, 0))
            pushed += 1
        if r + 1 < k:
            heapq.heappush(heap, (-(base + lp[d - 1][r + 1]), pushed, parent, base, d, r + 1))
            pushed += 1
    return DraftTree(tokens, mass, parents, depths, [row[0] for row in tok])


def top_candidates(log_probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top ``k`` of each row of ``log_probs[D, V]``: (log-probabilities, indices), each ``[D, k]``, sorted."""
    values, idx = torch.topk(log_probs, min(k, log_probs.shape[-1]), dim=-1, sorted=True)
    return values, idx
