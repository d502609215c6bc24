"""What a controller knows of the decoder it serves, checked once when it is built.

:func:`speculator_shape` checks a speculator against the protocol
(:class:`~adaptspec.speculator.BlockSpeculator`): ``prefill`` and ``decode`` present and
callable with the protocol's arguments (``inspect.signature``), an integer ``max_block_size``,
and the protocol's two optional declarations, ``feature_dim`` (the length of its prefill
features) and ``per_round`` (whether ``decode`` asks a :class:`~adaptspec.speculator.RoundSchedule`
every round), ``prefix_drafts`` and ``draft_trees`` (whether ``decode`` takes tree arms).
:func:`engine_shape` is the same record for an engine that decodes by itself and
only calls ``decide`` / ``feedback`` (no speculator object). Everything the controller decides
from the decoder (the default policy, the context width, which options it can honour) is read
from the :class:`DecoderShape` made here, never probed again.

>>> class NoSeed:
...     max_block_size = 8
...     def prefill(self, prompt_ids, temperature=0.0): ...
...     def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None): ...
>>> speculator_shape(NoSeed())
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: speculator NoSeed: prefill(prompt_ids, temperature=0.0) does not take seed=...: the protocol's is prefill(prompt_ids, temperature=0.0, seed=None) -> Prefill
>>> engine_shape([1, 2, 4, 8], feature_dim=40)
DecoderShape(name='engine', max_block_size=8, feature_dim=40, per_round=False, arms=(1, 2, 4, 8), speculator=False, prefix_drafts=False, draft_trees=False)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from ..speculator import check_block_sizes

#: The protocol's two methods, as a user must write them (the error messages quote these).
PREFILL_SIGNATURE = "prefill(prompt_ids, temperature=0.0, seed=None) -> Prefill"
DECODE_SIGNATURE = (
    "decode(prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None) -> Outcome"
)

# (method, positional arguments the controller may pass, keywords it passes, the protocol's signature)
_CALLS = (
    ("prefill", 1, ("temperature", "seed"), PREFILL_SIGNATURE),
    ("decode", 3, ("temperature", "seed", "on_round"), DECODE_SIGNATURE),
)


@dataclass(frozen=True)
class DecoderShape:
    """What a controller knows of its decoder: its ``name`` (for messages), the largest block it
    can draft, the width of its prefill features (None: fixed by the first request), whether it
    honours per-round schedules (``per_round``), the block sizes it can decode when it said so
    (``arms``: an engine's; None for a speculator: every size up to ``max_block_size``) and
    whether there is a speculator object to call (``generate`` needs one)."""

    name: str
    max_block_size: int
    feature_dim: int | None = None
    per_round: bool = False
    arms: tuple[int, ...] | None = None
    speculator: bool = True
    prefix_drafts: bool = False  # every round drafts one block and verifies a prefix (exact counterfactuals)
    draft_trees: bool = False  # decode takes tree arms (-N) and reports what each tree showed


def speculator_shape(speculator: Any, feature_dim: int | None = None) -> DecoderShape:
    """The :class:`DecoderShape` of ``speculator``, after checking it against the protocol: one
    :class:`~adaptspec.errors.AdaptspecError` line naming the method and the protocol's signature
    for a missing method or one that cannot take the controller's arguments. ``feature_dim``, when
    given, declares the features' width for a speculator that does not (and must agree with one
    that does)."""
    name = type(speculator).__name__
    for method, positional, keywords, signature in _CALLS:
        fn = getattr(speculator, method, None)
        if not callable(fn):
            raise AdaptspecError(f"speculator {name} has no {method}() method: the protocol's is {signature}")
        fault = _call_fault(fn, positional, keywords)
        if fault is not None:
            raise AdaptspecError(f"speculator {name}: {method}{fault}: the protocol's is {signature}")
    max_b = getattr(speculator, "max_block_size", None)
    if not _is_int(max_b) or max_b < 1:
        raise AdaptspecError(f"speculator {name} needs an integer max_block_size >= 1, got {max_b!r}")
    declared = getattr(speculator, "feature_dim", None)
    if declared is not None and (not _is_int(declared) or declared < 1):
        raise AdaptspecError(
            f"speculator {name}: feature_dim must be an integer >= 1 or None, got {declared!r}"
        )
    width = _width(feature_dim, "feature_dim")
    if width is not None and declared is not None and int(declared) != width:
        raise AdaptspecError(
            f"feature_dim={width}, but speculator {name} declares feature_dim {int(declared)}"
        )
    flags = {}
    for flag in ("per_round", "prefix_drafts", "draft_trees"):
        flags[flag] = getattr(speculator, flag, False)
        if not isinstance(flags[flag], (bool, np.bool_)):
            raise AdaptspecError(f"speculator {name}: {flag} must be True or False, got {flags[flag]!r}")
    return DecoderShape(
        name,
        int(max_b),
        width if width is not None else (None if declared is None else int(declared)),
        bool(flags["per_round"]),
        prefix_drafts=bool(flags["prefix_drafts"]),
        draft_trees=bool(flags["draft_trees"]),
    )


def engine_shape(
    arms: Sequence[int] | None, feature_dim: int | None = None, prefix_drafts: bool = False
) -> DecoderShape:
    """The :class:`DecoderShape` of an engine that decodes by itself: the block sizes it can
    decode (``arms``, required; no engine decodes draft trees yet, so tree arms are refused), the
    width of its prefill features (None: fixed by the first ``decide``) and whether every round
    drafts one block and verifies a prefix of it (``prefix_drafts``: every shorter arm's
    counterfactual is exact)."""
    if arms is None or isinstance(arms, (str, bytes)) or not all(_is_int(a) for a in arms):
        raise AdaptspecError(
            f"an engine's controller needs arms, the block sizes the engine can decode "
            f"(a list of integers), got {arms!r}"
        )
    checked = check_block_sizes(
        [int(a) for a in arms], max(int(a) for a in arms) if len(arms) else 1, name=f"arms {list(arms)}"
    )
    return DecoderShape(
        "engine",
        checked[-1],
        _width(feature_dim, "feature_dim"),
        False,
        checked,
        speculator=False,
        prefix_drafts=bool(prefix_drafts),
    )


def _call_fault(fn: Any, positional: int, keywords: tuple[str, ...]) -> str | None:
    """Why ``fn`` cannot be called with ``positional`` arguments and every one of ``keywords``
    (``"(a, b) does not take seed=..."``); None when it can, or when Python cannot tell."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or extension without a signature: trust it
        return None
    args = [object()] * positional
    try:
        sig.bind(*args)
    except TypeError:
        return f"({_params(sig)}) cannot take {positional} positional argument{'s' * (positional > 1)}"
    for k in keywords:
        try:
            sig.bind(*args, **{k: None})
        except TypeError:
            return f"({_params(sig)}) does not take {k}=..."
    return None


def _params(sig: inspect.Signature) -> str:
    return ", ".join(str(p.replace(annotation=p.empty)) for p in sig.parameters.values())


def _width(v: Any, name: str) -> int | None:
    if v is None:
        return None
    if not _is_int(v) or v < 1:
        raise AdaptspecError(f"{name} must be an integer >= 1 or None, got {v!r}")
    return int(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
