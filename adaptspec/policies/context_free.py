"""Shared parts of the context-free bandits (epsilon-greedy, UCB, Thompson sampling, EXP3).

All four keep per-arm statistics in numpy arrays (:class:`ArmStats`) that can forget, for
drift, in one of two ways:

- ``discount=gamma`` (0 < gamma < 1): every update first multiplies every arm's weighted
  count, sum and sum of squares by gamma (global time, as in discounted UCB, Garivier &
  Moulines 2011), so an observation ``s`` updates old weighs ``gamma ** s``; an arm that is not
  played sees its effective count shrink and its uncertainty grow, so it gets re-explored.
- ``window=W``: only the last W updates (over all arms) count; older ones are subtracted.

Rewards can be on any scale (tokens/s, tau, ...). UCB scales its bonus by the running
standard deviation of all rewards seen; Thompson sampling estimates the noise from the data;
EXP3 rescales rewards to [0, 1] online (see :class:`EXP3`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError
from .base import Policy


def check_forgetting(discount: float | None, window: int | None) -> tuple[float | None, int | None]:
    if discount is not None and window is not None:
        raise AdaptspecError("use either discount or window, not both")
    if discount is not None:
        discount = float(discount)
        if not 0.0 < discount <= 1.0:
            raise AdaptspecError(f"discount must be in (0, 1], got {discount}")
        if discount == 1.0:
            discount = None
    if window is not None:
        if int(window) != window or window < 1:
            raise AdaptspecError(f"window must be a positive integer, got {window}")
        window = int(window)
    return discount, window


class ArmStats:
    """Per-arm weighted count, sum and sum of squares of rewards, with optional forgetting.

    ``n``, ``s`` and ``ss`` are float arrays of length K (weighted by the discount, or
    restricted to the window); ``pulls`` counts every update ever made per arm, unweighted.

    >>> st = ArmStats(3, window=2)
    >>> for arm, r in [(0, 1.0), (1, 2.0), (1, 4.0)]:
    ...     st.add(arm, r)
    >>> st.n.tolist(), st.mean().tolist()[1], st.pulls.tolist()
    ([0.0, 2.0, 0.0], 3.0, [1, 2, 0])
    """

    def __init__(self, k: int, discount: float | None = None, window: int | None = None) -> None:
        self.k = int(k)
        self.discount, self.window = check_forgetting(discount, window)
        self.clear()

    def clear(self) -> None:
        k = self.k
        self.n = np.zeros(k)
        self.s = np.zeros(k)
        self.ss = np.zeros(k)
        self.pulls = np.zeros(k, dtype=np.int64)
        if self.window is not None:
            self.buf_arm = np.full(self.window, -1, dtype=np.int64)
            self.buf_r = np.zeros(self.window)
            self.pos = 0
            self.fill = 0

    def add(self, arm: int, r: float) -> None:
        """Record reward ``r`` for arm index ``arm``."""
        if self.discount is not None:
            g = self.discount
            self.n *= g
            self.s *= g
            self.ss *= g
        elif self.window is not None:
            if self.fill == self.window:
                old_a = self.buf_arm[self.pos]
                old_r = self.buf_r[self.pos]
                self.n[old_a] -= 1.0
                self.s[old_a] -= old_r
                self.ss[old_a] -= old_r * old_r
            else:
                self.fill += 1
            self.buf_arm[self.pos] = arm
            self.buf_r[self.pos] = r
            self.pos = (self.pos + 1) % self.window
            if self.pos == 0:
                self._recompute()
                self.pulls[arm] += 1
                return
        self.n[arm] += 1.0
        self.s[arm] += r
        self.ss[arm] += r * r
        self.pulls[arm] += 1

    def add_many(self, arms: np.ndarray, rewards: np.ndarray) -> None:
        """Same as calling :meth:`add` for each pair in order."""
        if self.discount is None and self.window is None:
            self.n += np.bincount(arms, minlength=self.k)
            self.s += np.bincount(arms, weights=rewards, minlength=self.k)
            self.ss += np.bincount(arms, weights=rewards * rewards, minlength=self.k)
            self.pulls += np.bincount(arms, minlength=self.k)
        else:
            for a, r in zip(arms.tolist(), rewards.tolist()):
                self.add(a, r)

    def _recompute(self) -> None:
        """Recompute window sums from the buffer (bounds floating-point drift from subtraction)."""
        m = self.buf_arm >= 0
        a, r = self.buf_arm[m], self.buf_r[m]
        self.n = np.bincount(a, minlength=self.k).astype(np.float64)
        self.s = np.bincount(a, weights=r, minlength=self.k)
        self.ss = np.bincount(a, weights=r * r, minlength=self.k)

    def mean(self) -> np.ndarray:
        """Per-arm mean reward (nan for arms without data)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.n > 1e-12, self.s / np.maximum(self.n, 1e-300), np.nan)

    def state(self) -> dict[str, Any]:
        st = {"n": self.n, "s": self.s, "ss": self.ss, "pulls": self.pulls}
        if self.window is not None:
            st.update(buf_arm=self.buf_arm, buf_r=self.buf_r, pos=self.pos, fill=self.fill)
        return st

    def load(self, st: dict[str, Any]) -> None:
        arrays = {}
        for key in ("n", "s", "ss", "pulls"):
            a = np.array(st[key], dtype=np.int64 if key == "pulls" else np.float64)
            if a.shape != (self.k,):
                raise AdaptspecError(f"state array {key!r} has shape {a.shape}, expected ({self.k},)")
            arrays[key] = a
        if self.window is not None:
            ba = np.array(st["buf_arm"], dtype=np.int64)
            br = np.array(st["buf_r"], dtype=np.float64)
            if ba.shape != (self.window,) or br.shape != (self.window,):
                raise AdaptspecError(f"state window buffer does not match window={self.window}")
            pos, fill = int(st["pos"]), int(st["fill"])
        self.n, self.s, self.ss, self.pulls = arrays["n"], arrays["s"], arrays["ss"], arrays["pulls"]
        if self.window is not None:
            self.buf_arm, self.buf_r, self.pos, self.fill = ba, br, pos, fill


