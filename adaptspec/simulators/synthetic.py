"""Synthetic trace sets with a known ground truth.

Requests come from domains. A domain is a cluster in feature space and a curve of
acceptance probabilities over draft positions: the k-th drafted token (k = 1..B-1) is
accepted, given the ones before it were, with probability::

    q_k = sigmoid(logit(accept) - decay * (k - 1) + z + e - overshoot * max(0, B - train_block))

``z`` is the request's own skill (normal, per request; one direction of its feature vector
carries it, so a contextual policy can see it), ``e`` per-round noise, and the last term the
drafter's trouble with blocks larger than it was trained on. A round commits the accepted
prefix plus the bonus token (tau = 1..B); rounds run until the request's new tokens are
committed; each round's draft and verify times come from a latency profile, with noise.
The expected tau of every (request, block size) is stored as ``expected_tau`` in
``outcomes.parquet`` and the skill as ``skill`` in ``requests.parquet``: the ground truth.

Scenarios: ``cpu-small`` (this project's CPU target: tau 1.2-3.5, no speculation or a small
block wins for prose, larger blocks for math) and ``dflash-gpu`` (DFlash-like: tau ~7-8 at
B=16 on math, ~4.3 on chat, H100 latencies). Deterministic under a seed.

>>> ts = generate("cpu-small", n_requests=20, seed=1, per_round=False)
>>> ts.n_requests, ts.arms[:3], ts.features.shape
(20, (1, 2, 4), (20, 32))
>>> bool(np.all(ts.tau_matrix()[:, 0] == 1.0))
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from ..costs.latency import LatencyProfile, get_profile
from ..errors import AdaptspecError
from ..traces import SCHEMA_VERSION, TraceSet

ARMS = (1, 2, 4, 6, 8, 10, 12, 16, 20, 24)


@dataclass(frozen=True)
class Domain:
    """One kind of request: acceptance curve, lengths, share of traffic."""

    name: str
    weight: float
    accept: float  # acceptance probability of the first drafted token (median request)
    decay: float  # logit drop per further draft position
    new_tokens: tuple[int, int] = (64, 160)
    prompt_tokens: tuple[int, int] = (40, 400)


@dataclass(frozen=True)
class Scenario:
    """A full synthetic set-up: domains, arms, drafter, latency profile, noise levels."""

    name: str
    domains: tuple[Domain, ...]
    latency: str
    arms: tuple[int, ...] = ARMS
    train_block: int = 16
    overshoot: float = 0.15
    skill_sd: float = 0.6  # per-request logit shift (what contextual policies can learn)
    round_sd: float = 0.5  # per-round logit noise
    timing_sd: float = 0.05  # per-pass multiplicative timing noise
    request_timing_sd: float = 0.03
    overhead_ms: float = 0.3  # host time per round outside the draft and verify passes
    dim: int = 32
    cluster_scale: float = 2.5  # distance of domain centres relative to within-domain noise
    description: str = ""


SCENARIOS: dict[str, Scenario] = {
    "cpu-small": Scenario(
        name="cpu-small",
        description="SmolLM2-135M-like target with a small DFlash-style drafter on 2 CPU cores (bf16): "
        "held-out tau at B=16 of ~3.3 math, ~1.8 code, ~1.3 prose/lists/chat (REFERENCES.md probe)",
        latency="cpu-smollm2-bf16",
        domains=(
            Domain("math", 0.25, accept=0.78, decay=0.25, new_tokens=(64, 160), prompt_tokens=(40, 300)),
            Domain("code", 0.20, accept=0.50, decay=0.45, new_tokens=(80, 192), prompt_tokens=(60, 500)),
            Domain("prose", 0.20, accept=0.25, decay=0.80, new_tokens=(96, 192), prompt_tokens=(30, 200)),
            Domain("lists", 0.15, accept=0.24, decay=0.80, new_tokens=(64, 128), prompt_tokens=(30, 150)),
            Domain("chat", 0.20, accept=0.21, decay=0.90, new_tokens=(48, 128), prompt_tokens=(20, 400)),
        ),
        overshoot=0.15,
        skill_sd=0.6,
        round_sd=0.5,
    ),
    "dflash-gpu": Scenario(
        name="dflash-gpu",
        description="Qwen3-8B-like target with a DFlash drafter trained at B=16 on an H100: expected tau at B=16 "
        "of ~7.8 math, ~6.5 gsm8k, ~6.6 code, ~4.3 chat (DFlash's figures); the gsm8k curve over "
        "block sizes is fitted to BlockPilot's per-block means (4: 3.3 ... 16: 6.5, 18: 6.3, 32: 4.2)",
        latency="h100-qwen3-8b",
        arms=(1, 4, 8, 12, 14, 16, 18, 20, 24, 32),
        domains=(
            Domain("math", 0.25, accept=0.921, decay=0.082, new_tokens=(192, 512), prompt_tokens=(60, 600)),
            Domain("gsm8k", 0.25, accept=0.885, decay=0.082, new_tokens=(128, 384), prompt_tokens=(60, 300)),
            Domain("code", 0.25, accept=0.891, decay=0.082, new_tokens=(128, 512), prompt_tokens=(80, 1200)),
            Domain("chat", 0.25, accept=0.806, decay=0.123, new_tokens=(128, 512), prompt_tokens=(40, 2000)),
        ),
        overshoot=0.053,
        skill_sd=0.5,
        round_sd=0.6,
        timing_sd=0.03,
        request_timing_sd=0.02,
        overhead_ms=0.05,
    ),
}


def get_scenario(name: str | Scenario) -> Scenario:
    if isinstance(name, Scenario):
        return name
    try:
        return SCENARIOS[name]
    except KeyError:
        raise AdaptspecError(f"unknown scenario {name!r}: choose one of {', '.join(SCENARIOS)}") from None


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def position_logits(sc: Scenario, domain: Domain, block_size: int) -> np.ndarray:
    """Logit of acceptance at draft positions 1..B-1 for a median request (no noise)."""
    k = np.arange(block_size - 1)
    pen = sc.overshoot * max(0, block_size - sc.train_block)
    return _logit(domain.accept) - domain.decay * k - pen


def expected_tau(logits: np.ndarray, round_sd: float = 0.0, nodes: int = 9) -> np.ndarray:
    """Expected tau of a round given per-position logits (last axis), averaging the per-round
    noise by Gauss-Hermite quadrature. An empty last axis (B=1) gives 1.

    >>> float(expected_tau(np.log(np.array([9.0, 9.0]))))  # q = 0.9 at both positions
    2.71
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.shape[-1] == 0:
        return np.ones(logits.shape[:-1])
    if round_sd <= 0:
        return 1.0 + np.cumprod(_sigmoid(logits), axis=-1).sum(axis=-1)
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    e = round_sd * x
    q = _sigmoid(logits[..., None, :] + e[:, None])
    return 1.0 + (np.cumprod(q, axis=-1).sum(axis=-1) * w).sum(axis=-1)


