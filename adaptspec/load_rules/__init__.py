"""Block-size rules under load: what a continuous-batching engine verifies for each row, each round.

A rule (:class:`~adaptspec.load_rules.base.LoadRule`) has ``choose(rows, load) -> block sizes``
(one per active row, called every round, so it can follow the load as it changes) and, after the
round, ``feedback(rows, block_sizes, taus, attributed_s, load)``: for every row of it, the block
size the rule asked, the tokens the row committed and its share of the round's time
(:mod:`adaptspec.reward.attribution`). The same rule objects run in the load simulator
(:mod:`adaptspec.simulators.load_sim`) and in the batched engine's server loop
(:mod:`adaptspec.load_rules.round_rule`). One rule a module:

- :class:`Fixed` (:mod:`~adaptspec.load_rules.fixed`): one block size, whatever the load (1 =
  plain decoding).
- :class:`Table` (:mod:`~adaptspec.load_rules.table`): a block size per load level, the static
  "batch size -> B" table engine users write by hand (vLLM's per-batch-size speculative tokens,
  TensorRT-LLM's draft length schedule); tuned in hindsight on other requests, or, on the same
  requests, the per-level oracle.
- :class:`Goodput` (:mod:`~adaptspec.load_rules.goodput`): SmartSpec-style. Each round, the block
  size that maximises the expected tokens per second of the whole batch: every row's expected
  tokens at ``B`` from its acceptance so far (independent per-draft acceptance ``a``:
  ``(1 - a^B) / (1 - a)``) over the cost model's round time at ``B``.
- :class:`Learned` (:mod:`~adaptspec.load_rules.learned`): a contextual bandit from
  :mod:`adaptspec.policies` (LinTS by default) choosing one block size for the whole batch every
  round, its context the load level, learning from the round's tokens per second. Given a prior
  acceptance it starts warm: before its first round it already prefers, at each level, what the
  goodput model predicts (:func:`predicted_speedup`), and measured rewards move it from there.
  With ``full_info`` it learns every block size a round reveals (every size up to the one
  verified), not only the one it chose.

>>> from adaptspec.load_rules.load import Load
>>> Table({1: 4, 8: 2, 64: 1}).choose([None] * 5, Load(rows=5, queue=0))   # 5 rows: the level up to 8
[2, 2, 2, 2, 2]
"""

from .base import LoadRule
from .fixed import Fixed
from .goodput import Goodput, acceptance, expected_tau, predicted_speedup
from .learned import (
    COLD_WEIGHT,
    HOLD_ROUNDS,
    LEVEL_ROWS,
    LEVEL_WEIGHT,
    LEVELS,
    PLAIN_EVERY,
    ROW_NOISE,
    SCALE_ROUNDS,
    SPECULATION_MARGIN,
    Learned,
    level_index,
)
from .table import Table

__all__ = [
    "COLD_WEIGHT",
    "HOLD_ROUNDS",
    "LEVEL_ROWS",
    "LEVEL_WEIGHT",
    "LEVELS",
    "PLAIN_EVERY",
    "ROW_NOISE",
    "SCALE_ROUNDS",
    "SPECULATION_MARGIN",
    "Fixed",
    "Goodput",
    "Learned",
    "LoadRule",
    "Table",
    "acceptance",
    "expected_tau",
    "level_index",
    "predicted_speedup",
]
