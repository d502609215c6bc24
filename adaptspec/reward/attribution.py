"""Who pays for a batched round: a round's time attributed to its rows.

In a batch no row owns the round's time: one target pass verifies every row's block, and a
row that verifies 8 tokens makes the pass slower for all the others. A request's reward must
see the cost it imposes, or a policy learns that long blocks are free under load; and it must
not be charged for what it cannot change, or it learns that speculating is always too dear.
Two rules:

- :func:`by_tokens`: each row pays in proportion to the tokens it puts in the pass (its block
  size). Simple; it charges a speculating row for a share of the pass's fixed cost that does
  not grow with its block, so it discourages speculation where the pass is memory-bound.
- :func:`by_marginal_cost` (the default): each row pays an equal share of the *plain round*
  (every row at B = 1: the step it would take anyway) plus the *marginal cost of its
  speculation*, read from the cost model (a :class:`~adaptspec.reward.latency.LatencyProfile`):
  ``t(batch) - t(batch with row i at B = 1)``, its draft-pass share and its extra verify
  tokens. A row's choice changes only its own marginal term. The shares are scaled to sum to
  the round's measured time, so measured time is never lost or invented.

For a cost linear in the tokens of the pass, ``t = a + k * sum(b)``, row ``i`` of ``n`` pays
``a / n + k * b_i`` under the marginal rule:

>>> by_tokens(0.048, [1, 4]).round(4)
array([0.0096, 0.0384])
>>> from adaptspec.reward.latency import CostCurve, LatencyProfile
>>> linear = LatencyProfile("linear", draft=CostCurve((1,), (0.0,)),
...                         verify=CostCurve((1,), (0.040,), tail_slope_s=0.002))   # a = 0.038, k = 0.002
>>> by_marginal_cost(0.048, [1, 4], [100, 100], linear).round(4)
array([0.021, 0.027])
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .latency import LatencyProfile

#: The attribution rules by name (``--attribution``).
ATTRIBUTIONS = ("marginal", "tokens")


def by_tokens(round_s: float, blocks: Sequence[int]) -> np.ndarray:
    """``round_s`` split in proportion to each row's block size."""
    b = np.asarray(blocks, dtype=np.float64)
    return round_s * b / b.sum()


def batch_round_s(profile: LatencyProfile, blocks: Sequence[int], contexts: Sequence[float]) -> float:
    """Modelled seconds of one batched round: one drafter pass over the rows that speculate
    (B > 1) and one target pass over every row's block.

    The profile's curves take ``n = block_size x batch`` tokens; a batch of unequal blocks is
    evaluated at its total tokens (the mean block size times the rows) and its mean context.
    """
    b = np.asarray(blocks, dtype=np.float64)
    c = np.asarray(contexts, dtype=np.float64)
    if b.size == 0:
        return 0.0
    verify = float(profile.verify(b.mean(), c.mean(), b.size))
    spec = b > 1
    draft = float(profile.draft(b[spec].mean(), c[spec].mean(), int(spec.sum()))) if spec.any() else 0.0
    return draft + verify


def speculation_costs(profile: LatencyProfile, blocks: Sequence[int], contexts: Sequence[float]) -> np.ndarray:
    """``t(batch) - t(batch with row i at B = 1)`` for every row, from the cost model (vectorised:
    the batch with row ``i`` plain has the same sums less row ``i``'s extra tokens)."""
    b = np.asarray(blocks, dtype=np.float64)
    c = np.asarray(contexts, dtype=np.float64)
    n = b.size
    whole = batch_round_s(profile, b, c)
    verify = profile.verify((b.sum() - b + 1) / n, c.mean(), n)
    spec = b > 1
    k, sb, sc = int(spec.sum()), b[spec].sum(), c[spec].sum()
    draft_all = float(profile.draft(sb / k, sc / k, k)) if k else 0.0
    draft = np.full(n, draft_all)  # a plain row is plain already: the draft pass is as it is
    if k > 1:
        draft[spec] = profile.draft((sb - b[spec]) / (k - 1), (sc - c[spec]) / (k - 1), k - 1)
    elif k == 1:
        draft[spec] = 0.0  # the only speculating row: plain, there is no draft pass
    return whole - (verify + draft)


def by_marginal_cost(round_s: float, blocks: Sequence[int], contexts: Sequence[float],
                     profile: LatencyProfile) -> np.ndarray:
    """``round_s`` split as an equal share of the plain round plus each row's speculation cost
    (see the module docstring), scaled to sum to ``round_s``."""
    n = len(blocks)
    plain = batch_round_s(profile, [1] * n, contexts)
    shares = plain / n + np.clip(speculation_costs(profile, blocks, contexts), 0.0, None)
    if not shares.sum() > 0:
        return by_tokens(round_s, blocks)
    return round_s * shares / shares.sum()


def attribute(rule: str, round_s: float, blocks: Sequence[int], contexts: Sequence[float],
              profile: LatencyProfile | None = None) -> np.ndarray:
    """Each row's share of ``round_s`` under ``rule`` (one of :data:`ATTRIBUTIONS`)."""
    if rule == "tokens" or profile is None:
        return by_tokens(round_s, blocks)
    return by_marginal_cost(round_s, blocks, contexts, profile)
