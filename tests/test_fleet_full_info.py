"""Full information in a fleet: fi-ucb's statistics are shared (adaptspec.fleet.stats.FullInfo).

- merging two replicas' sums equals one fi-ucb fed both streams (the exact statistics; the paired
  means against their closed form, written out here from the rewards);
- a fleet of controllers on a real Redis, each learning every arm its requests showed, ends with
  the paired means of both decision logs' counterfactual columns (closed form over the logs);
- malformed fi-ucb entries are refused with one line naming the entry, never merged;
- a replica killed mid-stream and restarted on its own log rebuilds its full-information sums.

The closed form of fi-ucb's means (docs/controller.md, full information): with every arm paired,
``mean_k = mean(r_ref) + mean over the requests that showed k and the reference of (r_k - r_ref)``,
the reference being the smallest block size.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import redis
from hypothesis import given, settings, strategies as st

from _redis import RedisServer
from adaptspec import AdaptiveController
from adaptspec.control.policy_build import choose_default_policy
from adaptspec.errors import AdaptspecError
from adaptspec.fleet import MemoryBackend, SharedState
from adaptspec.fleet.redis_backend import RedisBackend
from adaptspec.fleet.stats import FullInfo, family_for
from adaptspec.fleet.wire import Published, decode, encode
from adaptspec.policies import make_policy
from adaptspec.schedules import as_schedule
from adaptspec.speculator import Outcome, Prefill, Round
from adaptspec.traces import DecisionLog

HERE = Path(__file__).resolve().parent
ARMS = (1, 2, 4, 8)


def closed_form(R: np.ndarray, M: np.ndarray) -> np.ndarray:
    """fi-ucb's paired means (every arm paired), from the rewards ``R`` and the observed mask ``M``."""
    ref = M[:, 0]
    out = []
    for k in range(R.shape[1]):
        both = ref & M[:, k]
        out.append(R[ref, 0].mean() + (R[both, k] - R[both, 0]).mean())
    return np.array(out)


