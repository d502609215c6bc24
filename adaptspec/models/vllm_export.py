"""A target and its DFlash drafter as directories vLLM's ``dflash`` method loads as they are.

- :func:`export_target`: the target as a Hugging Face directory (``config.json``, the
  tokenizer, ``model.safetensors``); for the bundled SmolLM2 that is adaptspec's own
  conversion of the GGUF file (:func:`~adaptspec.decoding.loading.bundled_target_path`).
- :func:`export_drafter`: a DFlash v1 drafter (``dflash_format``'s directory) in the form
  vLLM reads. DFlash v1 itself has no reduced draft vocabulary; adaptspec stores one as an
  extension (``draft_vocab``) that vLLM does not read. vLLM has its own form for it, the
  EAGLE-3 one its ``DFlashQwen3ForCausalLM`` loads: ``draft_vocab_size`` in ``config.json``,
  an ``lm_head.weight`` of that many rows and ``d2t`` (row ``i`` drafts target token
  ``i + d2t[i]``; every other token scores minus infinity, as in adaptspec's drafter). The
  rows are the target's own LM-head rows, so the drafts are the same. A drafter with the
  full vocabulary is written as plain DFlash v1 (vLLM shares the target's LM head).

The result is checked by reading it back: the DFlash tensors through ``dflash_format`` and
the vocabulary through ``d2t`` (:func:`draft_vocab_of`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from .._util.checks import read_safetensors
from .._util.outputs import write_dir
from ..decoding import dflash_format
from ..errors import AdaptspecError

#: the DFlash-layout drafter shipped for the bundled target (adaptspec's DFlash v1 directory; docs/dflash.md)
SHIPPED_DFLASH_DRAFTER = Path(__file__).resolve().parent / "weights" / "smollm2-135m-dflash"
#: what vLLM's DFlash/EAGLE-3 loader calls the draft-to-target offsets and the draft head
D2T = "d2t"
LM_HEAD = "lm_head.weight"
VLLM_VOCAB_KEY = "draft_vocab_size"
#: the files of a Hugging Face target directory vLLM needs (the tokenizer's are copied when present)
TARGET_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


def export_target(
    out: str | os.PathLike, target: str | os.PathLike | None = None, replace: bool = False
) -> Path:
    """Write the target (default: the bundled SmolLM2, converted once) as a Hugging Face directory."""
    from ..decoding.loading import resolve_model_path

    src = resolve_model_path(target)
    if not (src / "model.safetensors").is_file():
        raise AdaptspecError(f"{src}: no model.safetensors (sharded or .bin checkpoints are not exported)")

    def write(tmp: Path) -> None:
        for name in TARGET_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, tmp / name)

    return write_dir(out, "model", replace, write, reads=[src])


def export_drafter(
    drafter: str | os.PathLike,
    target: str | os.PathLike | None,
    out: str | os.PathLike,
    dtype: torch.dtype = torch.bfloat16,
    replace: bool = False,
) -> Path:
    """Write the DFlash v1 drafter in ``drafter`` (``dflash_format``'s directory) for vLLM.

    ``target`` (default: the bundled SmolLM2) gives the LM-head rows of a reduced draft
    vocabulary; it must be the drafter's target (vocabulary, width and depth are checked).
    """
    from ..decoding.loading import load_target

    drafter = Path(drafter)
    config, tensors = read_dflash_drafter(drafter)
    raw = dflash_format.to_config(config, dtype)
    draft_vocab = tensors.pop(dflash_format.DRAFT_VOCAB_TENSOR, None)
    out_tensors = {dflash_format.to_dflash_names(k): v.to(dtype).contiguous() for k, v in tensors.items()}
    if draft_vocab is not None:
        model, _ = load_target(target, dtype="float32")
        tc = model.config
        for what, mine, theirs in (
            ("vocab_size", config.vocab_size, tc.vocab_size),
            ("hidden_size", config.hidden_size, tc.hidden_size),
            ("num_target_layers", config.num_target_layers, tc.num_hidden_layers),
        ):
            if mine != theirs:
                raise AdaptspecError(
                    f"{drafter}: made for a target with {what} {mine}, this target has {theirs}"
                )
        head = model.get_output_embeddings().weight.detach()
        out_tensors[LM_HEAD] = head[draft_vocab].to(dtype).contiguous()
        out_tensors[D2T] = (draft_vocab - torch.arange(len(draft_vocab))).to(torch.int64).contiguous()
        del raw[dflash_format.DRAFT_VOCAB_KEY]
        raw[VLLM_VOCAB_KEY] = len(draft_vocab)

    def write(tmp: Path) -> None:
        from safetensors.torch import save_file

        save_file(out_tensors, str(tmp / dflash_format.WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / dflash_format.CONFIG_FILE).write_text(json.dumps(raw, indent=2) + "\n")

    return write_dir(out, "drafter", replace, write, reads=[drafter])


def read_dflash_drafter(path: Path):
    """``dflash_format.load(path)``, refusing in one line a directory that is not a DFlash v1 drafter."""
    if not dflash_format.is_dflash_dir(path):
        raise AdaptspecError(
            f"{path}: not a DFlash v1 drafter (config.json naming DFlashDraftModel); train one "
            "with train-drafter --layout dflash, or re-lay adaptspec's with adaptspec.models.relayout"
        )
    return dflash_format.load(path)


def draft_vocab_of(path: str | os.PathLike) -> torch.Tensor | None:
    """The target ids an exported drafter drafts, read back from its ``d2t`` (None: all of them)."""
    path = Path(path)
    stored = read_safetensors(path / dflash_format.WEIGHTS_FILE, "DFlash weights file")
    if D2T not in stored:
        return None
    d2t = stored[D2T]
    return torch.arange(len(d2t)) + d2t


__all__ = [
    "D2T",
    "LM_HEAD",
    "SHIPPED_DFLASH_DRAFTER",
    "draft_vocab_of",
    "export_drafter",
    "export_target",
    "read_dflash_drafter",
]
