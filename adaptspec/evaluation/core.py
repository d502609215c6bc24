"""Building blocks of the evaluation: splits, contexts, heads, contenders, streams, runs, scores.

Everything here works on a :class:`~adaptspec.traces.TraceSet` through its public API (reward
matrices, features, domains), so a new trace set needs no code change. A *contender* is a
policy in an evaluation: a label and a builder ``(arms, seed) -> Policy`` (or a fixed
per-request choice, such as BlockPilot's released selections). A *run* streams a list of
request indices through every contender and records the arm each one chose; every figure of
the report is computed from those choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .._util.numbers import rounded
from ..analysis.statistics import mean_interval
from ..errors import AdaptspecError
from ..policies.base import Policy
from ..reward.functions import pct_of
from ..simulators.replay import feedback_of, run_policy

#: features wider than this are reduced (PCA, fitted on the training split) before policies see them
MAX_RAW_DIM = 64
#: components kept by that reduction
PCA_DIM = 32


@dataclass
class Settings:
    """How much replay the sections do (the defaults make the published report).

    ``splits`` training/evaluation splits x ``orders`` stream orders = runs per figure;
    ``passes`` passes over the evaluation requests per stream.
    """

    splits: int = 3
    orders: int = 3
    passes: int = 10
    train_fraction: float = 0.5
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    gpu_profile: str = "h100-qwen3-8b"
    blockpilot_passes: int = 30
    drift_phase_steps: int = 1000
    drift_synthetic_requests: int = 2400
    coldstart_repeats: int = 3
    load_requests: int = 24  # section 8: requests per load level (4 per client at higher loads)
    progress: bool = True

    def __post_init__(self) -> None:
        for name in (
            "splits",
            "orders",
            "passes",
            "blockpilot_passes",
            "drift_phase_steps",
            "drift_synthetic_requests",
            "coldstart_repeats",
            "load_requests",
        ):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise AdaptspecError(f"{name} must be a positive integer, got {v!r}")
        if not 0.0 < self.train_fraction < 1.0:
            raise AdaptspecError(f"train fraction must be in (0, 1), got {self.train_fraction}")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise AdaptspecError(f"batch sizes must be positive, got {list(self.batch_sizes)}")

    @property
    def runs(self) -> int:
        return self.splits * self.orders


# ============================================================================ splits and contexts
def split_requests(domains: np.ndarray, train_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint ``(train, eval)`` request indices, stratified by domain, seeded.

    Every domain with at least two requests puts at least one in each part.

    >>> tr, ev = split_requests(np.array(list("aaaabbbb")), 0.5, seed=0)
    >>> sorted(tr.tolist() + ev.tolist()), len(tr), len(set(tr) & set(ev))
    ([0, 1, 2, 3, 4, 5, 6, 7], 4, 0)
    """
    if not 0.0 < train_fraction < 1.0:
        raise AdaptspecError(f"train fraction must be in (0, 1), got {train_fraction}")
    rng = np.random.default_rng([int(seed), 31])
    doms = np.asarray(domains).astype(str)
    train, evals = [], []
    for d in sorted(set(doms.tolist())):
        idx = rng.permutation(np.flatnonzero(doms == d))
        k = int(round(train_fraction * len(idx)))
        if len(idx) >= 2:
            k = min(max(k, 1), len(idx) - 1)
        train.append(idx[:k])
        evals.append(idx[k:])
    tr, ev = np.sort(np.concatenate(train)), np.sort(np.concatenate(evals))
    if len(tr) == 0 or len(ev) == 0:
        raise AdaptspecError(f"cannot split {len(doms)} requests into training and evaluation parts")
    return tr.astype(np.int64), ev.astype(np.int64)


@dataclass
class Contexts:
    """What contextual policies see per request, and how it was made from the stored features."""

    X: np.ndarray | None
    featurizer: Any = None
    description: str = "no features"


_CONTEXTS: dict[tuple[int, bytes], tuple[Any, Contexts]] = {}


def make_contexts(traces: Any, train_idx: np.ndarray) -> Contexts:
    """The trace set's features as policy contexts.

    Up to :data:`MAX_RAW_DIM` features are used as stored. Wider ones (the real decoder's
    1,153-d prefill representation) go through the product's featurizer, a PCA to
    :data:`PCA_DIM` whitened components fitted on the *training* requests only (plus the log
    prompt length when the feature spec ends with it), as the controller would use it.
    Results are cached per trace set object and training split (sections share splits).
    """
    key = (id(traces), np.asarray(train_idx, dtype=np.int64).tobytes())
    hit = _CONTEXTS.get(key)
    if hit is not None and hit[0] is traces:
        return hit[1]
    ctx = _make_contexts(traces, train_idx)
    _CONTEXTS[key] = (traces, ctx)
    return ctx


