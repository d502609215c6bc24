"""How many nodes a round's draft tree verifies: a fixed budget (DDTree) or CaDDTree's rule.

A :class:`TreeBudget` is what :meth:`SpeculativeDecoder.decode
<adaptspec.decoding.decoder.SpeculativeDecoder.decode>` takes as its ``block_size`` to verify
trees instead of chains. Every round the decoder drafts one block of ``depth + 1`` positions
(the same whatever the budget, so a smaller tree of the same round is a prefix of this one:
:mod:`adaptspec.decoding.tree_outcomes`), builds the best-first tree of up to ``max_nodes``
nodes from each position's top ``top_k`` (:func:`~adaptspec.decoding.tree.build_tree`), and asks
:meth:`TreeBudget.nodes` how many of its nodes to verify, given their path masses in best-first
order (any prefix of that order is the best tree of its size).

:class:`FixedTree` always verifies ``nodes`` nodes. :class:`CostAwareTree` is CaDDTree's
per-round budget: with ``m`` nodes the expected tokens a round commits are ``1 + M(m)``, ``M(m)``
the sum of the first ``m`` path masses (a node is accepted exactly when its whole path is, and
the masses are the drafter's estimate of that chance), and the round costs ``cost(m)``, a
draft pass and a target pass of ``m + 1`` positions on the host's measured curve (a
:class:`~adaptspec.costs.latency.LatencyProfile`, :mod:`adaptspec.host`); it verifies the ``m``
that maximises ``(1 + M(m)) / cost(m)``. The masses fall in best-first order, so ``1 + M`` is
concave; under a convex cost the ratio is then unimodal in ``m`` and CaDDTree's stop (grow while
the ratio still rises) finds the same ``m`` (arXiv 2606.01813). A measured curve is piecewise
linear and need not be convex, where growing-while-rising can stop at a local maximum; taking
the maximum over every ``m`` costs the same ``O(max_nodes)`` and cannot.

>>> import numpy as np
>>> rule = CostAwareTree(lambda m: 1.0 + 0.1 * m, max_nodes=8)
>>> rule.nodes(np.log([0.9, 0.6, 0.3, 0.05, 0.01]))  # (1 + M) / cost is largest at 3 nodes
3
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import AdaptspecError
from ..speculator import TREE_ARM_DEPTH

#: The deepest node when a budget does not say (the drafter then drafts 16 positions a round):
#: the block size DFlash drafters and the bundled one are trained at, DDTree's depth; the depth a
#: tree arm drafts (:data:`adaptspec.speculator.TREE_ARM_DEPTH`).
DEFAULT_DEPTH = TREE_ARM_DEPTH

#: Candidates per depth when a budget does not say: the most any best-first tree of up to 16
#: nodes can use at one depth, and enough for larger ones on the bundled drafter (its rank-16
#: candidates carry under 1% of a position's mass).
DEFAULT_TOP_K = 16


class TreeBudget(abc.ABC):
    """A tree schedule: its largest tree, the candidates per depth, its deepest node, and the
    per-round choice of how many nodes to verify."""

    max_nodes: int
    top_k: int
    depth: int | None  # None: DEFAULT_DEPTH (at most the drafter's largest block minus one)

    @abc.abstractmethod
    def nodes(self, log_mass: np.ndarray) -> int:
        """Nodes to verify this round, ``0..len(log_mass)``, from the built tree's path masses
        (natural logs, best-first). 0 verifies the last token alone (a plain step)."""


def _check(max_nodes: Any, top_k: Any, depth: Any) -> tuple[int, int, int | None]:
    for name, v, low in (("nodes", max_nodes, 1), ("top_k", top_k, 1), ("depth", depth, 1)):
        if v is None and name == "depth":
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise AdaptspecError(f"a draft tree's {name} must be an int >= {low}, got {v!r}")
    return max_nodes, top_k, depth


@dataclass(frozen=True)
class FixedTree(TreeBudget):
    """Verify the best tree of ``nodes`` nodes every round (DDTree's fixed budget)."""

    max_nodes: int
    top_k: int = 0  # 0: min(max_nodes, DEFAULT_TOP_K)
    depth: int | None = None

    def __post_init__(self) -> None:
        _check(self.max_nodes, self.top_k or 1, self.depth)
        if not self.top_k:
            object.__setattr__(self, "top_k", min(self.max_nodes, DEFAULT_TOP_K))

    def nodes(self, log_mass: np.ndarray) -> int:
        return min(self.max_nodes, len(log_mass))

    def __str__(self) -> str:
        return f"tree:{self.max_nodes}"


class CostAwareTree(TreeBudget):
    """CaDDTree's per-round budget (module docstring). ``round_s(m)`` is a round's cost with ``m``
    nodes (any unit); :meth:`from_profile` prices it on a host's measured curve."""

    def __init__(
        self, round_s: Callable[[int], float], max_nodes: int = 64, top_k: int = 0, depth: int | None = None
    ) -> None:
        self.max_nodes, self.top_k, self.depth = _check(max_nodes, top_k or 1, depth)
        self.top_k = top_k or min(max_nodes, DEFAULT_TOP_K)
        costs = np.array([float(round_s(m)) for m in range(max_nodes + 1)])
        if not (np.isfinite(costs).all() and (costs > 0).all()):
            raise AdaptspecError("a tree's round costs must be finite and > 0 at every size")
        self.costs = costs

    @classmethod
    def from_profile(
        cls, profile: Any, max_nodes: int = 64, top_k: int = 0, depth: int | None = None
    ) -> "CostAwareTree":
        """Priced by ``profile`` (a :class:`~adaptspec.costs.latency.LatencyProfile`, at its
        context): a drafter pass of ``depth + 1`` positions and a target pass of ``m + 1`` (the
        draft is paid every round, whatever the tree)."""
        draft = float(profile.draft_s((depth or DEFAULT_DEPTH) + 1))
        return cls(lambda m: draft + float(profile.verify_s(m + 1)), max_nodes, top_k, depth)

    def nodes(self, log_mass: np.ndarray) -> int:
        top = min(self.max_nodes, len(log_mass))
        gain = 1.0 + np.concatenate([[0.0], np.cumsum(np.exp(np.asarray(log_mass[:top], dtype=float)))])
        return int(np.argmax(gain / self.costs[: top + 1]))  # the first of equal maxima: the smaller tree

    def __str__(self) -> str:
        return f"tree:auto<={self.max_nodes}"

    def __repr__(self) -> str:
        return f"CostAwareTree(max_nodes={self.max_nodes}, top_k={self.top_k}, depth={self.depth})"
