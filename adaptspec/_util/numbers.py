"""Numbers as reports store them: rounded for JSON, and JSON-safe (no NaN, no infinity).

>>> rounded(2 / 3), rounded(2 / 3, 2), rounded(float("nan")), rounded(None)
(0.666667, 0.67, None, None)
>>> finite({"mean": float("nan"), "ci": (1.5, float("inf")), "n": 3})
{'mean': None, 'ci': [1.5, None], 'n': 3}
"""

from __future__ import annotations

import math
from typing import Any


def rounded(x: Any, nd: int = 6) -> float | None:
    """``x`` rounded to ``nd`` decimals; None when it is None, NaN or infinite."""
    if x is None:
        return None
    x = float(x)
    return round(x, nd) if math.isfinite(x) else None


def finite(obj: Any) -> Any:
    """A copy of a nested report with NaN and infinities as None (JSON has neither)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj
