"""How long a controller's prefill features are: settled once, from everything that knows it.

Five parts may know the length of the prefill features (the *raw* width; the context a policy
sees is that, or a featurizer's output, plus the load features when they are on). They are
asked in this order; the first that knows fixes the width, and every later one that knows must
agree, or the controller is refused in one line naming both:

1. the decoder: the speculator's ``feature_dim`` declaration, or the controller's
   ``feature_dim`` argument (:class:`~adaptspec.control.protocol.DecoderShape`; an engine's);
2. the policy: its featurizer's input, or a contextual policy built for a width (a head's);
3. the decision log: the contexts it holds (when the controller logs them);
4. the policy as resumed: what a checkpoint, and the log replayed into it, taught it;
5. none of them: the first request's features fix it (:class:`~adaptspec.control.context.Contexts`).

With a featurizer the context's width is the featurizer's output, known from the start: the
log and the resumed policy are checked against it. :func:`settle_width` is the one place the
width is decided; :class:`~adaptspec.control.context.Contexts` is given its answer.

>>> from adaptspec.control.protocol import engine_shape
>>> w = settle_width(engine_shape([1, 4], feature_dim=3), reads=None, featurizer=None, extra=0, given=3)
>>> w.raw, w.source, w.declared
(3, "the controller's feature_dim is", True)
>>> settle_width(engine_shape([1, 4], feature_dim=3), reads=5, featurizer=None, extra=0, given=3, label="linucb")
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: policy linucb reads prefill features of 5 values, the engine's have 3: use a policy made for this decoder (or no policy, for the default)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import AdaptspecError
from .protocol import DecoderShape


@dataclass(frozen=True)
class ContextWidth:
    """The settled length of the prefill features (``raw``; None: the first request fixes it),
    who fixed it (``source``, the end of the error a request of another length gets:
    ``"features have 41 values, {source} {raw}"``) and whether the decoder declared it
    (``declared``: then every request must bring its features)."""

    raw: int | None
    source: str
    declared: bool = False


def settle_width(
    shape: DecoderShape,
    *,
    reads: int | None,
    featurizer: Any,
    extra: int,
    given: int | None,
    label: str = "",
    logged: int | None = None,
    log_dir: Path | None = None,
    learnt: int | None = None,
    checkpoint: str | None = None,
) -> ContextWidth:
    """The :class:`ContextWidth` of a controller over a decoder of ``shape`` (see the module
    docstring). ``reads``: the raw width the policy ``label`` reads (its featurizer's input, or its
    own dimension less the ``extra`` load features), None when it does not say; ``featurizer``:
    the featurizer contexts are made with, or None; ``given``: the controller's ``feature_dim``
    argument; ``logged``: the context width the decision log in ``log_dir`` holds (None: none, or
    not logged); ``learnt``: the context width of the resumed policy (None: it learnt nothing
    contextual), from ``checkpoint`` (its path) when there was one."""
    raw, source = None, ""
    if shape.feature_dim is not None:
        raw = shape.feature_dim
        source = (
            "the controller's feature_dim is"
            if given is not None
            else f"speculator {shape.name} declares feature_dim"
        )
    if reads is not None:
        if raw is not None and int(reads) != raw:
            by = "its featurizer" if featurizer is not None else f"policy {label}"
            whose = "the speculator's" if shape.speculator else "the engine's"
            raise AdaptspecError(
                f"{by} reads prefill features of {int(reads)} values, {whose} have {raw}: "
                "use a policy made for this decoder (or no policy, for the default)"
            )
        if raw is None:
            raw, source = int(reads), f"policy {label} reads"

    def context(raw_width: int | None) -> int | None:  # what the policy sees of features this long
        base = int(featurizer.out_dim) if featurizer is not None else raw_width
        return None if base is None else base + extra

    if logged is not None:
        if context(raw) is not None and int(logged) != context(raw):
            made_by = "the featurizer" if featurizer is not None else "the speculator's prefill"
            raise AdaptspecError(
                f"{log_dir}: this decision log holds contexts of {int(logged)} features, {made_by} "
                f"gives {context(raw)}: use another log directory"
            )
        if raw is None and featurizer is None:
            raw, source = int(logged) - extra, f"the decision log in {log_dir} holds"
    if learnt is not None:
        if context(raw) is not None and int(learnt) != context(raw):
            if source.startswith("the decision log"):
                raise AdaptspecError(
                    f"policy {label} has learnt contexts of {int(learnt)} values, but {source} "
                    f"{raw} feature values: use another checkpoint directory"
                )
            raise AdaptspecError(
                f"{checkpoint or 'the resumed policy'}: the checkpoint's policy learnt contexts of "
                f"{int(learnt)} values, this controller's have {context(raw)} (another model or "
                "featurizer): use another checkpoint directory"
            )
        if raw is None and featurizer is None:
            raw, source = int(learnt) - extra, f"policy {label} has learnt"
    return ContextWidth(raw, source or "the first request's features had", shape.feature_dim is not None)
