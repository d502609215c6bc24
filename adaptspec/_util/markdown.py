"""Markdown tables and the number formats the reports share.

>>> print(table(["block size", "speedup"], [[4, num(1.2512)]]))
| block size | speedup |
| --- | ---: |
| 4 | 1.25 |
>>> ci({"mean": 93.94, "lo": 93.51, "hi": 94.32})
'93.9 [93.5, 94.3]'
>>> sig(1234.5), sig(123.45), sig(1.2345), sig(0.012345), sig(None), pm(31.5, [30.25, 32.75])
('1234', '123.5', '1.23', '0.0123', '-', '31.50 ± 1.25')
"""

from __future__ import annotations

import math
from typing import Any


def table(head: list[str], rows: list[list[Any]], align: str | None = None) -> str:
    """A GitHub markdown table; ``align`` is one character per column (l or r)."""
    align = align or "l" + "r" * (len(head) - 1)
    sep = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def num(x: Any, nd: int = 2) -> str:
    if x is None:
        return "-"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if v != v:
        return "-"
    return f"{v:,.{nd}f}"


def ci(m: dict[str, Any] | None, nd: int = 1, sign: bool = False) -> str:
    """``93.9 [93.5, 94.3]`` (mean and 95% interval)."""
    if not m or m.get("mean") is None:
        return "-"
    f = f"{{:{'+' if sign else ''}.{nd}f}}"
    if m["lo"] is None or m["lo"] == m["hi"]:
        return f.format(m["mean"])
    return f"{f.format(m['mean'])} [{f.format(m['lo'])}, {f.format(m['hi'])}]"


def sig(x: Any) -> str:
    """``x`` with about three significant digits (``-`` for None, NaN or infinity)."""
    if x is None or not math.isfinite(float(x)):
        return "-"
    x = float(x)
    a = abs(x)
    return f"{x:.0f}" if a >= 1000 else f"{x:.1f}" if a >= 100 else f"{x:.2f}" if a >= 1 else f"{x:.3g}"


def pm(mean: Any, interval: Any) -> str:
    """``mean ± half the interval's width`` in :func:`sig` digits (the mean alone without an interval)."""
    if mean is None:
        return "-"
    if not interval or interval[0] is None or interval[1] is None:
        return sig(mean)
    return f"{sig(mean)} ± {sig((interval[1] - interval[0]) / 2)}"
