"""adaptspec.vllm in a real vLLM engine: lengths reach the verifier, the log holds what was served,
variants by ``adaptspec_variant``, ab-report and ope read the log, a failing controller falls back, a
checkpoint resumes, and the plug-in's metrics count what vLLM counts.

One engine for the module: the tiny target drafting for itself (``draft_model``, K = 4), so every
draft is accepted and vLLM's own per-position acceptance counts follow from the block sizes alone.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pyarrow as pa
import pytest

from conftest import accepted_per_position, make_llm, prompts, scheduler_of, shut_down

K, M = 4, 17  # drafts vLLM may propose a step; tokens per request
VARIANTS = {"A": "fixed:2", "B": "fixed:4"}


@pytest.fixture(scope="module")
def served(models, tmp_path_factory):
    """Runs the workload once: 3 requests per variant, then 2 of variant A whose controller raises
    (``ignore_eos``: every request runs to M tokens, so its steps follow from its length alone);
    returns what the tests read after the engine has shut down."""
    from vllm import SamplingParams

    root = tmp_path_factory.mktemp("served")
    entry = {
        "variants": VARIANTS,
        "log_dir": str(root / "log"),
        "checkpoint_dir": str(root / "ckpt"),
        "load_rule": "none",
    }  # each request keeps its variant's length (the lengths are what is tested)
    llm = make_llm(
        models["target"],
        {"method": "draft_model", "model": str(models["target"]), "num_speculative_tokens": K},
        entry,
    )
    try:
        plugin = scheduler_of(llm).adaptspec
        steps = _watch_drafts(scheduler_of(llm))
        asked = ["A", "B"] * 3
        params = [
            SamplingParams(
                temperature=0.0, max_tokens=M, ignore_eos=True, extra_args={"adaptspec_variant": v}
            )
            for v in asked
        ]
        outs = llm.generate(prompts(len(asked)), params, use_tqdm=False)
        per_pos = accepted_per_position(llm)

        ctl = plugin.controllers["A"]

        def broken(*args, **kwargs):
            raise RuntimeError("controller down")

        ctl.decide = broken  # the controller itself fails (not its policy): vLLM must go on at its own length
        try:
            faulty = llm.generate(
                prompts(2, seed=1),
                [
                    SamplingParams(
                        temperature=0.0, max_tokens=M, ignore_eos=True, extra_args={"adaptspec_variant": "A"}
                    )
                ]
                * 2,
                use_tqdm=False,
            )
        finally:
            del ctl.decide
        per_pos_after = accepted_per_position(llm)
        stats = plugin.stats()
    finally:
        shut_down(llm)
    return dict(
        root=root,
        entry=entry,
        asked=asked,
        outs=outs,
        per_pos=per_pos,
        faulty=faulty,
        per_pos_after=per_pos_after,
        stats=stats,
        steps=steps,
    )


def _watch_drafts(scheduler) -> list[dict]:
    """Every step as vLLM ran it: the drafts it asked its drafter for (``num_spec_tokens_to_schedule``),
    each scheduled request's state then (its variant's block size once decided, "fallback", "prefill"
    while its prompt is not all in, None before its decision), and the drafts the drafter proposed
    for each request after the step (vLLM's own ``update_draft_token_ids`` argument, before the cut)."""
    steps: list[dict] = []
    schedule, update = scheduler.schedule, scheduler.update_draft_token_ids
    plugin = scheduler.adaptspec

    def state(rid):
        rec = plugin.records.get(rid)
        if scheduler.requests[rid].is_prefill_chunk:
            return "prefill"
        if rec is None or rec.fallback is not None:
            return "fallback"
        return None if rec.decision is None else int(VARIANTS[rec.variant].split(":")[1])

    def watched_schedule(*args, **kwargs):
        out = schedule(*args, **kwargs)
        steps.append(
            {
                "k": out.num_spec_tokens_to_schedule,
                "rows": {r: state(r) for r in out.num_scheduled_tokens},
                "proposed": None,
            }
        )
        return out

    def watched_update(draft_token_ids):
        steps[-1]["proposed"] = {
            r: len(d) for r, d in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids)
        }
        return update(draft_token_ids)

    scheduler.schedule, scheduler.update_draft_token_ids = watched_schedule, watched_update
    return steps


def _log(root) -> dict:
    import pyarrow.parquet as pq

    parts = sorted((root / "log").glob("part-*.parquet"))
    return pa.concat_tables([pq.read_table(p) for p in parts]).to_pydict()


def test_each_requests_length_reaches_the_verifier(served):
    # closed form: every draft is accepted, so a request at block size B takes ceil((M - 1) / B) steps
    # after its prefill's token, each verifying B - 1 drafts; nothing ever verifies a 4th draft
    steps = {v: math.ceil((M - 1) / int(s.split(":")[1])) for v, s in VARIANTS.items()}
    n = {v: served["asked"].count(v) for v in VARIANTS}
    expected = [n["A"] * steps["A"] + n["B"] * steps["B"], n["B"] * steps["B"], n["B"] * steps["B"], 0]
    assert served["per_pos"] == expected
    assert all(len(o.outputs[0].token_ids) == M for o in served["outs"])


