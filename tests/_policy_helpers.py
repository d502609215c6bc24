"""Shared fixtures for the policy tests: a tiny synthetic stream with a known optimum, a small head,
and a catalogue of policies covering every family and variant."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

import numpy as np

ARMS = (2, 4, 8)
DIM = 4


def linear_stream(
    n: int, seed: int = 0, noise: float = 0.3, dim: int = DIM
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Contexts (n, dim), noisy rewards (n, K) and expected rewards (n, K) of a linear model whose
    best arm depends on the context (each arm wins in a third of the space)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim))
    theta = np.array([[2.0, 0.0, 0.5, 0.0], [-2.0, 0.0, 0.0, 0.5], [0.0, 2.0, 0.0, 0.0]])[:, :dim]
    bias = np.array([10.0, 10.0, 10.5])
    E = X @ theta.T + bias
    return X, E + rng.normal(0.0, noise, E.shape), E


def clustered_stream(n: int, seed: int = 0, noise: float = 0.3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three clusters in feature space, each with its own best arm (a non-linear map for the head)."""
    rng = np.random.default_rng(seed)
    centres = np.array([[3.0, 0, 0, 0], [0, 3.0, 0, 0], [0, 0, 3.0, 0]])
    c = rng.integers(0, 3, n)
    X = centres[c] + rng.normal(size=(n, DIM))
    table = np.array([[3.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 3.0]])
    E = table[c]
    return X, E + rng.normal(0.0, noise, E.shape), E


@lru_cache(maxsize=None)
def small_head(seed: int = 0):
    from adaptspec.policies.offline_head import train_head

    X, R, _ = linear_stream(600, seed=100 + seed)
    return train_head(X, R, ARMS, hidden=(16, 8), max_epochs=80, patience=10, seed=seed)


def river_regressor():
    from river import linear_model, preprocessing

    return preprocessing.StandardScaler() | linear_model.LinearRegression()


def catalogue() -> dict[str, Callable[[int | None], Any]]:
    """name -> factory(seed) of a fresh policy over ARMS (contexts of dimension DIM where contextual)."""
    from river import bandit

    from adaptspec.policies import (
        EXP3,
        UCB,
        EpsilonGreedy,
        LinTS,
        LinUCB,
        NeuralLinear,
        OfflineHead,
        RiverPolicy,
        SquareCB,
        Standardizer,
        ThompsonSampling,
    )

    st = Standardizer(np.zeros(DIM), np.ones(DIM), 10.0, 1.0)
    return {
        "eps-greedy": lambda s: EpsilonGreedy(ARMS, seed=s),
        "eps-greedy-window": lambda s: EpsilonGreedy(ARMS, window=15, decay=0.01, seed=s),
        "ucb": lambda s: UCB(ARMS, seed=s),
        "ucb-discount": lambda s: UCB(ARMS, discount=0.95, epsilon=0.1, seed=s),
        "ucb-throughput": lambda s: UCB.throughput(ARMS, seed=s),
        "ts": lambda s: ThompsonSampling(ARMS, mc_samples=64, seed=s),
        "ts-window": lambda s: ThompsonSampling(ARMS, window=20, mc_samples=64, seed=s),
        "exp3": lambda s: EXP3(ARMS, seed=s),
        "exp3-discount": lambda s: EXP3(ARMS, discount=0.98, reward_range=(5.0, 15.0), seed=s),
        "linucb": lambda s: LinUCB(ARMS, warmup=12, seed=s),
        "linucb-discount": lambda s: LinUCB(ARMS, warmup=12, discount=0.97, seed=s),
        "linucb-raw": lambda s: LinUCB(ARMS, standardize=False, epsilon=0.05, seed=s),
        "linucb-prior": lambda s: LinUCB(
            ARMS,
            standardize=st,
            prior_mean=np.zeros(DIM + 1),
            prior_precision=np.arange(1.0, DIM + 2),
            seed=s,
        ),
        "lints": lambda s: LinTS(ARMS, warmup=12, mc_samples=64, seed=s),
        "lints-discount": lambda s: LinTS(ARMS, warmup=12, discount=0.97, mc_samples=64, seed=s),
        "squarecb": lambda s: SquareCB(ARMS, warmup=12, seed=s),
        "head": lambda s: OfflineHead(small_head(), epsilon=0.1, seed=s),
        "neural-linear": lambda s: NeuralLinear(small_head(), seed=s),
        "neural-linear-ts": lambda s: NeuralLinear(small_head(), exploration="ts", mc_samples=64, seed=s),
        "neural-linear-discount": lambda s: NeuralLinear(small_head(), discount=0.97, prior_n=32.0, seed=s),
        "squarecb-head": lambda s: SquareCB(head=small_head(), seed=s),
        "river-regressor": lambda s: RiverPolicy(
            ARMS, regressor=river_regressor(), exploration="ucb", seed=s
        ),
        "river-eps": lambda s: RiverPolicy(ARMS, policy=bandit.EpsilonGreedy(epsilon=0.2), probe=16, seed=s),
        "river-linucb": lambda s: RiverPolicy(ARMS, policy=bandit.LinUCBDisjoint(), seed=s),
    }


def context_for(policy: Any, x: np.ndarray) -> np.ndarray | None:
    return x if policy.contextual else None


def run(policy: Any, X: np.ndarray, R: np.ndarray, start: int = 0, stop: int | None = None) -> list[tuple]:
    """decide + update over rows start..stop; returns (block size, propensity, probs) per step."""
    out = []
    for t in range(start, len(X) if stop is None else stop):
        ctx = context_for(policy, X[t])
        d = policy.decide(ctx)
        out.append((d.block_size, d.propensity, tuple(np.round(d.probs, 12)), d.version))
        policy.update(ctx, d.block_size, R[t, policy.arm_index(d.block_size)])
    return out


def same_state(a: Any, b: Any) -> bool:
    """Deep equality of state dicts (arrays compared exactly, NaN equal to NaN)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return (
            a.shape == b.shape
            and a.dtype.kind == b.dtype.kind
            and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
        )
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return a == b
