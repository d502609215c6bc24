"""What a GPU run must check of adaptspec.vllm (docs/vllm.md, "Out of reach on this CPU"). Prepared, not run here.

On one GPU with a supported vLLM (``pip install -e '.[vllm,dev]'`` keeps the installed 0.32-0.34;
each line of ``--out`` names the release), each check in a process of its own (one engine a
process), results as JSON lines in ``--out``:

- ``lossless``: greedy, every request of a concurrent mix, vLLM without speculation against the
  plug-in (default policy, learned load rule), with CUDA graphs (not eager): the same tokens;
- ``cut``: the target drafting for itself (``draft_model``, every draft accepted), variants
  ``fixed:2`` and ``fixed:K+1``: vLLM's per-position accepted counts equal the closed form, i.e.
  the per-request cut reaches the verifier with CUDA graphs and ragged per-request lengths;
- ``cost``: step time of the plug-in at ``fixed:K+1`` (no cut: the same work as vLLM's K) against
  vLLM's own K, at 8, 32 and 64 concurrent requests, and the plug-in's own share of a step
  (``adaptspec_vllm_plugin_seconds`` over ``adaptspec_vllm_step_seconds``; the issue asks < 2%);
- ``lossless`` and ``cut`` again with asynchronous scheduling (vLLM's default on a GPU: the
  plug-in runs as ``AdaptiveAsyncScheduler``), and ``cost`` with it at 8 and 64 requests;
- ``mrv2_refused``: under MRV2 (``VLLM_USE_V2_MODEL_RUNNER=1`` on 0.32/0.33; every engine on 0.34)
  the plug-in's engine stops at start with the one line naming ``VLLM_USE_V2_MODEL_RUNNER=0``.
  (vLLM 0.34 has only MRV2: there every plug-in check but this one reports the refusal.)

    python benchmarks/gpu_check_vllm.py --out runs/gpu_check_vllm.jsonl            # tiny Qwen3 models built here
    python benchmarks/gpu_check_vllm.py --target DIR --drafter DIR --out runs/x.jsonl  # a real pair (dflash drafter)

A check named ``NAME:async`` runs with ``async_scheduling=True``, every other with
``async_scheduling=False``. Nothing is downloaded: ``--target``/``--drafter`` are local folders.
``GPU_CHECK_MEMORY`` (default 0.9) is vLLM's ``gpu_memory_utilization`` (on the CPU build, the share
of RAM: a smoke run of one check on a CPU, ``GPU_CHECK_MEMORY=0.05 ... --check cut``, needs it small).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
K = 4


def _models(args) -> tuple[Path, Path, str]:
    if args.target:
        return (
            Path(args.target),
            Path(args.drafter or args.target),
            "dflash" if args.drafter else "draft_model",
        )
    sys.path.insert(0, str(HERE.parent / "tests_vllm"))
    from _tiny import tiny_qwen3

    root = Path(args.work)
    return tiny_qwen3(root / "target"), tiny_qwen3(root / "drafter", noise=0.2), "draft_model"


def _llm(target: Path, spec: dict | None, entry: dict | None, async_scheduling: bool = False):
    from vllm import LLM

    kw = dict(
        model=str(target),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=1024,
        max_num_seqs=64,
        seed=0,
        disable_log_stats=False,
        async_scheduling=async_scheduling,
        speculative_config=spec,
        gpu_memory_utilization=float(os.environ.get("GPU_CHECK_MEMORY", "0.9")),
    )
    if entry is not None:
        kw |= dict(scheduler_cls="adaptspec.vllm.AdaptiveScheduler", additional_config={"adaptspec": entry})
    return LLM(**kw)


def _prompts(n: int, seed: int = 0):
    import numpy as np
    from vllm.inputs import TokensPrompt

    rng = np.random.default_rng(seed)
    return [
        TokensPrompt(prompt_token_ids=rng.integers(1, 500, int(rng.integers(8, 200))).tolist())
        for _ in range(n)
    ]


def _per_pos(llm) -> list[int]:
    return next(
        list(m.values) for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos"
    )


def check(name: str, args) -> dict:
    from vllm import SamplingParams

    target, drafter, method = _models(args)
    spec = {"method": method, "model": str(drafter), "num_speculative_tokens": K}
    is_async = name.endswith(":async")
    name = name.removesuffix(":async")

    def make(target, spec, entry):
        return _llm(target, spec, entry, async_scheduling=is_async)

    if name == "reference":
        llm = make(target, None, None)
        outs = llm.generate(
            _prompts(32), [SamplingParams(temperature=0, max_tokens=16 + 3 * i) for i in range(32)]
        )
        return {"tokens": [list(o.outputs[0].token_ids) for o in outs]}
    if name == "lossless":
        llm = make(target, spec, {"load_rule": "learned"})
        outs = llm.generate(
            _prompts(32), [SamplingParams(temperature=0, max_tokens=16 + 3 * i) for i in range(32)]
        )
        return {"tokens": [list(o.outputs[0].token_ids) for o in outs]}
    if name == "cut":
        m = 33
        llm = make(
            target,
            {"method": "draft_model", "model": str(target), "num_speculative_tokens": K},
            {"variants": {"A": "fixed:2", "B": f"fixed:{K + 1}"}},
        )
        asked = ["A", "B"] * 8
        llm.generate(
            _prompts(len(asked)),
            [
                SamplingParams(
                    temperature=0, max_tokens=m, ignore_eos=True, extra_args={"adaptspec_variant": v}
                )
                for v in asked
            ],
        )
        sa, sb = math.ceil((m - 1) / 2), math.ceil((m - 1) / (K + 1))
        expected = [8 * sa + 8 * sb] + [8 * sb] * (K - 1)
        got = _per_pos(llm)
        return {"per_pos": got, "expected": expected, "passed": got == expected}
    if name.startswith("cost"):  # cost:ROWS:LABEL, one engine a process
        _, rows, label = name.split(":")
        entry = None if label == "vllm_K" else {"variants": {"A": f"fixed:{K + 1}"}}
        llm = make(target, spec, entry)
        llm.generate(_prompts(int(rows), seed=2), SamplingParams(temperature=0, max_tokens=8))  # warm-up
        t0 = time.perf_counter()
        llm.generate(
            _prompts(int(rows), seed=1), SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
        )
        out = {"seconds": time.perf_counter() - t0}
        if entry is not None:
            out["plugin_share"] = llm.llm_engine.engine_core.engine_core.scheduler.adaptspec.stats()[
                "plugin_share"
            ]
        return out
    raise SystemExit(f"unknown check {name!r}")


def _run(name: str, args, env: dict) -> dict:
    cmd = [sys.executable, __file__, "--check", name, "--work", args.work]
    cmd += ["--target", args.target] if args.target else []
    cmd += ["--drafter", args.drafter] if args.drafter else []
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} | env,
        timeout=args.timeout,
    )
    if p.returncode != 0:
        return {"check": name, "status": "refused or failed", "stderr_tail": p.stderr[-1500:]}
    return {"check": name, **json.loads(p.stdout.strip().splitlines()[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target")
    ap.add_argument("--drafter")
    ap.add_argument("--work", default="runs/gpu_check_vllm")
    ap.add_argument("--out", default="runs/gpu_check_vllm.jsonl")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--check")
    args = ap.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.check:
        print(json.dumps(check(args.check, args)))
        return
    import vllm

    results = []
    v1 = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    refused = _run("lossless", args, {"VLLM_USE_V2_MODEL_RUNNER": "1"})
    results.append(
        {
            "check": "mrv2_refused",
            "passed": refused.get("status") == "refused or failed"
            and "VLLM_USE_V2_MODEL_RUNNER=0" in refused.get("stderr_tail", ""),
            "stderr_tail": refused.get("stderr_tail"),
        }
    )
    for suffix in ("", ":async"):
        env = v1
        ref, got = _run("reference" + suffix, args, env), _run("lossless" + suffix, args, env)
        same = "tokens" in ref and "tokens" in got and ref["tokens"] == got["tokens"]
        results.append(
            {
                "check": "lossless" + suffix,
                "passed": same,
                **(
                    {}
                    if same
                    else {
                        "reference": ref.get("status"),
                        "plugin": got.get("status"),
                        "stderr_tail": got.get("stderr_tail") or ref.get("stderr_tail"),
                    }
                ),
            }
        )
        results.append(_run("cut" + suffix, args, env))
    costs = [(rows, "") for rows in (8, 32, 64)] + [(rows, ":async") for rows in (8, 64)]
    for rows, suffix in costs:
        base = _run(f"cost:{rows}:vllm_K{suffix}", args, v1)
        plug = _run(f"cost:{rows}:plugin_fixed{suffix}", args, v1)
        ok = "seconds" in base and "seconds" in plug
        results.append(
            {
                "check": "cost" + suffix,
                "rows": rows,
                "vllm_K_s": base.get("seconds"),
                "plugin_s": plug.get("seconds"),
                "ratio_plugin_over_vllm": plug["seconds"] / base["seconds"] if ok else None,
                "plugin_share": plug.get("plugin_share"),
            }
        )
    with open(args.out, "w") as f:
        for r in results:
            r = {"vllm": vllm.__version__, **r}
            f.write(json.dumps(r) + "\n")
            print(json.dumps({k: v for k, v in r.items() if k != "stderr_tail"}))


if __name__ == "__main__":
    main()
