"""A speculator's prefill and decode as a collection runs them: whatever they raise or return
that no honest speculator gives is one :class:`~adaptspec.errors.AdaptspecError` line naming
the request and the block size, before it reaches a trace set or a latency profile.

Checked as the controller checks them: the outcome by the one outcome rule
(:func:`adaptspec.speculator.outcome_fault`: no round larger than the block size asked for, at
most ``max_new_tokens`` tokens, rounds that add up to its tokens, times in seconds), the
features as a non-empty 1-D vector of finite numbers of the speculator's declared
``feature_dim`` (or, undeclared, of one length throughout). ``collect`` (every arm, the Ray
tasks) and ``profile-latency`` call them.

>>> from adaptspec.speculator import Outcome, Round
>>> class Liar:
...     max_block_size = 8
...     def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None):
...         return Outcome([1] * 9, [Round(8, 8, 0.0, 0.01)], 0.01)
>>> checked_decode(Liar(), None, 4, 16, "request q1")
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: request q1: decode at block size 4 is refused: round 0 ran block size 8, larger than the 4 decided
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from ..policies.base import feature_vector
from ..speculator import Outcome, Prefill, arm_label, outcome_fault, verified_positions


def _line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def checked_prefill(
    speculator: Any, prompt_ids: Sequence[int], temperature: float, seed: int, where: str
) -> Prefill:
    """``speculator.prefill`` of ``prompt_ids`` (with ``temperature`` and ``seed`` at T > 0)."""
    try:
        if temperature > 0:
            pre = speculator.prefill(list(prompt_ids), temperature=temperature, seed=seed)
        else:
            pre = speculator.prefill(list(prompt_ids))
    except AdaptspecError as e:
        raise AdaptspecError(f"{where}: prefill refused the prompt: {_line(e)}") from e
    except Exception as e:  # noqa: BLE001 - the speculator's own code failed: one line, the cause chained
        raise AdaptspecError(f"{where}: prefill raised {type(e).__name__}: {_line(e)}") from e
    if not isinstance(pre, Prefill):
        raise AdaptspecError(f"{where}: prefill returned {type(pre).__name__}, not an adaptspec Prefill")
    return pre


def checked_features(features: Any, width: int | None, where: str, whose: str) -> np.ndarray:
    """``features`` as a float32 vector: 1-D, non-empty, finite, ``width`` long when known
    (``whose`` says where ``width`` comes from, for the message)."""
    try:
        x = feature_vector(features)  # the controller's own check (adaptspec.policies.base)
    except AdaptspecError as e:
        raise AdaptspecError(f"{where}: {e}") from None
    if width is not None and x.size != width:
        raise AdaptspecError(f"{where}: features have {x.size} values, {whose} {width}")
    return x.astype(np.float32)


def checked_decode(
    speculator: Any,
    prefill: Prefill,
    block_size: int,
    max_new_tokens: int,
    where: str,
    temperature: float = 0.0,
    seed: int | None = None,
) -> Outcome:
    """``speculator.decode(prefill, block_size, max_new_tokens, temperature=, seed=)``, its outcome
    checked by :func:`~adaptspec.speculator.outcome_fault`."""
    at = f"{where}: decode at block size {arm_label(block_size)}"
    try:
        o = speculator.decode(prefill, block_size, max_new_tokens, temperature=temperature, seed=seed)
    except AdaptspecError as e:
        raise AdaptspecError(f"{at} failed: {_line(e)}") from e
    except Exception as e:  # noqa: BLE001 - the speculator's own code failed: one line, the cause chained
        raise AdaptspecError(f"{at} raised {type(e).__name__}: {_line(e)}") from e
    if not isinstance(o, Outcome):
        raise AdaptspecError(f"{at} returned {type(o).__name__}, not an adaptspec Outcome")
    fault = outcome_fault(o, verified_positions(block_size), max_new_tokens)
    if fault is not None:
        raise AdaptspecError(f"{at} is refused: {fault}")
    return o
