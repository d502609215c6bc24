"""The plug-in's rules on plain values, as the scheduler calls them (no engine): a request naming an
unknown variant runs at vLLM's own length, counted; one that ends at its first token is never
decided; a load rule caps the length each step (and is fed back the block that ran); the drafter is asked for
the drafts the batch verifies, and its pass is skipped only when no prompt a drafting request needs is in
the step; the goodput and learned rules are priced by the decode steps the engine ran, and a step with a prompt in it teaches the learned rule nothing; arms beyond K + 1
are refused at start."""

from __future__ import annotations

import pytest

from adaptspec.errors import AdaptspecError


def _plugin(entry: dict, k: int = 4):
    from adaptspec.vllm.config import plugin_settings
    from adaptspec.vllm.plugin import AdaptspecPlugin

    return AdaptspecPlugin(plugin_settings({"adaptspec": entry}), k, "sim")


def test_an_unknown_variant_runs_at_vllms_own_length_and_is_counted(tmp_path):
    p = _plugin({"variants": {"A": "fixed:2"}, "log_dir": str(tmp_path / "log"), "load_rule": "none"})
    try:
        p.admit("r1", [1, 2, 3], {"adaptspec_variant": "Z"})
        p.decide("r1", 1, rows=1, queue=0, max_tokens=8, temperature=0.0)
        assert p.cut({"r1": [9, 9, 9, 9]}, rows=1, queue=0) == {}  # not cut: vLLM's own 4 drafts
        assert p.stats()["counts"] == {
            "fallbacks": 1,
            "fallbacks_unknown_variant": 1,
        }  # the client's, not a fault
        p.admit("r2", [1, 2, 3], {"adaptspec_variant": "A"})
        p.decide("r2", 1, rows=1, queue=0, max_tokens=8, temperature=0.0)
        assert p.cut({"r2": [9, 9, 9, 9]}, rows=1, queue=0) == {"r2": [9]}  # fixed:2: one draft verified
    finally:
        p.close()


def test_a_request_that_ends_at_its_first_token_is_never_decided(tmp_path):
    from adaptspec.traces.log_writer import log_rows

    p = _plugin({"log_dir": str(tmp_path / "log")})
    try:
        p.admit("r1", [1, 2, 3], None)
        p.finish("r1", [5], "length")
        assert p.stats()["chosen"] == {} and p.stats()["in_flight"] == 0
    finally:
        p.close()
    assert not (tmp_path / "log").exists() or log_rows(tmp_path / "log") == []


def test_the_load_rule_caps_each_requests_length_for_the_step():
    p = _plugin({"variants": {"A": "fixed:5"}, "load_rule": "fixed:2"})
    try:
        for r in ("r1", "r2"):
            p.admit(r, [1, 2, 3], None)
            p.decide(r, 1, rows=2, queue=0, max_tokens=8, temperature=0.0)
        assert p.cut({"r1": [9] * 4, "r2": [9] * 4}, rows=2, queue=0) == {"r1": [9], "r2": [9]}
        p.observe([("r1", 2, 4, 1, 2), ("r2", 2, 4, 1, 1)], step_s=0.02)
        assert p.stats()["drafted"] == 2 and p.stats()["accepted"] == 1
    finally:
        p.close()


def test_the_drafter_is_asked_for_the_drafts_the_batch_verifies():
    # K = 4; variant A at B = 5 capped by the load rule to 2, variant B at B = 1 (no rule's cap above it)
    p = _plugin({"variants": {"A": "fixed:5", "B": "fixed:1"}, "load_rule": "fixed:2"})
    try:
        for r, v in (("a", "A"), ("b", "B")):
            p.admit(r, [1, 2, 3], {"adaptspec_variant": v})
        assert p.drafts_wanted({"a": True, "b": True}) == 0  # both still prefilling: no draft kept
        assert p.drafts_wanted({"a": False}) == 0  # its prefill ends undecided (one token asked)
        for r in ("a", "b"):  # decided in the step their prefill ends
            p.decide(r, 1, rows=2, queue=0, max_tokens=8, temperature=0.0)
        assert p.drafts_wanted({"a": False, "b": False}) == 4  # no cut yet: A's own B - 1
        assert p.drafts_wanted({"b": False}) == 0  # B = 1 alone: the drafter drafts nothing
        p.cut({"a": [9] * 4, "b": [9] * 4}, rows=2, queue=0)  # the rule asks 2 for both
        assert p.drafts_wanted({"a": False, "b": False}) == 1  # A capped to 2: one draft
        p.admit("c", [1, 2], {"adaptspec_variant": "A"})
        p.decide("c", 1, rows=2, queue=0, max_tokens=8, temperature=0.0)
        assert p.drafts_wanted({"b": False, "c": False}) == 1  # c not cut yet: the rule's latest level
        p.admit("z", [1, 2], {"adaptspec_variant": "nope"})  # falls back to vLLM's length
        assert p.drafts_wanted({"b": False, "z": True}) == 0  # its prefill chunk: none (vLLM drops them)
        assert p.drafts_wanted({"b": False, "z": False}) == 4
        assert p.drafts_wanted({"b": False, "unknown": False}) == 4  # a request the plug-in never saw
    finally:
        p.close()


