"""Acceptance of a DFlash drafter in vLLM against drafters in adaptspec's decoder, same prompts.

On the first ``--per-benchmark`` public benchmark prompts of each benchmark (GSM8K, MT-Bench,
HumanEval; text no drafter here was trained on), chat template applied by the target's
tokenizer, the same token ids to both engines, greedy, float32, ``--max-tokens`` new tokens:

- vLLM (a subprocess in ``--vllm-python``): the target with its own ``dflash`` method at
  ``num_speculative_tokens`` K = ``--block-size`` - 1; tau = 1 + accepted / drafts from vLLM's
  counters (``vllm:spec_decode_num_drafts``, ``_num_accepted_tokens``), the acceptance per draft
  position, and whether every text equals vLLM's own output without speculation;
- adaptspec's decoder at fixed B = ``--block-size`` with each drafter of ``--adaptspec-drafters``
  (``bundled``: the shipped adaptspec-layout drafter; or a directory): tau = tokens committed per
  round, over all rounds.

    python benchmarks/bench_vllm_tau.py --vllm-target OUT/target --vllm-drafter OUT/drafter \\
        --adaptspec-drafters bundled,adaptspec/models/weights/smollm2-135m-dflash
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def vllm_part(job: dict) -> dict:
    """Run in vLLM's environment: speculative then plain, the same token ids, greedy."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    sp = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"])
    common = dict(
        model=job["target"],
        dtype="float32",
        max_model_len=2048,
        enforce_eager=True,
        max_num_seqs=8,
        disable_log_stats=False,
        seed=0,
    )
    out: dict = {}
    t0 = time.time()
    llm = LLM(
        speculative_config={
            "method": "dflash",
            "model": job["drafter"],
            "num_speculative_tokens": job["block_size"] - 1,
        },
        **common,
    )
    spec = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp)]
    metrics = {m.name: m for m in llm.get_metrics()}
    drafts = metrics["vllm:spec_decode_num_drafts"].value
    accepted = metrics["vllm:spec_decode_num_accepted_tokens"].value
    out["spec_s"] = time.time() - t0
    out["num_drafts"], out["num_accepted_tokens"] = drafts, accepted
    out["tau"] = 1 + accepted / drafts
    per_pos = metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    out["accepted_per_position"] = [v / drafts for v in per_pos]
    del llm
    import gc

    gc.collect()
    llm = LLM(**common)
    plain = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp)]
    out["identical_to_plain"] = sum(a == b for a, b in zip(spec, plain))
    out["differing"] = [i for i, (a, b) in enumerate(zip(spec, plain)) if a != b]
    out["first_difference"] = [
        next(j for j, (x, y) in enumerate(zip(spec[i] + [-1], plain[i] + [-2])) if x != y)
        for i in out["differing"]
    ]
    out["tokens"] = sum(len(t) for t in spec)
    return out


def adaptspec_part(drafter: str, prompts: list[list[int]], block_size: int, max_tokens: int) -> dict:
    from adaptspec.models import load_speculator

    dec = load_speculator(drafter=None if drafter == "bundled" else drafter, dtype="float32", threads=1)
    rounds = tokens = 0
    for ids in prompts:
        o = dec.generate(ids, block_size=block_size, max_new_tokens=max_tokens)
        rounds += len(o.rounds)
        tokens += sum(r.tau for r in o.rounds)
    return {"tau": tokens / rounds, "rounds": rounds, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-target", required=True)
    ap.add_argument("--vllm-drafter", required=True)
    ap.add_argument("--adaptspec-drafters", default="bundled")
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--per-benchmark", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--vllm-python", default="/work/venv-vllm/bin/python")
    ap.add_argument("--ld-preload", default="/work/venv-vllm/lib/libiomp5.so")
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm-tau.json")
    ap.add_argument("--vllm-job", type=Path, help=argparse.SUPPRESS)  # the vLLM side's own entry
    args = ap.parse_args()
    if args.vllm_job:
        job = json.loads(args.vllm_job.read_text())
        Path(job["out"]).write_text(json.dumps(vllm_part(job)))
        return
    from adaptspec.decoding.loading import load_target
    from adaptspec.models.prompts import benchmark_prompts

    _, tok = load_target(args.vllm_target, dtype="float32")
    chosen = benchmark_prompts(per_benchmark=args.per_benchmark)
    ids = [
        tok.apply_chat_template(
            [{"role": "user", "content": p.prompt}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for p in chosen
    ]
    results: dict = {
        "settings": {k: str(v) for k, v in vars(args).items() if k != "vllm_job"},
        "prompts": [p.domain for p in chosen],
    }
    with tempfile.TemporaryDirectory() as tmp:
        job = {
            "prompts": ids,
            "target": args.vllm_target,
            "drafter": args.vllm_drafter,
            "block_size": args.block_size,
            "max_tokens": args.max_tokens,
            "out": str(Path(tmp) / "vllm.json"),
        }
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        env = {**os.environ, "LD_PRELOAD": args.ld_preload, "VLLM_CPU_KVCACHE_SPACE": "1"}
        subprocess.run(
            [
                args.vllm_python,
                __file__,
                "--vllm-target",
                args.vllm_target,
                "--vllm-drafter",
                args.vllm_drafter,
                "--vllm-job",
                str(Path(tmp) / "job.json"),
            ],
            check=True,
            env=env,
            cwd=tmp,
        )
        results["vllm"] = json.loads((Path(tmp) / "vllm.json").read_text())
    print("vllm", json.dumps(results["vllm"]), flush=True)
    results["adaptspec"] = {}
    for d in args.adaptspec_drafters.split(","):
        results["adaptspec"][d] = adaptspec_part(d, ids, args.block_size, args.max_tokens)
        print("adaptspec", d, json.dumps(results["adaptspec"][d]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
