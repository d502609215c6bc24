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

K, M = 4, 17   # drafts vLLM may propose a step; tokens per request
VARIANTS = {"A": "fixed:2", "B": "fixed:4"}


@pytest.fixture(scope="module")
def served(models, tmp_path_factory):
    """Runs the workload once: 3 requests per variant, then 2 of variant A whose controller raises
    (``ignore_eos``: every request runs to M tokens, so its steps follow from its length alone);
    returns what the tests read after the engine has shut down."""
    from vllm import SamplingParams

    root = tmp_path_factory.mktemp("served")
    entry = {"variants": VARIANTS, "log_dir": str(root / "log"), "checkpoint_dir": str(root / "ckpt")}
    llm = make_llm(models["target"], {"method": "draft_model", "model": str(models["target"]),
                                      "num_speculative_tokens": K}, entry)
    try:
        plugin = scheduler_of(llm).adaptspec
        asked = ["A", "B"] * 3
        params = [SamplingParams(temperature=0.0, max_tokens=M, ignore_eos=True, extra_args={"adaptspec_variant": v}) for v in asked]
        outs = llm.generate(prompts(len(asked)), params, use_tqdm=False)
        per_pos = accepted_per_position(llm)

        ctl = plugin.controllers["A"]

        def broken(*args, **kwargs):
            raise RuntimeError("controller down")

        ctl.decide = broken  # the controller itself fails (not its policy): vLLM must go on at its own length
        try:
            faulty = llm.generate(prompts(2, seed=1), [SamplingParams(temperature=0.0, max_tokens=M, ignore_eos=True,
                                                                      extra_args={"adaptspec_variant": "A"})] * 2,
                                  use_tqdm=False)
        finally:
            del ctl.decide
        per_pos_after = accepted_per_position(llm)
        stats = plugin.stats()
    finally:
        shut_down(llm)
    return dict(root=root, entry=entry, asked=asked, outs=outs, per_pos=per_pos, faulty=faulty,
                per_pos_after=per_pos_after, stats=stats)


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


def test_the_log_holds_one_decision_and_its_feedback_per_request_served(served):
    log = _log(served["root"])
    assert len(log["decision_id"]) == len(served["asked"]) == len(set(log["request_id"]))
    assert sorted(log["variant"]) == sorted(served["asked"])               # each as its request asked
    assert all(b == int(VARIANTS[v].split(":")[1]) for v, b in zip(log["variant"], log["block_size"]))
    assert all(r is not None and r < 0 for r in log["reward"])            # minus ms per token, measured
    assert log["new_tokens"] == [M] * len(served["asked"])
    assert all(q >= 0 and rows >= 1 for q, rows in zip(log["queue_length"], log["rows_in_flight"]))
    # full information: vLLM drafted every block it could and verified a prefix, so no shorter arm is a guess
    assert all(not any(row) for row in log["cf_approximate"]) and all(len(row) > 1 for row in log["cf_rewards"])


def test_ab_report_reads_the_log(served):
    out = subprocess.run([sys.executable, "-m", "adaptspec", "ab-report", str(served["root"] / "log"), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert '"A"' in out.stdout and '"B"' in out.stdout


def test_ope_reads_the_log(served):
    # off-policy value of fixed:4 from the log both variants wrote (its counterfactuals: full information)
    out = subprocess.run([sys.executable, "-m", "adaptspec", "ope", str(served["root"] / "log"), "--policy", "fixed:4",
                          "--counterfactuals", "--bootstrap", "20", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "fixed:4" in out.stdout


def test_a_controller_that_raises_falls_back_to_vllms_own_length(served):
    assert served["stats"]["counts"]["fallbacks"] == 2 == served["stats"]["counts"]["faults_decide"]
    assert all(len(o.outputs[0].token_ids) == M for o in served["faulty"])       # served all the same
    delta = [a - b for a, b in zip(served["per_pos_after"], served["per_pos"])]
    steps = math.ceil((M - 1) / (K + 1))                                         # vLLM's K drafts a step
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
    assert value("adaptspec_vllm_fallbacks_total", where="decide") == 2
    # the decided requests' drafts (the first run; the fallen back ones are vLLM's), every one accepted
    # here (the target drafts for itself): vLLM's own per-position counter agrees
    assert value("adaptspec_vllm_accepted_tokens_total") == value("adaptspec_vllm_drafted_tokens_total") \
        == sum(served["per_pos"])
    assert value("adaptspec_vllm_plugin_seconds_total") > 0 and value("adaptspec_vllm_step_seconds_total") > 0
