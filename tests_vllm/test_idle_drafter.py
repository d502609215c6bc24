"""The drafter's pass skipped on the steps after which no draft is verified (``IdleDrafterSkip``,
docs/vllm.md): every step of requests decided at B = 1 skips it, and the output stays vLLM's
without speculation when the load rule caps requests that draft again later (their drafter's cache
then misses the skipped positions).

Two engines, the reference without speculation first (conftest.make_llm); the plug-in's engine runs
the tiny target with its noisy copy as the draft model (drafts accepted and rejected both), K = 4,
and the worker extension.
"""

from __future__ import annotations

import pytest

from conftest import make_llm, prompts, scheduler_of, shut_down

K, M = 4, 13
MAX_TOKENS = [5, 9, 40, 17, 33, 24]


def _generate(llm, max_tokens, variant=None, seed=3):
    from vllm import SamplingParams

    extra = None if variant is None else {"adaptspec_variant": variant}
    params = [
        SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, extra_args=extra) for m in max_tokens
    ]
    outs = llm.generate(prompts(len(max_tokens), seed=seed), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _spec_drafts(llm) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_draft_tokens")


@pytest.fixture(scope="module")
def served(models):
    from adaptspec.vllm.idle_drafter import QUALNAME

    ref = make_llm(models["target"], plugin=False)
    try:
        reference = _generate(ref, MAX_TOKENS)
    finally:
        shut_down(ref)
    # variant one: every request at B = 1; variant four: B = 4, capped by the load rule to 1 while
    # more than 2 requests run, so the batch skips the drafter and drafts again as requests end
    llm = make_llm(
        models["target"],
        {"method": "draft_model", "model": str(models["drafter"]), "num_speculative_tokens": K},
        {"variants": {"one": "fixed:1", "four": "fixed:4"}, "load_rule": "table:2=4,8=1"},
        worker_extension_cls=QUALNAME,
    )
    try:
        sched = scheduler_of(llm)
        skipped0, drafts0 = llm.collective_rpc("adaptspec_skipped_drafter_passes")[0], _spec_drafts(llm)
        steps0 = sched.adaptspec.steps
        plain_mix = _generate(llm, [M] * 4, "one", seed=5)
        ones = dict(
            steps=sched.adaptspec.steps - steps0,
            skipped=llm.collective_rpc("adaptspec_skipped_drafter_passes")[0] - skipped0,
            drafts=_spec_drafts(llm) - drafts0,
        )
        capped = _generate(llm, MAX_TOKENS, "four")
        stats = sched.adaptspec.stats()
        skipped = llm.collective_rpc("adaptspec_skipped_drafter_passes")[0]
    finally:
        shut_down(llm)
    return dict(
        reference=reference,
        ones=ones,
        plain_mix=plain_mix,
        capped=capped,
        stats=stats,
        skipped=skipped,
        marked=stats["counts"].get("drafter_skipped", 0),
    )


def test_requests_at_block_size_one_skip_every_drafter_pass(served):
    # closed form: four requests admitted together, each ends after M tokens at B = 1: one prefill
    # step and M - 1 decode steps, no draft asked in any of them (all decided at B = 1 from their
    # prefill's step), so the worker skips the drafter M times and vLLM counts no draft
    assert served["ones"] == {"steps": M, "skipped": M, "drafts": 0}
    assert [len(t) for t in served["plain_mix"]] == [M] * 4


def test_capped_requests_that_draft_again_keep_vllms_output(served):
    assert served["capped"] == served["reference"]
    assert served["stats"]["drafted"] > 0 and 0 < served["stats"]["accepted"] < served["stats"]["drafted"]
    assert served["skipped"] > served["ones"]["skipped"]  # the capped mix skipped some passes too
    assert served["skipped"] == served["marked"]  # the worker skips exactly the steps marked
    assert not any(k.startswith("faults") for k in served["stats"]["counts"])
