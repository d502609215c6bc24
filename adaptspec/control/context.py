"""What a policy sees of a request: its context, made in one place.

:class:`Contexts` turns what is known when a request is decided into the context vector the
policy decides on, the update learns from and the decision log keeps: the prefill features,
mapped by the featurizer (:mod:`adaptspec.policies.featurizer`) when there is one, else
checked (a non-empty, finite 1-D vector) and passed through; then, for a controller made with
``load_features=True``, the :data:`LOAD_FEATURES` of the request's
:class:`~adaptspec.speculator.LoadState` (:func:`load_vector`) appended. It is the only place
a context is made: what it holds reaches the decider, the log and the updates unchanged.

The load features change the context's width (by ``len(LOAD_FEATURES)``), so they are chosen
when the policy is created: a policy, checkpoint or decision log made without them does not
take contexts made with them, and the other way round.

>>> c = Contexts(None, contextual=True, policy_label="linucb", raw_width=3)
>>> c([1, 2, 3]).dtype, c.width
(dtype('float64'), 3)
>>> c([1, 2, 3, 4])
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: features have 4 values, the decoder declares 3
>>> c(None)
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: policy linucb is contextual: it needs the prefill features
>>> from adaptspec.speculator import LoadState
>>> c = Contexts(None, contextual=True, policy_label="linucb", raw_width=3, load_features=True)
>>> c([1, 2, 3], LoadState(rows=3, queue=1, context_tokens=16, temperature=0.7, max_tokens=64)).tolist(), c.width
([1.0, 2.0, 3.0, 2.0, 1.0, 4.0, 1.0, 6.0], 8)
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..errors import AdaptspecError
from ..policies.base import CONTEXT_LIMIT, context_fault, feature_vector
from ..speculator import LoadState

#: The load features appended to a context (``load_features=True``), in order: rows decoding
#: with the request (itself included), requests queued behind it, its prompt's tokens, whether
#: it samples (temperature > 0), its max_tokens; counts on a log2 scale.
LOAD_FEATURES = ("log2_1p_rows", "log2_1p_queue", "log2_context_tokens", "sampled", "log2_max_tokens")


def load_vector(load: LoadState) -> np.ndarray:
    """The :data:`LOAD_FEATURES` of ``load``, as float64.

    >>> load_vector(LoadState(rows=7, queue=0, context_tokens=1024, temperature=0.0, max_tokens=128)).tolist()
    [3.0, 0.0, 10.0, 0.0, 7.0]
    """
    return np.array(
        [
            np.log2(1 + load.rows),
            np.log2(1 + load.queue),
            np.log2(load.context_tokens),
            float(load.temperature > 0),
            np.log2(load.max_tokens),
        ],
        dtype=np.float64,
    )


class Contexts:
    """Make the context of a request from its prefill ``features``.

    ``featurizer`` maps them (None: they pass through, checked); ``contextual`` is whether the
    policy needs them; ``raw_width`` is the length of the features the speculator gives, when
    known (the width of the logged contexts without a featurizer; ``width_source`` says who
    knows it), else fixed by the first valid features: features of another length raise from
    then on; ``load_features`` whether the :data:`LOAD_FEATURES` of the request's load are
    appended (then every request needs one).
    """

    def __init__(
        self,
        featurizer: Any,
        *,
        contextual: bool,
        policy_label: str,
        raw_width: int | None = None,
        load_features: bool = False,
        width_source: str = "the decoder declares",
        declared: bool = False,
    ) -> None:
        self.featurizer = featurizer
        self.contextual = contextual
        self.policy_label = policy_label
        self.raw_width = raw_width
        self.width_source = width_source
        self.declared = bool(declared)  # the decoder declared its features: every request brings them
        self.load_features = bool(load_features)
        self._fix = threading.Lock()

    @classmethod
    def settled(
        cls, width: Any, featurizer: Any, *, contextual: bool, policy_label: str, load_features: bool = False
    ) -> "Contexts":
        """The contexts of a controller whose width :func:`~adaptspec.control.context_width.settle_width`
        settled (``width``, a :class:`~adaptspec.control.context_width.ContextWidth`)."""
        return cls(
            featurizer,
            contextual=contextual,
            policy_label=policy_label,
            raw_width=width.raw,
            load_features=load_features,
            width_source=width.source,
            declared=width.declared,
        )

    def fix_width(self, width: int, source: str) -> None:
        """Fix the length of the features from now on (``source`` says who fixed it, for the error
        a feature vector of another length gets). Only where no width is known yet."""
        with self._fix:
            if self.raw_width is None:
                self.raw_width, self.width_source = int(width), source

    @property
    def width(self) -> int | None:
        """Length of the contexts made here (None: not known before the first request)."""
        base = int(self.featurizer.out_dim) if self.featurizer is not None else self.raw_width
        return None if base is None else base + (len(LOAD_FEATURES) if self.load_features else 0)

    @property
    def source(self) -> str:
        """What makes the contexts, in words (for error messages)."""
        return "the featurizer" if self.featurizer is not None else "the speculator's prefill"

    def __call__(self, features: Any, load: LoadState | None = None) -> np.ndarray | None:
        """The context of a request whose prefill gave ``features``, decided under ``load`` (None
        for a non-contextual policy given no features). Bad features, or no load where the load
        features are on, raise one clear error; ``load`` is ignored where they are off."""
        if features is None:
            if self.contextual:
                raise AdaptspecError(
                    f"policy {self.policy_label} is contextual: it needs the prefill features"
                )
            if self.declared:
                raise AdaptspecError(
                    f"features are missing: {self.width_source} {self.raw_width} (every request "
                    "brings its prefill features, which the log keeps)"
                )
            return None
        x = self._prefill(features)
        if not self.load_features:
            return x
        if not isinstance(load, LoadState):
            raise AdaptspecError(
                f"policy {self.policy_label} was made with load_features: each decision needs "
                f"load=LoadState(...), got {type(load).__name__}"
            )
        return np.concatenate([np.asarray(x, dtype=np.float64), load_vector(load)])

    def _prefill(self, features: Any) -> np.ndarray:
        if self.featurizer is not None:
            z = self.featurizer(features)  # checks its input's length and finiteness
            if (
                not float(z.dot(z)) <= CONTEXT_LIMIT * CONTEXT_LIMIT
            ):  # features far outside what it was fitted on
                raise context_fault(z, "the featurizer's contexts of these features")
            return z
        x = feature_vector(features)
        if self.raw_width is None:  # the first valid features fix the width
            self.fix_width(x.size, "the first request's features had")
        if x.size != self.raw_width:
            raise AdaptspecError(f"features have {x.size} values, {self.width_source} {self.raw_width}")
        return x.astype(np.float32).astype(np.float64)  # as the log keeps them (float32)

    def for_policy(self, ctx: np.ndarray | None) -> np.ndarray | None:
        """What the policy is given of a context: nothing for a non-contextual policy."""
        return ctx if self.contextual else None
