"""What this vLLM engine's steps cost, measured by the plug-in: the cost model of its load rules.

The ``goodput`` and ``learned`` load rules price block sizes with a cost model: goodput chooses by
it, and the learned rule prices every block size shorter than the one a step ran from that step
(full information) by the model's ratio of their costs. adaptspec's latency profiles are its own
engine's (``cpu-smollm2-bf16``: the bundled pair in bfloat16 in adaptspec's batched engine), and
vLLM's steps cost otherwise. Measured on this 2-core CPU with the bundled pair in float32
(``benchmarks/bench_vllm_steps.py``, BENCHMARKS.md): at one request a step verifying 4-6 tokens
took *less* than one verifying 1 or 2 (vLLM's CPU attention takes another path for a query of one
token), at 8 requests every token verified added ~3 ms to a ~60 ms step. No smooth curve of block
size fits both, so the plug-in measures them.

:class:`StepCosts` keeps, per load level (the learned rule's :data:`~adaptspec.load_rules.LEVELS`:
1, 2, 3-4, 5-8, ... requests in the step) and block size (the step's widest verified block: 1 + the
most drafts a request of it verified), an exponentially weighted mean of the decode steps' seconds
per request (steps with a prompt in them are left out: a prefill is no round). It answers as a
latency profile (``verify``, ``draft``, ``context_tokens``): a batch's round at block size B over
``rows`` requests costs ``rows`` times the mean at their level and B, the drafter's pass included
(``draft`` is 0: vLLM's drafter runs in the same step, and its cost is in the step's time). A
block size not measured at a level yet (fewer than ``min_steps`` steps there; the plain step, B = 1,
after one: it is what every speculating block size is weighed against, the learned rule forces it
rarely, and one measured plain step is nearer the truth than the prior's shape: at 4 requests the
prior priced a 2-token step well below what vLLM's took, and a rule measuring its plain step only
every fourth forced one kept B = 2 there for three runs):

- between two measured ones, linear between them;
- beyond the measured ones, the nearest measured one scaled by the prior profile's ratio of the two
  (``prior``: ``latency``, ``cpu-smollm2-bf16`` when unset), at the level's largest request count;
- with none measured at that level, the prior profile's own round there.

>>> from adaptspec.costs.latency import get_profile
>>> c = StepCosts(get_profile("cpu-smollm2-bf16"), min_steps=2)
>>> for _ in range(2):
...     c.observe(rows=1, block=1, step_s=0.050); c.observe(rows=1, block=5, step_s=0.046)
>>> [round(float(c.verify(b, 100, 1)) * 1000, 1) for b in (1, 3, 5)]   # 3: between the two measured
[50.0, 48.0, 46.0]
>>> ctx = c.prior.context_tokens
>>> float(c.verify(3, None, 2)) == batch_round_s(c.prior, [3, 3], [ctx, ctx])  # 2 rows: nothing measured, the prior's
True
>>> round(float(c.verify(9, None, 1)) / 0.046, 6) == round(batch_round_s(c.prior, [9], [ctx]) / batch_round_s(c.prior, [5], [ctx]), 6)
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..costs.latency import LatencyProfile
from ..load_rules import LEVEL_ROWS, LEVELS, level_index
from ..reward.attribution import batch_round_s

__all__ = ["StepCosts"]


class StepCosts:
    """Measured seconds of vLLM's steps by load level and block size (see the module docstring);
    a latency profile's ``verify``/``draft``/``context_tokens`` for the load rules."""

    def __init__(
        self, prior: LatencyProfile, *, max_block_size: int = 64, min_steps: int = 4, window: int = 64
    ) -> None:
        self.prior = prior
        self.name = f"vllm steps measured (prior {prior.name})"
        self.context_tokens = prior.context_tokens
        self.min_steps = int(min_steps)
        self.weight = 1.0 / float(window)
        shape = (len(LEVELS) + 1, int(max_block_size) + 1)
        self.mean_s = np.zeros(shape)  # seconds a request of a step, by level and block size
        self.steps = np.zeros(shape, dtype=np.int64)  # steps seen, by level and block size
        self._blocks = np.arange(shape[1], dtype=np.float64)
        # the prior's seconds a request at every block size, at each level's largest request count
        self._prior = np.array(
            [
                [
                    batch_round_s(prior, [max(b, 1)] * rows, [prior.context_tokens] * rows) / rows
                    for b in range(shape[1])
                ]
                for rows in LEVEL_ROWS
            ]
        )
        self._table: dict[
            int, np.ndarray
        ] = {}  # level -> seconds a request at every block size, as answered now

    def observe(self, rows: int, block: int, step_s: float) -> None:
        """A decode step over ``rows`` requests, its widest verified block ``block``, took ``step_s``."""
        if rows < 1 or not 1 <= block < self.mean_s.shape[1] or not step_s > 0:
            return
        i = level_index(rows)
        n = self.steps[i, block] = self.steps[i, block] + 1
        self.mean_s[i, block] += (step_s / rows - self.mean_s[i, block]) * max(1.0 / n, self.weight)
        self._table.pop(i, None)

    def per_row(self, rows: int) -> np.ndarray:
        """Seconds a request of a step over ``rows`` requests, at every block size (index: the block
        size; see the module docstring for the sizes not measured)."""
        i = level_index(rows)
        table = self._table.get(i)
        if table is None:
            table = self._table[i] = self._answer(i)
        return table

    def _measured(self, i: int) -> np.ndarray:
        """The block sizes measured at level ``i``: seen ``min_steps`` times, the plain step once."""
        return np.flatnonzero(
            (self.steps[i] >= self.min_steps) | ((self._blocks == 1) & (self.steps[i] >= 1))
        )

    def _answer(self, i: int) -> np.ndarray:
        prior = self._prior[i]
        seen = self._measured(i)
        if seen.size == 0:
            return prior.copy()
        means = self.mean_s[i, seen]
        out = np.interp(
            self._blocks, seen, means
        )  # linear between measured sizes; beyond them, rescaled below
        lo, hi = seen[0], seen[-1]
        out[:lo] = means[0] * prior[:lo] / prior[lo]
        out[hi + 1 :] = means[-1] * prior[hi + 1 :] / prior[hi]
        return out

    # ------------------------------------------------------------------ as a latency profile
    def verify(self, block_size: Any, context: Any = None, batch: Any = 1) -> Any:
        """Seconds of a step of ``batch`` requests at ``block_size`` (the drafter's pass included;
        ``context`` is not modelled: the steps measured are this engine's own contexts)."""
        rows = max(int(np.max(batch)), 1)
        table = self.per_row(rows)
        b = np.clip(np.rint(np.asarray(block_size, dtype=np.float64)).astype(np.int64), 1, table.size - 1)
        out = rows * table[b]
        return out if out.ndim else float(out)

    def draft(self, block_size: Any, context: Any = None, batch: Any = 1) -> Any:
        """0: the drafter's pass is in the step's time (:meth:`verify`)."""
        return np.zeros(np.shape(block_size)) if np.ndim(block_size) else 0.0

    def verify_s(self, block_size: Any, context: Any = None, batch: Any = 1) -> Any:
        return self.verify(block_size, context, batch)

    def draft_s(self, block_size: Any, context: Any = None, batch: Any = 1) -> Any:
        return self.draft(block_size, context, batch)

    def round_s(self, block_size: Any, context: Any = None, batch: Any = 1) -> Any:
        return self.verify(block_size, context, batch)

    def stats(self) -> dict[str, dict[int, float]]:
        """Per level (its largest request count) the measured block sizes' milliseconds a request."""
        out = {}
        for i, top in enumerate((*LEVELS, f">{LEVELS[-1]}")):
            seen = {int(b): round(float(self.mean_s[i, b]) * 1000, 2) for b in self._measured(i)}
            if seen:
                out[str(top)] = seen
        return out
