"""Who pays for a batched round: a round's time attributed to its rows.

In a batch no row owns the round's time: one target pass verifies every row's block, and a
row that verifies 8 tokens makes the pass slower for all the others. A request's reward must
see the cost it imposes, or a policy learns that long blocks are free under load; and it must
not be charged for what it cannot change, or it learns that speculating is always too dear.

The engine pads (:func:`batch_round_s`): every row's block is computed at the round's widest
block, so a round's cost depends on its widest block, not on the sum of its blocks; one row at
B = 8 among seven plain rows makes the target pass compute 64 positions, not 15. Two rules:

- :func:`by_tokens`: each row pays in proportion to the tokens it puts in the pass (its block
  size). Simple; it charges a speculating row for a share of the pass's fixed cost that does
  not grow with its block, so it discourages speculation where the pass is memory-bound.
- :func:`by_serial_cost` (the default, named ``"marginal"`` in :data:`ATTRIBUTIONS` and on the
  command line: each row pays the marginal cost of the width it adds, shared with the rows that
  need it): *serial cost sharing* (Moulin & Shenker 1992), which for a cost set by the widest
  member is the Shapley value of the airport game (Littlechild & Owen 1973). With ``C(w)`` the
  modelled round when every row's width is ``min(B_i, w)`` (``C(1)``: the plain round, the step
  every row takes anyway; ``C(max B)``: the round), each row pays ``C(1) / n`` plus, for every
  step between the sorted distinct widths ``w_{k-1} < w_k``, an equal part of
  ``C(w_k) - C(w_{k-1})``, split equally among the rows at ``B_i >= w_k``. A plain row pays only its
  share of the plain round; widening the pass is paid by the rows that need that width, shared
  equally among them. The shares are scaled to sum to the round's measured time, so measured
  time is never lost or invented.

For a pass costing ``t = a + k x rows x max(B)`` (draft free), rows at B = 1 and 4 pay
``C(1) / 2 = a / 2 + k`` and ``a / 2 + k + (C(4) - C(1)) = a / 2 + k + 6k``:

>>> by_tokens(0.048, [1, 4]).round(4)
array([0.0096, 0.0384])
>>> from adaptspec.costs.latency import CostCurve, LatencyProfile
>>> linear = LatencyProfile("linear", draft=CostCurve((1,), (0.0,)),
...                         verify=CostCurve((1,), (0.040,), tail_slope_s=0.002))   # a = 0.038, k = 0.002
>>> round(batch_round_s(linear, [1, 4], [100, 100]), 4)   # 2 rows x 4 positions
0.054
>>> by_serial_cost(0.054, [1, 4], [100, 100], linear).round(4)
array([0.021, 0.033])
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..costs.pass_costs import PassCosts
from ..errors import AdaptspecError

#: The attribution rules by name (``--attribution``): ``"marginal"`` is :func:`by_serial_cost`
#: (the name is kept for the command line and the logs), ``"tokens"`` is :func:`by_tokens`.
ATTRIBUTIONS = ("marginal", "tokens")


def by_tokens(round_s: float, blocks: Sequence[int]) -> np.ndarray:
    """``round_s`` split in proportion to each row's block size."""
    b = np.asarray(blocks, dtype=np.float64)
    return round_s * b / b.sum()


def batch_round_s(profile: PassCosts, blocks: Sequence[int], contexts: Sequence[float]) -> float:
    """Modelled seconds of one batched round: one drafter pass over the rows that speculate
    (B > 1) and one target pass over every row's block, both padded to their widest block.

    The engine pads: its target pass (:mod:`adaptspec.batching.target_pass`, blocks built in
    :mod:`adaptspec.batching.engine`) feeds every row ``max(B_i)`` positions, and its drafter
    pass (:mod:`adaptspec.batching.draft_pass`) feeds every speculating row the widest
    speculating block. So the target pass is ``profile.verify(max B, mean context, rows)`` and
    the drafter pass ``profile.draft(max B, mean context, rows)`` over the speculating rows
    (none when every row is plain).

    >>> from adaptspec.costs.latency import CostCurve, LatencyProfile
    >>> linear = LatencyProfile("linear", draft=CostCurve((1,), (0.0,)),
    ...                         verify=CostCurve((1,), (0.040,), tail_slope_s=0.002))
    >>> round(batch_round_s(linear, [8] + [1] * 7, [100] * 8), 3)   # 0.038 + 0.002 x 64 positions
    0.166
    """
    b = np.asarray(blocks, dtype=np.float64)
    c = np.asarray(contexts, dtype=np.float64)
    if b.size == 0:
        return 0.0
    verify = float(profile.verify(b.max(), c.mean(), b.size))
    spec = b > 1
    draft = float(profile.draft(b[spec].max(), c[spec].mean(), int(spec.sum()))) if spec.any() else 0.0
    return draft + verify


