"""What one vLLM engine step costs on this CPU, by what is in it: the target's tokens, the DFlash
drafter's query tokens, the rows; and what the ``dflash`` machinery costs when no draft is verified.

Up to three engines up at once (vLLM 0.32 CPU, each engine core in its own process, float32,
eager), the bundled target (``adaptspec export-vllm``) and its DFlash drafter:

- ``plain``: no speculation;
- ``dflash``: vLLM's ``dflash`` at ``num_speculative_tokens`` ``--k``, where a scheduler subclass
  (:class:`StepScheduler`, this module) sets every step's ``num_spec_tokens_to_schedule`` to a
  value drawn at random from 0..K, 0 a third of the time at K = 8 (the seam the plug-in uses): the target then verifies, next
  step, every row's drafts of this step, so a step's target tokens (``rows x (1 + k of the step
  before)``) and its drafter queries (``rows x (1 + k of this step)``) vary independently, and a
  least-squares fit tells their costs apart (``fit``);
- ``skip``: the same with adaptspec's worker extension ``IdleDrafterSkip``
  (:mod:`adaptspec.vllm.idle_drafter`), every step at k = 0 with no prompt token in it marked as
  the plug-in marks a step none of whose requests drafts: the worker skips the drafter's pass there.

Each logs every step (``schedule`` to the start of ``update_from_output``: vLLM's scheduling, the
target's pass, sampling or rejection sampling, the drafter's pass) with its rows, tokens and k. Each
``generate`` call runs ``rows`` chat-templated public benchmark prompts at once to ``--max-tokens``
(``ignore_eos``: the batch stays full), the engines' calls in a rotated order for ``--repeats``
rounds at every ``--rows``, so drift hits them alike.

The summary, for each speculative engine (``dflash``, ``skip``): per rows, the plain step's mean
seconds; the engine's steps at k = 0 whose previous step had k = 0 too (nothing verified; in
``dflash`` the drafter's pass at one query a row, in ``skip`` none: the *floor* the plug-in cannot
go under by choosing lengths, without and with the extension) and their ratio to plain's, also per repeat (the floor
steps' mean over plain's steps' mean in the same repeat: geometric mean and 95% t-interval over
the repeats, ``floor_over_plain_by_repeat``); and the fit
``step_s = a + b * target_tokens + c * drafter_queries`` over the engine's steps of each rows.

    LD_PRELOAD=.venv-vllm/lib/libiomp5.so VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python \\
        benchmarks/bench_vllm_steps.py --target /work/vx/target --drafter /work/vx/drafter --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

try:  # the engine core imports this module by name to make the scheduler: vLLM's Scheduler is there
    from vllm.v1.core.sched.scheduler import Scheduler
except ImportError:  # pragma: no cover - the summary alone needs no vLLM
    Scheduler = object  # type: ignore[assignment,misc]


class StepScheduler(Scheduler):  # type: ignore[misc,valid-type]
    """vLLM's scheduler, logging every step; with ``k_choices`` in ``additional_config["steps"]``
    every step's ``num_spec_tokens_to_schedule`` drawn from them."""

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        import random

        super().__init__(vllm_config, *args, **kwargs)
        cfg = (vllm_config.additional_config or {}).get("steps", {})
        self._log = open(cfg["log"], "a", buffering=1)  # noqa: SIM115 - open for the engine's life
        self._choices = list(cfg.get("k_choices", []))
        self._mark_idle = bool(cfg.get("mark_idle", False))
        self._rng = random.Random(cfg.get("seed", 0))
        self._t0 = 0.0
        self._k = 0

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = super().schedule(*args, **kwargs)
        self._t0 = t0
        if self._choices:
            out.num_spec_tokens_to_schedule = self._rng.choice(self._choices)
        self._k = out.num_spec_tokens_to_schedule
        if (
            self._mark_idle
            and self._k == 0
            and all(
                (r := self.requests.get(rid)) is not None and r.num_output_tokens
                for rid in out.num_scheduled_tokens
            )
        ):
            from adaptspec.vllm.idle_drafter import MARK

            setattr(out, MARK, True)  # as the plug-in marks a step none of whose requests drafts
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        step_s = time.perf_counter() - self._t0
        n = scheduler_output.num_scheduled_tokens
        prefill = sum(
            c for rid, c in n.items() if (r := self.requests.get(rid)) is not None and not r.num_output_tokens
        )
        verified = sum(len(v) for v in scheduler_output.scheduled_spec_decode_tokens.values())
        self._log.write(
            json.dumps(
                {
                    "rows": len(n),
                    "tokens": scheduler_output.total_num_scheduled_tokens,
                    "prefill_tokens": prefill,
                    "verified": verified,
                    "k": self._k,
                    "step_s": step_s,
                }
            )
            + "\n"
        )
        return super().update_from_output(scheduler_output, model_runner_output)


