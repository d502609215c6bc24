"""What a policy sees of a request: its context, made in one place.

:class:`Contexts` turns what is known when a request is decided into the context vector the
policy decides on, the update learns from and the decision log keeps. Today that is the
prefill features, mapped by the featurizer (:mod:`adaptspec.policies.featurizer`) when there
is one, else checked (a non-empty, finite 1-D vector) and passed through. It is the only
place a context is made: what else a decision should see (the load at decision time, say)
is added here, and reaches the decider, the log and the updates unchanged.

>>> c = Contexts(None, contextual=True, policy_label="linucb", raw_width=3)
>>> c([1, 2, 3]).dtype, c.width
(dtype('float64'), 3)
>>> c(None)
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: policy linucb is contextual: it needs the prefill features
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import AdaptspecError


class Contexts:
    """Make the context of a request from its prefill ``features``.

    ``featurizer`` maps them (None: they pass through, checked); ``contextual`` is whether the
    policy needs them; ``raw_width`` is the length of the features the speculator gives, when
    known (the width of the logged contexts without a featurizer).
    """

    def __init__(self, featurizer: Any, *, contextual: bool, policy_label: str, raw_width: int | None = None) -> None:
        self.featurizer = featurizer
        self.contextual = contextual
        self.policy_label = policy_label
        self.raw_width = raw_width

    @property
    def width(self) -> int | None:
        """Length of the contexts made here (None: not known before the first request)."""
        return int(self.featurizer.out_dim) if self.featurizer is not None else self.raw_width

    @property
    def source(self) -> str:
        """What makes the contexts, in words (for error messages)."""
        return "the featurizer" if self.featurizer is not None else "the speculator's prefill"

    def __call__(self, features: Any) -> np.ndarray | None:
        """The context of a request whose prefill gave ``features`` (None for a non-contextual
        policy given none). Bad features raise one clear error."""
        if features is None:
            if self.contextual:
                raise AdaptspecError(f"policy {self.policy_label} is contextual: it needs the prefill features")
            return None
        if self.featurizer is not None:
            return self.featurizer(features)
        try:
            x = np.asarray(features, dtype=np.float32)
        except (TypeError, ValueError):
            raise AdaptspecError(f"features must be a vector of numbers, got {type(features).__name__}") from None
        if x.ndim != 1 or x.size == 0:
            raise AdaptspecError(f"features must be a non-empty 1-D vector, got shape {x.shape}")
        if not np.isfinite(x).all():
            raise AdaptspecError("features have NaN or infinite values")
        return x.astype(np.float64)

    def for_policy(self, ctx: np.ndarray | None) -> np.ndarray | None:
        """What the policy is given of a context: nothing for a non-contextual policy."""
        return ctx if self.contextual else None