def _domain_weights(sc: Scenario, n: int, drift: bool) -> np.ndarray:
    """(n, D) domain probabilities per request position; drift moves traffic from the first
    half of the domains to the second over the logged order."""
    w = np.asarray([d.weight for d in sc.domains], dtype=np.float64)
    w = np.broadcast_to(w / w.sum(), (n, len(w))).copy()
    if drift and len(w[0]) > 1:
        sign = np.where(np.arange(len(sc.domains)) < len(sc.domains) / 2, 1.0, -1.0)
        t = np.linspace(1.0, -1.0, n)[:, None]
        w *= np.clip(1.0 + 0.9 * t * sign, 0.05, None)
        w /= w.sum(axis=1, keepdims=True)
    return w


def generate(
    scenario: str | Scenario = "cpu-small",
    n_requests: int = 300,
    *,
    seed: int = 0,
    arms: Sequence[int] | None = None,
    dim: int | None = None,
    drift: bool = False,
    per_round: bool = True,
    batch_size: int = 1,
    latency: str | LatencyProfile | None = None,
    progress: bool | None = None,
) -> TraceSet:
    """A synthetic trace set for ``scenario`` (see the module docstring).

    ``per_round`` keeps the per-round ``tau``, ``draft_ms`` and ``verify_ms`` lists (summary
    columns and ``decode_ms`` are always written). ``latency`` overrides the scenario's
    profile; ``batch_size`` is the batch the latencies are taken at.
    """
    sc = _checked_scenario(scenario, n_requests, arms, dim)
    prof = get_profile(latency or sc.latency)
    rng = np.random.default_rng(seed)
    req = _requests(sc, int(n_requests), drift, rng)
    X = _features(sc, req, seed)
    out = _Outcomes.empty(len(req.dom), len(sc.arms))
    with tqdm(
        total=out.mean_tau.size,
        desc=f"synth {sc.name}",
        unit="trace",
        leave=False,
        disable=(not progress) if progress is not None else None,
        delay=1.0,
    ) as bar:
        for j, B in enumerate(sc.arms):
            _arm_outcomes(sc, req, j, B, prof, batch_size, per_round, seed, out, bar)
    if np.any(req.need < 1):
        raise AdaptspecError("every request needs at least 2 new tokens")
    return _trace_set(sc, req, X, out, prof, seed, drift, batch_size, per_round)


