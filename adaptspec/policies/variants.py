"""Named policy variants, ``NAME=SPEC``, as the A/B command-line options take them.

>>> named_specs(["A=fixed:16", " B = linucb:alpha=0.5"], "--variant", "A=fixed:16")
{'A': 'fixed:16', 'B': 'linucb:alpha=0.5'}
"""

from __future__ import annotations

from typing import Iterable

from ..errors import AdaptspecError


def named_specs(pieces: Iterable[str], flag: str, example: str) -> dict[str, str]:
    """``{name: spec}`` from ``NAME=SPEC`` strings; a malformed piece or a repeated name raises,
    naming ``flag`` and showing ``example``."""
    out: dict[str, str] = {}
    for piece in pieces:
        name, eq, spec = piece.partition("=")
        name, spec = name.strip(), spec.strip()
        if not eq or not name or not spec:
            raise AdaptspecError(f"{flag} {piece!r}: expected NAME=SPEC, e.g. {example}")
        if name in out:
            raise AdaptspecError(f"{flag}: variant {name!r} given twice")
        out[name] = spec
    return out