class RunningStats:
    """Running count, mean and M2 of every reward seen (Welford), plus min and max."""

    @staticmethod
    def new() -> np.ndarray:
        return np.array([0.0, 0.0, 0.0, np.inf, -np.inf])

    @staticmethod
    def add(v: np.ndarray, r: float) -> None:
        v[0] += 1.0
        d = r - v[1]
        v[1] += d / v[0]
        v[2] += d * (r - v[1])
        v[3] = min(v[3], r)
        v[4] = max(v[4], r)

    @staticmethod
    def std(v: np.ndarray) -> float:
        return math.sqrt(v[2] / (v[0] - 1.0)) if v[0] > 1.5 else 0.0


class ContextFreePolicy(Policy):
    """Shared parts of the context-free bandits: ArmStats with forgetting, running reward stats."""

    contextual = False
    infinite_ok = {"running": slice(3, 5)}  # min and max of no reward yet: +inf, -inf

    def __init__(
        self,
        arms: Sequence[int],
        seed: int | None = None,
        epsilon: float = 0.0,
        discount: float | None = None,
        window: int | None = None,
    ) -> None:
        self.discount, self.window = check_forgetting(discount, window)
        super().__init__(arms, seed=seed, epsilon=epsilon)

    def _reset(self) -> None:
        self.stats = ArmStats(len(self.arms), self.discount, self.window)
        self.running = RunningStats.new()

    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        RunningStats.add(self.running, reward)
        self.stats.add(arm, reward)

    def _update_batch(self, X: np.ndarray | None, idx: np.ndarray, rewards: np.ndarray) -> None:
        for r in rewards.tolist():
            RunningStats.add(self.running, r)
        self.stats.add_many(idx, rewards)

    def _state(self) -> dict[str, Any]:
        return {
            "stats": self.stats.state(),
            "running": self.running,
            "forgetting": {"discount": self.discount, "window": self.window},
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        forgetting = state.get("forgetting", {})
        if forgetting.get("discount") != self.discount or forgetting.get("window") != self.window:
            raise AdaptspecError(
                f"state was saved with discount={forgetting.get('discount')}, window="
                f"{forgetting.get('window')}; this policy has discount={self.discount}, window={self.window}"
            )
        running = np.array(state["running"], dtype=np.float64)
        if running.shape != (5,):
            raise AdaptspecError("state 'running' must have 5 values")
        self.stats.load(state["stats"])
        self.running = running

    def _choose_batch(self, X: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        # Without learning in between, a context-free policy's probabilities are the same for
        # every request of the batch (subclasses with per-decision state override this).
        probs = self._mix(self._probs(None))
        idx = self._draw_many(np.broadcast_to(probs, (n, len(probs))))
        return idx, probs[idx]

    def _unplayed(self) -> np.ndarray:
        """Arms without data (never played, or forgotten by the window)."""
        return self.stats.n <= 1e-12

    def __repr__(self) -> str:
        extra = f", discount={self.discount}" if self.discount else ""
        extra += f", window={self.window}" if self.window else ""
        return f"{type(self).__name__}(arms={list(self.arms)}{extra})"