def _checked_scenario(
    scenario: str | Scenario, n_requests: int, arms: Sequence[int] | None, dim: int | None
) -> Scenario:
    """The scenario with ``arms`` and ``dim`` in place of its own when given, refused when it
    cannot make ``n_requests`` requests."""
    sc = get_scenario(scenario)
    if dim is not None:
        sc = replace(sc, dim=int(dim))
    if arms is not None:
        sc = replace(sc, arms=tuple(sorted({int(a) for a in arms})))
    if n_requests < 1:
        raise AdaptspecError(f"n_requests must be >= 1, got {n_requests}")
    if sc.dim < 2:
        raise AdaptspecError(f"dim must be >= 2, got {sc.dim}")
    if not sc.arms or min(sc.arms) < 1:
        raise AdaptspecError(f"arms must be positive block sizes, got {list(sc.arms)}")
    return sc


@dataclass
class _Requests:
    """The requests drawn: domain index, skill, prompt and new tokens, and the machine's
    per-request timing factor."""

    dom: np.ndarray
    skill: np.ndarray
    prompt: np.ndarray
    new: np.ndarray
    machine: np.ndarray

    @property
    def need(self) -> np.ndarray:
        """Tokens the rounds commit (the first comes from prefill)."""
        return self.new - 1


def _requests(sc: Scenario, n: int, drift: bool, rng: np.random.Generator) -> _Requests:
    """``n`` requests: each one's domain (by the domain weights, drifting if asked), skill, prompt
    length (log-uniform in its domain's range), new tokens and timing factor."""
    D = len(sc.domains)
    w = _domain_weights(sc, n, drift)
    dom = (rng.random(n)[:, None] > np.cumsum(w, axis=1)).sum(axis=1).clip(0, D - 1)
    skill = rng.normal(0.0, sc.skill_sd, n)
    lo_p = np.array([d.prompt_tokens[0] for d in sc.domains])[dom]
    hi_p = np.array([d.prompt_tokens[1] for d in sc.domains])[dom]
    prompt = np.exp(rng.uniform(np.log(lo_p), np.log(hi_p))).round().astype(np.int64)
    lo_n = np.array([d.new_tokens[0] for d in sc.domains])[dom]
    hi_n = np.array([d.new_tokens[1] for d in sc.domains])[dom]
    new = rng.integers(lo_n, hi_n + 1).astype(np.int64)
    machine = np.exp(rng.normal(0.0, sc.request_timing_sd, len(dom)))
    return _Requests(dom, skill, prompt, new, machine)


def _features(sc: Scenario, req: _Requests, seed: int) -> np.ndarray:
    """The requests' feature vectors: their domain's cluster, one direction carrying the skill
    (standardised), the last feature the log prompt length."""
    n, D = len(req.dom), len(sc.domains)
    frng = np.random.default_rng([seed, 1])
    centres = frng.normal(0.0, 1.0, (D, sc.dim)) * sc.cluster_scale / math.sqrt(2.0)
    u = frng.normal(0.0, 1.0, sc.dim)
    u /= np.linalg.norm(u)
    X = centres[req.dom] + frng.normal(0.0, 1.0, (n, sc.dim))
    X += (req.skill / sc.skill_sd - X @ u)[:, None] * u  # the skill direction carries the skill, standardised
    X[:, -1] = np.log(req.prompt) - 5.0  # last feature: log prompt length
    return X


@dataclass
class _Outcomes:
    """Every (request, arm)'s outcome: mean and expected tau, rounds, decode time, and the
    per-round tau, draft and verify times."""

    mean_tau: np.ndarray
    exp_tau: np.ndarray
    rounds: np.ndarray
    decode_ms: np.ndarray
    tau_lists: list[list[np.ndarray]]
    d_lists: list[list[np.ndarray]]
    v_lists: list[list[np.ndarray]]

    @classmethod
    def empty(cls, n: int, K: int) -> _Outcomes:
        return cls(
            np.empty((n, K)),
            np.empty((n, K)),
            np.empty((n, K), dtype=np.int64),
            np.empty((n, K)),
            [[None] * K for _ in range(n)],  # type: ignore[list-item]
            [[None] * K for _ in range(n)],  # type: ignore[list-item]
            [[None] * K for _ in range(n)],  # type: ignore[list-item]
        )