def batch_rounds_s(profile: PassCosts, blocks: np.ndarray, contexts: Sequence[float]) -> np.ndarray:
    """:func:`batch_round_s` of each row of ``blocks`` (rounds x rows) over the same rows'
    ``contexts``, in two calls of the profile's curves instead of two a round (the learned load rule
    prices every shorter block size of a step this way, once a step).

    >>> from adaptspec.costs.latency import CostCurve, LatencyProfile
    >>> p = LatencyProfile("p", draft=CostCurve((2,), (0.010,), tail_slope_s=0.001),
    ...                    verify=CostCurve((1,), (0.040,), tail_slope_s=0.002))
    >>> rounds = np.array([[1, 1], [2, 1], [4, 3]])
    >>> np.allclose(batch_rounds_s(p, rounds, [10, 30]), [batch_round_s(p, r, [10, 30]) for r in rounds])
    True
    """
    b = np.asarray(blocks, dtype=np.float64)
    c = np.asarray(contexts, dtype=np.float64)
    if b.ndim != 2 or b.shape[1] != c.size:
        raise ValueError(f"blocks must be rounds x {c.size} rows, got shape {b.shape}")
    if b.shape[0] == 0 or c.size == 0:
        return np.zeros(b.shape[0])
    verify = np.asarray(profile.verify(b.max(axis=1), c.mean(), c.size), dtype=np.float64)
    spec = b > 1
    n = spec.sum(axis=1)
    some = n > 0
    draft = np.zeros(b.shape[0])
    if some.any():
        widest = np.where(spec, b, 0.0).max(axis=1)[some]
        context = (spec * c).sum(axis=1)[some] / n[some]
        draft[some] = np.asarray(profile.draft(widest, context, n[some]), dtype=np.float64)
    return draft + np.broadcast_to(verify, draft.shape)


def serial_costs(profile: PassCosts, blocks: Sequence[int], contexts: Sequence[float]) -> np.ndarray:
    """Each row's serial cost share of the modelled round (see the module docstring); they sum
    to ``batch_round_s(profile, blocks, contexts)``."""
    b = np.asarray(blocks, dtype=np.int64)
    c = np.asarray(contexts, dtype=np.float64)
    n = b.size
    if n == 0:
        return np.zeros(0)
    widths = np.unique(b)  # sorted distinct widths
    steps = widths[widths > 1]
    levels = [batch_round_s(profile, np.minimum(b, w), c) for w in (1, *steps)]  # C(1), C(w_1), ...
    rises = np.diff(levels)  # C(w_k) - C(w_{k-1}), >= 0 for a valid profile
    payers = np.array([(b >= w).sum() for w in steps])
    per_row = np.concatenate([[0.0], np.cumsum(rises / payers)])  # what a row at w_k pays above C(1)/n
    return levels[0] / n + per_row[np.searchsorted(np.concatenate([[1], steps]), b)]


def by_serial_cost(
    round_s: float, blocks: Sequence[int], contexts: Sequence[float], profile: PassCosts
) -> np.ndarray:
    """``round_s`` split by serial cost sharing on ``profile`` (see the module docstring), scaled
    to sum to ``round_s``."""
    shares = serial_costs(profile, blocks, contexts)
    if not shares.sum() > 0:
        return by_tokens(round_s, blocks)
    return round_s * shares / shares.sum()


def attribute(
    rule: str,
    round_s: float,
    blocks: Sequence[int],
    contexts: Sequence[float],
    profile: PassCosts | None = None,
) -> np.ndarray:
    """Each row's share of ``round_s`` under ``rule`` (one of :data:`ATTRIBUTIONS`)."""
    if rule not in ATTRIBUTIONS:
        raise AdaptspecError(f"attribution must be one of {', '.join(ATTRIBUTIONS)}, got {rule!r}")
    if len(blocks) != len(contexts):
        raise AdaptspecError(
            f"attribution needs a context per row: {len(blocks)} blocks, {len(contexts)} contexts"
        )
    if len(blocks) and min(blocks) < 1:
        raise AdaptspecError(f"block sizes must be >= 1, got {list(blocks)}")
    if rule == "tokens" or profile is None:
        return by_tokens(round_s, blocks)
    return by_serial_cost(round_s, blocks, contexts, profile)