def _make_contexts(traces: Any, train_idx: np.ndarray) -> Contexts:
    X = traces.features
    if X is None:
        return Contexts(None)
    X = np.asarray(X, dtype=np.float64)
    if X.shape[1] <= MAX_RAW_DIM:
        return Contexts(X, None, f"{X.shape[1]} stored features")
    from ..policies.featurizer import Featurizer

    spec = str(traces.meta.get("features") or "")
    keep = [-1] if spec.split(",")[-1].strip() == "len" else []
    f = Featurizer.fit(X[train_idx], dim=PCA_DIM, keep=keep)
    extra = " + log prompt length" if keep else ""
    return Contexts(
        f.transform(X),
        f,
        f"{X.shape[1]} stored features -> PCA to {f.out_dim - len(keep)} "
        f"whitened components{extra}, fitted on the training split",
    )


@dataclass
class Heads:
    """The offline heads trained on one training split."""

    regression: Any
    classification: Any
    n_train: int


def train_heads(
    X: np.ndarray, R: np.ndarray, arms: Sequence[int], seed: int, classification: bool = True
) -> Heads:
    """A regression head (what NeuralLinear starts from) and a BlockPilot-style classifier."""
    from ..policies.offline_head import train_head

    reg = train_head(X, R, arms, mode="regression", seed=seed)
    cls = train_head(X, R, arms, mode="classification", seed=seed) if classification else None
    return Heads(reg, cls, len(X))


# ============================================================================ contenders
@dataclass(frozen=True)
class Contender:
    """A policy in an evaluation.

    ``build(arms, seed)`` makes a fresh policy per run; alternatively ``choices`` gives a fixed
    arm index per request (a selector whose decisions were published, not its model).
    ``kind`` is one of ``fixed``, ``context-free``, ``offline``, ``contextual``.
    """

    label: str
    kind: str
    build: Callable[[tuple[int, ...], int], Policy] | None = None
    choices: np.ndarray | None = None
    note: str = ""


def fixed_contenders(arms: Sequence[int]) -> list[Contender]:
    """One contender per fixed block size."""
    from ..policies.baselines import Fixed

    return [Contender(f"fixed:{a}", "fixed", (lambda ar, s, a=a: Fixed(a, arms=ar, seed=s))) for a in arms]


def spec_contender(label: str, spec: str, kind: str, note: str = "") -> Contender:
    """A contender built from a policy spec string (``make_policy``)."""
    from ..policies.spec import make_policy

    return Contender(label, kind, lambda ar, s: make_policy(spec, ar, seed=s), note=note)


def standard_lineup(heads: Heads | None, contextual: bool, *, discount: bool = False) -> list[Contender]:
    """The policies of the report: BanditSpec-style UCB, the heads (BlockPilot-style classifier and
    the regression head it is compared with), NeuralLinear warm-started (the default), LinUCB and
    SquareCB cold. ``discount`` adds the forgetting variants used in the drift section."""
    from ..policies.neural_linear import NeuralLinear
    from ..policies.offline_head import OfflineHead

    out = [
        spec_contender(
            "ucb-throughput",
            "ucb-throughput",
            "context-free",
            "BanditSpec-style: UCB over B on measured throughput, 8 round-robin warm-up rounds",
        )
    ]
    if discount:
        out.append(
            spec_contender(
                "ucb-throughput (window 300)",
                "ucb-throughput:window=300",
                "context-free",
                "the same, remembering only the last 300 requests",
            )
        )
    if heads is not None:
        if heads.classification is not None:
            out.append(
                Contender(
                    "head, classifier (BlockPilot-style)",
                    "offline",
                    lambda ar, s, h=heads.classification: OfflineHead(h, seed=s),
                    note="MLP from prefill features to the best B, trained offline, frozen",
                )
            )
        out.append(
            Contender(
                "head, regression (greedy)",
                "offline",
                lambda ar, s, h=heads.regression: OfflineHead(h, seed=s),
                note="MLP predicting every B's reward, frozen; what NeuralLinear starts from",
            )
        )
        out.append(
            Contender(
                "neural-linear (default)",
                "contextual",
                lambda ar, s, h=heads.regression: NeuralLinear(h, seed=s),
                note="Bayesian linear regression on the head's last layer, warm-started from the head",
            )
        )
        if discount:
            out.append(
                Contender(
                    "neural-linear (discount 0.998)",
                    "contextual",
                    lambda ar, s, h=heads.regression: NeuralLinear(h, discount=0.998, seed=s),
                )
            )
    if contextual:
        out.append(spec_contender("linucb (cold)", "linucb", "contextual", "LinUCB, no offline data"))
        if discount:
            out.append(spec_contender("linucb (cold, discount 0.999)", "linucb:discount=0.999", "contextual"))
        out.append(
            spec_contender(
                "squarecb (cold)", "squarecb", "contextual", "SquareCB, linear oracle, no offline data"
            )
        )
    return out


