"""``adaptspec export-vllm OUT``: the bundled target and its DFlash drafter as vLLM loads them.

Writes ``OUT/target`` (the target as a Hugging Face directory: config, tokenizer,
safetensors; the bundled SmolLM2 is converted from its GGUF file once) and ``OUT/drafter``
(the DFlash drafter shipped for it, ``adaptspec/models/weights/smollm2-135m-dflash``, or
``--drafter DIR``: any DFlash v1 directory, e.g. ``train-drafter --layout dflash``'s export),
in the form vLLM's ``dflash`` method reads (:mod:`adaptspec.models.vllm_export`), then prints
the vLLM command line that serves the pair.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import AdaptspecError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, help="directory to write (OUT/target and OUT/drafter)")
    p.add_argument(
        "--drafter",
        type=Path,
        default=None,
        help="a DFlash v1 drafter directory (default: the one shipped for the bundled target)",
    )
    p.add_argument(
        "--target",
        default=None,
        help="the drafter's target, a local Hugging Face model directory (default: the bundled SmolLM2; "
        "needs --drafter)",
    )
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="the drafter's weights (vLLM runs them in the server's --dtype either way)",
    )
    p.add_argument(
        "--force", action="store_true", help="replace OUT/target and OUT/drafter written by an earlier export"
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from .._util.outputs import check_output
    from ..models.vllm_export import (
        SHIPPED_DFLASH_DRAFTER,
        export_drafter,
        export_target,
        read_dflash_drafter,
    )

    if args.target is not None and args.drafter is None:
        raise AdaptspecError("--target: a custom target needs its own drafter (--drafter DIR)")
    drafter = args.drafter or SHIPPED_DFLASH_DRAFTER
    read_dflash_drafter(drafter)  # a drafter that cannot be exported is refused before the target is written
    target_out, drafter_out = args.out / "target", args.out / "drafter"
    for path, kind in ((target_out, "model"), (drafter_out, "drafter")):  # both, before anything is written
        check_output(path, kind, args.force, reads=[drafter])
    export_target(target_out, args.target, replace=args.force)
    export_drafter(drafter, args.target, drafter_out, dtype=getattr(torch, args.dtype), replace=args.force)
    print(
        f"wrote {target_out} and {drafter_out}; serve them with:\n"
        f"  python -m vllm.entrypoints.openai.api_server --model {target_out} --dtype float32 "
        f'--speculative-config \'{{"method": "dflash", "model": "{drafter_out}", "num_speculative_tokens": 3}}\''
    )
    return 0
