"""Per-round replay on dense traces: schedules, the per-request oracle and the per-round oracle.

A dense trace (:mod:`adaptspec.traces.dense`) knows, at T = 0, how many drafts the target accepts at
every position for every block size, so any schedule can be walked through it round by round
(:func:`adaptspec.traces.dense.replay_rounds`) and timed with a latency profile. Three references put
a schedule's time in perspective, all on the same profile:

- **plain**: block size 1 throughout (plain decoding);
- **per-request oracle**: for every request the fastest of a set of candidate schedules (by
  default plain and every fixed block size), chosen knowing the outcome -- the ceiling of any
  per-request policy over those candidates;
- **per-round oracle**: a dynamic programme over positions that picks, clairvoyantly, each
  round's drafted block and how much of it to verify (:func:`per_round_oracle_s`) -- the
  ceiling of any schedule at all on this drafter and profile.

Aggregate speed is total tokens over total time (what a server sees), and speed-ups are
against plain decoding on the same profile.

>>> from adaptspec.traces.dense import DenseRequest
>>> from adaptspec.costs.latency import CostCurve, LatencyProfile
>>> flat = LatencyProfile("toy", draft=CostCurve((2.0,), (0.01,)), verify=CostCurve((1.0,), (0.04,)))
>>> accept = np.array([[1, 2, 3]] * 8, dtype=np.uint8)     # 3 drafts accepted of 3 at B = 4
>>> r = DenseRequest(np.arange(9), accept, np.ones((8, 3), np.float32), np.zeros((8, 3), np.float32),
...                  np.zeros(2, np.float32), 10, "length")
>>> round(schedule_time_s(r, 4, max_new_tokens=9, profile=flat), 3)   # 2 rounds of 4: 2 x 0.05
0.1
>>> round(per_round_oracle_s(r, 9, flat), 3), round(schedule_time_s(r, 1, 9, flat), 3)
(0.1, 0.32)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..costs.latency import LatencyProfile, get_profile
from ..errors import AdaptspecError
from ..traces.dense import DenseRequest, DenseTraceSet, replay_rounds


def schedule_time_s(
    request: DenseRequest, schedule: Any, max_new_tokens: int, profile: LatencyProfile, batch: int = 1
) -> float:
    """Seconds a schedule (block size, :class:`~adaptspec.speculator.RoundSchedule`) spends on
    one request's decode, on ``profile``."""
    return float(
        sum(r.draft_s + r.verify_s for r in replay_rounds(request, schedule, max_new_tokens, profile, batch))
    )


def per_round_oracle_s(
    request: DenseRequest, max_new_tokens: int, profile: LatencyProfile, batch: int = 1, prefix: bool = True
) -> float:
    """The least decode time of any per-round schedule on this request: a dynamic programme
    over committed-token counts ``m``. From ``m`` a round is a plain step, or drafts a block of
    ``b`` and verifies ``v`` of it; knowing the acceptance ``a(m, b)`` the best ``v`` is
    ``a + 1`` (``prefix=True``: a schedule may verify a prefix) or ``b`` (``prefix=False``).
    Blocks are shortened near ``max_new_tokens`` as the decoder shortens them."""
    n = len(request.tokens)
    largest = request.accept.shape[1] + 1
    best = np.zeros(n + largest + 1)  # best[m]: least seconds to go from m committed tokens to n
    for m in range(n - 1, 0, -1):
        ctx = request.prompt_tokens + m
        options = [float(profile.verify_s(1, ctx, batch)) + best[m + 1]]
        room = max_new_tokens - m
        for b in range(2, min(largest, room) + 1):
            j = min(int(request.accept[m - 1, b - 2]), n - 1 - m)
            if j == 0:
                continue  # a plain step is cheaper
            v = j + 1 if prefix else b
            options.append(
                float(profile.draft_s(b, ctx, batch) + profile.verify_s(v, ctx, batch)) + best[m + j + 1]
            )
        best[m] = min(options)
    return float(best[1])


