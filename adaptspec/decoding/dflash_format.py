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

import torch

from .._util.checks import integer, number, read_safetensors
from .._util.files import read_json_object
from ..errors import AdaptspecError
from .drafter_config import CONFIG_NAME, MAX_BLOCK_SIZE, DrafterConfig, check_config

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ARCHITECTURE = "DFlashDraftModel"

#: Keys of ``dflash_config`` that v1 defines; any other one belongs to a later layout.
_DFLASH_KEYS = {"mask_token_id", "target_layer_ids", "block_size"}
#: Top-level keys that mark a newer (DFlash2) layout this port does not implement.
_NEWER_LAYOUT_KEYS = ("projector_type", "use_swa", "swa_window", "sliding_window_layers", "num_swa_layers")

#: adaptspec extension (not DFlash v1): a reduced draft vocabulary, stored as this tensor
#: (int64 target ids) in ``model.safetensors`` and its length under this config key.
DRAFT_VOCAB_TENSOR = "draft_vocab"
DRAFT_VOCAB_KEY = "adaptspec_draft_vocab_size"

#: A decoder layer's modules: DFlash v1 (and Qwen3/Llama) name -> the drafter layer's name.
LAYER_MODULES = {
    **{f"self_attn.{n}": n for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")},
    **{f"mlp.{n}": n for n in ("gate_proj", "up_proj", "down_proj")},
    "input_layernorm": "input_norm",
    "post_attention_layernorm": "post_norm",
}
#: Modules outside the layers, same direction.
_TOP_MODULES = {"hidden_norm": "context_norm", "fc": "fc", "norm": "norm"}
_TO_MINE = {**_TOP_MODULES, **{f"layers.{{}}.{k}": f"layers.{{}}.{v}" for k, v in LAYER_MODULES.items()}}
_TO_DFLASH = {v: k for k, v in _TO_MINE.items()}


def _rename(name: str, table: dict[str, str]) -> str | None:
    """``name`` (``MODULE.weight``, the layer index as ``{}``) through ``table``; None if absent."""
    if not name.endswith(".weight"):
        return None
    module = name[: -len(".weight")]
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", module)
    key = f"layers.{{}}.{m.group(2)}" if m else module
    out = table.get(key)
    return None if out is None else f"{out.format(m.group(1)) if m else out}.weight"


def is_dflash_dir(path: str | Path) -> bool:
    """Whether ``path`` holds a ``config.json`` naming the ``DFlashDraftModel`` architecture."""
    cfg = Path(path) / CONFIG_FILE
    if not cfg.is_file():
        return False
    try:
        arch = read_json_object(cfg, "a DFlash config.json").get("architectures") or []
    except AdaptspecError:
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
    rope_theta = _rope_theta(raw, fail, source)

    block_size = _block_size(raw, dflash, fail)
    mask = dflash.get("mask_token_id")
    vocab = _positive_int(raw, "vocab_size", fail)
    if not isinstance(mask, int) or isinstance(mask, bool) or not 0 <= mask < vocab:
        raise fail(f"dflash_config.mask_token_id={mask!r} must be a token id in 0..{vocab - 1} (vocab_size)")
    num_target_layers = _positive_int(raw, "num_target_layers", fail)
    ids = dflash.get("target_layer_ids")
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        raise fail(f"dflash_config.target_layer_ids={ids!r} must be a non-empty list of layer ids")
    if not all(0 <= i < num_target_layers for i in ids):
        raise fail(
            f"dflash_config.target_layer_ids {ids} outside 0..{num_target_layers - 1} (num_target_layers)"
        )

    hidden = _positive_int(raw, "hidden_size", fail)
    heads = _positive_int(raw, "num_attention_heads", fail)
    kv_heads = (
        heads
        if raw.get("num_key_value_heads") is None
        else integer(raw["num_key_value_heads"], source, "num_key_value_heads", 1)
    )
    if heads % kv_heads:
        raise fail(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    return check_config(
        DrafterConfig(
            hidden_size=hidden,
            num_layers=_positive_int(raw, "num_hidden_layers", fail),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=hidden // heads
            if raw.get("head_dim") is None
            else integer(raw["head_dim"], source, "head_dim", 1),
            intermediate_size=_positive_int(raw, "intermediate_size", fail),
            vocab_size=vocab,
            target_layers=[i + 1 for i in ids],  # hidden_states index: 0 is the embeddings
            max_block_size=block_size,
            rms_norm_eps=number(raw.get("rms_norm_eps", 1e-6), source, "rms_norm_eps", 0, lo_open=True),
            rope_theta=rope_theta,
            target_name=str(raw.get("_name_or_path") or ""),
            qk_norm=True,
            mask_token_id=mask,
            num_target_layers=num_target_layers,
            draft_vocab_size=_draft_vocab_size(raw, vocab, fail),
            extra={"format": "dflash-v1"}
            | (
                {"max_position_embeddings": raw["max_position_embeddings"]}
                if "max_position_embeddings" in raw
                else {}
            ),
        ),
        source,
    )


def _draft_vocab_size(raw: dict, vocab: int, fail) -> int | None:
    """The adaptspec extension's reduced vocabulary size, or None (the full vocabulary)."""
    if DRAFT_VOCAB_KEY not in raw:
        return None
    v = raw[DRAFT_VOCAB_KEY]
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= vocab:
        raise fail(f"{DRAFT_VOCAB_KEY}={v!r} must be an integer in 1..{vocab} (vocab_size)")
    return v


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
    if not isinstance(b, int) or isinstance(b, bool) or not 2 <= b <= MAX_BLOCK_SIZE:
        raise fail(
            f"block_size={b!r} (top level or in dflash_config) must be an integer in 2..{MAX_BLOCK_SIZE}"
        )
    return b


def _rope_theta(raw: dict, fail, source: str) -> float:
    """``rope_theta`` (transformers 4) or ``rope_parameters.rope_theta`` (5); default RoPE only."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    for name, p in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(p, dict):
            raise fail(f"{name}={p!r} must be an object")
        kind = p.get("rope_type", p.get("type", "default"))
        extra = set(p) - {"rope_type", "type", "rope_theta"}
        if kind != "default" or extra:
            raise fail(f"{name}={p!r}: only default RoPE is supported (no scaling)")
    thetas = {
        number(v, source, name, 0, lo_open=True)
        for name, v in (
            ("rope_theta", raw.get("rope_theta")),
            ("rope_parameters.rope_theta", params.get("rope_theta")),
            ("rope_scaling.rope_theta", scaling.get("rope_theta")),
        )
        if v is not None
    }
    if not thetas:
        raise fail("no rope_theta (top level or in rope_parameters)")
    if len(thetas) > 1:
        raise fail(f"rope_theta values disagree: {sorted(thetas)}")
    return thetas.pop()


def to_adaptspec_names(name: str) -> str:
    """A DFlash v1 tensor name -> the drafter's parameter name (unknown names are refused)."""
    out = _rename(name, _TO_MINE)
    if out is None:
        raise AdaptspecError(f"tensor {name!r} is not part of the DFlash v1 layout")
    return out


def to_dflash_names(name: str) -> str:
    """The drafter's parameter name -> its DFlash v1 tensor name (the inverse of :func:`to_adaptspec_names`).

    >>> to_dflash_names("layers.0.post_norm.weight")
    'layers.0.post_attention_layernorm.weight'
    """
    out = _rename(name, _TO_DFLASH)
    if out is None:
        raise AdaptspecError(f"parameter {name!r} has no name in the DFlash v1 layout")
    return out


def load(path: str | Path):
    """``(DrafterConfig, state dict with the drafter's names)`` of a DFlash v1 directory.

    A reduced draft vocabulary (the adaptspec extension written by :func:`save`) comes back as
    the state dict's ``draft_vocab`` entry, which ``BlockDiffusionDrafter.from_pretrained`` takes.
    """
    path = Path(path)
    raw = read_json_object(path / CONFIG_FILE, "a DFlash config.json")
    config = read_config(raw, str(path / CONFIG_FILE))
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise AdaptspecError(f"{path}: no {WEIGHTS_FILE} (sharded checkpoints are not supported)")
    stored = read_safetensors(weights, "DFlash weights file")
    draft_vocab = stored.pop(DRAFT_VOCAB_TENSOR, None)
    if (draft_vocab is None) != (config.draft_vocab_size is None):
        have = "has a" if draft_vocab is not None else "has no"
        key = "sets" if config.draft_vocab_size is not None else "does not set"
        raise AdaptspecError(
            f"{path}: {WEIGHTS_FILE} {have} {DRAFT_VOCAB_TENSOR} tensor but {CONFIG_FILE} {key} {DRAFT_VOCAB_KEY}"
        )
    tensors = {to_adaptspec_names(k): v for k, v in stored.items()}
    if draft_vocab is not None:
        if (
            draft_vocab.dim() != 1
            or len(draft_vocab) != config.draft_vocab_size
            or draft_vocab.is_floating_point()
        ):
            raise AdaptspecError(
                f"{path}: {DRAFT_VOCAB_TENSOR} must be {config.draft_vocab_size} integer token ids "
                f"({DRAFT_VOCAB_KEY}), got shape {tuple(draft_vocab.shape)} {draft_vocab.dtype}"
            )
        if draft_vocab.numel() and not (
            0 <= int(draft_vocab.min()) and int(draft_vocab.max()) < config.vocab_size
        ):
            raise AdaptspecError(
                f"{path}: {DRAFT_VOCAB_TENSOR} holds ids outside 0..{config.vocab_size - 1} (vocab_size)"
            )
        tensors[DRAFT_VOCAB_TENSOR] = draft_vocab.to(torch.long)
    return config, tensors


def unsupported(config: DrafterConfig) -> str | None:
    """Why a drafter of this config cannot be written in the DFlash v1 layout (None: it can)."""
    c = config
    if c.mask_token_id is None:
        return "the mask is a learned vector (mask_token_id None); DFlash v1 uses the target's embedding of mask_token_id"
    if c.normalize_context_layers:
        return "normalize_context_layers=True has no DFlash v1 equivalent (one hidden_norm after fc only)"
    if not c.qk_norm:
        return "qk_norm=False; DFlash v1 always applies q_norm/k_norm"
    if c.num_target_layers is None:
        return "num_target_layers is not recorded; DFlash v1 needs the target's depth"
    if min(c.target_layers) < 1 or max(c.target_layers) > c.num_target_layers:
        return (
            f"target_layers {c.target_layers} outside 1..{c.num_target_layers}: DFlash v1 taps decoder "
            f"outputs (target_layer_ids 0..num_target_layers-1), not the embeddings"
        )
    return None


def to_config(config: DrafterConfig, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """The DFlash v1 ``config.json`` (as a dict) of a drafter config; refuses what v1 cannot express."""
    why = unsupported(config)
    if why is not None:
        raise AdaptspecError(f"cannot save in the DFlash v1 layout: {why}")
    c = config
    dtype_name = str(dtype).removeprefix("torch.")
    raw: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": c.max_block_size,
        "dflash_config": {
            "mask_token_id": c.mask_token_id,
            "target_layer_ids": [i - 1 for i in c.target_layers],
        },
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size,
        "layer_types": ["full_attention"] * c.num_layers,
        "max_position_embeddings": int(c.extra.get("max_position_embeddings", 32768)),
        "max_window_layers": 28,  # Qwen3Config's default; unused without sliding windows
        "num_attention_heads": c.num_heads,
        "num_hidden_layers": c.num_layers,
        "num_key_value_heads": c.num_kv_heads,
        "num_target_layers": c.num_target_layers,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_parameters": {"rope_theta": c.rope_theta, "rope_type": "default"},
        "rope_scaling": None,
        "rope_theta": c.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": c.vocab_size,
        "dtype": dtype_name,
        "torch_dtype": dtype_name,
    }
    if c.draft_vocab_size is not None:
        raw[DRAFT_VOCAB_KEY] = c.draft_vocab_size
    return raw


def save(drafter, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write ``drafter`` as a DFlash v1 directory (``config.json`` + ``model.safetensors``), the
    inverse of :func:`load`. No embedding or LM head (they are the target's). A reduced draft
    vocabulary is stored as the adaptspec extension (``draft_vocab`` tensor, config key
    ``adaptspec_draft_vocab_size``), which DFlash engines do not read.

    Refused with one line: a learned mask vector, ``normalize_context_layers``, ``qk_norm=False``,
    an unrecorded target depth or an embeddings tap; a directory that holds an adaptspec drafter
    (its ``drafter_config.json`` would be read first).
    """
    import os

    from safetensors.torch import save_file

    raw = to_config(drafter.config, dtype)
    path = Path(path)
    if (path / CONFIG_NAME).exists():
        raise AdaptspecError(
            f"{path}: holds an adaptspec drafter ({CONFIG_NAME}), which loads before config.json; "
            "choose another directory"
        )
    tensors = {
        to_dflash_names(k): v.detach().to("cpu", dtype).contiguous() for k, v in drafter.state_dict().items()
    }
    if drafter.draft_vocab is not None:
        tensors[DRAFT_VOCAB_TENSOR] = drafter.draft_vocab.detach().cpu().to(torch.int64).contiguous()
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / (WEIGHTS_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path / WEIGHTS_FILE)
    tmp = path / (CONFIG_FILE + ".tmp")
    tmp.write_text(json.dumps(raw, indent=2) + "\n")
    os.replace(tmp, path / CONFIG_FILE)


__all__ = [
    "is_dflash_dir",
    "load",
    "read_config",
    "save",
    "to_adaptspec_names",
    "to_config",
    "to_dflash_names",
    "unsupported",
]
