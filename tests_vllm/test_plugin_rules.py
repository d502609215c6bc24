"""The plug-in's rules on plain values, as the scheduler calls them (no engine): a request naming an
unknown variant runs at vLLM's own length, counted; one that ends at its first token is never
decided; a load rule caps the length each step; arms beyond K + 1 are refused at start."""

from __future__ import annotations

import pytest

from adaptspec.errors import AdaptspecError


def _plugin(entry: dict, k: int = 4):
    from adaptspec.vllm.config import plugin_settings
    from adaptspec.vllm.plugin import AdaptspecPlugin

    return AdaptspecPlugin(plugin_settings({"adaptspec": entry}), k, "sim")


def test_an_unknown_variant_runs_at_vllms_own_length_and_is_counted(tmp_path):
    p = _plugin({"variants": {"A": "fixed:2"}, "log_dir": str(tmp_path / "log")})
    try:
        p.admit("r1", [1, 2, 3], {"adaptspec_variant": "Z"})
        p.decide("r1", 1, rows=1, queue=0, max_tokens=8, temperature=0.0)
        assert p.cut({"r1": [9, 9, 9, 9]}, rows=1, queue=0) == {}          # not cut: vLLM's own 4 drafts
        assert p.stats()["counts"] == {"fallbacks": 1, "faults_admit": 1}
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


def test_block_sizes_beyond_k_plus_one_are_refused_at_start():
    with pytest.raises(AdaptspecError, match=r"adaptspec.arms \[1, 2, 8\]: block size 8 needs 7 drafts, beyond "
                                             r"num_speculative_tokens 4"):
        _plugin({"arms": [1, 2, 8]})


def test_vllm_without_speculation_is_refused_at_start():
    with pytest.raises(AdaptspecError, match="vLLM runs without speculative decoding"):
        _plugin({}, k=0)
