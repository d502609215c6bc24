"""The host measurement: block sizes and dtypes priced by a measured curve (against closed forms),
the bundled head re-priced exactly, and the per-host cache (keyed, refused when corrupt, in one line)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.costs.latency import CostCurve, LatencyProfile, fit_round_totals, get_profile
from adaptspec.errors import AdaptspecError
from adaptspec.host.choice import choose
from adaptspec.host.costs import HostCosts, host_costs, read_record, write_record
from adaptspec.host.identity import host_key, key_digest
from adaptspec.host.pricing import best_block_size, cheaper_dtype, cost_ratios, expected_speeds, reprice_head
from adaptspec.paths import BUNDLED_HEAD
from adaptspec.policies.offline_head import HeadModel

ARMS = (1, 2, 3, 4, 6, 8)


def linear_profile(fixed_s: float, per_token_s: float, draft_s: float = 0.0) -> LatencyProfile:
    """A round of ``B`` tokens costs ``fixed_s + per_token_s * (B - 1)`` to verify, plus ``draft_s`` to draft (B > 1)."""
    verify = CostCurve((1.0, 64.0), (fixed_s, fixed_s + 63 * per_token_s), tail_slope_s=per_token_s)
    return LatencyProfile("linear", CostCurve((1.0,), (draft_s,)), verify, context_tokens=0)


def measured(points_ms: dict[int, float]) -> LatencyProfile:
    """A profile through round times at one row (ms by block size), nothing else."""
    b = sorted(points_ms)
    verify = CostCurve(
        tuple(float(x) for x in b),
        tuple(points_ms[x] / 1e3 for x in b),
        tail_slope_s=(points_ms[b[-1]] - points_ms[b[-2]]) / 1e3 / (b[-1] - b[-2]),
    )
    return LatencyProfile("measured", CostCurve((1.0,), (0.0,)), verify, context_tokens=0)


@settings(max_examples=25, deadline=None)
@given(
    fixed=st.floats(0.005, 0.2),
    slope=st.floats(0.0, 0.05),
    draft=st.floats(0.0, 0.02),
    gains=st.lists(st.floats(0.0, 1.0), min_size=len(ARMS) - 1, max_size=len(ARMS) - 1),
)
def test_the_chosen_block_size_is_the_argmax_of_expected_tokens_per_second(fixed, slope, draft, gains):
    # acceptance lengths: 1 at B = 1, never decreasing, at most B
    tau, a = {1: 1.0}, 1.0
    for b, g in zip(ARMS[1:], gains):
        a = min(float(b), a + g)
        tau[b] = a
    profile = linear_profile(fixed, slope, draft)
    # the closed form, written out: tokens per round over seconds per round
    rate = {b: tau[b] / (fixed + slope * (b - 1) + (draft if b > 1 else 0.0)) for b in ARMS}
    top = max(rate.values())
    want = min(b for b in ARMS if rate[b] >= top * (1 - 1e-9))
    got = best_block_size(profile, tau)
    assert rate[got] >= top * (1 - 1e-9) and (got == want or abs(rate[got] - rate[want]) <= 1e-9 * top)
    assert expected_speeds(profile, tau)[got] == pytest.approx(top)


# the host (AVX2, no native bf16): one row plain 47.8 ms, at B = 4 121.9 ms (2.55x); the
# drafter's acceptance 1.41 / 1.54 / 1.59 / 1.6 at B = 2 / 3 / 4 / 6+ (the bundled trace set's)
AVX2_BF16 = measured({1: 47.8, 4: 121.9, 8: 220.0})
AVX2_FP32 = measured({1: 83.9, 4: 151.5, 8: 230.0})
DEV_HOST = measured({1: 25.2, 4: 33.9, 8: 40.0})  # BENCHMARKS.md's developers' host: B = 4 at 1.35x plain
TAU = {1: 1.0, 2: 1.41, 3: 1.54, 4: 1.67, 6: 1.6, 8: 1.6}


def test_a_verify_costing_2_55x_with_tau_1_67_is_plain_decoding_and_1_35x_speculates():
    assert best_block_size(AVX2_BF16, TAU) == 1
    assert best_block_size(DEV_HOST, TAU) > 1  # B = 4: 1.67 / 1.345 = 1.24x plain
    # the faster dtype at one row: bf16's plain 20.9 tok/s against fp32's best, its plain 11.9
    assert cheaper_dtype({"float32": AVX2_FP32, "bfloat16": AVX2_BF16}, TAU) == "bfloat16"
    assert (
        cheaper_dtype({"bfloat16": measured({1: 90.0, 4: 300.0, 8: 500.0}), "float32": AVX2_FP32}, TAU)
        == "float32"
    )


@settings(max_examples=60, deadline=None)
@given(ratio2=st.floats(1.05, 1.6))
def test_speculation_counts_as_paying_only_beyond_the_margin(ratio2):
    """A host whose 2-token verify costs ``ratio2`` a 1-token one (B = 2 only, no drafter cost): B = 2
    decodes ``tau(2) / ratio2`` times plain, by hand; it is chosen only where that clears 1 + PAYS_MARGIN."""
    from adaptspec.host.pricing import PAYS_MARGIN, paying_block_size

    zero = CostCurve((1,), (0.0,))
    curve = LatencyProfile("c", draft=zero, verify=CostCurve((1, 2), (0.040, 0.040 * ratio2)))
    tau = {1: 1.0, 2: TAU[2]}
    gain = TAU[2] / ratio2
    assert paying_block_size(curve, tau) == (2 if gain >= 1 + PAYS_MARGIN else 1)
    assert best_block_size(curve, tau) == (2 if gain > 1 else 1)


@settings(max_examples=40, deadline=None)
@given(
    fixed=st.lists(st.floats(0.01, 0.1), min_size=2, max_size=2),
    slope=st.lists(st.floats(0.0, 0.03), min_size=2, max_size=2),
    rows=st.sampled_from([(1,), (1, 2), (1, 2, 4, 8), (4, 8)]),
)
def test_a_server_runs_the_dtype_whose_worst_load_is_the_nearest_the_faster_one(fixed, slope, rows):
    """Plain decoding only (tau 1 at B = 1): at r rows a round verifies r positions, fixed + slope * (r - 1)
    seconds, r tokens; each dtype's speed over the faster one's at every r, the dtype with the best worst ratio."""
    profiles = {"bfloat16": linear_profile(fixed[0], slope[0]), "float32": linear_profile(fixed[1], slope[1])}
    speed = {d: [r / (f + k * (r - 1)) for r in rows] for d, f, k in zip(profiles, fixed, slope)}
    top = [max(speed[d][i] for d in speed) for i in range(len(rows))]
    worst = {d: min(v / t for v, t in zip(speed[d], top)) for d in speed}
    got = cheaper_dtype(profiles, {1: 1.0}, rows)
    assert worst[got] >= max(worst.values()) * (1 - 1e-9)


def test_on_the_avx2_kind_one_request_runs_bfloat16_and_a_server_of_8_rows_float32():
    """The AVX2 host's measured curves (BENCHMARKS.md): bf16 29 ms a plain round and steep in positions,
    fp32 58 ms and flat; a 2.5x steeper bf16 loses at 8 rows by more than fp32 loses at one."""
    bf16, fp32 = (
        measured({1: 29.0, 2: 42.9, 4: 71.3, 8: 146.0}),
        measured({1: 58.3, 2: 59.5, 4: 68.0, 8: 80.0}),
    )
    assert cheaper_dtype({"bfloat16": bf16, "float32": fp32}, TAU) == "bfloat16"
    assert cheaper_dtype({"bfloat16": bf16, "float32": fp32}, TAU, rows=(1, 2, 4, 8)) == "float32"


def test_the_repriced_head_predicts_each_arm_times_its_cost_ratio():
    head = HeadModel.load(BUNDLED_HEAD)
    timed_on = get_profile(head.info["timings"])
    repriced = reprice_head(head, timed_on, AVX2_BF16, "host.json")
    k = np.array([float(AVX2_BF16.round_s(b)) / float(timed_on.round_s(b)) for b in head.arms])
    X = head.x_mean + head.x_scale * np.random.default_rng(0).standard_normal((64, head.in_dim))
    np.testing.assert_allclose(repriced.predict(X), head.predict(X) * k, rtol=1e-9)
    np.testing.assert_allclose(cost_ratios(timed_on, AVX2_BF16, head.arms), k)
    np.testing.assert_allclose(repriced.val_mse, np.asarray(head.val_mse) * k**2)
    np.testing.assert_allclose(
        repriced.hidden(X), head.hidden(X)
    )  # the acceptance model (features) untouched
    assert repriced.info["timings"] == "host.json" and repriced.info["repriced_from"] == head.info["timings"]
    # on the 2.55x host the re-priced head prefers plain decoding where the original speculated
    assert (head.predict(X).argmax(1) > 0).mean() > 0.5
    assert (repriced.predict(X).argmax(1) == 0).mean() > 0.9


def records(plain_s: float, per_token_s: float) -> list[dict]:
    return [
        dict(
            block_size=b,
            batch_size=m,
            context_tokens=128,
            draft_s=0.0,
            verify_s=plain_s + per_token_s * (b * m - 1) + (b > 1) * 0.002,
        )
        for m, bs in ((1, (1, 2, 3, 4, 6, 8)), (4, (1, 2, 4)))
        for b in bs
    ]


def costs_at(tmp_path, key=None) -> HostCosts:
    key = key or host_key("test-models", 2)
    profiles = {
        "bfloat16": fit_round_totals(records(0.048, 0.024), "bf16"),
        "float32": fit_round_totals(records(0.084, 0.022), "fp32"),
    }
    return HostCosts(key, profiles, {"bfloat16": 1.0, "float32": 1.5}, tmp_path, "2026-12-04T00:00:00Z")


def test_a_record_reads_back_for_its_key_and_is_refused_for_another(tmp_path):
    costs = costs_at(tmp_path)
    write_record(costs)
    back = read_record(costs.path, costs.key)
    assert back.profiles == costs.profiles and back.timing_s == costs.timing_s
    assert get_profile(str(costs.profile_path("float32"))) == costs.profiles["float32"]
    restricted = (
        "default" if costs.key.get("ATEN_CPU_CAPABILITY") == "avx2" else "avx2"
    )  # a kernel cap not this one
    other = dict(costs.key, ATEN_CPU_CAPABILITY=restricted)
    assert key_digest(other) != costs.digest
    with pytest.raises(AdaptspecError, match="another host") as e:
        read_record(costs.path, other)
    assert "\n" not in str(e.value)


def test_the_key_names_the_kernel_restriction_and_the_threads(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    plain = host_key("m", 2)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    restricted = host_key("m", 2)
    assert restricted["ATEN_CPU_CAPABILITY"] == "avx2" and key_digest(restricted) != key_digest(plain)
    assert key_digest(host_key("m", 1)) != key_digest(restricted) != key_digest(host_key("n", 2))


@pytest.mark.parametrize(
    "content", [b"{not json", b"[]", b'{"kind": "adaptspec-host-costs", "format": 1}', b"\xff\xfe", b""]
)
def test_a_corrupt_record_is_refused_in_one_line(tmp_path, content):
    costs = costs_at(tmp_path)
    write_record(costs)
    costs.path.write_bytes(content)
    with pytest.raises(AdaptspecError) as e:
        read_record(costs.path, costs.key)
    assert str(costs.path) in str(e.value) and "refused" in str(e.value) and "\n" not in str(e.value)


def test_a_corrupt_profile_in_a_record_is_refused(tmp_path):
    costs = costs_at(tmp_path)
    write_record(costs)
    d = json.loads(costs.path.read_text())
    d["profiles"]["bfloat16"]["verify"]["values_s"] = [-1.0]
    costs.path.write_text(json.dumps(d))
    with pytest.raises(AdaptspecError, match="refused") as e:
        read_record(costs.path, costs.key)
    assert "\n" not in str(e.value)


def tiny_speculator(dtype: str):
    from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
    from decoding_helpers import tiny_target

    model = tiny_target(eos=None)
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8)
    return SpeculativeDecoder(TargetModel(model, verification="fast"), drafter)


@pytest.mark.slow  # three timings of a tiny model: ~12 s on a busy 2-core host
def test_host_costs_measures_once_then_reads_the_cache_and_remeasures_a_corrupt_one(tmp_path, caplog):
    loads: list[str] = []

    def load(dtype):
        loads.append(dtype)
        return tiny_speculator(dtype)

    key = host_key("tiny", 1)
    first = host_costs(load, key, directory=tmp_path)
    assert first.fresh and loads == ["bfloat16", "float32", "mixed"] and first.path.is_file()
    again = host_costs(load, key, directory=tmp_path)
    assert not again.fresh and again.profiles == first.profiles and len(loads) == 3
    first.path.write_text("{truncated")
    with caplog.at_level("WARNING", logger="adaptspec.host"):
        third = host_costs(load, key, directory=tmp_path)
    assert third.fresh and len(loads) == 6
    assert [r.getMessage().count("\n") for r in caplog.records] == [0]
    assert "refused" in caplog.records[0].getMessage()
    remeasured = host_costs(load, key, directory=tmp_path, remeasure=True)
    assert remeasured.fresh and len(loads) == 9
    older = HostCosts(key, {d: first.profiles[d] for d in ("bfloat16", "float32")}, first.timing_s, tmp_path)
    write_record(older)  # a record of a release that timed two dtypes: the third is timed, all three again
    assert host_costs(load, key, directory=tmp_path).fresh and len(loads) == 12


def test_the_choice_runs_the_faster_dtype_and_writes_a_repriced_head(tmp_path):
    costs = costs_at(tmp_path)
    write_record(costs)
    choice = choose(costs)
    assert choice.dtype == "bfloat16" and choice.chosen_by.startswith("measured")
    assert choice.best_block_size == 1 and not choice.speculation_pays
    head = HeadModel.load(choice.head)
    assert head.info["timings"] == str(choice.profile_path)
    assert (choice.head / "featurizer.json").is_file()
    assert choose(costs).head == choice.head  # written once, by its weights
    forced = choose(costs, "float32")
    assert forced.dtype == "float32" and forced.chosen_by == "--dtype" and forced.head != choice.head
    with pytest.raises(AdaptspecError, match="not timed"):
        choose(costs, "float16")
    line = choice.summary()
    assert "\n" not in line and "bfloat16" in line and "cannot pay" in line
    report = choice.to_dict()
    assert json.dumps(report)
    assert str(tmp_path) not in json.dumps(report), "/health names no server path (issue 46 item 11)"
    assert report["profile"] == choice.profile_path.name and report["head"] == choice.head.name

    from adaptspec.serving import CompletionService, ServerLimits
    from adaptspec.serving.tiny import tiny_speculator

    spec, codec = tiny_speculator(0)
    svc = CompletionService.build(
        spec, {"A": "fixed:2"}, codec=codec, limits=ServerLimits(max_context=512, vocab_size=128), host=report
    )
    try:
        assert svc.health()["host"] == report  # what /health says was measured and chosen
    finally:
        svc.close()