def engine(args, name: str, log: Path):
    from vllm import LLM

    from adaptspec.vllm.idle_drafter import QUALNAME

    spec, extension = None, {}
    steps: dict[str, Any] = {"log": str(log)}
    if name in ("dflash", "skip"):
        spec = {"method": "dflash", "model": str(args.drafter), "num_speculative_tokens": args.k}
        steps["k_choices"] = [0] * (args.k // 2) + list(
            range(args.k + 1)
        )  # k = 0 a third of the steps (K = 8)
    if name == "skip":
        steps["mark_idle"] = True
        extension = {"worker_extension_cls": QUALNAME}
    return LLM(
        model=str(args.target),
        dtype="float32",
        max_model_len=2048,
        enforce_eager=True,
        seed=0,
        max_num_seqs=max(args.rows),
        speculative_config=spec,
        disable_log_stats=True,
        scheduler_cls="bench_vllm_steps.StepScheduler",
        additional_config={"steps": steps},
        **extension,
    )


def chat_prompts(target: Path, split: str) -> list[list[int]]:
    from transformers import AutoTokenizer

    from adaptspec.models.prompts import benchmark_prompts

    tok = AutoTokenizer.from_pretrained(str(target))
    every = [p.prompt for p in benchmark_prompts()]
    chosen = {"odd": every[1::2], "even": every[0::2], "all": every}[split]
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in chosen
    ]
    return [list(tok(t, add_special_tokens=False).input_ids) for t in texts]


