"""The vLLM plug-in's faults on plain values, as its scheduler calls it, without vLLM: a stuck policy's
request gets the fallback within ``decide_timeout`` (and the next ones at once), every fallback is
counted by variant and reason and not as a decision, a policy's update errors are faults of its
variant, and a client's variant is counted under no label of its own and cut in the log.
(tests_vllm/test_faults.py does the same against the real engine.)"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from prometheus_client import REGISTRY

from adaptspec.policies.baselines import Fixed
from adaptspec.policies.spec import REGISTRY as POLICIES
from adaptspec.speculator import Decision
from adaptspec.vllm.config import plugin_settings
from adaptspec.vllm.plugin import AdaptspecPlugin

K = 2  # vLLM's drafts a step: block sizes 1-3, the fallback 3


class Broken(Fixed):
    """Block size 2, or the misbehaviour ``mode`` names: stuck (until ``release``, 10 s at most), raise,
    invalid (block size 99), update (every update raises)."""

    mode = "fast"
    release = threading.Event()

    def __init__(self, arms, seed=None) -> None:
        super().__init__(2, arms=arms, seed=seed)

    def decide(self, context=None) -> Decision:
        if Broken.mode == "stuck":
            Broken.release.wait(10)
        if Broken.mode == "raise":
            raise RuntimeError("down")
        d = super().decide(context)
        return Decision(99, d.propensity, d.probs, d.arms, d.policy) if Broken.mode == "invalid" else d

    def _update(self, context, arm, reward) -> None:
        if Broken.mode == "update":
            raise RuntimeError("update down")


@pytest.fixture
def plugin(monkeypatch, tmp_path):
    monkeypatch.setitem(POLICIES, "broken", Broken)
    Broken.mode = "fast"
    Broken.release.clear()
    entry = {
        "variants": {"B": "fixed:2", "S": "broken"},
        "load_rule": "none",
        "decide_timeout": 0.05,
        "log_dir": str(tmp_path / "log"),
    }
    p = AdaptspecPlugin(plugin_settings({"adaptspec": entry}), K, "sim")
    yield p
    Broken.release.set()
    p.close()


def counted(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(f"adaptspec_vllm_{name}_total", labels) or 0.0


def serve(p: AdaptspecPlugin, rid: str, variant) -> float:
    """Admit and decide one request as the scheduler does when its prefill ends; the seconds the decision took."""
    p.admit(rid, [1, 2, 3, 4], {"adaptspec_variant": variant})
    t0 = time.perf_counter()
    p.decide(rid, 1, rows=1, queue=0, max_tokens=8, temperature=0.0)
    return time.perf_counter() - t0


def finish(p: AdaptspecPlugin, rid: str) -> None:
    p.observe([(rid, 2, 5, 1, 2)], step_s=0.01)
    p.finish(rid, [7, 7, 7], "length")


def test_a_stuck_policy_costs_its_request_the_budget_once_and_the_next_ones_nothing(plugin):
    Broken.mode = "stuck"
    before = counted("fallbacks", variant="S", reason="timeout")
    took = [serve(plugin, f"r{i}", "S") for i in range(4)]
    assert took[0] < 1.0 and sum(took[1:]) < 0.05  # a stuck policy held the hook 10 s a request before
    assert counted("fallbacks", variant="S", reason="timeout") - before == 4
    assert all(plugin.records[f"r{i}"].block_size == K + 1 for i in range(4))  # the fallback length
    assert serve(plugin, "b", "B") < 0.5 and plugin.records["b"].block_size == 2  # another variant decides


@pytest.mark.parametrize("mode, reason", [("raise", "error"), ("invalid", "invalid")])
def test_a_broken_policys_fallback_is_counted_by_variant_and_reason_not_as_a_decision(plugin, mode, reason):
    Broken.mode = mode
    fell = counted("fallbacks", variant="S", reason=reason)
    decided = sum(counted("decisions", variant="S", block_size=str(b)) for b in (1, 2, 3))
    serve(plugin, "r1", "S")
    assert counted("fallbacks", variant="S", reason=reason) - fell == 1
    assert sum(counted("decisions", variant="S", block_size=str(b)) for b in (1, 2, 3)) == decided
    assert plugin.stats()["counts"] == {"fallbacks": 1, f"fallbacks_{reason}": 1}


def test_a_policys_update_errors_are_faults_of_its_variant(plugin):
    Broken.mode = "update"
    before = counted("faults", variant="S", where="update")
    for rid in ("r1", "r2"):
        serve(plugin, rid, "S")
        finish(plugin, rid)
    plugin.controllers["S"].sync()
    plugin.watch()
    plugin.watch()  # each error counted once
    assert counted("faults", variant="S", where="update") - before == 2
    assert plugin.stats()["counts"]["faults_update"] == 2


@pytest.mark.parametrize("asked", ["x" * 10_000, "Z", 5, ["S"]])
def test_a_clients_unknown_variant_is_counted_under_no_label_of_its_own_and_cut_in_the_log(
    plugin, caplog, asked
):
    before = counted("fallbacks", variant="", reason="unknown_variant")
    with caplog.at_level(logging.WARNING, logger="adaptspec.vllm"):
        serve(plugin, "r1", asked)
    assert counted("fallbacks", variant="", reason="unknown_variant") - before == 1
    assert plugin.records["r1"].block_size is None  # vLLM's own length
    [line] = [r.getMessage() for r in caplog.records if "adaptspec_variant" in r.getMessage()]
    assert len(line) < 300 and "x" * 33 not in line
