"""Named policy variants, ``NAME=SPEC``, as the A/B command-line options take them: one
``NAME=SPEC`` per value (``serve --variant``, ``ab-report --policy``) or two in one value
(``simulate --ab``).

A variant's name becomes a folder (``--checkpoint-dir DIR/NAME``) and part of a Redis key, so it
is checked where it enters (:func:`check_variant_name`, :data:`VARIANT_NAME`): 1-32 letters,
digits or ``_.-``, starting with a letter or a digit (never ``.``, ``..``, a path, an option).

>>> named_specs(["A=fixed:16", " B = linucb:alpha=0.5"], "--variant", "A=fixed:16")
{'A': 'fixed:16', 'B': 'linucb:alpha=0.5'}
>>> named_specs(["..=ucb"], "--variant", "A=fixed:16")
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: --variant: variant name '..': use 1-32 letters, digits or _.-, starting with a letter or a digit
>>> parse_ab_specs("A=fixed:16,B=linucb:alpha=0.5,lam=2")
{'A': 'fixed:16', 'B': 'linucb:alpha=0.5,lam=2'}
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from ..errors import AdaptspecError

__all__ = ["VARIANT_NAME", "check_variant_name", "named_specs", "parse_ab_specs", "split_variants"]

#: what a variant may be called (it names a folder and a Redis key): see the module docstring
VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


def check_variant_name(name: Any, where: str = "variant name") -> str:
    """``name`` if it is a variant name (:data:`VARIANT_NAME`, whole); otherwise one line naming ``where``."""
    if isinstance(name, str) and VARIANT_NAME.fullmatch(name):
        return name
    shown = (
        repr(name[:40]) + f"... ({len(name)} characters)"
        if isinstance(name, str) and len(name) > 40
        else repr(name)
    )
    raise AdaptspecError(
        f"{where} {shown}: use 1-32 letters, digits or _.-, starting with a letter or a digit"
    )


def named_specs(pieces: Iterable[str], flag: str, example: str) -> dict[str, str]:
    """``{name: spec}`` from ``NAME=SPEC`` strings; a malformed piece or a repeated name raises,
    naming ``flag`` and showing ``example``."""
    out: dict[str, str] = {}
    for piece in pieces:
        name, eq, spec = piece.partition("=")
        name, spec = name.strip(), spec.strip()
        if not eq or not name or not spec:
            raise AdaptspecError(f"{flag} {piece!r}: expected NAME=SPEC, e.g. {example}")
        check_variant_name(name, f"{flag}: variant name")
        if name in out:
            raise AdaptspecError(f"{flag}: variant {name!r} given twice")
        out[name] = spec
    return out


def split_variants(text: str) -> list[str]:
    """The ``NAME=SPEC`` pieces of one string. ``;`` always separates variants; a comma does only
    when what follows is ``NAME=`` and a known policy name (a spec's own options have commas).

    >>> split_variants("ctl=linucb:alpha=0.5,lam=2;new=ucb")
    ['ctl=linucb:alpha=0.5,lam=2', 'new=ucb']
    """
    from ..policies.spec import REGISTRY

    out: list[str] = []
    for chunk in text.split(";"):
        pieces: list[str] = []
        for part in chunk.split(","):
            name, eq, rest = part.partition("=")
            starts_variant = (
                bool(eq) and name.strip().isidentifier() and rest.split(":")[0].strip().lower() in REGISTRY
            )
            if pieces and not starts_variant:
                pieces[-1] += "," + part
            else:
                pieces.append(part)
        out += pieces
    return out


def parse_ab_specs(text: str, flag: str = "--ab") -> dict[str, str]:
    """The two variants of an A/B value such as ``"A=fixed:16,B=ucb"`` (see :func:`split_variants`)."""
    out = named_specs(split_variants(text), flag, "A=fixed:16,B=ucb")
    if len(out) != 2:
        raise AdaptspecError(f"{flag} needs exactly two variants, got {len(out)} in {text!r}")
    return out
