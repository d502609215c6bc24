"""The bundled speculator: SmolLM2-135M-Instruct and the drafter trained for it.

>>> BUNDLED_DRAFTER.name
'smollm2-135m-drafter'
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import AdaptspecError
from ..paths import BUNDLED_HEAD

#: the dtype name of a float32 target whose one- and two-row products run on a bfloat16 copy of its
#: weights (:mod:`adaptspec.decoding.prepacked`, "Small products on a second copy"); its drafter runs in float32
MIXED = "mixed"

BUNDLED_DRAFTER = Path(__file__).resolve().parent / "weights" / "smollm2-135m-drafter"
#: The head trained on the template prompts' trace set (:data:`adaptspec.traces.TEMPLATE_TRACES`,
#: ``adaptspec/data/traces/templates``, the drafter's training distribution), with its
#: featurizer: the pair for in-distribution replay.
TEMPLATES_HEAD = Path(__file__).resolve().parent / "weights" / "smollm2-135m-head-templates"


def paired_head(traces: str | os.PathLike | None) -> Path:
    """The shipped head that goes with trace set directory ``traces``: :data:`TEMPLATES_HEAD`
    for the bundled template set, else :data:`~adaptspec.paths.BUNDLED_HEAD` (trained on the bundled default).

    >>> from adaptspec.traces import DEFAULT_TRACES, TEMPLATE_TRACES
    >>> paired_head(DEFAULT_TRACES).name, paired_head(TEMPLATE_TRACES).name, paired_head(None).name
    ('smollm2-135m-head', 'smollm2-135m-head-templates', 'smollm2-135m-head')
    """
    from ..traces import TEMPLATE_TRACES

    if traces is not None and Path(traces).resolve() == TEMPLATE_TRACES.resolve():
        return TEMPLATES_HEAD
    return BUNDLED_HEAD


@dataclass(frozen=True)
class LoadedFrom:
    """How :func:`load_speculator` made a speculator: its arguments, the paths as given (None: the
    bundled model). The host measurement (:func:`adaptspec.host.for_speculator`) reads it to
    time and price those very models."""

    target: str | None
    drafter: str | None
    dtype: str
    device: str
    verification: str


_LOADED: "weakref.WeakKeyDictionary[Any, LoadedFrom]" = weakref.WeakKeyDictionary()


def loaded_from(speculator: Any) -> LoadedFrom | None:
    """How :func:`load_speculator` made ``speculator``; None for any other object (a speculator
    of one's own, or a decoder built by hand).

    >>> loaded_from(object()) is None
    True
    """
    try:
        return _LOADED.get(speculator)
    except TypeError:  # not weak-referenceable: not one of ours
        return None


def load_speculator(
    target: str | os.PathLike | None = None,
    drafter: str | os.PathLike | None = None,
    dtype: str = "bfloat16",
    device: str = "cpu",
    features: str | None = None,
    threads: int | None = None,
    verification: str = "fast",
):
    """A ready :class:`~adaptspec.decoding.SpeculativeDecoder`: the bundled models by default.

    ``target`` is a local Hugging Face model directory (default: the bundled SmolLM2);
    ``drafter`` a directory written by ``BlockDiffusionDrafter.save_pretrained`` or a
    published DFlash v1 drafter as it is (default: the drafter shipped for the bundled
    target). Both run in ``dtype`` on ``device``; ``dtype="mixed"`` (:data:`MIXED`): both in
    float32, the target's products of one or two rows on a bfloat16 copy of its weights (a CPU
    without native bf16 kernels decodes one request as fast as in bfloat16 and a batch as fast
    as in float32).
    ``verification`` is ``"fast"`` (the model's own kernels; block size 1 is plain decoding
    at full speed) or ``"exact"`` (bit-identical to one-token greedy decoding, slower):
    see :class:`~adaptspec.decoding.TargetModel`. :func:`loaded_from` tells how it was made.
    """
    import torch

    from ..decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
    from ..decoding.loading import load_target
    from ..decoding.target import DEFAULT_FEATURES

    if drafter is None and target is not None:
        raise AdaptspecError("a custom target needs its own drafter: pass drafter=PATH")
    path = Path(drafter) if drafter is not None else BUNDLED_DRAFTER
    if threads is not None:
        torch.set_num_threads(threads)
    weights = (
        "float32" if dtype == MIXED else dtype
    )  # mixed: a float32 model with a bfloat16 copy for small passes
    model, tok = load_target(target, dtype=weights, device=device)
    d = BlockDiffusionDrafter.from_pretrained(
        path, target=model, dtype=getattr(torch, weights), device=device
    )
    small = torch.bfloat16 if dtype == MIXED else None
    decoder = SpeculativeDecoder(
        TargetModel(
            model, tok, features=features or DEFAULT_FEATURES, verification=verification, small_dtype=small
        ),
        d,
    )
    _LOADED[decoder] = LoadedFrom(
        None if target is None else str(target),
        None if drafter is None else str(drafter),
        dtype,
        device,
        verification,
    )
    return decoder