def read_steps(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def is_floor(s: dict) -> bool:
    """A decode step that asked for no draft and verified none (k = 0 after k = 0)."""
    return not s["prefill_tokens"] and s["k"] == 0 and s["verified"] == 0


def floor_by_repeat(
    plain: list[dict], other: list[dict], plain_marks: list[dict], other_marks: list[dict], rows: int
) -> dict | None:
    """Per repeat at ``rows``: the mean floor step of ``other`` over the mean decode step of ``plain``
    (the same repeat's calls); their geometric mean and 95% t-interval over the repeats."""
    import numpy as np

    from adaptspec.analysis.statistics import mean_interval

    def means(steps, marks, keep):
        out = {}
        for m in marks:
            if m["rows"] == rows:
                xs = [
                    s["step_s"]
                    for s in steps[m["first_step"] : m["last_step"]]
                    if s["rows"] == rows and not s["prefill_tokens"] and keep(s)
                ]
                if xs:
                    out[m["repeat"]] = float(np.mean(xs))
        return out

    p, f = means(plain, plain_marks, lambda s: True), means(other, other_marks, is_floor)
    logs = np.log([f[r] / p[r] for r in sorted(set(p) & set(f))])
    ci = mean_interval(logs, 0.95)
    if ci is None:
        return None
    return {
        "repeats": len(logs),
        "geomean": float(np.exp(logs.mean())),
        "ci95": [float(np.exp(ci[0])), float(np.exp(ci[1]))],
    }


def summarize(
    plain: list[dict],
    dflash: list[dict],
    plain_marks: list[dict] | None = None,
    dflash_marks: list[dict] | None = None,
) -> dict:
    """Per rows: plain's mean step, the floor's (k = 0 after k = 0, no prefill) and the ratio (also by
    repeat, given the calls' marks), the fit."""
    import numpy as np

    out: dict = {}
    for rows in sorted({s["rows"] for s in plain if s["rows"] and not s["prefill_tokens"]}):
        p = [s["step_s"] for s in plain if s["rows"] == rows and not s["prefill_tokens"]]
        d = [s for s in dflash if s["rows"] == rows and not s["prefill_tokens"]]
        floor = [s["step_s"] for s in d if is_floor(s)]
        entry: dict = {
            "plain_steps": len(p),
            "plain_mean_s": float(np.mean(p)) if p else None,
            "plain_median_s": float(np.median(p)) if p else None,
            "floor_steps": len(floor),
            "floor_mean_s": float(np.mean(floor)) if floor else None,
            "floor_median_s": float(np.median(floor)) if floor else None,
        }
        if p and floor:
            entry["floor_over_plain_mean"] = entry["floor_mean_s"] / entry["plain_mean_s"]
            entry["floor_over_plain_median"] = entry["floor_median_s"] / entry["plain_median_s"]
            if plain_marks and dflash_marks:
                entry["floor_over_plain_by_repeat"] = floor_by_repeat(
                    plain, dflash, plain_marks, dflash_marks, rows
                )
        if len(d) >= 8:
            x = np.array([[1.0, s["tokens"], rows * (1 + s["k"])] for s in d])
            y = np.array([s["step_s"] for s in d])
            coef, *_ = np.linalg.lstsq(x, y, rcond=None)
            resid = y - x @ coef
            entry["fit"] = {
                "a_s": float(coef[0]),
                "per_target_token_s": float(coef[1]),
                "per_drafter_query_s": float(coef[2]),
                "steps": len(d),
                "residual_sd_s": float(resid.std(ddof=3)),
            }
            entry["by_k"] = {
                str(k): float(
                    np.median([s["step_s"] for s in d if s["k"] == k and s["verified"] == rows * k])
                )
                for k in sorted({s["k"] for s in d})
                if any(s["k"] == k and s["verified"] == rows * k for s in d)
            }
        out[str(rows)] = entry
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--split", choices=("odd", "even", "all"), default="odd")
    ap.add_argument("--engines", default="plain,dflash,skip", help="plain and one or both of dflash, skip")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    work = args.out.with_suffix(".steps")
    work.mkdir(parents=True, exist_ok=True)
    names = args.engines.split(",")
    if "plain" not in names or not set(names) - {"plain"} or not set(names) <= {"plain", "dflash", "skip"}:
        ap.error(f"--engines {args.engines!r}: plain and one or both of dflash, skip")
    logs = {n: work / f"{n}.jsonl" for n in names}
    for p in logs.values():
        p.unlink(missing_ok=True)
    prompts = chat_prompts(args.target, args.split)
    load_start = list(os.getloadavg())
    engines = {n: engine(args, n, logs[n]) for n in names}
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    marks: dict[str, list] = {n: [] for n in engines}
    offset = 0
    for rep in range(args.repeats):
        for rows in args.rows:
            batch = [TokensPrompt(prompt_token_ids=prompts[(offset + i) % len(prompts)]) for i in range(rows)]
            offset += rows
            shift = (rep + rows) % len(names)
            for n in names[shift:] + names[:shift]:
                before = len(read_steps(logs[n]))
                t0 = time.perf_counter()
                engines[n].generate(batch, params, use_tqdm=False)
                marks[n].append(
                    {
                        "repeat": rep,
                        "rows": rows,
                        "wall_s": time.perf_counter() - t0,
                        "first_step": before,
                        "last_step": len(read_steps(logs[n])),
                    }
                )
                print(f"repeat {rep} rows {rows} {n}: {marks[n][-1]['wall_s']:.1f} s", flush=True)
    steps = {n: read_steps(p) for n, p in logs.items()}
    result = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "load_average_at_start": load_start,
        "load_average_at_end": list(os.getloadavg()),
        "runs": marks,
        "summary": {
            n: summarize(steps["plain"], steps[n], marks["plain"], marks[n]) for n in names if n != "plain"
        },
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
