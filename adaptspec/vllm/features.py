"""What the policy sees of a vLLM request when its prefill ends: statistics of its prompt's tokens.

vLLM's scheduler, where the plug-in decides, holds a request's token ids but not the target's
hidden states: those stay in the worker, and no seam of vLLM 0.32 carries them to the scheduler
without patching vLLM (docs/vllm.md, "Features", says what was tried). So the context is computed
from the prompt's tokens, the signals that predict how much a drafter can copy or guess:

- ``log1p_tokens``: log(1 + the prompt's length);
- ``distinct``: distinct tokens over tokens (low: repetitive text, which drafters copy well);
- ``repeated_bigrams``, ``repeated_trigrams``: the share of the prompt's 2- and 3-grams that
  occurred earlier in it (what an n-gram drafter can look up);
- ``top_token_share``: the most frequent token's share;
- ``suffix_match``: the longest suffix of the prompt (up to :data:`SUFFIX_WINDOW` tokens) that
  occurred earlier in it, over :data:`SUFFIX_WINDOW` (the n-gram lookup a continuation starts from).

The engine's load (rows, queue) goes to the controller beside them (``LoadState``) and joins the
context with ``load_features``.

>>> f = prompt_features([5, 6, 7, 5, 6, 7, 5, 6])
>>> dict(zip(FEATURE_NAMES, f.round(3).tolist()))["distinct"], float(f[FEATURE_NAMES.index("suffix_match")])
(0.375, 0.625)
>>> prompt_features([1]).tolist()      # one token: nothing repeats
[0.6931471824645996, 1.0, 0.0, 0.0, 1.0, 0.0]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["FEATURE_NAMES", "FEATURE_DIM", "SUFFIX_WINDOW", "prompt_features"]

FEATURE_NAMES = (
    "log1p_tokens",
    "distinct",
    "repeated_bigrams",
    "repeated_trigrams",
    "top_token_share",
    "suffix_match",
)
FEATURE_DIM = len(FEATURE_NAMES)
#: The longest prompt suffix ``suffix_match`` looks for earlier in the prompt.
SUFFIX_WINDOW = 8


def prompt_features(token_ids: Sequence[int]) -> np.ndarray:
    """The :data:`FEATURE_NAMES` of a prompt (a non-empty sequence of token ids), float32."""
    ids = np.asarray(token_ids, dtype=np.int64)
    n = ids.size
    _, counts = np.unique(ids, return_counts=True)
    return np.array(
        [
            np.log1p(n),
            counts.size / n,
            _repeated(ids, 2),
            _repeated(ids, 3),
            counts.max() / n,
            _suffix_match(ids) / SUFFIX_WINDOW,
        ],
        dtype=np.float32,
    )


def _repeated(ids: np.ndarray, k: int) -> float:
    """The share of ``ids``'s k-grams that occurred earlier in it (0 when it has none)."""
    if ids.size < k:
        return 0.0
    grams = np.lib.stride_tricks.sliding_window_view(ids, k)
    distinct = np.unique(grams, axis=0).shape[0]
    return 1.0 - distinct / grams.shape[0]


def _suffix_match(ids: np.ndarray) -> int:
    """The longest suffix of ``ids`` (up to :data:`SUFFIX_WINDOW`) that also starts earlier in it."""
    best = 0
    for k in range(1, min(SUFFIX_WINDOW, ids.size - 1) + 1):
        suffix = ids[-k:]
        earlier = np.lib.stride_tricks.sliding_window_view(ids[:-1], k)
        if not (earlier == suffix).all(axis=1).any():
            break
        best = k
    return best
