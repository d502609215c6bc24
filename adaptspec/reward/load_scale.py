"""A batched request's time on the scale of one row: rewards that do not move with the load.

Under batching a row's attributed share of a round (:mod:`adaptspec.reward.attribution`) falls
as rows join: at 16 rows a plain round of the bundled pair costs little more than a one-row
round, so each row's share is many times smaller than alone. A request's measured reward (``token_latency``: minus ms
per token over its attributed time) therefore says more about the load it ran under than about
the block size it chose. A per-request policy that does not see the load then learns whatever
block sizes happened to run in busy minutes: on the load sweep the controller, after a phase of
16 clients in which the load rule played plain decoding for everyone, chose plain decoding for
later requests at one row, where B = 3 is faster.

So the server puts each round's share back on the scale of one row: ``share x rows x t1 /
t(rows)``, with ``t(rows)`` the cost model's plain round over ``rows`` rows (one target pass at
one token a row, the round's mean context) and ``t1`` one row's. A plain row at any load then
costs one plain one-row round a round (when the cost model is right about the plain rounds),
and a speculating row costs what its share says relative to that: its reward is its speed-up
over plain decoding *at the load it ran under*, in the unit of a request decoded alone (the
unit the head and the batch-1 policy were trained in). What stays is what the block size did.

For a pass costing ``a + k x rows`` seconds at one token a row, the factor is
``rows (a + k) / (a + k rows)``:

>>> from adaptspec.costs.latency import CostCurve, LatencyProfile
>>> linear = LatencyProfile("linear", draft=CostCurve((1,), (0.0,)),
...                         verify=CostCurve((1,), (0.040,), tail_slope_s=0.002))   # a = 0.038, k = 0.002
>>> scale = OneRowScale(linear)
>>> round(scale.factor(rows=8, context=100), 4), round(8 * 0.040 / (0.038 + 0.002 * 8), 4)
(5.9259, 5.9259)
>>> scale.factor(rows=1, context=100)
1.0
"""

from __future__ import annotations

from ..costs.latency import LatencyProfile

#: Contexts are rounded to this many tokens when caching a factor (the plain pass's cost moves
#: little with the context; a cache keeps the per-round work to one dict lookup).
CONTEXT_STEP = 8


class OneRowScale:
    """``factor(rows, context)``: what one row's share of a round of ``rows`` rows is multiplied by
    to put it on the scale of a request decoded alone (see the module docstring); cached."""

    def __init__(self, profile: LatencyProfile) -> None:
        self.profile = profile
        self._cache: dict[tuple[int, int], float] = {}

    def factor(self, rows: int, context: float) -> float:
        if rows <= 1:
            return 1.0
        key = (int(rows), int(context) // CONTEXT_STEP)
        f = self._cache.get(key)
        if f is None:
            if len(self._cache) > 4096:
                self._cache.clear()
            ctx = CONTEXT_STEP * key[1] + CONTEXT_STEP // 2
            alone = float(self.profile.verify(1, ctx, 1))
            f = self._cache[key] = key[0] * alone / float(self.profile.verify(1, ctx, key[0]))
        return f