@dataclass
class RoundsReport:
    """Per-request decode seconds of every schedule and reference, on one profile."""

    profile: str
    batch: int
    request_ids: list[str]
    domains: list[str]
    tokens: np.ndarray  # [N] new tokens per request (prefill's token included)
    seconds: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [N]

    def speedup(self, name: str, domain: str | None = None) -> float:
        """Aggregate tok/s of ``name`` over plain decoding's (optionally on one domain)."""
        rows = self._rows(domain)
        return float(self.seconds["plain"][rows].sum() / self.seconds[name][rows].sum())

    def best_fixed(self, domain: str | None = None) -> str:
        fixed = [k for k in self.seconds if k.startswith("fixed:")]
        return max(fixed, key=lambda k: self.speedup(k, domain))

    def headroom_captured(self, name: str, domain: str | None = None) -> float:
        """Share of the per-round oracle's gain over the best fixed block size that ``name`` gets."""
        base = self.speedup(self.best_fixed(domain), domain)
        top = self.speedup("per-round oracle", domain)
        return float((self.speedup(name, domain) - base) / (top - base)) if top > base else float("nan")

    def domain_names(self) -> list[str]:
        return sorted(set(self.domains))

    def table(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """One row per schedule: speed-up overall and per domain."""
        names = list(names or self.seconds)
        doms = self.domain_names()
        return [
            {"schedule": k, "all": self.speedup(k), **{d: self.speedup(k, d) for d in doms}} for k in names
        ]

    def _rows(self, domain: str | None) -> np.ndarray:
        if domain is None:
            return np.ones(len(self.domains), dtype=bool)
        rows = np.asarray([d == domain for d in self.domains])
        if not rows.any():
            raise AdaptspecError(f"no request of domain {domain!r}; have {', '.join(self.domain_names())}")
        return rows


def evaluate_rounds(
    dense: DenseTraceSet | Iterable[tuple[str, str, DenseRequest]],
    schedules: Mapping[str, Any],
    profile: str | LatencyProfile = "cpu-smollm2-fast",
    *,
    fixed: Sequence[int] | None = None,
    batch: int = 1,
    max_new_tokens: int | None = None,
    choose: Mapping[str, Callable[[str, DenseRequest], Any]] | None = None,
) -> RoundsReport:
    """Time every schedule, every fixed block size in ``fixed`` (default all), plain decoding and
    both oracles on each request of a dense set.

    ``schedules`` maps names to a block size or a schedule used on every request; ``choose``
    maps names to functions ``(request_id, request) -> schedule`` for per-request policies (a
    head's choice, say). The per-request oracle picks among plain and the fixed sizes.
    """
    profile = get_profile(profile)
    if isinstance(dense, DenseTraceSet):
        max_new_tokens = max_new_tokens or dense.max_new_tokens
        items = list(dense.requests())
    else:
        items = list(dense)
    if not items:
        raise AdaptspecError("no dense requests to evaluate")
    if max_new_tokens is None:
        raise AdaptspecError("max_new_tokens is needed when the requests do not come from a DenseTraceSet")
    largest = items[0][2].accept.shape[1] + 1
    fixed = sorted(set(fixed or range(2, largest + 1)) - {1})
    names = ["plain", *[f"fixed:{b}" for b in fixed], *schedules, *(choose or {})]
    secs = {k: np.zeros(len(items)) for k in names + ["per-request oracle", "per-round oracle"]}
    for i, (rid, _, req) in enumerate(items):
        for b in [1, *fixed]:
            secs["plain" if b == 1 else f"fixed:{b}"][i] = schedule_time_s(
                req, b, max_new_tokens, profile, batch
            )
        for k, s in schedules.items():
            secs[k][i] = schedule_time_s(req, s, max_new_tokens, profile, batch)
        for k, fn in (choose or {}).items():
            secs[k][i] = schedule_time_s(req, fn(rid, req), max_new_tokens, profile, batch)
        secs["per-request oracle"][i] = min(secs[k][i] for k in ["plain", *[f"fixed:{b}" for b in fixed]])
        secs["per-round oracle"][i] = per_round_oracle_s(req, max_new_tokens, profile, batch)
    return RoundsReport(
        profile.name,
        batch,
        [r for r, _, _ in items],
        [d for _, d, _ in items],
        np.asarray([len(r.tokens) for _, _, r in items]),
        secs,
    )