def test_the_drafters_pass_may_be_skipped_only_when_no_prompt_a_drafting_request_needs_is_in_the_step():
    p = _plugin({"variants": {"one": "fixed:1", "four": "fixed:4"}, "load_rule": "none"})
    try:
        for r, v in (("a", "one"), ("b", "four"), ("c", "four")):
            p.admit(r, [1, 2, 3], {"adaptspec_variant": v})
        for r in ("a", "b"):
            p.decide(r, 1, rows=2, queue=0, max_tokens=8, temperature=0.0)
        assert p.drafter_idle([]) and p.drafter_idle(["a"])  # decode rows only; a prompt at B = 1
        assert not p.drafter_idle(["a", "b"])  # a prompt B = 4 will draft from
        assert not p.drafter_idle(["c"]) and not p.drafter_idle(["zz"])  # undecided, unknown
        assert p.stats()["counts"]["drafter_skipped"] == 2
    finally:
        p.close()


def test_the_load_rule_learns_the_block_that_ran_when_fewer_drafts_were_proposed():
    p = _plugin({"variants": {"A": "fixed:5"}, "load_rule": "fixed:5"})
    fed = []
    try:
        p.rule.feedback = lambda views, blocks, *rest: fed.append(list(blocks))
        p.admit("a", [1, 2, 3], None)
        p.decide("a", 1, rows=1, queue=0, max_tokens=8, temperature=0.0)
        assert p.cut({"a": [9]}, rows=1, queue=0) == {"a": [9]}  # asked 5, one draft there
        p.observe([("a", 2, 4, 1, 2)], step_s=0.01)
        assert fed == [[2]]  # B = 2 ran, not the 5 asked
    finally:
        p.close()


def test_a_listener_gets_each_decided_requests_outcome_and_its_failure_is_counted():
    p = _plugin({"variants": {"A": "fixed:4"}, "load_rule": "none"})
    heard = []
    try:
        p.on_outcome = lambda rid, variant, outcome: heard.append(
            (rid, variant, outcome.tokens, len(outcome.rounds))
        )
        for r in ("a", "b"):
            p.admit(r, [1, 2, 3], None)
        p.decide("a", 1, rows=1, queue=0, max_tokens=8, temperature=0.0)
        p.cut({"a": [9, 9, 9]}, rows=1, queue=0)
        p.observe([("a", 3, 4, 2, 3)], step_s=0.01)
        p.finish("a", [5, 6, 7, 8], "length")
        p.finish("b", [5], "length")  # never decided: nothing to hear
        assert heard == [("a", "A", [5, 6, 7, 8], 1)]
        p.on_outcome = lambda *args: 1 / 0
        p.admit("c", [1, 2, 3], None)
        p.decide("c", 1, rows=1, queue=0, max_tokens=8, temperature=0.0)
        p.observe([("c", 1, 4, 0, 1)], step_s=0.01)
        p.finish("c", [5, 6], "length")
        assert (
            p.stats()["counts"]["faults_outcome"] == 1 and p.stats()["counts"]["feedback_applied"] == 2
        )  # fed back all the same
    finally:
        p.close()


def test_a_last_step_vllm_cut_at_the_requests_stop_gives_its_round_the_tokens_kept():
    from adaptspec.simulators.counterfactuals import trace_outcome

    p = _plugin({"variants": {"A": "fixed:4"}, "load_rule": "none"})
    heard = []
    try:
        p.on_outcome = lambda rid, variant, outcome: heard.append(outcome)
        p.admit("a", [1, 2, 3], None)
        p.decide("a", 1, rows=1, queue=0, max_tokens=6, temperature=0.0)
        p.observe([("a", 4, 4, 3, 4)], step_s=0.01)  # 1 + 4 tokens out
        p.observe([("a", 4, 8, 3, 3)], step_s=0.01)  # 3 sampled, 1 left before max_tokens = 6: vLLM keeps 1
        p.finish("a", [5, 6, 7, 8, 9, 10], "length")
    finally:
        p.close()
    assert [r.tau for r in heard[0].rounds] == [4, 1]
    # what a trace set's reader accepts of a request at max_new_tokens = 6 (it raises on a round past the limit)
    assert [r.tau for r in trace_outcome([4, 1], 4, 6, 0.02, float("nan")).rounds] == [4, 1]


