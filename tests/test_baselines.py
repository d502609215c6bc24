"""Fixed, RandomPolicy, Oracle and the make_policy spec parser."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.errors import AdaptspecError
from adaptspec.policies import REGISTRY, Fixed, Oracle, RandomPolicy, make_policy
from adaptspec.policies.base import Policy
from adaptspec.policies.spec import describe, parse_spec

ARMS = (1, 2, 4, 8, 16)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    eps=st.floats(0.0, 1.0),
    n=st.integers(1, 40),
    which=st.sampled_from(["fixed", "random"]),
)
def test_batch_equals_sequential_decisions_and_probs_sum_to_one(seed, eps, n, which):
    def build():
        return (
            Fixed(4, arms=ARMS, seed=seed, epsilon=eps)
            if which == "fixed"
            else RandomPolicy(ARMS, seed=seed, epsilon=eps)
        )

    a, b = build(), build()
    idx, prop = a.decide_batch(None, n)
    seq = [b.decide() for _ in range(n)]
    assert [ARMS[i] for i in idx] == [d.block_size for d in seq]
    np.testing.assert_allclose(prop, [d.propensity for d in seq])
    for d in seq:
        assert d.probs.sum() == pytest.approx(1.0) and np.all(d.probs >= 0)
        assert d.probs[ARMS.index(d.block_size)] == pytest.approx(d.propensity)
    P = build().probs_batch(None, n)
    assert P.shape == (n, len(ARMS)) and np.allclose(P.sum(axis=1), 1.0)


def test_fixed():
    p = Fixed(8, arms=ARMS)
    assert {p.decide().block_size for _ in range(20)} == {8} and p.decide().propensity == 1.0
    assert p.label == "fixed:8" and Fixed(8).arms == (8,)
    q = Fixed(8, arms=ARMS, epsilon=0.5, seed=1)
    np.testing.assert_allclose(q.decide().probs, [0.1, 0.1, 0.1, 0.6, 0.1])
    idx, _ = Fixed(8, arms=ARMS, epsilon=0.5, seed=2).decide_batch(None, 20000)
    assert np.mean(idx == 3) == pytest.approx(0.6, abs=0.02)
    p.update(None, 8, 3.0)  # learns nothing, but checks its input
    with pytest.raises(AdaptspecError, match="unknown arm 5"):
        p.update(None, 5, 3.0)
    with pytest.raises(AdaptspecError, match="reward must be finite"):
        p.update(None, 8, float("nan"))
    with pytest.raises(AdaptspecError, match="fixed:3: block size 3 is not one of the arms"):
        Fixed(3, arms=ARMS)
    with pytest.raises(AdaptspecError, match="positive integer"):
        Fixed(2.5)


def test_random_is_uniform_and_seeded():
    idx, prop = RandomPolicy(ARMS, seed=0).decide_batch(None, 50000)
    np.testing.assert_allclose(np.bincount(idx) / 50000, 0.2, atol=0.01)
    assert np.all(prop == 0.2)
    a = RandomPolicy(ARMS, seed=5).decide_batch(None, 100)[0]
    assert np.array_equal(a, RandomPolicy(ARMS, seed=5).decide_batch(None, 100)[0])
    assert not np.array_equal(a, RandomPolicy(ARMS, seed=6).decide_batch(None, 100)[0])


def test_state_round_trip_continues_exactly():
    p = RandomPolicy(ARMS, seed=3)
    p.decide_batch(None, 7)
    state = p.state_dict()
    a = p.decide_batch(None, 10)[0]
    q = RandomPolicy(ARMS, seed=99)
    q.load_state_dict(state)
    assert np.array_equal(q.decide_batch(None, 10)[0], a)


def test_oracle():
    o = Oracle(ARMS)
    assert o.full_information and not o.learning
    R = np.array([[1.0, 2.0, 3.0, 2.0, 1.0], [5.0, 5.0, 1.0, 1.0, 1.0]])
    idx, prop = o.decide_batch(None, 2, rewards=R)
    assert idx.tolist() == [2, 0] and prop.tolist() == [1.0, 1.0]  # ties -> smaller block
    assert o.decide(rewards=R[0]).block_size == 4
    with pytest.raises(AdaptspecError, match="runs only in the simulator"):
        o.decide()
    with pytest.raises(AdaptspecError, match="runs only in the simulator"):
        o.decide_batch(None, 3)
    with pytest.raises(AdaptspecError, match=r"rewards must have shape \(n, 5\)"):
        o.decide_batch(None, 1, rewards=np.ones((1, 3)))


def test_make_policy_parses_specs():
    assert make_policy("fixed:16", ARMS).block_size == 16
    assert make_policy("fixed:block_size=2,epsilon=0.25", ARMS, seed=1).epsilon == 0.25
    assert make_policy("random", ARMS, seed=4).seed == 4
    assert isinstance(make_policy("oracle", ARMS), Oracle)
    assert parse_spec(" Fixed : 16 ") == ("fixed", ["16"], {})
    assert parse_spec("x:a=1,b-c=2") == ("x", [], {"a": "1", "b_c": "2"})
    assert describe("fixed") == "fixed:block_size=None,epsilon=0.0"


@pytest.mark.parametrize(
    "spec,msg",
    [
        ("", "empty policy spec"),
        ("nope", "unknown policy 'nope' in spec 'nope': known policies are"),
        ("fixed", "fixed needs a block size"),
        ("fixed:x", "fixed: block_size must be an integer, got 'x'"),
        ("fixed:16,8", "too many positional values"),
        ("fixed:16,epsilon=a", "fixed: epsilon must be a number, got 'a'"),
        ("fixed:16,colour=red", "unknown option 'colour'"),
        ("fixed:epsilon=0.1,16", "positional value '16' after key=value"),
        ("fixed:16,,", "empty value between commas"),
        ("random:epsilon=2", "epsilon must be in [0, 1]"),
    ],
)
def test_make_policy_errors(spec, msg):
    with pytest.raises(AdaptspecError) as e:
        make_policy(spec, ARMS)
    assert msg in str(e.value)


class _Toy(Policy):
    name = "toy"

    def __init__(
        self,
        arms,
        seed=None,
        head: Path | None = None,
        flag: bool = False,
        k: int = 1,
        scale: float = 1.0,
        note: str = "",
        **kwargs,
    ):
        self.head, self.flag, self.k, self.scale, self.note, self.extra = head, flag, k, scale, note, kwargs
        super().__init__(arms, seed=seed)

    def _probs(self, context):
        return np.full(len(self.arms), 1.0 / len(self.arms))

    def _update(self, context, arm, reward):
        pass


def test_registry_is_extensible_with_typed_options(monkeypatch):
    monkeypatch.setitem(REGISTRY, "toy", _Toy)
    p = make_policy("toy:head=~/h.pt,flag=yes,k=3,scale=2,note=7", ARMS)
    assert p.head == Path("~/h.pt").expanduser() and p.flag is True and p.k == 3
    assert p.scale == 2.0 and isinstance(p.scale, float) and p.note == "7"
    with pytest.raises(AdaptspecError, match="unknown option 'other'"):  # **kwargs end at Policy's init
        make_policy("toy:other=1", ARMS)

    def factory(arms, seed=None, **kwargs):  # a function factory: untyped options are guessed
        return _Toy(arms, seed, head=kwargs.pop("head"), **kwargs)

    monkeypatch.setitem(REGISTRY, "toy2", factory)
    q = make_policy("toy2:head=none,other=1.5,on=true,n=3,s=abc", ARMS)
    assert q.head is None and q.extra == {"other": 1.5, "on": True, "n": 3, "s": "abc"}
    with pytest.raises(AdaptspecError, match="toy: flag must be true or false"):
        make_policy("toy:flag=maybe", ARMS)
    r = make_policy("toy", ARMS, k=9)
    assert r.k == 9