def test_the_drafter_proposes_only_the_drafts_its_batch_verifies(served):
    # a step whose requests are all decided asks the drafter for the largest block size among them - 1
    # (the variants' fixed sizes; no load here caps them: the per-position counts above show it), a
    # step with a fallen-back request vLLM's K; vLLM's drafter then proposes that many for every request
    decided = [
        s for s in served["steps"] if s["rows"] and all(isinstance(b, int) for b in s["rows"].values())
    ]
    fallen = [s for s in served["steps"] if "fallback" in s["rows"].values()]
    assert decided and fallen
    assert {s["k"] for s in decided} == {1, 3}  # B = 2 alone, and with a B = 4 request
    for s in decided:
        assert s["k"] == max(s["rows"].values()) - 1
    assert all(s["k"] == K for s in fallen)
    for s in served["steps"]:
        if s["proposed"] is not None:
            assert set(s["proposed"].values()) <= {s["k"]}


def test_each_request_is_decided_in_the_step_its_prefill_ends(served):
    # decided before that step runs, so the drafter's pass after it drafts for the request's own length:
    # no step ever runs a request past its prefill undecided
    assert not any(None in s["rows"].values() for s in served["steps"])
    assert any(s["proposed"] for s in served["steps"])


def test_the_log_holds_one_decision_and_its_feedback_per_request_served(served):
    log = _log(served["root"])
    assert len(log["decision_id"]) == len(served["asked"]) == len(set(log["request_id"]))
    assert sorted(log["variant"]) == sorted(served["asked"])  # each as its request asked
    assert all(b == int(VARIANTS[v].split(":")[1]) for v, b in zip(log["variant"], log["block_size"]))
    assert all(r is not None and r < 0 for r in log["reward"])  # minus ms per token, measured
    assert log["new_tokens"] == [M] * len(served["asked"])
    assert all(q >= 0 and rows >= 1 for q, rows in zip(log["queue_length"], log["rows_in_flight"]))
    # full information: vLLM drafted every block it could and verified a prefix, so no shorter arm is a guess
    assert all(not any(row) for row in log["cf_approximate"]) and all(
        len(row) > 1 for row in log["cf_rewards"]
    )


def test_ab_report_reads_the_log(served):
    out = subprocess.run(
        [sys.executable, "-m", "adaptspec", "ab-report", str(served["root"] / "log"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert '"A"' in out.stdout and '"B"' in out.stdout


def test_ope_reads_the_log(served):
    # off-policy value of fixed:4 from the log both variants wrote (its counterfactuals: full information)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "adaptspec",
            "ope",
            str(served["root"] / "log"),
            "--policy",
            "fixed:4",
            "--counterfactuals",
            "--bootstrap",
            "20",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "fixed:4" in out.stdout


def test_a_controller_that_raises_falls_back_to_vllms_own_length(served):
    assert served["stats"]["counts"]["fallbacks"] == 2 == served["stats"]["counts"]["faults_decide"]
    assert all(len(o.outputs[0].token_ids) == M for o in served["faulty"])  # served all the same
    delta = [a - b for a, b in zip(served["per_pos_after"], served["per_pos"])]
    steps = math.ceil((M - 1) / (K + 1))  # vLLM's K drafts a step
    assert delta == [2 * steps] * K


def test_a_checkpoint_resumes_the_learnt_state(served):
    from adaptspec.vllm.config import plugin_settings
    from adaptspec.vllm.plugin import AdaptspecPlugin

    for v in VARIANTS:
        assert any((served["root"] / "ckpt" / v).iterdir()), f"no checkpoint written for {v} at shutdown"
    again = AdaptspecPlugin(plugin_settings({"adaptspec": served["entry"]}), K, "draft_model")
    try:
        for v in VARIANTS:
            st = again.controllers[v].sync().stats()
            assert st["updates"] == served["asked"].count(v)
    finally:
        again.close()


def test_an_operator_sees_the_plugins_metrics_next_to_vllms(served):
    from prometheus_client import REGISTRY

    def value(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    for v, spec in VARIANTS.items():
        assert value("adaptspec_vllm_decisions_total", variant=v, block_size=spec.split(":")[1]) == 3
    assert value("adaptspec_vllm_fallbacks_total", variant="A", reason="decide") == 2
    assert value("adaptspec_vllm_faults_total", variant="A", where="decide") == 2
    # the decided requests' drafts (the first run; the fallen back ones are vLLM's), every one accepted
    # here (the target drafts for itself): vLLM's own per-position counter agrees
    assert (
        value("adaptspec_vllm_accepted_tokens_total")
        == value("adaptspec_vllm_drafted_tokens_total")
        == sum(served["per_pos"])
    )
    assert 0 < value("adaptspec_vllm_plugin_seconds_total") < value("adaptspec_vllm_step_seconds_total")
    assert (
        value("adaptspec_vllm_steps_total") == len(served["steps"]) == served["stats"]["steps"]
    )  # one a schedule()
