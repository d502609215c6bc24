"""Target adapter: any Hugging Face causal LM, with the three calls a speculator needs.

``prefill`` runs the prompt and returns the first-token logits, the hidden states the drafter
reads and the prefill feature vector; ``verify`` runs a block against the KV cache;
``crop`` rolls the cache back after a partial acceptance.

The feature vector is :func:`~adaptspec.decoding.features.prefill_features` of the prefill,
described by a feature spec (:mod:`adaptspec.decoding.features`; default
:data:`~adaptspec.decoding.features.DEFAULT_FEATURES`).

>>> parse_feature_spec("last:-1,mean:mid,len", num_layers=30)
[('last', 30), ('mean', 15), ('len', 0)]
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from ..errors import AdaptspecError
from .batch_invariant import is_batch_invariant, make_batch_invariant
from .features import DEFAULT_FEATURES, feature_dim, parse_feature_spec, prefill_features
from .prepacked import Prepacked


@dataclass
class TargetPrefill:
    """What the target computed on a prompt."""

    logits: torch.Tensor  # [V] at the last prompt position
    context_hidden: torch.Tensor | None  # [T, k*H] at the drafter's layers, or None
    features: np.ndarray  # float32 [d]
    cache: Any  # transformers Cache holding T positions


#: How a block is verified: ``"fast"`` runs the model's ordinary kernels (what serving engines
#: do: every committed token is the target's argmax in the pass that verified it, which can
#: differ from one-token greedy decoding only where two logits tie within rounding);
#: ``"exact"`` runs batch-invariant kernels, bit-identical to one-token greedy decoding.
VERIFICATION_MODES = ("fast", "exact")


@functools.cache
def cache_keyword() -> str:
    """The keyword a Hugging Face model's forward takes its KV cache by: ``cache`` from
    transformers 5.24, ``past_key_values`` before it (vLLM 0.32 pins transformers < 5.20, and
    adaptspec runs beside it; 5.24+ still takes ``past_key_values`` with a FutureWarning until 5.40)."""
    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


class TargetModel:
    """Wraps a causal LM (a model object or a local path) for speculative decoding.

    ``verification="fast"`` (the default) leaves the model's kernels as they are: a one-token
    step is the model's own, so block size 1 is plain decoding at full speed. With
    ``verification="exact"`` the model is patched in place so that a block is computed row
    for row exactly as token-by-token decoding computes it (see
    :mod:`adaptspec.decoding.batch_invariant`): greedy speculative output is then
    bit-identical to the model's own ``generate`` under the same (patched) kernels, at the
    price of slower steps (docs/decoding.md has both guarantees and their costs).
    ``prepacked`` (default True): on a CPU, the passes run each plain linear layer on its weight
    reordered once for oneDNN (:mod:`~adaptspec.decoding.prepacked`: bfloat16 products
    bit-identical, float32 ones oneDNN's instead of MKL's; an exact target's layers are left as
    they are). ``small_dtype`` (with ``prepacked``, a float32 model): the products of one or two
    rows run on a copy of the weights in that dtype (the dtype ``mixed``: a bfloat16 copy;
    :class:`~adaptspec.decoding.prepacked.SmallCopyLinear`).
    """

    def __init__(
        self,
        model: nn.Module | str | os.PathLike,
        tokenizer: Any = None,
        features: str = DEFAULT_FEATURES,
        context_layers: Sequence[int] | None = None,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device | None = None,
        verification: str = "fast",
        prepacked: bool = True,
        small_dtype: torch.dtype | None = None,
    ) -> None:
        if verification not in VERIFICATION_MODES:
            raise AdaptspecError(
                f"verification must be one of {', '.join(VERIFICATION_MODES)}, got {verification!r}"
            )
        if not isinstance(model, nn.Module):
            from .loading import load_target

            model, tokenizer = load_target(
                model, dtype=_dtype_name(dtype) or "bfloat16", device=str(device or "cpu")
            )
        else:
            if dtype is not None or device is not None:
                model = model.to(device=device, dtype=_torch_dtype(dtype))
        if verification == "exact":
            make_batch_invariant(model)
        elif is_batch_invariant(model):
            raise AdaptspecError(
                "this model was patched for exact verification; load a fresh copy for fast verification"
            )
        self.verification = verification
        self.model = model.eval()
        #: the passes' linear layers on weights reordered once (:mod:`~adaptspec.decoding.prepacked`;
        #: none with ``prepacked=False``, on an exact target, or where this CPU cannot reorder them)
        self.prepacked = Prepacked(model if prepacked else nn.Module(), small_dtype=small_dtype)
        self.tokenizer = tokenizer
        cfg = model.config
        self.num_layers: int = cfg.num_hidden_layers
        self.vocab_size: int = cfg.vocab_size
        self.feature_parts = parse_feature_spec(features, self.num_layers)
        self.feature_spec = features
        self.context_layers: list[int] | None = list(context_layers) if context_layers is not None else None
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = getattr(cfg, "eos_token_id", None)
        self.eos_token_ids: set[int] = (
            set() if eos is None else set(eos if isinstance(eos, (list, tuple)) else [eos])
        )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def feature_dim(self) -> int:
        """The length of the prefill feature vector (:func:`~adaptspec.decoding.features.feature_dim`)."""
        return feature_dim(self.model.config.hidden_size, self.num_layers, self.feature_spec)

    def encode_chat(self, prompt: str) -> list[int]:
        """Token ids of ``prompt`` as one user turn in the chat template (plain text if none)."""
        if self.tokenizer is None:
            raise AdaptspecError("this target has no tokenizer: pass token ids instead of text")
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return list(ids)
        return list(self.tokenizer(prompt)["input_ids"])

    # ------------------------------------------------------------------ forward passes
    def _forward(self, ids: torch.Tensor, cache: Any, want_hidden: bool, last_only: bool = False):
        from transformers import DynamicCache

        if cache is None:
            cache = DynamicCache(config=self.model.config)
        with self.prepacked.on():
            out = self.model(
                input_ids=ids,
                **{cache_keyword(): cache},
                use_cache=True,
                output_hidden_states=want_hidden,
                logits_to_keep=1 if last_only else 0,
            )
        return out, cache

    def _context(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
        if self.context_layers is None:
            return None
        return torch.cat([hidden_states[i][0] for i in self.context_layers], dim=-1)

    @torch.inference_mode()
    def prefill(self, prompt_ids: Sequence[int] | torch.Tensor) -> TargetPrefill:
        """Run the prompt; return last-position logits, drafter context, features and the cache."""
        ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=self.device).reshape(1, -1)
        if ids.shape[1] == 0:
            raise AdaptspecError("empty prompt: give at least one token")
        if int(ids.max()) >= self.vocab_size or int(ids.min()) < 0:
            raise AdaptspecError(f"prompt has token ids outside 0..{self.vocab_size - 1}")
        out, cache = self._forward(ids, None, want_hidden=True, last_only=True)
        hs = out.hidden_states
        logits = out.logits[0, -1]
        return TargetPrefill(logits, self._context(hs), self._features(hs, logits, ids.shape[1]), cache)

    @torch.inference_mode()
    def verify(
        self, block: torch.Tensor, cache: Any, context: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run ``block[B]`` after the cached positions: logits ``[B, V]`` and drafter context ``[B, k*H]``
        (None when ``context`` is False or the target feeds no drafter: then this is the model's
        plain forward step)."""
        context = context and self.context_layers is not None
        out, _ = self._forward(block.reshape(1, -1), cache, want_hidden=context)
        return out.logits[0], self._context(out.hidden_states) if context else None

    @staticmethod
    def crop(cache: Any, length: int) -> None:
        """Keep the first ``length`` cached positions (transformers 5: ``crop(-n)`` drops the last n)."""
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)

    # ------------------------------------------------------------------ features
    def _features(self, hs: tuple[torch.Tensor, ...], logits: torch.Tensor, n: int) -> np.ndarray:
        return prefill_features(hs, logits=logits, prompt_tokens=n, spec=self.feature_spec)


def _torch_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    t = getattr(torch, str(dtype), None)
    if not isinstance(t, torch.dtype):
        raise AdaptspecError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    return t


def _dtype_name(dtype: str | torch.dtype | None) -> str | None:
    if dtype is None:
        return None
    return str(dtype).replace("torch.", "")