# ============================================================================ streams and runs
def shuffled_stream(pool: np.ndarray, n_steps: int, seed: int) -> np.ndarray:
    """``n_steps`` request indices: passes over ``pool``, each pass a fresh seeded permutation."""
    pool = np.asarray(pool, dtype=np.int64)
    if len(pool) == 0 or n_steps < 1:
        raise AdaptspecError("a stream needs at least one request and one step")
    rng = np.random.default_rng([int(seed), 17])
    passes = -(-int(n_steps) // len(pool))
    return np.concatenate([rng.permutation(pool) for _ in range(passes)])[:n_steps]


def run_contenders(
    contenders: Iterable[Contender],
    R: np.ndarray,
    X: np.ndarray | None,
    idx: np.ndarray,
    arms: tuple[int, ...],
    seed: int,
    bar: Any = None,
    feedback: Any = None,
    kinds: dict[str, str] | None = None,
) -> dict[str, np.ndarray]:
    """Arm index chosen at each step of ``idx`` by every contender (fresh policies seeded with ``seed``);
    ``feedback`` (:class:`~adaptspec.simulators.counterfactuals.Feedback`, :func:`contender_feedback`)
    feeds full-information ones. ``kinds``, when given, receives what each contender learnt from
    (a key of :data:`~adaptspec.simulators.replay.FEEDBACK_KINDS`)."""
    out: dict[str, np.ndarray] = {}
    for c in contenders:
        if c.choices is not None:
            out[c.label] = np.asarray(c.choices, dtype=np.int64)[idx]
            kind = "none"
        else:
            pol = c.build(arms, seed)
            out[c.label] = run_policy(pol, R, idx, X if pol.contextual else None, feedback=feedback)
            kind = feedback_of(pol, feedback)
        if kinds is not None:
            kinds[c.label] = kind
        if bar is not None:
            bar.update(len(idx))
    return out


def contender_feedback(
    contenders: Sequence[Contender],
    traces: Any,
    R: np.ndarray,
    reward: str,
    latency: Any = None,
    batch_size: int = 1,
) -> Any:
    """The counterfactual feedback the controller would give the full-feedback contenders (a
    :class:`~adaptspec.simulators.counterfactuals.Feedback` of ``traces`` and ``R``), or None when
    none of ``contenders`` learns from it or the trace set keeps no per-round taus."""
    from ..simulators.counterfactuals import replay_feedback

    arms = tuple(traces.arms)
    if not any(c.build is not None and feedback_of(c.build(arms, 0), True) == "full" for c in contenders):
        return None
    return replay_feedback(traces, R, reward, latency, batch_size)


class ProgressBar:
    """A progress bar (tqdm) whose total grows as work is planned."""

    def __init__(self, desc: str, enabled: bool, unit: str = "step") -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=0, desc=desc, unit=unit, unit_scale=True, leave=False, disable=not enabled, delay=0.5
        )

    def plan(self, n: int) -> None:
        self.bar.total += int(n)
        self.bar.refresh()

    def update(self, n: int) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


