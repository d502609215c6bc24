"""Featurizer: fitting, identical contexts row by row and in batches, files, trace sets, the controller."""

from __future__ import annotations

import json

import numpy as np
import pytest

from _controller_helpers import FakeSpeculator
from _threads import torch_threads
from adaptspec import AdaptiveController, AdaptspecError
from adaptspec.policies.featurizer import Featurizer
from adaptspec.reward.functions import trace_rewards
from adaptspec.traces import TraceSet


def data(n=300, d=12, seed=0):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, 4))
    X = Z @ rng.normal(size=(4, d)) * rng.uniform(0.1, 50, size=d) + rng.normal(0, 0.01, (n, d)) + 7.0
    return X.astype(np.float32)


def test_pca_is_standardised_projected_and_whitened():
    X = data()
    f = Featurizer.fit(X, dim=3)
    Z = f.transform(X)
    assert Z.shape == (300, 3) and f.out_dim == 3 and f.in_dim == 12
    assert np.allclose(Z.mean(axis=0), 0, atol=1e-4) and np.allclose(Z.std(axis=0), 1, atol=1e-4)
    assert np.allclose(np.corrcoef(Z.T), np.eye(3), atol=1e-4)  # components are uncorrelated
    assert 0.5 < f.info["explained_variance"] < Featurizer.fit(X, dim=4).info["explained_variance"]
    assert Featurizer.fit(X, dim=4).info["explained_variance"] > 0.99  # four latent factors
    assert Featurizer.fit(X, dim=3).fingerprint == f.fingerprint  # deterministic, signs fixed
    assert Featurizer.fit(X[:5], dim=32).out_dim == 4  # capped at n - 1
    g = Featurizer.fit(X, dim=2, keep=[-1, 0])
    assert g.out_dim == 4 and g.keep == (11, 0)
    zs = (X[:, [11, 0]] - X[:, [11, 0]].mean(0)) / X[:, [11, 0]].std(0)
    assert np.allclose(g.transform(X)[:, 2:], zs, atol=1e-5)  # kept columns, standardised


def test_other_kinds():
    X = data()
    s = Featurizer.fit(X, kind="standardize")
    assert s.out_dim == 12 and np.allclose(s.transform(X).std(axis=0), 1, atol=1e-4)
    i = Featurizer.fit(X, kind="identity")
    assert np.array_equal(i.transform(X), X.astype(np.float64))
    X[:, 3] = 2.0  # a constant column gets scale 1, not a division by zero
    assert np.isfinite(Featurizer.fit(X, kind="standardize").transform(X)).all()


@pytest.mark.parametrize("d,k", [(12, 3), (1153, 32), (129, 16)])
def test_one_row_equals_the_same_row_in_any_batch(d, k):
    rng = np.random.default_rng(d)
    X = (rng.normal(size=(80, d)) * rng.uniform(0.01, 30, d)).astype(np.float32)
    f = Featurizer.fit(X, dim=k, keep=[-1])
    Y = (rng.normal(size=(400, d)) * rng.uniform(0.01, 30, d)).astype(np.float32)
    full = f.transform(Y)
    for n in (1, 2, 7, 64, 400):
        assert np.array_equal(f.transform(Y[:n]), full[:n])
    for i in (0, 5, 399):
        assert np.array_equal(f(Y[i]), full[i])
    # outputs are float32 values: a context stored as float32 and read back is unchanged
    assert np.array_equal(full.astype(np.float32).astype(np.float64), full)


def test_save_load_round_trip_and_checks(tmp_path):
    X = data()
    f = Featurizer.fit(X, dim=4, keep=[1])
    f.save(tmp_path / "f")
    g = Featurizer.load(tmp_path / "f")
    assert g == f and g.keep == f.keep and np.array_equal(g.transform(X), f.transform(X))
    assert Featurizer.load(tmp_path / "f" / "featurizer.json") == f
    assert Featurizer.exists(tmp_path / "f") and not Featurizer.exists(tmp_path)
    cfg = json.loads((tmp_path / "f" / "featurizer.json").read_text())
    cfg["fingerprint"] = "0" * 16
    (tmp_path / "f" / "featurizer.json").write_text(json.dumps(cfg))
    with pytest.raises(AdaptspecError, match="do not match"):
        Featurizer.load(tmp_path / "f")
    with pytest.raises(AdaptspecError, match="no saved featurizer"):
        Featurizer.load(tmp_path)
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "featurizer.json").write_text('{"kind": "something else"}')
    (tmp_path / "g" / "featurizer.safetensors").write_bytes(b"")
    with pytest.raises(AdaptspecError, match="does not describe"):
        Featurizer.load(tmp_path / "g")


def test_bad_input_is_rejected_clearly():
    X = data()
    f = Featurizer.fit(X, dim=3)
    with pytest.raises(AdaptspecError, match="12"):
        f(np.ones(11))
    with pytest.raises(AdaptspecError, match="NaN"):
        f(np.r_[np.nan, np.ones(11)])
    with pytest.raises(AdaptspecError, match="1-D"):
        f(X[:2])
    with pytest.raises(AdaptspecError, match="n >= 2"):
        Featurizer.fit(X[:1])
    with pytest.raises(AdaptspecError, match="row 3"):
        Featurizer.fit(np.where(np.arange(300)[:, None] == 3, np.inf, X))
    with pytest.raises(AdaptspecError, match="kind"):
        Featurizer.fit(X, kind="umap")
    with pytest.raises(AdaptspecError, match="keep index 12"):
        Featurizer.fit(X, keep=[12])
    with pytest.raises(AdaptspecError, match="only applies to a pca"):
        Featurizer("standardize", np.zeros(3), np.ones(3), keep=[0])
    with pytest.raises(AdaptspecError, match="positive"):
        Featurizer("standardize", np.zeros(3), np.zeros(3))


