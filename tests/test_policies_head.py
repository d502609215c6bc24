"""Offline head, NeuralLinear warm start, SquareCB with the head, the train-head command, spec strings."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from _policy_helpers import ARMS, clustered_stream, linear_stream, small_head
from adaptspec.cli import main
from adaptspec.errors import AdaptspecError
from adaptspec.policies import HeadModel, NeuralLinear, OfflineHead, SquareCB, make_policy, train_head
from adaptspec.policies.neural_linear import PRIOR_GRID, JointArms, head_arm_cov, head_prior, systematic_corr


def test_head_save_load_round_trip(tmp_path):
    head = small_head()
    head.save(tmp_path / "h")
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == ["config.json", "model.safetensors"]
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["arms"] == list(ARMS) and cfg["mode"] == "regression" and cfg["hidden"] == [16, 8]
    back = HeadModel.load(tmp_path / "h")
    X, _, _ = linear_stream(50, seed=9)
    assert np.allclose(back.predict(X), head.predict(X))
    assert np.allclose(back.hidden(X), head.hidden(X))
    assert np.allclose(back.val_gram, head.val_gram) and np.allclose(back.val_mse, head.val_mse)
    assert np.allclose(back.val_cov, head.val_cov) and np.allclose(np.diag(head.val_cov), head.val_mse)
    assert back.info["n_val"] == head.info["n_val"]


def test_training_is_deterministic_and_early_stops():
    X, _, _ = linear_stream(300, seed=11)
    R = np.random.default_rng(0).normal(size=(300, 3))  # nothing to learn: validation loss soon rises
    a = train_head(X, R, ARMS, hidden=(32,), max_epochs=400, patience=5, seed=3)
    b = train_head(X, R, ARMS, hidden=(32,), max_epochs=400, patience=5, seed=3)
    assert all(np.array_equal(wa, wb) for (wa, _), (wb, _) in zip(a.layers, b.layers))
    assert a.info["epochs"] < 400 and a.info["best_epoch"] <= a.info["epochs"]
    assert a.info["n_train"] + a.info["n_val"] == 300


def test_head_learns_a_nonlinear_optimum_and_beats_fixed():
    X, R, E = clustered_stream(1500, seed=1)
    pol = OfflineHead.fit(X[:1000], R[:1000], ARMS, hidden=(16, 8), seed=0)
    idx, prop = pol.decide_batch(X[1000:])
    got = E[1000:][np.arange(500), idx]
    assert got.sum() / E[1000:].max(axis=1).sum() > 0.97
    assert got.mean() > E[1000:].mean(axis=0).max() + 0.5
    assert np.all(prop == 1.0)
    for t in range(5):  # decide agrees with decide_batch
        assert pol.arm_index(pol.decide(X[1000 + t]).block_size) == idx[t]


def test_classification_head():
    X, R, E = clustered_stream(900, seed=2)
    head = train_head(X[:600], R[:600], ARMS, mode="classification", hidden=(16,), seed=0)
    P = head.predict(X[600:])
    assert np.allclose(P.sum(axis=1), 1.0)
    pol = OfflineHead(head)
    idx, _ = pol.decide_batch(X[600:])
    assert np.mean(idx == E[600:].argmax(axis=1)) > 0.9
    with pytest.raises(AdaptspecError, match="regression"):
        NeuralLinear(head)


def test_training_input_errors():
    X, R, _ = linear_stream(50)
    with pytest.raises(AdaptspecError, match="shape"):
        train_head(X, R[:, :2], ARMS)
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(AdaptspecError, match="NaN"):
        train_head(bad, R, ARMS)
    with pytest.raises(AdaptspecError, match="mode"):
        train_head(X, R, ARMS, mode="ranking")
    with pytest.raises(AdaptspecError, match="not a saved head"):
        HeadModel.load("/nonexistent/head")
    with pytest.raises(AdaptspecError, match="arms"):
        OfflineHead(small_head(), arms=[1, 2, 3])


def test_neural_linear_starts_exactly_as_the_head():
    head = small_head()
    X, _, _ = linear_stream(200, seed=12)
    nl = NeuralLinear(head, alpha=0.0)
    assert np.allclose(nl.predict(X), head.predict(X), atol=1e-9)
    greedy = OfflineHead(head)
    assert np.array_equal(nl.decide_batch(X)[0], greedy.decide_batch(X)[0])
    mean, prec, s2 = head_prior(head, 10.0)
    assert np.allclose(mean[:, :-1], head.layers[-1][0]) and np.allclose(mean[:, -1], head.layers[-1][1])
    assert s2 == pytest.approx(float(np.mean(head.val_mse)))
    # arms the head predicted worse on validation get a weaker prior
    order = np.argsort(head.val_mse)
    tr = np.trace(prec, axis1=1, axis2=2)
    assert tr[order[0]] >= tr[order[-1]]


def _stream_score(pol, X, R, E):
    got = []
    for t in range(len(X)):
        d = pol.decide(X[t])
        a = pol.arm_index(d.block_size)
        pol.update(X[t], d.block_size, R[t, a])
        got.append(E[t, a])
    return 100 * np.sum(got) / E.max(axis=1).sum()


def test_neural_linear_keeps_a_good_head_and_fixes_a_wrong_one():
    head = small_head()
    X, R, E = linear_stream(1500, seed=13)
    good = NeuralLinear(head, seed=0)
    pct_good = _stream_score(good, X, R, E)
    head_alone = 100 * E[np.arange(1500), OfflineHead(head).decide_batch(X)[0]].sum() / E.max(axis=1).sum()
    assert pct_good > head_alone - 0.5

    # the world changed after the head was trained: arm rewards are permuted
    perm = [2, 0, 1]
    R2, E2 = R[:, perm], E[:, perm]
    wrong_head_alone = (
        100 * E2[np.arange(1500), OfflineHead(head).decide_batch(X)[0]].sum() / E2.max(axis=1).sum()
    )
    fixed = NeuralLinear(head, seed=0)
    pct_fixed = _stream_score(fixed, X, R2, E2)
    assert fixed.head_weight <= 16
    assert pct_fixed > 95.0 and pct_fixed > wrong_head_alone + 20
    stubborn = NeuralLinear(head, prior_n=1024.0, seed=0)  # a fixed strong prior is slower to correct
    assert _stream_score(stubborn, X, R2, E2) < pct_fixed


def test_neural_linear_prior_grid_and_state_checks():
    head = small_head()
    nl = NeuralLinear(head, prior_n=50.0)
    assert nl.prior_grid.tolist() == [50.0] and nl.head_weight == 50.0
    auto = NeuralLinear(head)
    assert auto.prior_grid.tolist() == list(PRIOR_GRID) and auto.head_weight == 64.0
    with pytest.raises(AdaptspecError, match="state"):
        auto.load_state_dict(nl.state_dict())
    other = train_head(*linear_stream(300, seed=50)[:2], ARMS, hidden=(16, 8), max_epochs=20, seed=1)
    with pytest.raises(AdaptspecError, match="head"):
        NeuralLinear(other).load_state_dict(auto.state_dict())
    with pytest.raises(AdaptspecError, match="prior"):
        auto.set_prior(np.zeros(9), 1.0)
    with pytest.raises(AdaptspecError, match="exploration"):
        NeuralLinear(head, exploration="greedy")


def test_neural_linear_learns_all_arms_jointly(tmp_path):
    head = small_head()
    C = head_arm_cov(head)
    assert C.shape == (len(ARMS), len(ARMS)) and np.allclose(np.diag(C), head.val_mse / head.val_mse.mean())
    x = linear_stream(1, seed=4)[0][0]
    nl = NeuralLinear(head, prior_n=16.0)
    before = nl.predict(x[None])[0]
    nl.update(x, ARMS[0], float(before[0]) + 5.0)
    moved = nl.predict(x[None])[0] - before
    # the other arms move by the correlation of the head's validation errors with arm 0
    assert moved[0] > 0 and np.all(np.sign(moved[1:]) == np.sign(C[0, 1:]))
    # a head saved without val_cov: independent arms, as before
    old = dataclasses.replace(head, val_cov=None)
    nl_old = NeuralLinear(old, prior_n=16.0)
    nl_old.update(x, ARMS[0], float(before[0]) + 5.0)
    assert np.allclose(nl_old.predict(x[None])[0][1:], before[1:])
    few = dataclasses.replace(head, info={**head.info, "n_val": 2 * len(ARMS) - 1})  # too few to estimate C
    assert np.allclose(head_arm_cov(few), np.diag(np.diag(C)))


def test_systematic_corr_undoes_the_dilution_by_independent_noise():
    rng = np.random.default_rng(0)
    k, n = 6, 20000
    # systematic errors correlated 0.9 ** |a - b| across arms, plus noise of each arm's own, twice as large
    true = 0.9 ** np.abs(np.subtract.outer(np.arange(k), np.arange(k)))
    err = rng.multivariate_normal(np.zeros(k), true, n) + rng.normal(0.0, np.sqrt(2.0), (n, k))
    cov = err.T @ err / n
    raw = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    R = systematic_corr(cov)
    off = ~np.eye(k, dtype=bool)
    assert np.allclose(np.diag(R), 1.0) and np.linalg.eigvalsh(R).min() > 0
    assert np.abs(raw - true)[off].mean() > 0.4  # the raw correlations are a third of the truth
    assert np.abs(R - true)[off].mean() < 0.1
    # uncorrelated errors stay (nearly) uncorrelated
    assert np.abs(systematic_corr(np.diag([1.0, 2.0, 3.0])) - np.eye(3)).max() < 1e-9


def test_joint_arms_discount_matches_a_weighted_refit():
    rng = np.random.default_rng(0)
    prior = np.array([[1.0, 0.3], [0.3, 2.0]])
    core = JointArms(np.zeros((2, 1)), prior, discount=0.9, every=1)
    phis, arms, rs = rng.normal(size=(6, 1)), [0, 1, 0, 0, 1, 1], rng.normal(size=6)
    for a, p, r in zip(arms, phis, rs):
        core.update(a, p, r)
    # exact posterior with weights 0.9^(updates after it)
    w = 0.9 ** np.arange(5, -1, -1)
    A, b = np.linalg.inv(prior), np.zeros(2)
    for wi, a, p, r in zip(w, arms, phis, rs):
        f = np.zeros(2)
        f[a] = p[0]
        A += wi * np.outer(f, f)
        b += wi * r * f
    assert np.allclose(core.theta.ravel(), np.linalg.solve(A, b))
    back = JointArms(np.zeros((2, 1)), prior, discount=0.9, every=1)
    back.load(core.state())
    assert np.allclose(back.S, core.S) and np.allclose(back.theta, core.theta)


def test_squarecb_with_the_head_starts_from_it():
    head = small_head()
    X, R, E = linear_stream(300, seed=14)
    pol = SquareCB(head=head, seed=0)
    assert pol.label == "squarecb-head"
    assert np.allclose(pol.predict(X), head.predict(X), atol=1e-9)
    assert _stream_score(pol, X, R, E) > 90.0
    with pytest.raises(AdaptspecError, match="arms"):
        SquareCB([1, 2], head=head)
    with pytest.raises(AdaptspecError):
        SquareCB(head=head, standardize=False)


@pytest.fixture(scope="module")
def tiny_traces(tmp_path_factory):
    from adaptspec.simulators.synthetic import generate

    path = tmp_path_factory.mktemp("traces") / "ts"
    generate("cpu-small", n_requests=200, seed=3, per_round=False).write(path)
    return path


def test_train_head_command_and_specs(tiny_traces, tmp_path, capsys):
    out = tmp_path / "head"
    assert (
        main(
            [
                "train-head",
                str(tiny_traces),
                "--out",
                str(out),
                "--hidden",
                "16,8",
                "--epochs",
                "60",
                "--reward",
                "modelled",
                "--latency",
                "cpu-smollm2-bf16",
                "--json",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["out"] == str(out) and summary["n_train"] + summary["n_val"] == 200
    assert summary["reward"] == "modelled" and 0 < summary["val_pct_oracle"] <= 100
    head = HeadModel.load(out)
    assert head.info["latency"] == "cpu-smollm2-bf16" and head.hidden_sizes == (16, 8)
    arms = list(head.arms)
    assert isinstance(make_policy(f"head:{out}", arms), OfflineHead)
    assert isinstance(make_policy(f"head:path={out},epsilon=0.1", arms), OfflineHead)
    nl = make_policy(f"neural-linear:head={out},exploration=ts,prior_n=32", arms, seed=1)
    assert isinstance(nl, NeuralLinear) and nl.exploration == "ts" and nl.head_weight == 32.0
    assert isinstance(make_policy(f"squarecb:head={out}", arms), SquareCB)
    # user errors: exit code 2, one line
    assert main(["train-head", str(tiny_traces), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["train-head", str(tiny_traces), "--out", str(tmp_path / "h2"), "--hidden", "0"]) == 2
    # without head=, neural-linear stands on the bundled head (trained on the bundled traces)
    from adaptspec.paths import BUNDLED_HEAD

    bundled = make_policy("neural-linear", list(HeadModel.load(BUNDLED_HEAD).arms))
    assert (
        isinstance(bundled, NeuralLinear) and bundled.dim == 33
    )  # its featurizer maps 1,153 prefill features to 33
    with pytest.raises(AdaptspecError, match="not a saved head"):
        make_policy(f"neural-linear:head={tmp_path / 'missing'}", arms)


def test_train_head_needs_features(tmp_path, capsys):
    from adaptspec.traces import TraceSet

    path = tmp_path / "nofeat"
    TraceSet.from_arrays(list("abcdef"), ["x"] * 6, [1, 2], np.ones((6, 2))).write(path)
    assert main(["train-head", str(path), "--out", str(tmp_path / "h")]) == 2
    assert "no features" in capsys.readouterr().err


def test_head_outputs_follow_sorted_arms():
    X, R, _ = linear_stream(200, seed=15)
    a = train_head(X, R, ARMS, hidden=(8,), max_epochs=30, seed=0)
    b = train_head(X, R[:, ::-1], ARMS[::-1], hidden=(8,), max_epochs=30, seed=0)
    assert b.arms == ARMS
    assert np.allclose(a.predict(X), b.predict(X))
    with pytest.raises(AdaptspecError, match="unique"):
        train_head(X, R, [2, 2, 8])
