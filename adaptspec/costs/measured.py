"""What a round costs on this machine, learnt from the rounds a decoder reports.

Counterfactual rewards (:mod:`adaptspec.reward.counterfactual`) need the relative cost of verifying
and drafting each block size: a shorter block's rounds are cheaper on a CPU, about as dear on a
GPU. A controller given no latency profile used to borrow the bundled pair's CPU profile for that,
which on a GPU prices a shorter block too cheap and a longer one too dear. :class:`MeasuredCosts`
learns the curves instead from the times every :class:`~adaptspec.speculator.Round` carries
(``draft_s``, ``verify_s``):

- a round timed alone (``rows == 1``) with a positive verify time is kept (the last ``window``);
  a round of a batched pass is not (its time holds the other rows' work);
- once ``min_rounds`` rounds of at least two verified sizes are in, the verify curve is a
  least-squares fit through them (:func:`~adaptspec.costs.latency.fit_curve`, never decreasing),
  its end pieces continued as straight lines outside the sizes measured (a pass costs a fixed
  part and a part per token); the drafted sizes likewise for the draft curve (with one drafted
  size, or none, the prior's draft curve scaled to what was measured).

Until then :meth:`profile` is the prior, and :attr:`measured` is false: a caller pricing other
block sizes from one size's rounds has nothing to price them with (the controller then learns the
arm that ran alone). Context is not modelled (the curves price every round at the prior's
reference context): only the relative cost of block sizes matters to the prices, which are scaled
to the measured time of what ran.

>>> from adaptspec.speculator import Outcome, Round
>>> from adaptspec.costs.latency import get_profile
>>> m = MeasuredCosts(get_profile("cpu-smollm2-fast"), min_rounds=2)
>>> flat = lambda b: 0.020 + 0.0001 * b  # a GPU-like verify: about as dear at every size
>>> for b in (4, 16):
...     _ = m.observe(Outcome([1] * 5, [Round(b, 1, 0.002, flat(b))] * 4, decode_s=0.1))
>>> p, cpu = m.profile(), m.prior
>>> round(float(p.verify_s(16) / p.verify_s(4)), 4)      # this machine's: (0.020 + 0.0016) / (0.020 + 0.0004)
1.0588
>>> round(float(cpu.verify_s(16) / cpu.verify_s(4)), 2)  # the CPU profile's, for contrast
1.37
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

from .latency import CostCurve, LatencyProfile, fit_curve


class MeasuredCosts:
    """Draft and verify curves fitted to the rounds seen; ``prior`` until two block sizes have been timed."""

    def __init__(
        self, prior: LatencyProfile, *, min_rounds: int = 16, window: int = 2048, refit_every: int = 256
    ) -> None:
        import scipy.optimize  # noqa: F401 - fit_curve's solver: loaded now, not on a request's feedback path

        self.prior = prior
        self.min_rounds = int(min_rounds)
        self.refit_every = int(refit_every)
        self._verify: deque[tuple[int, float]] = deque(maxlen=int(window))
        self._draft: deque[tuple[int, float]] = deque(maxlen=int(window))
        self._lock = threading.Lock()
        self._profile = prior
        self._since = 0  # rounds kept since the last fit
        self._seen: dict[tuple[str, int], int] = {}  # rounds kept per (curve, size), up to min_rounds

    def observe(self, outcome: Any) -> int:
        """Keep the times of ``outcome``'s rounds that were timed alone (returns how many); fit
        again every ``refit_every`` rounds, and as soon as another size has ``min_rounds``."""
        with self._lock:
            new_size, kept = False, 0
            for r in outcome.rounds:
                if r.rows != 1 or not r.verify_s > 0:
                    continue
                self._verify.append((int(r.block_size), float(r.verify_s)))
                new_size |= self._count("verify", int(r.block_size))
                if r.draft_size > 1 and r.draft_s > 0:
                    self._draft.append((int(r.draft_size), float(r.draft_s)))
                    new_size |= self._count("draft", int(r.draft_size))
                self._since += 1
                kept += 1
            if new_size or (self._since >= self.refit_every and self._profile is not self.prior):
                self._profile = self._fit()
                self._since = 0
            return kept

    def _count(self, curve: str, size: int) -> bool:
        """Count one round of ``size``; whether that size has just reached ``min_rounds``."""
        n = self._seen.get((curve, size), 0)
        if n < self.min_rounds:
            self._seen[(curve, size)] = n + 1
        return n + 1 == self.min_rounds

    def profile(self) -> LatencyProfile:
        """The profile to price rounds with: the fit once there is enough, else the prior."""
        with self._lock:
            return self._profile

    @property
    def measured(self) -> bool:
        """Whether :meth:`profile` is fitted to this machine's rounds (not the prior)."""
        return self.profile() is not self.prior

    # -------------------------------------------------------------- fitting
    def _sizes(self, data: deque[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray]:
        """Every size with at least ``min_rounds`` measurements, and the mean of its times (a curve
        with a knot at every size measured passes through these means, as through the points)."""
        if not data:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        b = np.fromiter((x[0] for x in data), dtype=np.int64, count=len(data))
        s = np.fromiter((x[1] for x in data), dtype=np.float64, count=len(data))
        n = np.bincount(b)
        sizes = np.flatnonzero(n >= self.min_rounds)
        return sizes, np.bincount(b, weights=s)[sizes] / n[sizes]

    def _fit(self) -> LatencyProfile:
        sizes, means = self._sizes(self._verify)
        if sizes.size < 2:
            return self._profile
        ctx = self.prior.context_tokens
        verify = _extended(fit_curve(sizes, means), sizes)
        dsizes, dmeans = self._sizes(self._draft)
        if dsizes.size >= 2:
            draft = _extended(fit_curve(dsizes, dmeans), dsizes)
        else:  # the prior's draft curve, scaled as the verify curve moved from the prior (or to the one drafted size)
            at = float(sizes[0])
            scale = float(verify(at)) / float(self.prior.verify_s(at, ctx))
            if dsizes.size == 1:
                scale = float(dmeans[0]) / max(float(self.prior.draft(float(dsizes[0]), ctx)), 1e-12)
            draft = _scaled(self.prior.draft, scale, ctx)
        return LatencyProfile(
            "measured" if dsizes.size >= 2 else f"measured (draft: {self.prior.name}'s shape)",
            draft,
            verify,
            context_tokens=ctx,
            source=f"{len(self._verify)} rounds timed alone",
        )


def _extended(fit: CostCurve, sizes: np.ndarray) -> CostCurve:
    """``fit`` between the sizes measured, its end pieces' straight lines continued outside them
    (down to size 1, and past the largest), never below a microsecond."""
    k = np.asarray(fit.knots, dtype=np.float64)
    v = np.asarray(fit.values_s, dtype=np.float64)
    lo = float(sizes.min())
    first = (v[1] - v[0]) / (k[1] - k[0]) if k.size > 1 else 0.0
    knots = np.concatenate([[1.0], k]) if lo > 1 else k
    values = np.concatenate([[v[0] - first * (lo - 1.0)], v]) if lo > 1 else v
    values = np.maximum.accumulate(np.maximum(values, 1e-6))
    return CostCurve(tuple(float(x) for x in knots), tuple(float(x) for x in values), fit.tail_slope_s)


def _scaled(curve: CostCurve, scale: float, ctx: int) -> CostCurve:
    """``curve`` at context ``ctx`` times ``scale``, on sizes 1..64."""
    knots = np.arange(1.0, 65.0)
    values = np.maximum.accumulate(np.maximum(np.asarray(curve(knots, ctx), dtype=np.float64) * scale, 0.0))
    return CostCurve(tuple(float(k) for k in knots), tuple(float(v) for v in values))