# ============================================================================ scores
@dataclass
class Scorer:
    """Scores chosen arms against a reward matrix: rewards ``R`` (n, K), tau (n, K) and the
    tokens and seconds behind aggregate throughput (None when unknown)."""

    R: np.ndarray
    tau: np.ndarray
    costs: tuple[np.ndarray, np.ndarray] | None = None

    def score(self, idx: np.ndarray, chosen: np.ndarray, ref: int | None = None) -> dict[str, float]:
        """Mean reward, mean tau, throughput, % of the per-request oracle and % gain over the
        fixed arm ``ref`` (default: the best fixed arm in hindsight on these requests)."""
        R = self.R[idx]
        if ref is None:
            ref = int(np.argmax(R.sum(axis=0)))
        r = R[np.arange(len(idx)), chosen]
        tp = float("nan")
        if self.costs is not None:
            tok, sec = self.costs
            tp = float(tok[idx, chosen].sum() / sec[idx, chosen].sum())
        return {
            "mean_reward": float(r.mean()),
            "mean_tau": float(self.tau[idx, chosen].mean()),
            "throughput": tp,
            "pct_oracle": float(pct_of(r.sum(), R.max(axis=1).sum())),
            "gain_pct": float(pct_of(r.sum(), R[:, ref].sum()) - 100.0),
        }

    def oracle_choice(self, idx: np.ndarray) -> np.ndarray:
        return np.argmax(self.R[idx], axis=1)

    def regret(self, idx: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        """Cumulative regret against the per-request oracle after each step."""
        R = self.R[idx]
        return np.cumsum(R.max(axis=1) - R[np.arange(len(idx)), chosen])


def ci95(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval; the interval collapses to the mean with one value or no spread."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    m = float(v.mean())
    lo, hi = mean_interval(v, 0.95) or (m, m)
    return m, lo, hi


@dataclass
class Tally:
    """Per-run scores of every contender, aggregated into means and 95% intervals."""

    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, label: str, scores: dict[str, float], **meta: Any) -> None:
        if label not in self.values:
            self.values[label] = {}
            self.order.append(label)
            self.meta[label] = dict(meta)
        for k, v in scores.items():
            self.values[label].setdefault(k, []).append(float(v))

    #: metrics whose per-run values are kept in summaries (for comparisons paired by run)
    PAIRED = ("pct_oracle", "gain_pct")

    def summary(self) -> list[dict[str, Any]]:
        """``[{"policy", **meta, metric: {"mean", "lo", "hi"[, "values"]}, "runs"}]`` in insertion order;
        per-run ``values`` for :attr:`PAIRED` metrics of non-fixed contenders."""
        rows = []
        for label in self.order:
            row: dict[str, Any] = {"policy": label, **self.meta[label]}
            for k, vs in self.values[label].items():
                m, lo, hi = ci95(vs)
                row[k] = {"mean": rounded(m, 5), "lo": rounded(lo, 5), "hi": rounded(hi, 5)}
                if k in self.PAIRED and self.meta[label].get("kind") != "fixed":
                    row[k]["values"] = [rounded(x, 5) for x in vs]
            row["runs"] = len(next(iter(self.values[label].values()), []))
            rows.append(row)
        return rows


def curve_points(T: int, n: int = 120) -> np.ndarray:
    """Up to ``n`` step numbers (1-based) spread over a stream of ``T`` steps, ending at ``T``."""
    return np.unique(np.linspace(1, T, min(T, n)).round().astype(np.int64))


# ============================================================================ provenance
def display_path(path: Any) -> str:
    """``path`` relative to the checkout this package lives in when it is inside it, else as given."""
    from pathlib import Path

    p = Path(path).resolve()
    root = Path(__file__).resolve().parents[2]
    try:
        return p.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def provenance(traces: Any) -> dict[str, Any]:
    """Where a trace set came from (its ``meta.json``), with a fingerprint of its contents.

    ``synthetic`` is True when the source says so (the bundled set is synthetic until real
    traces replace it); the report prints a warning then.
    """
    import hashlib
    import json

    meta = dict(traces.meta)
    src = meta.get("source")
    kind = src.get("kind") if isinstance(src, dict) else (str(src) if src is not None else None)
    h = hashlib.sha256()
    h.update("\n".join(str(x) for x in traces.request_ids).encode())
    h.update(np.ascontiguousarray(traces.tau_matrix()).tobytes())
    return {
        "path": None if traces.path is None else display_path(traces.path),
        "source": json.loads(json.dumps(src, default=str)) if src is not None else None,
        "source_kind": kind,
        "synthetic": kind == "synthetic" or str(meta.get("target", "")).startswith("synthetic"),
        "target": meta.get("target"),
        "drafter": meta.get("drafter"),
        "hardware": meta.get("hardware"),
        "temperature": meta.get("temperature"),
        "requests": int(traces.n_requests),
        "arms": [int(a) for a in traces.arms],
        "domains": {
            str(k): int(v) for k, v in zip(*np.unique(traces.domains.astype(str), return_counts=True))
        },
        "features": None if traces.features is None else int(traces.features.shape[1]),
        "timings": bool(traces.has_timings),
        "fingerprint": h.hexdigest()[:16],
    }
