"""The fault tests' engine, run as a script in a process of its own (``test_faults.py``): vLLM 0.32
starts one engine a process once adaptspec's policies are loaded (``conftest.make_llm``), and that
module starts its own.

One engine (the tiny target drafting for itself, K = 2) with three variants: ``B`` (``fixed:2``),
``F`` (``fixed:3``, the fallback length) and ``S``, whose policy's misbehaviour each scenario switches
(``_misbehaving``), ``decide_timeout`` 0.05 s. A batch is 4 requests of ``B`` and 2 of ``S`` (or of
``F``) sent at once, each running to :data:`TOKENS` tokens. Each scenario records its batches' times,
the tokens each request got, and the change of every plug-in counter over it
(``adaptspec_vllm_{decisions,fallbacks,faults}_total``, by their labels):

- ``warm``: one batch with ``F`` and one with ``S`` falling back (each batch shape once, before any
  is timed: vLLM's first step of a shape costs more);
- ``raise``, ``invalid``: ``S``'s policy raises, answers block size 99;
- ``update``: it decides, every update raises (the controller synced and watched before the counters
  are read);
- ``never``: its policy never returns (released after the scenario, and its late answer awaited),
  :data:`REPEATS` batches, each after one of ``base_never``: the same batch with ``F`` in place of
  ``S`` (the same lengths: ``S``'s requests fall back to 3), so the two see the same load on a shared
  host;
- ``slow``: its policy takes 8 s a decision, :data:`REPEATS` batches, each after one of ``base_slow``;
- ``long_variant``: one request of ``B`` and one asking for a 10,000-character variant.

The log lines of ``adaptspec``'s loggers are kept too. Prints one JSON line: ``{"scenarios": {name:
{"seconds": [...], "tokens": [...], "counters": {...}}}, "log": [...]}``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from conftest import make_llm, prompts, scheduler_of, shut_down

K, TOKENS, REPEATS = 2, 128, 5
ENTRY = {
    "variants": {"B": "fixed:2", "F": "fixed:3", "S": "misbehaving"},
    "load_rule": "none",
    "decide_timeout": 0.05,
}
COUNTERS = ("adaptspec_vllm_decisions_total", "adaptspec_vllm_fallbacks_total", "adaptspec_vllm_faults_total")
LONG_VARIANT = "x" * 10_000


class Kept(logging.Handler):
    """Every message logged to it, as its line."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def counters() -> dict[str, float]:
    """Every sample of the plug-in's decision, fallback and fault counters: ``name{label=value,...}`` -> count."""
    from prometheus_client import REGISTRY

    out = {}
    for metric in REGISTRY.collect():
        for s in metric.samples:
            if s.name in COUNTERS:
                out[s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"] = s.value
    return out


def main(model: Path) -> None:
    from vllm import SamplingParams

    llm = make_llm(
        model,
        {"method": "draft_model", "model": str(model), "num_speculative_tokens": K},
        ENTRY,
        scheduler_cls="_misbehaving.AdaptiveScheduler",
    )  # _misbehaving.SCHEDULER: imported by vLLM, after its worker
    from _misbehaving import Misbehaving  # imported by vLLM with the scheduler class: the same module

    kept = Kept()
    logging.getLogger("adaptspec").addHandler(kept)
    plugin = scheduler_of(llm).adaptspec
    scenarios: dict[str, dict] = {}

    def run(name: str, variants: list[str], after=None) -> None:
        """One batch; its time, tokens and counters added to scenario ``name``'s."""
        params = [
            SamplingParams(
                temperature=0.0, max_tokens=TOKENS, ignore_eos=True, extra_args={"adaptspec_variant": v}
            )
            for v in variants
        ]
        before = counters()
        t0 = time.perf_counter()
        outs = llm.generate(prompts(len(variants), seed=3), params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        if after is not None:
            after()
        now = counters()
        sc = scenarios.setdefault(name, {"seconds": [], "tokens": [], "counters": {}})
        sc["seconds"].append(seconds)
        sc["tokens"] += [len(o.outputs[0].token_ids) for o in outs]
        for k, v in now.items():
            if v != before.get(k, 0.0):
                sc["counters"][k] = sc["counters"].get(k, 0.0) + v - before.get(k, 0.0)

    def interleaved(name: str) -> None:
        for _ in range(REPEATS):
            run(f"base_{name}", batch("F"))
            run(name, batch("S"))

    def batch(other: str) -> list[str]:
        return ["B"] * 4 + [other] * 2

    try:
        Misbehaving.mode = "raise"
        run("warm", batch("F"))
        run("warm", batch("S"))
        run("raise", batch("S"))
        Misbehaving.mode = "invalid"
        run("invalid", batch("S"))
        Misbehaving.mode = "update"
        run("update", batch("S"), after=lambda: (plugin.controllers["S"].sync(), plugin.watch()))
        Misbehaving.mode = "never"
        interleaved("never")
        Misbehaving.release.set()  # the decision that never returned does now, and its answer is dropped:
        deadline = time.monotonic() + 30  # the decider says so (then S's decision thread is free again)
        while not any("answered" in line for line in kept.lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        Misbehaving.mode = "sleep"
        interleaved("slow")
        run("long_variant", ["B", LONG_VARIANT])
    finally:
        Misbehaving.release.set()
        shut_down(llm)
    print(json.dumps({"scenarios": scenarios, "log": kept.lines}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
