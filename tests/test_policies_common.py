"""Properties every learning policy must have (all families, all variants).

Probabilities are a distribution and the propensity is the chosen arm's; the same seed gives the
same choices; save -> load -> continue equals never stopping (in memory and through a file);
NaN/inf rewards, unknown arms and wrong feature dimensions raise and leave the state unchanged;
reset forgets everything.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from _policy_helpers import ARMS, DIM, catalogue, context_for, linear_stream, run, same_state
from adaptspec.errors import AdaptspecError

CATALOGUE = catalogue()
NAMES = sorted(CATALOGUE)
X, R, _ = linear_stream(120, seed=7)


def fresh(name: str, seed: int | None = 0):
    return CATALOGUE[name](seed)


@pytest.mark.parametrize("name", NAMES)
def test_probabilities_are_a_distribution(name):
    pol = fresh(name)
    for t in range(60):
        ctx = context_for(pol, X[t])
        d = pol.decide(ctx)
        assert d.probs.shape == (len(ARMS),)
        assert np.all(d.probs >= 0) and abs(d.probs.sum() - 1.0) < 1e-9
        assert d.propensity == pytest.approx(d.probs[pol.arm_index(d.block_size)])
        assert d.propensity > 0
        assert d.arms == ARMS and d.block_size in ARMS
        pol.update(ctx, d.block_size, R[t, pol.arm_index(d.block_size)])
    P = pol.probs_batch(X[60:80] if pol.contextual else None, n=20)
    assert P.shape == (20, len(ARMS)) and np.all(P >= 0) and np.allclose(P.sum(axis=1), 1.0)
    idx, prop = pol.decide_batch(X[60:80] if pol.contextual else None, n=20)
    assert idx.dtype == np.int64 and np.all((idx >= 0) & (idx < len(ARMS)))
    assert np.all(prop > 0) and np.all(prop <= 1.0 + 1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_choices(name):
    a, b = fresh(name, 3), fresh(name, 3)
    assert run(a, X, R, 0, 50) == run(b, X, R, 0, 50)


@pytest.mark.parametrize("name", NAMES)
def test_save_load_continue_equals_never_stopping(name, tmp_path):
    straight = fresh(name)
    expected = run(straight, X, R, 0, 90)
    first = fresh(name)
    run(first, X, R, 0, 50)
    state = first.state_dict()
    first.save_state(tmp_path / "state.npz")
    resumed = fresh(name, seed=12345)  # its own seed must not matter: the generator is restored
    resumed.load_state_dict(state)
    assert run(resumed, X, R, 50, 90) == expected[50:]
    from_file = fresh(name, seed=999)
    from_file.load_state(tmp_path / "state.npz")
    assert run(from_file, X, R, 50, 90) == expected[50:]
    # the saved dict is a copy: continuing did not change it
    again = fresh(name, seed=1)
    again.load_state_dict(state)
    assert run(again, X, R, 50, 90) == expected[50:]


@pytest.mark.parametrize("name", NAMES)
def test_reset_forgets(name):
    pol = fresh(name, 5)
    first = run(pol, X, R, 0, 30)
    pol.reset()
    assert pol.version == 0
    assert run(pol, X, R, 0, 30) == first


def _bad_calls(pol):
    good_ctx = context_for(pol, X[0])
    calls = [
        ("NaN reward", lambda: pol.update(good_ctx, ARMS[0], float("nan"))),
        ("inf reward", lambda: pol.update(good_ctx, ARMS[0], float("inf"))),
        ("text reward", lambda: pol.update(good_ctx, ARMS[0], "fast")),
        ("unknown arm", lambda: pol.update(good_ctx, 5, 1.0)),
        ("non-integer arm", lambda: pol.update(good_ctx, 4.5, 1.0)),
        (
            "batch with one NaN",
            lambda: pol.update_batch(X[:3] if pol.contextual else None, [2, 4, 8], [1.0, np.nan, 1.0]),
        ),
        (
            "batch with one unknown arm",
            lambda: pol.update_batch(X[:3] if pol.contextual else None, [2, 3, 8], [1.0, 1.0, 1.0]),
        ),
        (
            "batch of wrong length",
            lambda: pol.update_batch(X[:3] if pol.contextual else None, [2, 4, 8], [1.0, 1.0]),
        ),
    ]
    if pol.contextual:
        calls += [
            ("NaN context", lambda: pol.update(np.full(DIM, np.nan), ARMS[0], 1.0)),
            ("missing context", lambda: pol.decide(None)),
            ("2-D context", lambda: pol.decide(X[:2])),
            ("text context", lambda: pol.decide(["a"] * DIM)),
            (
                "batch with NaN context",
                lambda: pol.update_batch(np.vstack([X[:2], np.full((1, DIM), np.inf)]), [2, 4, 8], [1.0] * 3),
            ),
        ]
        if pol.dim is not None:  # a policy built without dim learns it from the first valid context
            calls += [
                ("short context", lambda: pol.update(X[0][:-1], ARMS[0], 1.0)),
                ("long context", lambda: pol.decide(np.ones(DIM + 1))),
                ("batch of wrong width", lambda: pol.decide_batch(np.ones((3, DIM + 2)))),
            ]
    return calls


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("steps", [0, 5, 40])
def test_bad_input_raises_and_changes_nothing(name, steps):
    pol = fresh(name)
    run(pol, X, R, 0, steps)
    for what, call in _bad_calls(pol):
        before = pol.state_dict()
        with pytest.raises(AdaptspecError):
            call()
            pytest.fail(f"{what}: no error")
        assert same_state(pol.state_dict(), before), what


@pytest.mark.parametrize("name", NAMES)
def test_state_of_another_policy_is_refused(name):
    pol = fresh(name)
    run(pol, X, R, 0, 20)
    before = pol.state_dict()
    other = "ucb" if name != "ucb" else "ts"
    with pytest.raises(AdaptspecError):
        pol.load_state_dict(fresh(other).state_dict())
    with pytest.raises(AdaptspecError):
        pol.load_state_dict({"nonsense": 1})
    broken = pol.state_dict()
    broken["arms"] = [1, 2, 3]
    with pytest.raises(AdaptspecError):
        pol.load_state_dict(broken)
    assert same_state(pol.state_dict(), before)


@pytest.mark.parametrize("name", NAMES)
def test_update_batch_equals_sequential_updates(name):
    a, b = fresh(name), fresh(name)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(ARMS), 40)
    arms = np.asarray(ARMS)[idx]
    r = R[np.arange(40), idx]
    a.update_batch(X[:40] if a.contextual else None, arms, r)
    for t in range(40):
        b.update(context_for(b, X[t]), int(arms[t]), float(r[t]))
    assert a.version == b.version == 40
    sa, sb = a.state_dict(), b.state_dict()
    sa.pop("rng"), sb.pop("rng")
    if name.startswith("river"):  # pickles of equal river objects can differ byte-wise
        return
    assert _close(sa, sb)


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, (np.ndarray, float)) and not isinstance(a, bool):
        return bool(np.allclose(a, b, rtol=1e-9, atol=1e-9, equal_nan=True))
    return a == b


SMALL = [
    "eps-greedy",
    "ucb-discount",
    "ts-window",
    "exp3",
    "linucb",
    "linucb-discount",
    "lints",
    "squarecb",
    "neural-linear",
    "neural-linear-ts",
]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(SMALL),
    rewards=st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=40),
    scale=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**31 - 1),
)
def test_any_reward_sequence_keeps_probabilities_valid(name, rewards, scale, seed):
    pol = fresh(name, seed)
    ctxs = np.random.default_rng(seed).normal(size=(len(rewards) + 1, DIM)) * scale
    for t, r in enumerate(rewards):
        ctx = context_for(pol, ctxs[t])
        d = pol.decide(ctx)
        assert np.all(np.isfinite(d.probs)) and np.all(d.probs >= 0) and abs(d.probs.sum() - 1) < 1e-9
        assert d.propensity > 0
        pol.update(ctx, d.block_size, r)
    d = pol.decide(context_for(pol, ctxs[-1]))
    assert np.all(np.isfinite(d.probs)) and abs(d.probs.sum() - 1) < 1e-9


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(SMALL), n=st.integers(1, 30), seed=st.integers(0, 1000))
def test_decide_batch_probabilities_match_probs_batch(name, n, seed):
    """Deterministic policies: the batch propensities are the probabilities probs_batch reports."""
    pol = fresh(name, seed)
    run(pol, X, R, 0, 30)
    ctx = X[:n] if pol.contextual else None
    if getattr(pol, "_stochastic", False) or name.startswith("ts"):
        return  # Monte-Carlo probabilities: covered by the distribution test
    P = pol.probs_batch(ctx, n=n)
    idx, prop = pol.decide_batch(ctx, n=n)
    assert np.allclose(prop, P[np.arange(n), idx])
