"""The prefill feature vector: what a policy sees of a request, from the target's prefill.

:func:`prefill_features` turns a Hugging Face causal LM's output on a prompt (run with
``output_hidden_states=True``) into the standard feature vector, the one the bundled decoder
puts in ``Prefill.features`` (:class:`~adaptspec.decoding.target.TargetModel` calls it). A
speculator of your own calls it on its own target's prefill and returns the result as
``Prefill.features``; its length is :func:`feature_dim` (declare it as the speculator's
``feature_dim``).

The vector is described by a short spec, parts joined by commas:

- ``last:L`` the last position's hidden state at layer ``L``,
- ``mean:L`` the mean over prompt positions at layer ``L``,
- ``logits:D`` the last position's logits, projected to ``D`` dims by a fixed random matrix
  (seed 0, so the same for every process),
- ``len`` log(1 + prompt length) (context length matters: long contexts favour small blocks).

Layers are indices into ``hidden_states`` (0 = embeddings); ``-1`` is the last layer (after
the final norm) and ``mid`` the middle one. The default, :data:`DEFAULT_FEATURES`, is
``last:-1,mean:mid,len``: ``2 * hidden_size + 1`` values.

>>> parse_feature_spec("last:-1,mean:mid,len", num_layers=30)
[('last', 30), ('mean', 15), ('len', 0)]
>>> feature_dim(hidden_size=576, num_layers=30)
1153
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from ..errors import AdaptspecError

__all__ = ["DEFAULT_FEATURES", "feature_dim", "parse_feature_spec", "prefill_features"]

DEFAULT_FEATURES = "last:-1,mean:mid,len"


def parse_feature_spec(spec: str, num_layers: int) -> list[tuple[str, int]]:
    """Parse a feature spec into ``(kind, layer-or-dim)`` parts (see the module docstring)."""
    parts: list[tuple[str, int]] = []
    for raw in spec.split(","):
        raw = raw.strip()
        kind, _, arg = raw.partition(":")
        if kind == "len" and not arg:
            parts.append(("len", 0))
            continue
        if kind not in ("last", "mean", "logits") or not arg:
            raise AdaptspecError(f"bad feature part {raw!r} in {spec!r}: use last:L, mean:L, logits:D or len")
        if kind == "logits":
            if not arg.isdigit() or int(arg) < 1:
                raise AdaptspecError(f"logits:D needs a positive dimension, got {raw!r}")
            parts.append(("logits", int(arg)))
            continue
        if arg == "mid":
            layer = num_layers // 2
        else:
            try:
                layer = int(arg)
            except ValueError:
                raise AdaptspecError(f"bad layer {arg!r} in feature part {raw!r}") from None
            if layer < 0:
                layer = num_layers + 1 + layer
        if not 0 <= layer <= num_layers:
            raise AdaptspecError(f"feature layer {arg} outside 0..{num_layers}")
        parts.append((kind, layer))
    return parts


def feature_dim(hidden_size: int, num_layers: int, spec: str = DEFAULT_FEATURES) -> int:
    """The length of the feature vector of ``spec`` for a model of ``hidden_size`` and
    ``num_layers`` (a Hugging Face config's ``hidden_size`` and ``num_hidden_layers``)."""
    return sum(
        hidden_size if k in ("last", "mean") else (1 if k == "len" else d)
        for k, d in parse_feature_spec(spec, num_layers)
    )


def prefill_features(
    output: Any, *, logits: Any = None, prompt_tokens: int | None = None, spec: str = DEFAULT_FEATURES
) -> np.ndarray:
    """The standard feature vector (float32, 1-D) of a prompt, from a Hugging Face causal LM's
    prefill: exactly what the bundled decoder gives as ``Prefill.features``.

    ``output`` is the model's output on the whole prompt, run with ``output_hidden_states=True``
    (``model(input_ids, output_hidden_states=True)``; a batch of one), or its ``hidden_states``
    tuple (the embeddings, then every layer). ``logits`` (the output's own when not given) is
    needed only by ``logits:D`` parts: the last position's are used. ``prompt_tokens`` is the
    prompt's length (default: the positions in the hidden states: the prompt, when it was run in
    one pass). ``spec`` is the feature spec (module docstring).

    >>> hs = tuple(torch.arange(6, dtype=torch.float32).reshape(1, 3, 2) + i for i in range(3))
    >>> prefill_features(hs).round(4).tolist()   # last:-1 (layer 2), mean:mid (layer 1), len
    [6.0, 7.0, 3.0, 4.0, 1.3863]
    """
    hidden = getattr(output, "hidden_states", output)
    if logits is None:
        logits = getattr(output, "logits", None)
    if hidden is None:
        raise AdaptspecError(
            "the model output has no hidden states: run the model with output_hidden_states=True"
        )
    if not isinstance(hidden, (tuple, list)) or not hidden or not all(torch.is_tensor(h) for h in hidden):
        raise AdaptspecError(
            f"prefill_features needs the hidden states, a tuple of tensors (embeddings, then each "
            f"layer), got {type(hidden).__name__}"
        )
    if hidden[0].ndim != 3 or hidden[0].shape[0] != 1:
        raise AdaptspecError(
            f"prefill_features needs hidden states of one prompt, [1, positions, hidden], got "
            f"{list(hidden[0].shape)}"
        )
    n = int(hidden[0].shape[1]) if prompt_tokens is None else int(prompt_tokens)
    out: list[torch.Tensor] = []
    for kind, arg in parse_feature_spec(spec, len(hidden) - 1):
        if kind == "last":
            out.append(hidden[arg][0, -1].float())
        elif kind == "mean":
            out.append(hidden[arg][0].float().mean(0))
        elif kind == "logits":
            if logits is None:
                raise AdaptspecError(f"feature part logits:{arg} needs the model's logits")
            last = logits.reshape(-1, logits.shape[-1])[-1].float()
            out.append(last @ logit_projection(int(last.shape[0]), arg, last.device))
        else:
            out.append(torch.tensor([np.log1p(n)], dtype=torch.float32, device=hidden[0].device))
    return torch.cat(out).cpu().numpy().astype(np.float32)


def logit_projection(vocab_size: int, dim: int, device: Any = "cpu") -> torch.Tensor:
    """The fixed random matrix ``[vocab_size, dim]`` (seed 0) the ``logits:D`` part projects with."""
    return _projection(int(vocab_size), int(dim), str(device))


@functools.lru_cache(maxsize=8)
def _projection(vocab_size: int, dim: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(vocab_size, dim, generator=g) / np.sqrt(dim)).to(device)
