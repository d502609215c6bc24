"""The plug-in's Prometheus metrics, next to vLLM's own (``vllm:spec_decode_*``).

Counted in the engine process, where the scheduler runs: block sizes chosen (per variant),
drafts verified and accepted after the cut, the requests run at the fallback length instead of
their policy's choice (per variant and reason), the failures of the plug-in's work and of its
controllers' background work (per variant and where), and the plug-in's own time against the
engine steps' (its per-step cost). A variant label is one of the configured variants' names, never
a client's string: empty where none is known (a request naming no variant of this engine, a fault
of a whole step).

vLLM's HTTP server serves metrics written by its engine processes when
``PROMETHEUS_MULTIPROC_DIR`` is set (``vllm serve`` sets it; with ``python -m
vllm.entrypoints.openai.api_server``, set it yourself): then these appear on vLLM's ``/metrics``
beside its own. prometheus_client picks the multiprocess mode from that variable. In a
process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, tests) they are in
prometheus_client's default registry. Made once a process: a second engine there counts on.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["plugin_metrics"]


@functools.cache
def plugin_metrics() -> dict[str, Any]:
    """The metrics, registered in prometheus_client's default registry the first time."""
    from prometheus_client import Counter

    return {
        "decisions": Counter(
            "adaptspec_vllm_decisions",
            "Requests whose policy chose their block size, by variant "
            "and block size (1 + drafts verified); fallbacks are counted apart",
            ["variant", "block_size"],
        ),
        "fallbacks": Counter(
            "adaptspec_vllm_fallbacks",
            "Requests run at the fallback length instead of their "
            "policy's choice, by variant and reason: the policy's (error, invalid, timeout) or the "
            "plug-in's (unknown_variant, admit, decide)",
            ["variant", "reason"],
        ),
        "faults": Counter(
            "adaptspec_vllm_faults",
            "Failures of the plug-in's work (admit, decide, drafts, cut, "
            "observe, load_rule, step, feedback, outcome, close) and of its controllers' background "
            "work (update, checkpoint, log), by variant and where",
            ["variant", "where"],
        ),
        "drafted": Counter("adaptspec_vllm_drafted_tokens", "Drafts verified after the plug-in's cut"),
        "accepted": Counter("adaptspec_vllm_accepted_tokens", "Drafts accepted among those verified"),
        "plugin_seconds": Counter("adaptspec_vllm_plugin_seconds", "Time spent in the plug-in's hooks"),
        "step_seconds": Counter(
            "adaptspec_vllm_step_seconds",
            "Time of the engine steps (schedule to output, the drafts' update, aborts)",
        ),
        "steps": Counter("adaptspec_vllm_steps", "Engine steps"),
        "step_blocks": Counter(
            "adaptspec_vllm_decode_steps",
            "Decode steps (no prompt in them), by their widest "
            "verified block (1 + the most drafts a request verified)",
            ["block_size"],
        ),
        "fetch_seconds": Counter(
            "adaptspec_vllm_draft_fetch_seconds",
            "Time of vLLM's engine fetching the drafts from its worker after each step (in the steps' time)",
        ),
        "drafter_skipped": Counter(
            "adaptspec_vllm_drafter_skipped_steps",
            "Steps whose drafter pass the worker skips (no draft wanted; adaptspec.vllm.IdleDrafterSkip)",
        ),
    }
