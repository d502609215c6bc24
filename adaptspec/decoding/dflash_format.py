"""The published DFlash v1 drafter layout (z-lab): read its config and map its tensor names.

A DFlash v1 directory holds ``config.json`` (a Qwen3 config with
``"architectures": ["DFlashDraftModel"]``, ``block_size``, ``num_target_layers`` and
``dflash_config: {mask_token_id, target_layer_ids}``) and ``model.safetensors`` (no
embedding, no LM head: both are the target's). :func:`read_config` turns the config into a
:class:`~adaptspec.decoding.drafter.DrafterConfig` and refuses, with one line naming the
field, everything this port does not compute exactly as the reference does;
:func:`to_adaptspec_names` renames the tensors to the drafter's own parameter names.

Conventions carried over (they change every draft):

- ``target_layer_ids`` count the target's decoder layers from 0 and read the output of that
  layer, which is ``hidden_states[id + 1]`` (index 0 is the embeddings);
- queries and keys (of the context and of the block) get a per-head RMS norm before RoPE;
- the mask is the target's embedding of ``mask_token_id``; there is no learned mask vector;
- the trained ``block_size`` sits at the top level or inside ``dflash_config``.

>>> cfg = {"architectures": ["DFlashDraftModel"], "hidden_size": 64, "num_hidden_layers": 1,
...        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
...        "vocab_size": 256, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "num_target_layers": 6,
...        "block_size": 16, "dflash_config": {"mask_token_id": 255, "target_layer_ids": [1, 4]}}
>>> c = read_config(cfg)
>>> c.target_layers, c.max_block_size, c.head_dim, c.qk_norm, c.mask_token_id
([2, 5], 16, 16, True, 255)
>>> to_adaptspec_names("layers.0.self_attn.k_norm.weight")
'layers.0.k_norm.weight'
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..errors import AdaptspecError
from .drafter import DrafterConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ARCHITECTURE = "DFlashDraftModel"

#: Keys of ``dflash_config`` that v1 defines; any other one belongs to a later layout.
_DFLASH_KEYS = {"mask_token_id", "target_layer_ids", "block_size"}
#: Top-level keys that mark a newer (DFlash2) layout this port does not implement.
_NEWER_LAYOUT_KEYS = ("projector_type", "use_swa", "swa_window", "sliding_window_layers", "num_swa_layers")

_RENAMES = [
    (r"layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.weight", r"layers.\1.\2.weight"),
    (r"layers\.(\d+)\.mlp\.(gate_proj|up_proj|down_proj)\.weight", r"layers.\1.\2.weight"),
    (r"layers\.(\d+)\.input_layernorm\.weight", r"layers.\1.input_norm.weight"),
    (r"layers\.(\d+)\.post_attention_layernorm\.weight", r"layers.\1.post_norm.weight"),
    (r"hidden_norm\.weight", "context_norm.weight"),
    (r"(fc|norm)\.weight", r"\1.weight"),
]


def is_dflash_dir(path: str | Path) -> bool:
    """Whether ``path`` holds a ``config.json`` naming the ``DFlashDraftModel`` architecture."""
    cfg = Path(path) / CONFIG_FILE
    if not cfg.is_file():
        return False
    try:
        arch = json.loads(cfg.read_text()).get("architectures") or []
    except (ValueError, AttributeError):
        return False
    return ARCHITECTURE in arch


def read_config(raw: dict[str, Any], source: str = CONFIG_FILE) -> DrafterConfig:
    """A DFlash v1 ``config.json`` (as a dict) -> :class:`DrafterConfig`; refuses what is unsupported."""

    def fail(msg: str) -> AdaptspecError:
        return AdaptspecError(f"{source}: {msg}")

    if ARCHITECTURE not in (raw.get("architectures") or []):
        raise fail(f"architectures {raw.get('architectures')!r} does not name {ARCHITECTURE}")
    newer = [k for k in _NEWER_LAYOUT_KEYS if k in raw]
    dflash = raw.get("dflash_config")
    if not isinstance(dflash, dict):
        raise fail("no dflash_config object: not a DFlash v1 drafter")
    newer += [f"dflash_config.{k}" for k in sorted(set(dflash) - _DFLASH_KEYS)]
    if newer:
        raise fail(f"{', '.join(newer)}: a newer DFlash layout than v1, not supported")
    if raw.get("attention_bias"):
        raise fail("attention_bias=true is not supported (DFlash v1 projections have no bias)")
    if raw.get("use_sliding_window") or any(t != "full_attention" for t in raw.get("layer_types") or []):
        raise fail("sliding-window attention layers are not supported (only full_attention)")
    if raw.get("hidden_act", "silu") != "silu":
        raise fail(f"hidden_act={raw['hidden_act']!r} is not supported (only silu)")
    rope_theta = _rope_theta(raw, fail)

    block_size = _block_size(raw, dflash, fail)
    mask = dflash.get("mask_token_id")
    vocab = _positive_int(raw, "vocab_size", fail)
    if not isinstance(mask, int) or isinstance(mask, bool) or not 0 <= mask < vocab:
        raise fail(f"dflash_config.mask_token_id={mask!r} must be a token id in 0..{vocab - 1} (vocab_size)")
    num_target_layers = _positive_int(raw, "num_target_layers", fail)
    ids = dflash.get("target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise fail(f"dflash_config.target_layer_ids={ids!r} must be a non-empty list of layer ids")
    if not all(0 <= i < num_target_layers for i in ids):
        raise fail(f"dflash_config.target_layer_ids {ids} outside 0..{num_target_layers - 1} (num_target_layers)")

    hidden = _positive_int(raw, "hidden_size", fail)
    heads = _positive_int(raw, "num_attention_heads", fail)
    kv_heads = raw.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise fail(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    return DrafterConfig(
        hidden_size=hidden,
        num_layers=_positive_int(raw, "num_hidden_layers", fail),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=raw.get("head_dim") or hidden // heads,
        intermediate_size=_positive_int(raw, "intermediate_size", fail),
        vocab_size=vocab,
        target_layers=[i + 1 for i in ids],  # hidden_states index: 0 is the embeddings
        max_block_size=block_size,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        target_name=str(raw.get("_name_or_path") or ""),
        qk_norm=True,
        mask_token_id=mask,
        num_target_layers=num_target_layers,
        extra={"format": "dflash-v1"},
    )


def _positive_int(raw: dict, key: str, fail) -> int:
    v = raw.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise fail(f"{key}={v!r} must be a positive integer")
    return v


def _block_size(raw: dict, dflash: dict, fail) -> int:
    top, inner = raw.get("block_size"), dflash.get("block_size")
    if top is not None and inner is not None and top != inner:
        raise fail(f"block_size={top} and dflash_config.block_size={inner} disagree")
    b = inner if inner is not None else top
    if not isinstance(b, int) or isinstance(b, bool) or b < 2:
        raise fail(f"block_size={b!r} (top level or in dflash_config) must be an integer >= 2")
    return b


def _rope_theta(raw: dict, fail) -> float:
    """``rope_theta`` (transformers 4) or ``rope_parameters.rope_theta`` (5); default RoPE only."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    for name, p in (("rope_parameters", params), ("rope_scaling", scaling)):
        kind = p.get("rope_type", p.get("type", "default"))
        extra = set(p) - {"rope_type", "type", "rope_theta"}
        if kind != "default" or extra:
            raise fail(f"{name}={p!r}: only default RoPE is supported (no scaling)")
    thetas = {float(v) for v in (raw.get("rope_theta"), params.get("rope_theta"), scaling.get("rope_theta")) if v is not None}
    if not thetas:
        raise fail("no rope_theta (top level or in rope_parameters)")
    if len(thetas) > 1:
        raise fail(f"rope_theta values disagree: {sorted(thetas)}")
    return thetas.pop()


def to_adaptspec_names(name: str) -> str:
    """A DFlash v1 tensor name -> the drafter's parameter name (unknown names are refused)."""
    for pattern, repl in _RENAMES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, repl, name)
    raise AdaptspecError(f"tensor {name!r} is not part of the DFlash v1 layout")


def load(path: str | Path):
    """``(DrafterConfig, state dict with the drafter's names)`` of a DFlash v1 directory."""
    from safetensors.torch import load_file

    path = Path(path)
    try:
        raw = json.loads((path / CONFIG_FILE).read_text())
    except ValueError as e:
        raise AdaptspecError(f"{path / CONFIG_FILE}: not valid JSON ({e})") from None
    config = read_config(raw, str(path / CONFIG_FILE))
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise AdaptspecError(f"{path}: no {WEIGHTS_FILE} (sharded checkpoints are not supported)")
    tensors = {to_adaptspec_names(k): v for k, v in load_file(str(weights)).items()}
    return config, tensors


__all__ = ["is_dflash_dir", "load", "read_config", "to_adaptspec_names"]