def _arm_outcomes(
    sc: Scenario,
    req: _Requests,
    j: int,
    B: int,
    prof: LatencyProfile,
    batch_size: int,
    per_round: bool,
    seed: int,
    out: _Outcomes,
    bar: tqdm,
) -> None:
    """Block size ``B``'s (arm ``j``'s) outcomes for every request, decoded in chunks of requests
    (each arm's noise its own generator's, seeded by ``seed`` and ``B``)."""
    arng = np.random.default_rng([seed, 2, B])
    n, D = len(req.dom), len(sc.domains)
    base = np.stack([position_logits(sc, sc.domains[d], B) for d in range(D)])[req.dom] + req.skill[:, None]
    out.exp_tau[:, j] = expected_tau(base, sc.round_sd)
    R = int(max(req.need.max(), 1))
    chunk = max(1, int(4e6 // max(1, R * max(B - 1, 1))))
    for s in range(0, n, chunk):
        sl = slice(s, min(n, s + chunk))
        taus, done_before = _round_taus(sc, req, B, base[sl], R, sl, arng)
        live = taus > 0
        ctx = req.prompt[sl, None] + 1 + done_before
        vt = prof.verify_s(B, ctx, batch_size) * 1000.0
        dt = prof.draft_s(B, ctx, batch_size) * 1000.0
        jit = np.exp(arng.normal(0.0, sc.timing_sd, (2, *taus.shape))) * req.machine[sl, None]
        vt, dt = np.round(vt * jit[0], 2), np.round(dt * jit[1], 2)
        nr = live.sum(axis=1)
        out.rounds[sl, j] = nr
        out.mean_tau[sl, j] = req.need[sl] / np.maximum(nr, 1)
        out.decode_ms[sl, j] = np.where(live, vt + dt + sc.overhead_ms, 0.0).sum(axis=1)
        if per_round:
            for r in range(len(nr)):
                c = nr[r]
                out.tau_lists[sl.start + r][j] = taus[r, :c].astype(np.int32)
                out.d_lists[sl.start + r][j] = dt[r, :c].astype(np.float32)
                out.v_lists[sl.start + r][j] = vt[r, :c].astype(np.float32)
        bar.update(len(nr))


def _round_taus(
    sc: Scenario, req: _Requests, B: int, base: np.ndarray, R: int, sl: slice, arng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(taus, committed before)`` of ``R`` rounds at block size ``B`` for the requests in ``sl``:
    each round's accepted prefix plus the bonus token, the last one cut to the tokens left and
    the rounds past the end <= 0."""
    m = sl.stop - sl.start
    if B == 1:
        taus = np.ones((m, R), dtype=np.int64)
    else:
        noise = arng.normal(0.0, sc.round_sd, (m, R, 1))
        q = _sigmoid(base[:, None, :] + noise)
        acc = arng.random((m, R, B - 1)) < q
        taus = 1 + np.cumprod(acc, axis=2).sum(axis=2)
    done_before = np.cumsum(taus, axis=1) - taus
    left = req.need[sl, None] - done_before
    return np.minimum(taus, left), done_before


def _trace_set(
    sc: Scenario,
    req: _Requests,
    X: np.ndarray,
    out: _Outcomes,
    prof: LatencyProfile,
    seed: int,
    drift: bool,
    batch_size: int,
    per_round: bool,
) -> TraceSet:
    """The trace set of the requests and their outcomes, its meta naming the scenario and source."""
    n = len(req.dom)
    flat = (lambda L: [x for row in L for x in row]) if per_round else (lambda L: None)
    meta = {
        "schema_version": SCHEMA_VERSION,
        "source": {
            "kind": "synthetic",
            "scenario": sc.name,
            "seed": seed,
            "drift": drift,
            "batch_size": batch_size,
        },
        "scenario": sc.name,
        "description": sc.description,
        "target": "synthetic",
        "drafter": f"synthetic (trained at block size {sc.train_block})",
        "hardware": prof.name,
        "latency_profile": prof.name,
        "temperature": 0.0,
        "domains": {d.name: {"weight": d.weight, "accept": d.accept, "decay": d.decay} for d in sc.domains},
    }
    return TraceSet.from_arrays(
        [f"{sc.name}-{seed}-{i:06d}" for i in range(n)],
        [sc.domains[d].name for d in req.dom],
        sc.arms,
        out.mean_tau,
        prompt_tokens=req.prompt,
        features=X.astype(np.float32),
        new_tokens=req.new,
        rounds=out.rounds,
        decode_ms=np.round(out.decode_ms, 3),
        tau=flat(out.tau_lists),
        draft_ms=flat(out.d_lists),
        verify_ms=flat(out.v_lists),
        request_columns={"skill": req.skill.astype(np.float32)},
        outcome_columns={"expected_tau": out.exp_tau.ravel()},
        meta=meta,
    )
