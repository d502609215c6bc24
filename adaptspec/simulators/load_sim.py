"""Replay under load: continuous batching of dense traces, with arrivals and a batched cost model.

At batch 1 the best block size hardly depends on the prompt; under load it moves, because the
cost of verifying ``B`` tokens per row grows with the rows in the pass. This simulator replays
dense traces (:mod:`adaptspec.traces.dense`: at T = 0, how many drafts are accepted at every
position and block size) through a model of a continuous-batching engine
(:mod:`adaptspec.batching`), so that any block-size rule (:mod:`adaptspec.load_rules`)
can be compared at any load on the same arrivals:

- **arrivals**: ``clients=N`` closed-loop clients (each sends its next request when the last one
  finishes), or ``rate=R`` Poisson arrivals per second, or a *day*: a list of
  ``(seconds, clients)`` phases whose client count changes during the run;
- **one round**: every active row's block size is chosen by the rule (1 = a plain step); one
  drafter pass over the rows that speculate and one target pass over all rows cost
  :func:`~adaptspec.reward.attribution.batch_round_s` on the latency profile; every row commits
  its accepted drafts plus one token, read from its dense trace;
- **joining and leaving**: a request is prefilled alone when a row is free (its own pass, the
  profile's cost of its prompt tokens), joins at the next round and leaves when its greedy
  output is complete; a new request's first token is the prefill's (time to first token);
- **the rule learns** from each row's tokens and *attributed* time
  (:mod:`adaptspec.reward.attribution`): the cost each row imposes on the batch.

Aggregate throughput is tokens over the run's duration (what a server sees); latency is per
request, from arrival to its last token.

>>> import numpy as np
>>> from adaptspec.costs.latency import CostCurve, LatencyProfile
>>> from adaptspec.load_rules import Fixed
>>> from adaptspec.traces.dense import DenseRequest
>>> flat = LatencyProfile("flat", draft=CostCurve((2,), (0.010,)), verify=CostCurve((1,), (0.040,)))
>>> accept = np.array([[1, 2, 3]] * 12, dtype=np.uint8)     # every draft right, up to B = 4
>>> req = DenseRequest(np.arange(13), accept, np.ones((12, 3), np.float32), np.zeros((12, 3), np.float32),
...                    np.zeros(2, np.float32), 10, "length")
>>> run = simulate(Fixed(4), [req], flat, clients=1, requests=1, prefill=False)
>>> run.rounds, round(run.duration_s, 3)      # 12 tokens after the first: 3 rounds of 4, 50 ms each
(3, 0.15)
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from ..costs.latency import CostCurve, LatencyProfile, RowsCostCurve
from ..errors import AdaptspecError
from ..load_rules.load import Load
from ..reward.attribution import ATTRIBUTIONS, attribute, batch_round_s
from ..traces.dense import DenseRequest


@dataclass
class Row:
    """One active request: its dense trace and where it is."""

    request: DenseRequest
    arrival_s: float
    client: int
    m: int = 1  # committed tokens, the prefill's included
    first_token_s: float = 0.0
    accepted: int = 0  # drafts accepted so far
    rejected: int = 0  # rounds that ended at a rejected draft (accepted / (accepted + rejected):
    #                    the per-draft acceptance under independent trials until a rejection)
    extras: dict = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.m >= len(self.request.tokens)

    @property
    def context(self) -> int:
        return self.request.prompt_tokens + self.m


@dataclass
class LoadRun:
    """One simulated run: aggregate throughput and per-request latencies."""

    rule: str
    tokens: int
    duration_s: float
    rounds: int
    latency_s: np.ndarray  # per finished request, arrival to last token
    ttft_s: np.ndarray  # per finished request, arrival to first token
    mean_rows: float  # time-weighted rows in flight
    block_sizes: dict[int, int]  # verified block size -> rows-rounds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.duration_s if self.duration_s > 0 else float("nan")

    def summary(self) -> dict[str, Any]:
        q = lambda a, p: float(np.percentile(a, p)) if len(a) else float("nan")  # noqa: E731
        return {
            "rule": self.rule,
            "tokens_per_s": self.tokens_per_s,
            "tokens": self.tokens,
            "duration_s": self.duration_s,
            "rounds": self.rounds,
            "requests": len(self.latency_s),
            "p50_s": q(self.latency_s, 50),
            "p95_s": q(self.latency_s, 95),
            "ttft_p50_s": q(self.ttft_s, 50),
            "mean_rows": self.mean_rows,
            "block_sizes": dict(sorted(self.block_sizes.items())),
        }


def simulate(
    rule: Any,
    pool: Sequence[DenseRequest],
    profile: LatencyProfile,
    *,
    clients: int | None = None,
    rate: float | None = None,
    day: Sequence[tuple[float, int]] | None = None,
    requests: int = 200,
    max_rows: int = 64,
    max_new_tokens: int = 128,
    attribution: str = "marginal",
    prefill: bool = True,
    seed: int = 0,
    model: LatencyProfile | None = None,
) -> LoadRun:
    """Serve ``requests`` requests drawn in order from ``pool`` (cycling) under one arrival
    process (exactly one of ``clients``, ``rate``, ``day``), choosing block sizes with ``rule``.

    ``day`` phases: ``(seconds, clients)``; no request is sent after the last phase ends (nor
    after ``requests``). ``prefill=False`` charges nothing for prefill (a request's first token
    is free), isolating decode rounds. ``model``: the cost model the engine believes, which
    splits each round's time among its rows (default ``profile``, the true cost; a wrong one
    shows what a rule learns when the engine's model of the cost is wrong).
    """
    if sum(x is not None for x in (clients, rate, day)) != 1:
        raise AdaptspecError("give exactly one of clients, rate or day")
    if not pool:
        raise AdaptspecError("no requests to replay")
    if attribution not in ATTRIBUTIONS:
        raise AdaptspecError(f"attribution must be one of {', '.join(ATTRIBUTIONS)}, got {attribution!r}")
    rng = np.random.default_rng(seed)
    arrivals = _Arrivals(clients, rate, day, requests, rng)
    t, rounds, tokens, rows_time = 0.0, 0, 0, 0.0
    active: list[Row] = []
    latency, ttft, blocks_seen = [], [], {}
    for client in arrivals.start():
        arrivals.push(0.0, client)
    while True:
        t = _admit(active, arrivals, pool, profile, t, max_rows, prefill)
        if not active:
            nxt = arrivals.next_time()
            if nxt is None:
                break
            t = max(t, nxt)
            continue
        load = Load(rows=len(active), queue=arrivals.waiting(t))
        chosen = rule.choose(active, load)
        blocks = [max(1, min(int(b), max_new_tokens - r.m)) for b, r in zip(chosen, active)]
        contexts = [r.context for r in active]
        round_s = batch_round_s(profile, blocks, contexts)
        shares = attribute(attribution, round_s, blocks, contexts, model or profile)
        t += round_s
        rounds += 1
        rows_time += len(active) * round_s
        taus = _advance(active, blocks, blocks_seen)
        tokens += sum(taus)
        rule.feedback(active, [int(a) for a in chosen], taus, [float(x) for x in shares], load)
        still = _retire(active, t, arrivals, latency, ttft)
        tokens += len(active) - len(still)  # each finished request's prefill token
        active = still
    return LoadRun(
        getattr(rule, "name", type(rule).__name__),
        tokens,
        t,
        rounds,
        np.asarray(latency),
        np.asarray(ttft),
        rows_time / t if t > 0 else 0.0,
        blocks_seen,
    )


def _admit(
    active: list[Row],
    arrivals: _Arrivals,
    pool: Sequence[DenseRequest],
    profile: LatencyProfile,
    t: float,
    max_rows: int,
    prefill: bool,
) -> float:
    """Admits whoever has arrived, while a row is free (each prefill runs alone); the time after."""
    while len(active) < max_rows and arrivals.ready(t):
        arrival_s, client, i = arrivals.pop()
        req = pool[i % len(pool)]
        if prefill:
            t += float(profile.verify(req.prompt_tokens, 0, 1))
        active.append(Row(req, arrival_s, client, first_token_s=t))
    return t


def _advance(active: list[Row], blocks: list[int], blocks_seen: dict[int, int]) -> list[int]:
    """One round: each row accepts what its dense trace accepted at its position for its block size;
    the tokens each row committed (accepted drafts + 1)."""
    taus = []
    for row, b in zip(active, blocks):
        n = len(row.request.tokens)
        j = min(int(row.request.accept[row.m - 1, b - 2]), n - 1 - row.m) if b > 1 else 0
        row.m += j + 1
        row.accepted += j
        row.rejected += int(j < b - 1)
        blocks_seen[b] = blocks_seen.get(b, 0) + 1
        taus.append(j + 1)
    return taus


def _retire(
    active: list[Row], t: float, arrivals: _Arrivals, latency: list[float], ttft: list[float]
) -> list[Row]:
    """Records the finished rows' latency and time to first token and frees their clients; the rows
    still decoding."""
    still: list[Row] = []
    for row in active:
        if row.done:
            latency.append(t - row.arrival_s)
            ttft.append(row.first_token_s - row.arrival_s)
            arrivals.finished(t, row.client)
        else:
            still.append(row)
    return still


def misjudged(profile: LatencyProfile, per_token: float) -> LatencyProfile:
    """``profile`` with the verify pass's cost per token scaled by ``per_token``: a pass over one
    token costs what it did, each further token in the pass ``per_token`` times as much (the cost
    model of an engine that misjudges how its pass grows; the draft pass is unchanged).

    >>> from adaptspec.costs.latency import get_profile
    >>> cpu = get_profile("cpu-smollm2-bf16")
    >>> wrong = misjudged(cpu, 2.0)
    >>> [round(1000 * float(p.verify_s(b)), 1) for p in (cpu, wrong) for b in (1, 16)]   # 40 -> 52 ms becomes 40 -> 64
    [40.0, 52.0, 40.0, 64.0]
    """
    if not (per_token > 0 and math.isfinite(per_token)):
        raise AdaptspecError(f"per-token cost factor must be > 0, got {per_token!r}")

    def scaled(v: CostCurve) -> CostCurve:
        base = v.values_s[0]
        return replace(
            v,
            values_s=tuple(base + per_token * (x - base) for x in v.values_s),
            tail_slope_s=per_token * v.tail_slope_s,
            per_pair_s=per_token * v.per_pair_s,
        )

    v = profile.verify
    verify = (
        RowsCostCurve(tuple((r, scaled(c)) for r, c in v.curves))
        if isinstance(v, RowsCostCurve)
        else scaled(v)
    )
    return replace(profile, name=f"{profile.name} (verify x{per_token:g} per token)", verify=verify)


def draft_acceptance(pool: Sequence[DenseRequest], block_size: int = 8) -> float:
    """Per-draft acceptance of ``pool`` at ``block_size``: accepted drafts over accepted drafts and
    rejections, at every position of every trace (what a goodput model's prior is set from).

    >>> req = DenseRequest(np.arange(4), np.array([[1, 2], [0, 0], [1, 1]], np.uint8), np.ones((3, 2), np.float32),
    ...                    np.zeros((3, 2), np.float32), np.zeros(2, np.float32), 5, "length")
    >>> draft_acceptance([req], block_size=3)     # 2 + 0 + 1 accepted, 2 rejections
    0.6
    """
    if not pool or not 2 <= block_size <= min(r.accept.shape[1] for r in pool) + 1:
        raise AdaptspecError(f"block size {block_size} is not in every trace (2 to the traces' largest)")
    acc = np.concatenate([r.accept[:, block_size - 2] for r in pool]).astype(np.float64)
    tried = acc.sum() + (acc < block_size - 1).sum()
    return float(acc.sum() / tried) if tried > 0 else 0.0


class _Arrivals:
    """When requests arrive: closed-loop clients, Poisson, or a day of changing client counts.

    Requests are numbered in the order they are sent (the ``i``-th takes ``pool[i % len]``), so
    every rule replays the same requests in the same order under the same arrival process.
    """

    def __init__(self, clients, rate, day, total, rng) -> None:
        self.total, self.sent = int(total), 0
        self.heap: list[tuple[float, int, int]] = []  # (arrival, order, client)
        self.phases = [(float(s), int(c)) for s, c in day] if day is not None else None
        self.clients, self.rate, self.rng = clients, rate, rng
        if clients is not None and clients < 1:
            raise AdaptspecError(f"clients must be >= 1, got {clients}")
        if rate is not None and not rate > 0:
            raise AdaptspecError(f"rate must be > 0, got {rate}")
        if self.phases is not None and (not self.phases or any(s <= 0 or c < 1 for s, c in self.phases)):
            raise AdaptspecError("day phases must be (seconds > 0, clients >= 1)")
        self.ends = np.cumsum([s for s, _ in self.phases]) if self.phases else None
        self.busy = 0  # clients with a request out (closed loop and day)

    def start(self) -> list[int]:
        if self.rate is not None:
            t = 0.0
            for _ in range(self.total):  # Poisson: every arrival known up front
                t += float(self.rng.exponential(1.0 / self.rate))
                self._send(t, -1)
            return []
        return list(range(self.clients if self.clients is not None else self.phases[0][1]))

    def target(self, t: float) -> int:
        """Clients wanted at time ``t`` (0 after the day ends)."""
        if self.phases is None:
            return self.clients or 0
        k = int(np.searchsorted(self.ends, t, side="right"))
        return self.phases[k][1] if k < len(self.phases) else 0

    def _send(self, t: float, client: int) -> None:
        if self.sent < self.total:
            heapq.heappush(self.heap, (t, self.sent, client))
            self.sent += 1
            if client >= 0:
                self.busy += 1

    def push(self, t: float, client: int) -> None:
        self._send(t, client)

    def finished(self, t: float, client: int) -> None:
        if client < 0:
            return
        self.busy -= 1
        self._top_up(t)

    def _top_up(self, t: float) -> None:
        want = self.target(t)
        while self.busy < want and self.sent < self.total:
            self._send(t, self.busy)

    def ready(self, t: float) -> bool:
        if self.phases is not None:
            self._top_up(t)
        return bool(self.heap) and self.heap[0][0] <= t

    def waiting(self, t: float) -> int:
        return sum(1 for a, _, _ in self.heap if a <= t)

    def pop(self) -> tuple[float, int, int]:
        a, i, client = heapq.heappop(self.heap)
        return a, client, i

    def next_time(self) -> float | None:
        """The next arrival, if any is on its way. (During a day a client always has a request
        out, so the engine idles only after the day.)"""
        return self.heap[0][0] if self.heap else None