def test_a_step_with_a_prompt_in_it_teaches_the_load_rule_nothing():
    p = _plugin({"variants": {"A": "fixed:5"}, "load_rule": "learned"})
    fed = []
    try:
        learn = p.rule.feedback
        p.rule.feedback = lambda *args: (fed.append(list(args[1])), learn(*args))
        for r in ("a", "b"):
            p.admit(r, [1, 2, 3], None)
        p.decide("a", 1, rows=1, queue=0, max_tokens=400, temperature=0.0)
        assert p.cut({"a": [9] * 4}, rows=1, queue=0) == {"a": []}  # a level's first round is plain
        # a's plain row beside b's 150-token prompt: by tokens its share is 1/151 of the step
        p.observe([("a", 1, 4, 0, 1), ("b", 150, 0, 0, 0)], step_s=0.150)
        assert fed == []
        ran = {}
        for i in range(100):  # then a alone, one draft accepted a step
            d = len(p.cut({"a": [9] * 4}, rows=1, queue=0)["a"])
            ran[1 + d] = ran.get(1 + d, 0) + 1
            p.observe([("a", 1 + d, 5 + 2 * i, d, 1 + min(d, 1))], step_s=0.050)
        assert len(fed) == 100
        # each such round commits 1-2 tokens in 50 ms where a plain step is modelled at ~56 ms (the shipped
        # profile, 1 request): the block that ran most is learnt as faster than plain (a forced plain round
        # learnt from the sliver above would have scaled every reward by ~1/150: ~0.02)
        level = p.rule.features(0)[None]
        means = dict(zip(p.rule.arms, p.rule.policy.predict(level)[0]))
        most = max(ran, key=ran.get)
        assert means[most] > 1.0, (ran, means)
    finally:
        p.close()


@pytest.mark.parametrize("rule", ["goodput", "learned"])
def test_the_load_rules_are_priced_by_the_decode_steps_this_engine_ran(rule):
    p = _plugin({"variants": {"A": "fixed:5"}, "load_rule": rule})
    try:
        assert p.rule.profile is p.step_costs
        for r in ("a", "b"):
            p.admit(r, [1, 2, 3], None)
        # a step with a prefill in it (b's prompt: no token out of a decode round) is no measure of a block
        p.observe([("a", 3, 4, 2, 3), ("b", 3, 0, 0, 0)], step_s=0.5)
        assert p.stats()["step_costs_ms"] == {} and p.stats()["step_blocks"] == {}
        # decode steps: two requests, the widest verified block 1 + 3 drafts, then 1 + 1
        for _ in range(4):
            p.observe([("a", 4, 8, 3, 2), ("b", 2, 8, 1, 2)], step_s=0.080)
            p.observe([("a", 2, 9, 1, 1), ("b", 2, 9, 1, 2)], step_s=0.060)
        assert p.stats()["step_costs_ms"] == {"2": {2: 30.0, 4: 40.0}}  # ms a request, at the 2-request level
        assert p.stats()["step_blocks"] == {2: 4, 4: 4}
        assert p.step_costs.verify(3, None, 2) == pytest.approx(0.070)  # between the two measured sizes
    finally:
        p.close()


def test_block_sizes_beyond_k_plus_one_are_refused_at_start():
    with pytest.raises(
        AdaptspecError,
        match=r"adaptspec.arms \[1, 2, 8\]: block size 8 needs 7 drafts, beyond "
        r"num_speculative_tokens 4",
    ):
        _plugin({"arms": [1, 2, 8]})


def test_vllm_without_speculation_is_refused_at_start():
    with pytest.raises(AdaptspecError, match="vLLM runs without speculative decoding"):
        _plugin({}, k=0)


def test_the_learned_rule_asks_speculation_to_clear_the_load_margin():
    from adaptspec.load_rules import SPECULATION_MARGIN

    for entry, margin in (
        ({}, SPECULATION_MARGIN),
        ({"load_margin": 0.0}, 0.0),
        ({"load_margin": 0.25}, 0.25),
    ):
        p = _plugin({"variants": {"A": "fixed:5"}, "load_rule": "learned", **entry})
        try:
            assert p.rule.discount == pytest.approx(1 / (1 + margin))
        finally:
            p.close()
    with pytest.raises(AdaptspecError, match="load_margin"):
        _plugin({"load_margin": 1.5})
