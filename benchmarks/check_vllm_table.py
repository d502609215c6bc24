"""Check that vLLM starts with a table ``adaptspec export-vllm-table`` wrote, as it is, and decodes losslessly.

Two engines, each in a process of its own (vLLM 0.32 starts one engine a process): vLLM with
``{"method": "dflash", "model": DRAFTER, **TABLE}`` as its ``speculative_config`` (the file's keys
unchanged), then vLLM without speculation. The first must parse the table into the same ranges,
and both must give the same greedy tokens (float32) for ``--prompts`` public benchmark prompts
(the odd-numbered half, which the collection did not use) run ``--concurrency`` at once, so the
batch sizes cross the table's levels. Not a timing: run it beside anything.

    .venv-vllm/bin/python benchmarks/check_vllm_table.py --table benchmarks/results/vllm-table.json \\
        --target /work/vx/target --drafter /work/vx/drafter
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def engine(target: str, spec: dict | None, prompts: int, concurrency: int, max_tokens: int) -> dict:
    """In this process: start vLLM (``spec``: its speculative_config, None without), decode, report."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from adaptspec.models.prompts import benchmark_prompts

    tok = AutoTokenizer.from_pretrained(target)
    texts = [p.prompt for p in benchmark_prompts()[1::2][:prompts]]
    ids = [
        list(
            tok.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True
            )["input_ids"]
        )
        for t in texts
    ]
    llm = LLM(
        model=target,
        dtype="float32",
        max_model_len=2048,
        max_num_seqs=concurrency,
        enforce_eager=True,
        seed=0,
        **({"speculative_config": spec} if spec is not None else {}),
    )
    try:
        parsed = None
        if spec is not None:
            parsed = [
                list(r)
                for r in llm.llm_engine.vllm_config.speculative_config.num_speculative_tokens_per_batch_size
            ]
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=i) for i in ids],
            [SamplingParams(temperature=0.0, max_tokens=max_tokens)] * len(ids),
            use_tqdm=False,
        )
        return {"parsed": parsed, "tokens": [list(o.outputs[0].token_ids) for o in outs]}
    finally:
        llm.llm_engine.engine_core.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--engine", choices=("table", "plain"), default=None, help=argparse.SUPPRESS
    )  # one engine, here
    args = ap.parse_args()
    entry = json.loads(args.table.read_text())
    spec = {"method": "dflash", "model": args.drafter, **entry}
    if args.engine is not None:
        print(
            json.dumps(
                engine(
                    args.target,
                    spec if args.engine == "table" else None,
                    args.prompts,
                    args.concurrency,
                    args.max_tokens,
                )
            )
        )
        return 0
    runs = {}
    for name in ("table", "plain"):
        p = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--engine", name], capture_output=True, text=True
        )
        if p.returncode != 0:
            print(f"{name}: exit {p.returncode}\n{p.stderr[-3000:]}", file=sys.stderr)
            return 1
        runs[name] = json.loads(p.stdout.strip().splitlines()[-1])
    same = sum(a == b for a, b in zip(runs["table"]["tokens"], runs["plain"]["tokens"]))
    ok = runs["table"]["parsed"] == entry["num_speculative_tokens_per_batch_size"] and same == args.prompts
    print(
        json.dumps(
            {
                "table": entry,
                "vllm_parsed": runs["table"]["parsed"],
                "prompts": args.prompts,
                "concurrency": args.concurrency,
                "identical_to_plain": same,
                "ok": ok,
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
