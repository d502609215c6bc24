"""What makes a decision valid: one statement of the rule and its tolerances.

A decision (a :class:`~adaptspec.speculator.Decision`, or a decision-log row) is valid when
its block size is an integer among its arms, its probabilities (one per arm) are finite,
>= 0 and sum to 1 (within 1e-6), and its propensity is in (0, 1] and is the chosen block
size's probability (within 1e-6). :func:`decision_fault` says what is wrong, or None.

Two boundaries use it: the controller, where a policy's decision enters
(:func:`adaptspec.control.block_sizes.check_decision`), and the decision-log writer, for rows
that did not come from a checked decision: a caller's own rows and rows read back from a
journal on disk (:mod:`adaptspec.traces.log_writer`). Parquet parts are checked column-wise,
with the same tolerances, by :mod:`adaptspec.traces.decision_log`.

>>> decision_fault(4, 1.0, [0.0, 1.0], [1, 4]) is None
True
>>> decision_fault(True, 1.0, [1.0, 0.0], [1, 4])
'block_size True is not an integer'
>>> decision_fault(4, 0.7, [0.5, 0.5], [1, 4])
'propensity 0.7 does not match its probabilities'
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

#: Tolerances of the check (the same as the column-wise check of log parts).
SUM_TOL = 1e-6
NEG_TOL = 1e-12


def decision_fault(block_size: Any, propensity: Any, probs: Any, arms: Sequence[Any]) -> str | None:
    """What is wrong with a decision's fields (one short phrase), or None when it is valid.

    Plain Python on purpose: a decision has a handful of arms, where numpy's per-call cost
    would be most of the time (this runs once per decision)."""
    if isinstance(block_size, (bool, np.bool_)) or not isinstance(block_size, (int, np.integer)):
        return f"block_size {block_size!r} is not an integer"
    try:
        p = [float(x) for x in probs]
        prop = float(propensity)
    except (TypeError, ValueError):
        return "probabilities and propensity must be numbers"
    if len(p) != len(arms) or not p:
        return f"has {len(p)} probabilities for {len(arms)} arms"
    if block_size not in arms:
        return f"block_size {block_size} is not one of its arms {list(arms)}"
    if not all(math.isfinite(x) and x >= -NEG_TOL for x in p) or abs(sum(p) - 1.0) > SUM_TOL:
        return "probabilities must be finite, >= 0 and sum to 1"
    if not (0.0 < prop <= 1.0 + 1e-9) or abs(p[list(arms).index(block_size)] - prop) > SUM_TOL:
        return f"propensity {prop} does not match its probabilities"
    return None
