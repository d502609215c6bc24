"""The compiled kernels (numba) and the numpy path of RidgeArms compute the same thing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.policies import LinTS, LinUCB, ridge_kernels
from adaptspec.policies.ridge import DiscountedRidgeArms, RidgeArms
from adaptspec.policies.standardizer import Standardizer


def test_numba_is_installed_for_the_suite():
    # the dev extra installs numba, so that the suite runs both paths; without it only numpy runs
    assert ridge_kernels.AVAILABLE, "numba is missing: pip install -e '.[dev]' (or '.[fast]')"


def _run_core(core_cls, seed: int, **kw):
    rng = np.random.default_rng(seed)
    k, d = 4, 6
    core = core_cls(k, d, lam=0.7, **kw)
    errs, scores = [], []
    for _ in range(60):
        phi = rng.normal(size=d)
        out, best, ties = core.mean_var_score(phi, 0.8)
        scores.append((out.copy(), best, ties))
        errs.append(core.update(int(rng.integers(k)), phi, float(rng.normal())))
    return core, np.array(errs), scores


@pytest.mark.parametrize("core_cls,kw", [(RidgeArms, {}), (DiscountedRidgeArms, {"gamma": 0.9, "every": 5})])
@given(seed=st.integers(0, 2**16))
@settings(max_examples=15, deadline=None)
def test_compiled_and_numpy_statistics_agree(core_cls, kw, seed):
    fast, fast_err, fast_scores = _run_core(core_cls, seed, **kw)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ridge_kernels, "AVAILABLE", False)
        slow, slow_err, slow_scores = _run_core(core_cls, seed, **kw)
    np.testing.assert_allclose(fast.A_inv, slow.A_inv, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fast.theta, slow.theta, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fast_err, slow_err, rtol=1e-9, atol=1e-12)
    assert (fast.count == slow.count).all()
    for (o1, b1, t1), (o2, b2, t2) in zip(fast_scores, slow_scores):
        np.testing.assert_allclose(o1, o2, rtol=1e-9, atol=1e-12)
        assert (b1, t1) == (b2, t2)


@pytest.mark.parametrize("compiled", [True, False])
def test_ties_are_counted(compiled, monkeypatch):
    monkeypatch.setattr(ridge_kernels, "AVAILABLE", compiled)
    core = RidgeArms(3, 2, lam=1.0)  # every arm at the same prior: a three-way tie
    out, best, ties = core.mean_var_score(np.array([1.0, 2.0]), 0.5)
    assert (best, ties) == (0, 3)
    np.testing.assert_allclose(out[1], [5.0, 5.0, 5.0])
    np.testing.assert_allclose(out[2], 0.5 * np.sqrt(5.0))
    core.update(1, np.array([1.0, 2.0]), 3.0)
    assert core.mean_var_score(np.array([1.0, 2.0]), 0.5)[1:] == (1, 1)


def test_standardize_kernel_matches_numpy(monkeypatch):
    st_ = Standardizer(np.array([1.0, -2.0, 0.5]), np.array([2.0, 0.5, 4.0]))
    x = np.array([3.0, 1.0, -1.5])
    fast = st_.phi(x)
    monkeypatch.setattr(ridge_kernels, "AVAILABLE", False)
    np.testing.assert_allclose(fast, st_.phi(x), rtol=1e-15)
    assert fast.tolist() == [1.0, 6.0, -0.5, 1.0]


@pytest.mark.parametrize("cls", [LinUCB, LinTS])
def test_policies_choose_the_same_on_both_paths(cls, monkeypatch):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 5))
    W = rng.normal(size=(3, 5))

    def run():
        pol = cls([2, 4, 8], warmup=30, seed=7)
        chosen = []
        for x in X:
            d = pol.decide(x)
            chosen.append(d.block_size)
            pol.update(x, d.block_size, float(W[pol.arm_index(d.block_size)] @ x))
        return chosen, pol.noise_std()

    fast = run()
    monkeypatch.setattr(ridge_kernels, "AVAILABLE", False)
    slow = run()
    assert fast[0] == slow[0]
    assert fast[1] == pytest.approx(slow[1], rel=1e-9)
