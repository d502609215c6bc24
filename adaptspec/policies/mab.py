"""Context-free bandits: epsilon-greedy, UCB (UCB1 and the BanditSpec-style throughput variant),
Gaussian Thompson sampling and EXP3.

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

__all__ = ["ArmStats", "EpsilonGreedy", "UCB", "ThompsonSampling", "EXP3", "greedy_probs", "ucb_throughput"]

#: default number of Monte-Carlo draws used to estimate Thompson sampling's propensities
MC_SAMPLES = 512


def greedy_probs(scores: np.ndarray) -> np.ndarray:
    """Uniform probability over the arms with the highest score (ties share the mass).

    >>> greedy_probs(np.array([1.0, 3.0, 3.0]))
    array([0. , 0.5, 0.5])
    """
    j = scores.argmax()
    m = scores == scores[j]
    c = np.count_nonzero(m)
    if c == 1:
        p = np.zeros(scores.shape[0])
        p[j] = 1.0
        return p
    return m / c


def _check_forgetting(discount: float | None, window: int | None) -> tuple[float | None, int | None]:
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
        self.discount, self.window = _check_forgetting(discount, window)
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


class _Running:
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


class _ContextFree(Policy):
    """Shared parts of the context-free bandits: ArmStats with forgetting, running reward stats."""

    contextual = False

    def __init__(
        self,
        arms: Sequence[int],
        seed: int | None = None,
        epsilon: float = 0.0,
        discount: float | None = None,
        window: int | None = None,
    ) -> None:
        self.discount, self.window = _check_forgetting(discount, window)
        super().__init__(arms, seed=seed, epsilon=epsilon)

    def _reset(self) -> None:
        self.stats = ArmStats(len(self.arms), self.discount, self.window)
        self.running = _Running.new()

    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        _Running.add(self.running, reward)
        self.stats.add(arm, reward)

    def _update_batch(self, X: np.ndarray | None, idx: np.ndarray, rewards: np.ndarray) -> None:
        for r in rewards.tolist():
            _Running.add(self.running, r)
        self.stats.add_many(idx, rewards)

    def _state(self) -> dict[str, Any]:
        return {"stats": self.stats.state(), "running": self.running,
                "forgetting": {"discount": self.discount, "window": self.window}}

    def _load_state(self, state: dict[str, Any]) -> None:
        forgetting = state.get("forgetting", {})
        if forgetting.get("discount") != self.discount or forgetting.get("window") != self.window:
            raise AdaptspecError(f"state was saved with discount={forgetting.get('discount')}, window="
                                 f"{forgetting.get('window')}; this policy has discount={self.discount}, window={self.window}")
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


class EpsilonGreedy(_ContextFree):
    """Play the arm with the best mean reward, explore uniformly with probability epsilon.

    Arms without data are played first (uniformly among them). ``epsilon`` decays as
    ``epsilon / (1 + decay * t)`` after ``t`` updates.

    Parameters
    ----------
    arms
        Block sizes.
    epsilon
        Exploration probability (the probabilities are ``(1 - eps) greedy + eps / K``).
    decay
        Decay rate of epsilon (0: constant).
    discount, window
        Forgetting for drift (see the module docstring).
    seed
        Seed of the generator.

    >>> pol = EpsilonGreedy([4, 8, 16], epsilon=0.1, seed=0)
    >>> for _ in range(300):
    ...     d = pol.decide()
    ...     pol.update(None, d.block_size, {4: 1.0, 8: 2.0, 16: 1.5}[d.block_size])
    >>> d = pol.decide()
    >>> d.probs.round(3).tolist()
    [0.033, 0.933, 0.033]
    """

    name = "eps-greedy"

    def __init__(
        self,
        arms: Sequence[int],
        epsilon: float = 0.1,
        decay: float = 0.0,
        discount: float | None = None,
        window: int | None = None,
        seed: int | None = None,
    ) -> None:
        if decay < 0 or not math.isfinite(decay):
            raise AdaptspecError(f"decay must be >= 0, got {decay}")
        self.decay = float(decay)
        super().__init__(arms, seed=seed, epsilon=epsilon, discount=discount, window=window)

    @property
    def current_epsilon(self) -> float:
        return self.epsilon / (1.0 + self.decay * self.version)

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        un = self._unplayed()
        return un / un.sum() if un.any() else greedy_probs(self.stats.mean())

    def _mix(self, probs: np.ndarray) -> np.ndarray:
        e = self.current_epsilon
        return (1.0 - e) * probs + e / len(self.arms) if e > 0 else probs


class UCB(_ContextFree):
    """UCB1 on rewards of any scale, with a round-robin warm-up.

    Score of arm ``a``: ``mean_a + c * scale * sqrt(2 ln N / n_a)`` where ``n_a`` is the
    arm's (discounted / windowed) count, ``N`` their sum, and ``scale`` the running standard
    deviation of all rewards seen (or a fixed number), so that ``c`` needs no re-tuning when
    rewards are tokens/s rather than values in [0, 1]. Ties share the probability.

    Before any arm has ``warmup`` observations, arms are played round-robin (arm order,
    skipping arms that already have enough). This choice is deterministic, so the
    propensity is 1 unless ``epsilon`` > 0 mixes in uniform exploration.

    :meth:`UCB.throughput` builds the BanditSpec-style variant (UCB over block sizes on the
    measured throughput of each request, ``tokens / decode seconds``, with 8 round-robin
    warm-up rounds), spec string ``ucb-throughput``.

    Parameters
    ----------
    arms
        Block sizes.
    c
        Exploration weight (default 0.25: the std-scaled UCB1 bonus with ``c = 1`` over-explored
        ten block sizes on the development scenario, see BENCHMARKS.md).
    scale
        ``"auto"`` (running std of rewards; 1 until two different rewards were seen) or a
        fixed reward scale.
    warmup
        Observations per arm collected round-robin before UCB scores are used.
    discount, window
        Forgetting for drift (discounted UCB / sliding-window UCB).
    epsilon
        Optional floor for off-policy evaluation.

    >>> pol = UCB([4, 8, 16], seed=0)
    >>> [pol.decide().block_size for _ in range(3)]  # warm-up is round-robin
    [4, 8, 16]
    >>> for b, r in [(4, 1.0), (8, 3.0), (16, 2.0)]:
    ...     pol.update(None, b, r)
    >>> d = pol.decide()
    >>> d.block_size, d.propensity
    (8, 1.0)
    """

    name = "ucb"

    def __init__(
        self,
        arms: Sequence[int],
        c: float = 0.25,
        scale: float | str = "auto",
        warmup: int = 1,
        discount: float | None = None,
        window: int | None = None,
        epsilon: float = 0.0,
        seed: int | None = None,
        label: str | None = None,
    ) -> None:
        if not c >= 0 or not math.isfinite(c):
            raise AdaptspecError(f"c must be >= 0, got {c}")
        if not (scale == "auto" or (isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale))):
            raise AdaptspecError(f"scale must be 'auto' or a positive number, got {scale!r}")
        if int(warmup) != warmup or warmup < 0:
            raise AdaptspecError(f"warmup must be a non-negative integer, got {warmup}")
        self.c = float(c)
        self.scale = scale
        self.warmup = int(warmup)
        self._label = label
        super().__init__(arms, seed=seed, epsilon=epsilon, discount=discount, window=window)

    @classmethod
    def throughput(cls, arms: Sequence[int], warmup_rounds: int = 8, **kwargs: Any) -> "UCB":
        """BanditSpec-style UCB: feed it measured throughput (tokens per decode second).

        ``warmup_rounds`` round-robin rounds in all (at least one per arm) come first, as in
        BanditSpec; the bonus is scaled by the running std of throughput.

        >>> UCB.throughput([2, 4, 8, 16]).warmup
        2
        """
        k = len(set(int(a) for a in arms))
        kwargs.setdefault("label", "ucb-throughput")
        return cls(arms, warmup=max(1, math.ceil(warmup_rounds / max(k, 1))), **kwargs)

    @property
    def label(self) -> str:
        return self._label or self.name

    def _reset(self) -> None:
        super()._reset()
        self._rr = 0

    def _warming(self) -> np.ndarray | None:
        """Arms still in warm-up (raw pulls below ``warmup``, or forgotten by the window)."""
        need = (self.stats.pulls < self.warmup) | self._unplayed()
        return need if need.any() else None

    def _scores(self) -> np.ndarray:
        n = self.stats.n
        scale = self.scale if self.scale != "auto" else (_Running.std(self.running) or 1.0)
        total = max(n.sum(), 1.0)
        bonus = self.c * scale * np.sqrt(2.0 * math.log(max(total, math.e)) / np.maximum(n, 1e-12))
        return self.stats.mean() + bonus

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        return greedy_probs(self._scores())

    def _choose(self, context: np.ndarray | None) -> tuple[int, np.ndarray]:
        need = self._warming()
        if need is None:
            probs = self._mix(self._probs(context))
            return self._draw(probs), probs
        k = len(self.arms)
        order = (self._rr + np.arange(k)) % k
        first = int(order[np.argmax(need[order])])
        self._rr = (first + 1) % k
        probs = np.zeros(k)
        probs[first] = 1.0
        probs = self._mix(probs)
        return self._draw(probs), probs

    def _choose_batch(self, X: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self._warming() is not None:
            return Policy._choose_batch(self, X, n)
        return super()._choose_batch(X, n)

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "rr": self._rr}

    def _load_state(self, state: dict[str, Any]) -> None:
        rr = int(state["rr"])
        super()._load_state(state)
        self._rr = rr


class ThompsonSampling(_ContextFree):
    """Gaussian Thompson sampling.

    Each arm's mean reward has the posterior ``N(m_a, sigma^2 / (n0 + n_a))`` with
    ``m_a = (n0 * prior_mean + sum_a) / (n0 + n_a)``; ``prior_mean`` defaults to the running
    mean of all rewards (empirical Bayes), ``sigma^2`` to the pooled within-arm variance
    (the variance of all rewards until two arms have two observations each).

    Propensity: probabilities are estimated from ``mc_samples`` joint posterior draws
    (vectorised), ``p_a = share of draws in which arm a is the best``, and the arm is drawn
    from those estimated probabilities. Picking one of the draws uniformly is the same as
    one Thompson draw, so the policy is exactly Thompson sampling, and the logged propensity
    is the exact probability with which the arm was chosen given the draws (never 0 for the
    chosen arm). The error of ``p_a`` as an estimate of the infinite-sample Thompson
    probability is at most ``sqrt(p (1 - p) / mc_samples)`` (about 0.022 at 512 draws).

    Parameters
    ----------
    arms
        Block sizes.
    prior_mean
        ``"auto"`` (running mean of rewards) or a number.
    prior_count
        ``n0``, the prior's weight in observations.
    noise
        ``"auto"`` or a fixed noise standard deviation.
    mc_samples
        Monte-Carlo draws per decision for the propensity.
    discount, window
        Forgetting for drift.

    >>> pol, noise = ThompsonSampling([4, 8], seed=1), np.random.default_rng(0)
    >>> for _ in range(200):
    ...     d = pol.decide()
    ...     pol.update(None, d.block_size, {4: 1.0, 8: 1.5}[d.block_size] + noise.normal(0, 0.3))
    >>> d = pol.decide()
    >>> d.block_size, bool(d.probs[1] > 0.9)
    (8, True)
    """

    name = "ts"

    def __init__(
        self,
        arms: Sequence[int],
        prior_mean: float | str = "auto",
        prior_count: float = 1.0,
        noise: float | str = "auto",
        mc_samples: int = MC_SAMPLES,
        discount: float | None = None,
        window: int | None = None,
        epsilon: float = 0.0,
        seed: int | None = None,
    ) -> None:
        if not (prior_mean == "auto" or (isinstance(prior_mean, (int, float)) and math.isfinite(prior_mean))):
            raise AdaptspecError(f"prior_mean must be 'auto' or a number, got {prior_mean!r}")
        if not (isinstance(prior_count, (int, float)) and prior_count > 0 and math.isfinite(prior_count)):
            raise AdaptspecError(f"prior_count must be > 0, got {prior_count!r}")
        if not (noise == "auto" or (isinstance(noise, (int, float)) and noise > 0 and math.isfinite(noise))):
            raise AdaptspecError(f"noise must be 'auto' or a positive number, got {noise!r}")
        if int(mc_samples) != mc_samples or mc_samples < 1:
            raise AdaptspecError(f"mc_samples must be a positive integer, got {mc_samples}")
        self.prior_mean = prior_mean
        self.prior_count = float(prior_count)
        self.noise = noise
        self.mc_samples = int(mc_samples)
        super().__init__(arms, seed=seed, epsilon=epsilon, discount=discount, window=window)

    def noise_std(self) -> float:
        """Current noise standard deviation."""
        if self.noise != "auto":
            return float(self.noise)
        st = self.stats
        with np.errstate(invalid="ignore", divide="ignore"):
            within = np.where(st.n > 1e-12, st.ss - st.s * st.s / np.maximum(st.n, 1e-300), 0.0)
        dof = float(np.sum(np.maximum(st.n - 1.0, 0.0)))
        if dof >= 2.0:
            return math.sqrt(max(float(within.sum()) / dof, 1e-12))
        return _Running.std(self.running) or 1.0

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of every arm's mean reward."""
        m0 = self.prior_mean if self.prior_mean != "auto" else (self.running[1] if self.running[0] > 0 else 0.0)
        n = self.stats.n + self.prior_count
        mean = (self.prior_count * m0 + self.stats.s) / n
        return mean, self.noise_std() / np.sqrt(n)

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        mean, sd = self.posterior()
        z = self.rng.standard_normal((self.mc_samples, len(self.arms)))
        best = np.argmax(mean + sd * z, axis=1)
        return np.bincount(best, minlength=len(self.arms)) / self.mc_samples

    def _choose_batch(self, X: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        mean, sd = self.posterior()
        k, m = len(self.arms), self.mc_samples
        idx = np.empty(n, dtype=np.int64)
        prop = np.empty(n)
        step = max(1, 262_144 // (m * k))
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            z = self.rng.standard_normal((hi - lo, m, k))
            best = np.argmax(mean + sd * z, axis=2)
            counts = (best[:, :, None] == np.arange(k)).sum(axis=1) / m
            probs = self._mix(counts)
            j = self._draw_many(probs)
            idx[lo:hi], prop[lo:hi] = j, probs[np.arange(hi - lo), j]
        return idx, prop


class EXP3(_ContextFree):
    """EXP3 (Auer et al. 2002) for adversarial rewards, with online reward rescaling.

    Probabilities: ``p = (1 - epsilon) softmax(eta * G) + epsilon / K`` where ``G_a`` is the
    (discounted / windowed) sum of importance-weighted rescaled rewards ``r' / p_a`` of arm
    ``a``; ``eta`` defaults to ``epsilon / K`` as in the original algorithm.

    Rescaling to [0, 1]: with ``reward_range=(lo, hi)`` rewards are clipped to that range and
    mapped linearly. Without it, each reward is mapped with the running minimum and maximum
    of all rewards seen so far, this one included (``r' = (r - min) / (max - min)``, 0.5
    while all rewards are equal). Earlier terms of ``G`` are not re-mapped when the range
    widens: the first few updates use a cruder scale, which only matters until the range
    has been seen.

    The importance weight uses the arm's probability at update time, which equals the
    probability it was chosen with when feedback arrives before the next decision (as in
    replay); with delayed feedback it is an approximation.

    >>> pol = EXP3([4, 8, 16], epsilon=0.2, seed=0)
    >>> for _ in range(500):
    ...     d = pol.decide()
    ...     pol.update(None, d.block_size, {4: 10.0, 8: 30.0, 16: 20.0}[d.block_size])
    >>> int(np.argmax(pol.decide().probs))
    1
    """

    name = "exp3"

    def __init__(
        self,
        arms: Sequence[int],
        epsilon: float = 0.1,
        eta: float | None = None,
        reward_range: tuple[float, float] | None = None,
        discount: float | None = None,
        window: int | None = None,
        seed: int | None = None,
    ) -> None:
        k = len(arms)
        if eta is None:
            eta = max(epsilon, 1e-3) / max(k, 1)
        if not (eta > 0 and math.isfinite(eta)):
            raise AdaptspecError(f"eta must be > 0, got {eta}")
        if reward_range is not None:
            lo, hi = (float(v) for v in reward_range)
            if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
                raise AdaptspecError(f"reward_range must be (lo, hi) with lo < hi, got {reward_range}")
            reward_range = (lo, hi)
        self.eta = float(eta)
        self.reward_range = reward_range
        super().__init__(arms, seed=seed, epsilon=epsilon, discount=discount, window=window)

    def rescale(self, reward: float) -> float:
        """Map a reward to [0, 1] (after it has been added to the running range)."""
        if self.reward_range is not None:
            lo, hi = self.reward_range
        else:
            lo, hi = self.running[3], self.running[4]
            if not hi > lo:
                return 0.5
        return min(1.0, max(0.0, (reward - lo) / (hi - lo)))

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        w = self.eta * self.stats.s
        w = np.exp(w - w.max())
        return w / w.sum()

    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        p = self._mix(self._probs(None))[arm]
        _Running.add(self.running, reward)
        self.stats.add(arm, self.rescale(reward) / p)

    def _update_batch(self, X: np.ndarray | None, idx: np.ndarray, rewards: np.ndarray) -> None:
        for a, r in zip(idx.tolist(), rewards.tolist()):
            self._update(None, a, r)


def ucb_throughput(arms: Sequence[int], seed: int | None = None, warmup_rounds: int = 8, c: float = 0.25,
                   discount: float | None = None, window: int | None = None, epsilon: float = 0.0) -> UCB:
    """Factory of the ``ucb-throughput`` spec: :meth:`UCB.throughput`."""
    return UCB.throughput(arms, warmup_rounds=warmup_rounds, c=c, discount=discount, window=window,
                          epsilon=epsilon, seed=seed)
