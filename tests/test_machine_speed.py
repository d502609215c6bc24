"""The controller's machine-speed calibration (adaptspec.costs.machine_speed).

The requests are the bundled trace set's (features and outcomes of the public benchmark prompts,
timed by the ``cpu-smollm2-fast`` profile the bundled head was trained with), replayed through a
speculator whose clock runs ``slow`` times slower than that profile.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec import AdaptiveController
from adaptspec.control.policy_checkpoint import latest_checkpoint
from adaptspec.costs.latency import CostCurve, LatencyProfile
from adaptspec.costs.machine_speed import MachineSpeed
from adaptspec.errors import AdaptspecError
from adaptspec.speculator import Outcome, Prefill, Round
from adaptspec.traces import load_traces
from adaptspec.traces.log_writer import log_rows

PROFILE = "cpu-smollm2-fast"
N_REQUESTS = 24


class TraceClock:
    """Replays trace-set request ``ids[0]``: its tokens, rounds and decode time at the chosen block
    size, the time multiplied by ``slow`` and by log-normal noise (seeded)."""

    max_block_size = 16

    def __init__(self, slow: float = 1.0, noise: float = 0.1, seed: int = 0) -> None:
        ts = load_traces()
        self.arms = list(ts.arm_array)
        self.X, self.T = ts.features, ts.decode_s_matrix()
        self.feature_dim = self.X.shape[1]  # the protocol's declaration: the bundled head fits these features
        self.N, self.R = ts.new_tokens_matrix(), ts.rounds_matrix()
        self.slow = slow
        self.noise = np.exp(np.random.default_rng(seed).normal(0.0, noise, size=self.T.shape))

    def prefill(self, ids, temperature=0.0, seed=None):
        return Prefill(0, 50, self.X[ids[0]].astype(np.float32), state=int(ids[0]))

    def decode(self, pre, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        i, a = pre.state, self.arms.index(int(block_size))
        tokens, rounds = int(self.N[i, a]), int(self.R[i, a])
        s = float(self.T[i, a] * self.slow * self.noise[i, a])
        taus = np.full(rounds, (tokens - 1) // rounds)
        taus[: tokens - 1 - taus.sum()] += 1
        return Outcome([0] * tokens, [Round(int(block_size), int(t), 0.0, s / rounds) for t in taus], s)


def choices(spec: TraceClock, n: int = N_REQUESTS, **kw) -> list[int]:
    out = []
    with AdaptiveController(spec, None, **kw) as c:
        for i in range(n):
            out.append(c.generate([i], 128).decision.block_size)
            c.sync()
    return out


# ============================================================================ the estimate
@given(st.lists(st.floats(0.2, 5.0), min_size=1, max_size=40), st.floats(1.0, 50.0))
@settings(max_examples=40, deadline=None)
def test_factor_is_the_discounted_geometric_mean_of_the_ratios(ratios, half_life):
    speed = MachineSpeed(PROFILE, half_life=half_life)
    for r in ratios:
        speed.observe(r)
    w = 0.5 ** (np.arange(len(ratios))[::-1] / half_life)  # newest weight 1, halving every half_life
    assert speed.factor == pytest.approx(math.exp(np.sum(w * np.log(ratios)) / w.sum()), rel=1e-9)


def test_profile_time_is_the_profiles_round_time_summed():
    # closed form: draft 10 ms + 1 ms per drafted token past the first (none at B = 1), verify
    # 40 ms + 2 ms per verified token past the first; no context terms
    toy = LatencyProfile(
        "toy",
        draft=CostCurve((1,), (0.010,), tail_slope_s=0.001),
        verify=CostCurve((1,), (0.040,), tail_slope_s=0.002),
    )
    rounds = [
        Round(1, 1, 0.0, 0.0),
        Round(4, 2, 0.0, 0.0),
        Round(8, 8, 0.0, 0.0),
        Round(3, 1, 0.0, 0.0, drafted=8),
    ]
    want = (0.040) + (0.013 + 0.046) + (0.017 + 0.054) + (0.017 + 0.044)
    assert MachineSpeed(toy).profile_s(rounds) == pytest.approx(want, rel=1e-12)


def test_no_round_or_no_time_is_no_observation():
    speed = MachineSpeed(PROFILE)
    assert speed.ratio(Outcome([1], [], 0.0)) is None
    assert speed.ratio(Outcome([1, 2], [Round(2, 2, 0.0, 0.0)], 0.0)) is None
    speed.observe(None)
    speed.observe(float("nan"))
    assert speed.factor == 1.0
    with pytest.raises(AdaptspecError, match="measured rewards"):
        speed.calibrate("tau", 2.0)
    with pytest.raises(AdaptspecError, match="half_life"):
        MachineSpeed(PROFILE, half_life=0)


# ============================================================================ in the controller
def test_the_bundled_head_names_its_profile_and_the_default_controller_uses_it():
    with AdaptiveController(TraceClock(), None) as c:
        assert c.machine_speed is not None and c.machine_speed.profile.name == PROFILE
    with AdaptiveController(TraceClock(), None, speed_reference=None) as c:
        assert c.machine_speed is None
    with AdaptiveController(TraceClock(), None, reward="tau") as c:  # a reward not measured in time
        assert c.machine_speed is None
    with pytest.raises(AdaptspecError, match="measured rewards"):
        AdaptiveController(TraceClock(), None, reward="tau", speed_reference=PROFILE)


def test_a_policy_object_is_calibrated_by_its_own_heads_profile():
    from adaptspec.paths import BUNDLED_HEAD
    from adaptspec.policies import NeuralLinear, SquareCB, make_policy

    for policy in (NeuralLinear(BUNDLED_HEAD), SquareCB(head=BUNDLED_HEAD), make_policy("ucb", [1, 2, 4])):
        has_head = (
            getattr(policy, "head", None) is not None
        )  # a head reads the prefill features through its featurizer
        with AdaptiveController(TraceClock(), policy, featurizer=BUNDLED_HEAD if has_head else None) as c:
            assert (c.machine_speed is not None) == has_head, type(policy).__name__
            if has_head:
                assert c.machine_speed.profile.name == PROFILE


@given(st.floats(0.4, 3.0))
@settings(max_examples=4, deadline=None)
def test_a_uniformly_slower_or_faster_machine_leaves_every_choice_unchanged(slow):
    assert choices(TraceClock(slow)) == choices(TraceClock(1.0))


def test_without_calibration_a_slower_machine_drives_the_policy_off_the_head():
    # the failure the calibration is for: 35% slower, the default policy switches speculation off
    same_machine = choices(TraceClock(1.0), speed_reference=None)
    slower = choices(TraceClock(1.35), speed_reference=None)
    assert same_machine.count(1) <= 2  # on the profile's own machine it rarely stops speculating (noise: 10%)
    assert slower.count(1) >= same_machine.count(1) + 4


def test_the_log_keeps_the_measured_reward_and_the_ratio(tmp_path):
    spec = TraceClock(1.5, noise=0.0)
    with AdaptiveController(spec, None, log_dir=tmp_path / "log") as c:
        gens = [c.generate([i], 128) for i in range(5)]
        factor = c.sync().stats()["machine_speed"]
    rows = log_rows(tmp_path / "log")
    speed = MachineSpeed(PROFILE)
    for g, row in zip(gens, rows):
        assert row["reward"] == pytest.approx(-1000.0 * g.outcome.decode_s / g.outcome.new_tokens)
        assert row["speed_ratio"] == pytest.approx(g.outcome.decode_s / speed.profile_s(g.outcome.rounds))
    # the trace set's times are the profile's own, up to the profile's reference context
    assert factor == pytest.approx(1.5, rel=0.1)


def test_resume_replays_the_calibration_exactly(tmp_path):
    opts = dict(variant="A", checkpoint_every=4, checkpoint_interval_s=None)
    dirs = dict(log_dir=tmp_path / "log", checkpoint_dir=tmp_path / "ck")
    spec = TraceClock(1.3)

    def run(c, lo, hi):
        out = []
        for i in range(lo, hi):
            out.append(c.generate([i], 128).decision.block_size)
            c.sync()
        return out

    with AdaptiveController(spec, None, **opts) as c:
        straight = run(c, 0, 10)
        factor_at_10 = c.stats()["machine_speed"]
        straight += run(c, 10, 16)
        digest = c.policy_digest()
    with AdaptiveController(spec, None, **opts, **dirs) as c:  # checkpoints at 4, 8 and 10 (at close)
        first = run(c, 0, 10)
    shutil.rmtree(latest_checkpoint(tmp_path / "ck"))  # back to 8: two logged feedbacks to replay
    with AdaptiveController(spec, None, **opts, **dirs) as c:
        assert c.resumed["updates_at_checkpoint"] == 8 and c.resumed["replayed"] == 2
        assert c.stats()["machine_speed"] == factor_at_10
        second = run(c, 10, 16)
        assert c.policy_digest() == digest
    assert first + second == straight


def test_the_factor_is_exported_to_prometheus():
    from prometheus_client import CollectorRegistry, generate_latest

    from adaptspec.serving.metrics import _ControllerCollector

    with (
        AdaptiveController(TraceClock(2.0, noise=0.0), None, variant="A") as a,
        AdaptiveController(TraceClock(), "fixed:4", variant="B") as b,
    ):
        for i in range(3):
            a.generate([i], 128)
            b.generate([i], 128)
        a.sync()
        registry = CollectorRegistry()
        registry.register(_ControllerCollector({"A": a, "B": b}))
        text = generate_latest(registry).decode()
    (line,) = [x for x in text.splitlines() if x.startswith("adaptspec_machine_speed{")]
    assert 'variant="A"' in line and float(line.split()[-1]) == pytest.approx(2.0, rel=0.1)
