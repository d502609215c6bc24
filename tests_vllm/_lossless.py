"""Lossless: at T = 0 in fp32, vLLM with the plug-in gives every request of a concurrent mix the
tokens vLLM gives it without speculation, the default policy choosing lengths and the learned load
rule cutting them per step. The check, shared by test_lossless_draft_model.py (a drafter that is
often wrong) and test_lossless_ngram.py (vLLM's n-gram lookup): two engines a module, the
reference first (see conftest.make_llm)."""

from __future__ import annotations

import pytest

from conftest import make_llm, prompts, scheduler_of, shut_down

K = 4
MAX_TOKENS = [5, 9, 40, 17, 33, 2, 24, 12]


def _generate(llm):
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in MAX_TOKENS]
    return [
        list(o.outputs[0].token_ids)
        for o in llm.generate(prompts(len(MAX_TOKENS), seed=3), params, use_tqdm=False)
    ]


@pytest.fixture(scope="module")
def reference(models):
    llm = make_llm(models["target"], plugin=False)
    try:
        return _generate(llm)
    finally:
        shut_down(llm)


def same_tokens_as_vllm_without_speculation(models, reference, method, tmp_path):
    spec = {"method": method, "num_speculative_tokens": K}
    spec |= (
        {"model": str(models["drafter"])}
        if method == "draft_model"
        else {"prompt_lookup_max": 3, "prompt_lookup_min": 1}
    )
    llm = make_llm(models["target"], spec, {"log_dir": str(tmp_path / "log"), "load_rule": "learned"})
    try:
        got = _generate(llm)
        stats = scheduler_of(llm).adaptspec.stats()
    finally:
        shut_down(llm)
    assert got == reference
    assert [len(t) for t in got] == MAX_TOKENS
    assert stats["counts"].get("fallbacks", 0) == 0 and not any(
        k.startswith("faults") for k in stats["counts"]
    )
    assert sum(stats["chosen"].values()) == sum(
        m > 1 for m in MAX_TOKENS
    )  # every request past its first token decided
    assert stats["drafted"] > 0
    if method == "draft_model":
        assert 0 < stats["accepted"] < stats["drafted"]  # drafts accepted and rejected both