def requests(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rewards and observed masks as a request's rounds show them: every arm up to the one that ran,
    the longer ones unless censored; the first request shows every arm (every arm paired)."""
    rng = np.random.default_rng(seed)
    R = rng.normal(size=(n, len(ARMS))) + np.array([1.0, 2.0, 2.6, 1.8])
    ran = rng.integers(0, len(ARMS), size=n)
    censored = rng.random(n) < 0.4
    M = (np.arange(len(ARMS))[None, :] <= ran[:, None]) | ~censored[:, None]
    M[0] = True
    return R, M


def fed(R: np.ndarray, M: np.ndarray, rows) -> object:
    pol = make_policy("fi-ucb", ARMS, seed=0)
    for i in rows:
        pol.update_full(None, R[i], M[i])
    return pol


def replica_sums(R: np.ndarray, M: np.ndarray, rows) -> dict[str, np.ndarray]:
    """One replica learning ``rows`` alone, as SharedState counts its own updates."""
    pol = make_policy("fi-ucb", ARMS, seed=0)
    fam = family_for(pol)
    sums = fam.zero()
    for i in rows:
        pre = fam.before(pol)
        pol.update_full(None, R[i], M[i])
        fam.observe_full(sums, pol, None, R[i], M[i], pre)
    return sums


def assert_exact_statistics(merged, single) -> None:
    for key in ("n", "s", "ss"):
        np.testing.assert_allclose(
            getattr(merged.stats, key), getattr(single.stats, key), rtol=1e-12, atol=1e-12
        )
    np.testing.assert_allclose(merged.ref, single.ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(merged.diff, single.diff, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(merged.means(), single.means(), rtol=1e-12, atol=1e-12)
    assert merged.version == single.version


# ----------------------------------------------------------------------------- the family
def test_two_replicas_merged_equal_one_policy_fed_both_streams_and_the_closed_form():
    R, M = requests(400, seed=1)
    split = np.random.default_rng(2).random(400) < 0.35  # disjoint streams of unequal sizes
    a = replica_sums(R, M, [i for i in range(400) if i == 0 or split[i]])
    b = replica_sums(R, M, [i for i in range(1, 400) if not split[i]])
    fam = FullInfo(make_policy("fi-ucb", ARMS))
    for total in (fam.add(a, b), fam.add(b, a)):  # the order of the replicas does not matter
        merged = make_policy("fi-ucb", ARMS, seed=0)
        fam.apply(merged, total)
        single = fed(R, M, range(400))  # the reference: one policy fed everything, in the stream's order
        assert_exact_statistics(merged, single)
        np.testing.assert_allclose(merged.means(), closed_form(R, M), rtol=1e-12)
        np.testing.assert_array_equal(merged.stats.n, M.sum(axis=0))
        # the estimates: the bonus' scale within a few per cent of the single process's
        merged_sd = np.sqrt(merged.err[1] / merged.err[0])
        assert merged_sd == pytest.approx(np.sqrt(single.err[1] / single.err[0]), rel=0.05)
    assert merged.decide().block_size == single.decide().block_size


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 60), st.integers(0, 10_000), st.integers(0, 10_000))
def test_any_split_of_any_stream_merges_to_the_closed_form(n, seed, split_seed):
    R, M = requests(n, seed)
    split = np.random.default_rng(split_seed).random(n) < 0.5
    fam = FullInfo(make_policy("fi-ucb", ARMS))
    total = fam.add(replica_sums(R, M, np.flatnonzero(split)), replica_sums(R, M, np.flatnonzero(~split)))
    merged = make_policy("fi-ucb", ARMS, seed=0)
    fam.apply(merged, total)
    np.testing.assert_allclose(merged.means(), closed_form(R, M), rtol=1e-9, atol=1e-9)
    assert merged.version == n and FullInfo.updates(total) == n


def test_the_arm_that_ran_alone_is_a_full_update_with_one_arm_shown():
    """A fleet update without counterfactuals (a given reward) is shared as fi-ucb learns it: one arm shown."""
    backend, pol, ref = (
        MemoryBackend(),
        make_policy("fi-ucb", ARMS, seed=0),
        make_policy("fi-ucb", ARMS, seed=0),
    )
    shared = SharedState(backend, "r1", sync_interval_s=60, lease_ttl_s=180)
    shared.attach(pol, "A")
    R, M = requests(30, seed=3)
    for i in range(30):
        if i % 3:
            shared.update_full(pol, None, R[i], M[i])
            ref.update_full(None, R[i], M[i])
        else:
            shared.update(pol, None, ARMS[i % 4], float(R[i, i % 4]))
            ref.update(None, ARMS[i % 4], float(R[i, i % 4]))
    shared.sync_now()
    joined = make_policy("fi-ucb", ARMS, seed=0)  # a fresh replica starts from the fleet's statistics
    other = SharedState(backend, "r2", sync_interval_s=60, lease_ttl_s=180)
    other.attach(joined, "A")
    try:
        assert_exact_statistics(joined, ref)
        assert_exact_statistics(pol, ref)
    finally:
        shared.close()
        other.close()


def test_a_bandit_family_refuses_full_updates_in_one_line():
    pol = make_policy("ucb", ARMS, seed=0)
    shared = SharedState(MemoryBackend(), "r1", sync_interval_s=60, lease_ttl_s=180)
    shared.attach(pol, "A")
    try:
        assert not shared.full_feedback
        with pytest.raises(AdaptspecError, match="arm that ran only"):
            shared.update_full(pol, None, np.ones(4), np.ones(4, bool))
        assert shared.status()["local_updates"] == 0
    finally:
        shared.close()


def test_the_cold_default_is_fi_ucb_in_a_fleet_too():
    from adaptspec.control.config import ControllerConfig
    from adaptspec.control.policy_build import setup_policy
    from adaptspec.control.protocol import DecoderShape

    assert choose_default_policy(8, None, ARMS).spec == "fi-ucb"
    cfg = ControllerConfig(shared=SharedState(MemoryBackend(), "r1"))
    shape = DecoderShape("toy", max_block_size=8)
    assert setup_policy(None, cfg, shape).spec == "fi-ucb"


# ----------------------------------------------------------------------------- malformed entries
def _sums(**change) -> dict[str, np.ndarray]:
    return FullInfo(make_policy("fi-ucb", ARMS)).zero() | change


MALFORMED = {
    "negative requests": (_sums(requests=np.array([-1])), "'requests' hold a negative count"),
    "negative reference count": (_sums(ref=np.array([-2.0, 1.0])), "'ref' hold a negative count"),
    "negative paired count": (
        _sums(diff=np.array([[0, -1.0, 0, 0], [0] * 4])),
        "'diff' hold a negative count",
    ),
    "negative error count": (_sums(err=np.array([-1.0, 0.0])), "'err' hold a negative count"),
    "negative sum of squares": (_sums(err=np.array([1.0, -3.0])), "negative sum of squares"),
    "diff of another width": (_sums(diff=np.zeros((2, 3))), "'diff' have shape (2, 3), expected (2, 4)"),
    "no reference": ({k: v for k, v in _sums().items() if k != "ref"}, "'ref' have shape ()"),
    "an infinite difference": (
        _sums(diff=np.array([[1.0] * 4, [0, np.inf, 0, 0]])),
        "'diff' hold an infinity",
    ),
    "a plain ucb entry": (
        {k: v for k, v in _sums().items() if k in ("n", "s", "ss", "count", "running")},
        "'requests' have shape ()",
    ),
}


@pytest.fixture
def redis_server(tmp_path):
    srv = RedisServer(tmp_path / "redis").start()
    yield srv
    srv.stop()


@pytest.mark.integration
def test_malformed_fi_ucb_entries_are_refused_in_one_line_and_never_merged(redis_server):
    url, key = f"{redis_server.url}/bad", "adaptspec:fleet:bad:A"
    pol = make_policy("fi-ucb", ARMS, seed=0)
    a = SharedState(RedisBackend(url).connect(), "r1", sync_interval_s=0.1, lease_ttl_s=1.5)
    a.attach(pol, "A")
    r = redis.Redis(port=redis_server.port)
    try:
        fp = a.fingerprint
        for i, (sums, _) in enumerate(MALFORMED.values()):
            r.hset(key, f"x{i}", encode(Published(f"x{i}", fp, 1, sums)))
        r.hset(key, "nan", encode(Published("nan", fp, 1, _sums(err=np.array([1.0, np.nan])))))
        good = replica_sums(*requests(20, seed=4), range(20))
        r.hset(key, "good", encode(Published("good", fp, 20, good)))
        a.sync_now()
        why = a.status()["refused_entries"]
        for i, (name, (_, needle)) in enumerate(MALFORMED.items()):
            assert why[f"x{i}"].startswith(f"shared statistics of replica 'x{i}' of variant 'A': "), name
            assert needle in why[f"x{i}"] and "\n" not in why[f"x{i}"], (name, why[f"x{i}"])
        assert "array 'err' holds NaN" in why["nan"]
        assert a.status()["other_replicas"] == 1 and a.status()["state"] == "degraded"
        assert a.apply_pending(pol)
        np.testing.assert_allclose(
            pol.means(), closed_form(*requests(20, seed=4)), rtol=1e-12
        )  # the good one alone
    finally:
        a.close()
        r.close()


def test_a_malformed_fi_ucb_blob_decodes_or_is_one_error():
    blob = encode(Published("x", "f", 3, replica_sums(*requests(3, seed=5), range(3)), time=0.0))
    assert decode(blob, "e").updates == 3
    for cut in (10, len(blob) // 2, len(blob) - 5):
        with pytest.raises(AdaptspecError, match="^shared statistics of e: "):
            decode(blob[:cut], "e")


# ----------------------------------------------------------------------------- controllers on a real Redis
class Taus:
    """A speculator with known acceptance: each round gets 0, 1, 2 or 8 drafts right (from the prompt's seed),
    so a round commits ``min(right + 1, verified)``; one that accepts all it verified censors the longer arms."""

    max_block_size = 8
    feature_dim = 2

    def prefill(self, prompt_ids, temperature=0.0, seed=None):
        ids = [int(i) for i in prompt_ids]
        return Prefill(
            first_token=1,
            prompt_tokens=len(ids),
            features=np.array([1.0, len(ids)], np.float32),
            state={"seed": sum(ids)},
        )

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        b = block_size if isinstance(block_size, int) else as_schedule(block_size).draft_size([])
        rng = np.random.default_rng(prefill.state["seed"])
        tokens, rounds = [prefill.first_token], []
        while len(tokens) < max_new_tokens:
            v = min(b, max_new_tokens - len(tokens))
            tau = min(int(rng.choice([1, 2, 3, 9], p=[0.75, 0.15, 0.05, 0.05])), v)
            rounds.append(Round(v, tau, 0.0, 0.0))
            tokens += [2] * tau
        return Outcome(tokens, rounds, 0.001 * (7 + 3 * len(rounds) + sum(r.block_size for r in rounds)))


def prompt(i: int) -> list[int]:
    return [i % 11 + 1, i % 5 + 20, i, 7] + [3] * (i % 4)


def controller(url: str, rid: str, log_dir: Path, ttl: float = 15.0) -> AdaptiveController:
    shared = SharedState(RedisBackend(url).connect(), rid, sync_every=4, sync_interval_s=0.2, lease_ttl_s=ttl)
    return AdaptiveController(
        Taus(),
        "fi-ucb",
        arms=ARMS,
        variant="A",
        log_dir=log_dir,
        shared=shared,
        log_fsync=False,
        feedback_timeout_s=None,
        speed_reference=None,
        seed=0,
    )


def settle(ctls) -> None:
    """Every update applied and published, then every replica merges everyone's."""
    for c in ctls:
        c.sync()
        c._shared.sync_now()
    for c in ctls:
        c._shared.sync_now()
        deadline = time.monotonic() + 10
        while c._shared._applied_seq != c._shared._fetch_seq and time.monotonic() < deadline:
            time.sleep(0.02)
        c.sync()


def logged(*dirs: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every logged request's counterfactual rewards and observed arms (the decision logs' columns)."""
    logs = [DecisionLog.read(d) for d in dirs]
    assert all(np.isfinite(lg.cf_rewards[lg.cf_observed]).all() for lg in logs)
    return (np.concatenate([lg.cf_rewards for lg in logs]), np.concatenate([lg.cf_observed for lg in logs]))


@pytest.mark.integration
def test_two_replicas_on_disjoint_streams_learn_the_means_of_both(redis_server, tmp_path):
    url = f"{redis_server.url}/two"
    a, b = controller(url, "r0", tmp_path / "r0"), controller(url, "r1", tmp_path / "r1")
    try:
        for i in range(40):  # disjoint streams: even prompts to a, odd ones to b
            assert (a if i % 2 == 0 else b).generate(prompt(i), max_new_tokens=19).decision is not None
        settle([a, b])
        seen = [(c.policy_snapshot(), c.stats()) for c in (a, b)]
    finally:
        a.close()
        b.close()
    R, M = logged(tmp_path / "r0", tmp_path / "r1")  # the logs are whole once closed
    assert len(R) == 40 and (~M).any() and M[:, 0].all()  # some arms were censored: the paired means matter
    want = closed_form(R, M)
    for pol, stats in seen:
        np.testing.assert_allclose(pol.means(), want, rtol=1e-9)
        np.testing.assert_array_equal(pol.stats.n, M.sum(axis=0))  # every arm a request showed, not one
        assert pol.version == 40 and stats["shared"]["fleet_updates"] == 40 and stats["update_errors"] == 0


CRASH = textwrap.dedent("""
    import os, signal, sys, json
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_fleet_full_info import controller, prompt
    c = controller({url!r}, "r0", Path({log!r}), ttl=1.0)
    for i in range({n}):
        c.generate(prompt(i), max_new_tokens=19)
    c.sync()
    print(json.dumps(c._shared.status()), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.integration
def test_a_replica_killed_mid_stream_rebuilds_its_full_information_sums_from_its_log(redis_server, tmp_path):
    url, log = f"{redis_server.url}/crash", tmp_path / "r0"
    p = subprocess.run(
        [sys.executable, "-c", CRASH.format(tests=str(HERE), url=url, log=str(log), n=22)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert json.loads(p.stdout.splitlines()[-1])["local_updates"] == 22
    c = redis.Redis(port=redis_server.port)
    deadline = time.monotonic() + 20
    while (
        c.exists("adaptspec:fleet:crash:A:lease:r0") and time.monotonic() < deadline
    ):  # the dead one's lease
        time.sleep(0.1)
    c.close()
    back, other = controller(url, "r0", log), controller(url, "r1", tmp_path / "r1")
    try:
        rebuilt = back._shared.rebuilt
        assert rebuilt["from"] == "log" and rebuilt["updates"] == 22 and rebuilt["published_before"] <= 22
        for i in range(22, 34):
            (back if i % 2 else other).generate(prompt(i), max_new_tokens=19)
        settle([back, other])
        seen = [(ctl.policy_snapshot(), ctl.stats()) for ctl in (back, other)]
    finally:
        back.close()
        other.close()
    R, M = logged(log, tmp_path / "r1")
    assert len(R) == 34
    for pol, stats in seen:
        np.testing.assert_allclose(pol.means(), closed_form(R, M), rtol=1e-9)
        np.testing.assert_array_equal(
            pol.stats.n, M.sum(axis=0)
        )  # rebuilt from the vectors, not the arm alone
        assert stats["shared"]["fleet_updates"] == 34


def calibrated(ratios: np.ndarray, R: np.ndarray, half_life: float = 16.0) -> np.ndarray:
    """Each request's rewards over the machine-speed factor after its own ratio: the exponential of a
    discounted mean of the log ratios so far (weight 2 ** (-1 / half_life) per older request)."""
    d = 0.5 ** (1.0 / half_life)
    out, s, w = np.empty_like(R), 0.0, 0.0
    for i, q in enumerate(ratios):
        s, w = d * s + np.log(q), d * w + 1.0
        out[i] = R[i] / np.exp(s / w)  # token_latency: ms per token over the factor
    return out


def test_a_replica_restarted_on_its_log_learns_the_calibrated_rewards_it_learnt_before(tmp_path):
    """With a speed reference the learner divides each reward by the machine-speed factor; a replica
    that rebuilds its fleet sums from its log must divide them alike, in log order."""
    be, log = MemoryBackend(), tmp_path / "r0"

    def replica() -> AdaptiveController:
        return AdaptiveController(
            Taus(),
            "fi-ucb",
            arms=ARMS,
            variant="A",
            log_dir=log,
            log_fsync=False,
            shared=SharedState(be, "r0", sync_every=4, sync_interval_s=0.05),
            feedback_timeout_s=None,
            speed_reference="cpu-smollm2-fast",
            seed=0,
        )

    c = replica()
    for i in range(24):
        c.generate(prompt(i), max_new_tokens=19)
    c.sync()
    before = c.policy_snapshot().means()
    c.close()
    lg = DecisionLog.read(log)
    ratios = np.asarray(lg.table.column("speed_ratio").to_pylist(), dtype=np.float64)
    assert len(ratios) == 24 and np.ptp(ratios) > 0.05  # the factor moves from request to request
    want = closed_form(calibrated(ratios, lg.cf_rewards), lg.cf_observed)
    assert not np.allclose(want, closed_form(lg.cf_rewards, lg.cf_observed), rtol=1e-3)  # calibration matters
    np.testing.assert_allclose(before, want, rtol=1e-9)
    back = replica()
    try:
        assert back.stats()["shared"]["rebuilt"] == {"from": "log", "updates": 24, "published_before": 24}
        np.testing.assert_allclose(back.policy_snapshot().means(), want, rtol=1e-9)
    finally:
        back.close()