def full_information_traces(spec: FakeSpeculator, arms, n=80):
    """Every arm run on every prompt of the fake speculator: a real (if toy) trace set."""
    prompts = [[i % 11 + 1, i % 5 + 30, i] for i in range(n)]
    feats, tau, new, ms, rounds = [], [], [], [], []
    for p in prompts:
        pre = spec.prefill(p)
        feats.append(pre.features)
        outs = [spec.decode(pre, b, 24) for b in arms]
        tau.append([o.mean_tau for o in outs])
        new.append([o.new_tokens for o in outs])
        ms.append([1000 * o.decode_s for o in outs])
        rounds.append([len(o.rounds) for o in outs])
    ts = TraceSet.from_arrays(
        [f"r{i}" for i in range(n)],
        ["toy"] * n,
        arms,
        np.array(tau),
        features=np.array(feats),
        new_tokens=np.array(new),
        decode_ms=np.array(ms),
        rounds=np.array(rounds, dtype=np.int64),
    )
    return prompts, ts


def test_replay_and_the_controller_see_identical_contexts(tmp_path):
    from adaptspec.policies import NeuralLinear, train_head

    arms = (1, 2, 4, 8, 16)
    spec = FakeSpeculator(dim=8)
    prompts, ts = full_information_traces(spec, arms)
    f = Featurizer.fit_traces(ts, dim=4, keep=[0])
    tf = f.transform_traces(ts)
    assert tf.features.shape == (80, 5) and tf.meta["featurizer"]["fingerprint"] == f.fingerprint
    tf.write(tmp_path / "traces")  # through Parquet and back: the contexts do not change
    again = TraceSet.read(tmp_path / "traces")
    online = np.stack([f(spec.prefill(p).features) for p in prompts])
    assert np.array_equal(again.features.astype(np.float64), online)

    with torch_threads(1):
        head = train_head(
            tf.features, trace_rewards(tf, "throughput"), arms, hidden=(8,), max_epochs=30, seed=0
        )
    head.save(tmp_path / "head")
    f.save(tmp_path / "head")  # saved with the head: the controller picks it up
    replay_policy = NeuralLinear(head)
    want = [replay_policy.decide(x).block_size for x in again.features]
    with AdaptiveController(spec, f"neural-linear:head={tmp_path / 'head'}") as c:
        assert c.featurizer == f and c.arms == arms
        got = [c.decide(spec.prefill(p).features).block_size for p in prompts]
    assert got == want and len(set(got)) > 1
    # a checkpoint remembers the featurizer; another one cannot resume from it
    with AdaptiveController(
        spec, f"neural-linear:head={tmp_path / 'head'}", checkpoint_dir=tmp_path / "ck"
    ) as c:
        c.generate(prompts[0], max_new_tokens=8)
    other = Featurizer.fit_traces(ts, dim=3)
    with pytest.raises(AdaptspecError, match="featurizer"):
        AdaptiveController(
            spec,
            f"neural-linear:head={tmp_path / 'head'}",
            checkpoint_dir=tmp_path / "ck",
            featurizer=Featurizer.fit_traces(ts, dim=4, keep=[1]),
        )
    with pytest.raises(AdaptspecError, match="expects 5"):
        AdaptiveController(spec, f"neural-linear:head={tmp_path / 'head'}", featurizer=other)


def test_train_head_saves_a_featurizer_and_simulate_applies_it(tmp_path, capsys):
    """Wide features: the head trains on the featurizer's contexts, replay maps the same way."""
    import json as _json

    from adaptspec.cli import main
    from adaptspec.policies.featurizer import Featurizer
    from adaptspec.simulators.synthetic import generate

    ts = generate("cpu-small", n_requests=240, seed=3, dim=96)
    ts.meta["features"] = "last:-1,len"
    ts.write(tmp_path / "wide")
    assert (
        main(
            [
                "train-head",
                str(tmp_path / "wide"),
                "--out",
                str(tmp_path / "head"),
                "--epochs",
                "30",
                "--json",
            ]
        )
        == 0
    )
    out = _json.loads(capsys.readouterr().out)
    f = Featurizer.load(tmp_path / "head")
    assert (f.in_dim, f.out_dim) == (96, 33) and out["hidden"] == [64, 32]
    spec = f"neural-linear:head={tmp_path / 'head'}"
    assert main(["simulate", str(tmp_path / "wide"), "--policy", spec, "--json", "--no-progress"]) == 0
    rep = _json.loads(capsys.readouterr().out)
    assert rep["policies"][0]["pct_oracle"] > 50
    # without the featurizer the head cannot read the raw 96 features
    assert (
        main(["simulate", str(tmp_path / "wide"), "--policy", spec, "--featurizer", "none", "--no-progress"])
        == 2
    )
    assert "96" in capsys.readouterr().err
