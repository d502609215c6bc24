"""Reward functions: what a policy is paid for choosing a block size.

Four rewards, the same for the simulator and the controller:

- ``throughput``: measured new tokens per second of decoding (prefill excluded);
- ``token_latency``: minus the measured milliseconds of decoding per new token (a cost, so
  negative; higher is better). Its mean over requests follows aggregate throughput (all tokens
  over all decode time, what a server delivers) for requests of similar length, where the mean
  of per-request ``throughput`` favours a block size that is very fast on a few requests;
- ``modelled``: the observed acceptance re-timed with a latency profile,
  ``mean_tau / (draft_s(B) + verify_s(B, context, batch))`` tokens per second: what the same
  acceptance would give on another machine or at another batch size;
- ``tau``: mean tokens committed per round (ignores cost: larger blocks never look worse).

The default (:data:`DEFAULT_REWARD`, for the controller, ``serve``, ``train-head`` and
``simulate`` on trace sets with timings) is ``token_latency``: a server is judged on aggregate
throughput, and on the template trace set per-request ``throughput`` made every learner favour
B = 8 (very fast on math, slower overall) where aggregate throughput is best at B = 4.

>>> from adaptspec.speculator import Outcome, Round
>>> out = Outcome(tokens=[1] * 9, rounds=[Round(8, 3, 0.01, 0.05), Round(8, 5, 0.01, 0.05)], decode_s=0.125)
>>> measured_throughput(out), mean_tau(out), round(measured_token_latency(out), 2)
(72.0, 4.0, -13.89)
>>> from adaptspec.costs.latency import get_profile
>>> p = get_profile("cpu-smollm2-bf16")
>>> round(float(modelled_throughput(4.0, 8, p)), 2)   # 4 tokens per 10 + 45 ms round
72.73
>>> modelled_throughput(np.array([1.0, 3.0]), np.array([1, 16]), p).round(1)
array([25. , 44.1])
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

import numpy as np

from ..costs.latency import LatencyProfile, get_profile
from ..errors import AdaptspecError
from ..speculator import REWARD_LIMIT, Outcome, tree_arm

#: The reward names accepted everywhere (``--reward``).
REWARDS = ("throughput", "token_latency", "modelled", "tau")

#: The reward learnt from by default where decode times are measured (see the module docstring).
DEFAULT_REWARD = "token_latency"

#: Units of each reward, for reports.
REWARD_UNITS = {
    "throughput": "tok/s",
    "token_latency": "-ms/token",
    "modelled": "tok/s (modelled)",
    "tau": "tau",
}

#: What each reward is, in words, for reports.
REWARD_NAMES = {
    "throughput": "measured throughput",
    "token_latency": "measured ms per token (negated)",
    "modelled": "modelled throughput",
    "tau": "tau",
}


def check_reward(value: Any, what: str = "reward") -> float:
    """``value`` as a reward: a real number (not a string or a boolean), finite, of plausible size
    (:data:`~adaptspec.speculator.REWARD_LIMIT`); anything else is one :class:`~adaptspec.errors.AdaptspecError` line.

    >>> check_reward(-12.5), check_reward(np.float32(3))
    (-12.5, 3.0)
    >>> check_reward(1e300)
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: reward must be a number within +-1e+09 (a reward is tokens/s, -ms/token or tau), got 1e+300
    >>> check_reward("5")
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: reward must be a number, got '5' (str)
    """
    if type(value) is float:  # the common case, first (a policy's every update)
        r = value
    elif isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise AdaptspecError(f"{what} must be a number, got {value!r} ({type(value).__name__})")
    else:
        r = float(value)
    if not math.isfinite(r):
        raise AdaptspecError(f"{what} must be finite, got {value!r}")
    if abs(r) > REWARD_LIMIT:
        raise AdaptspecError(
            f"{what} must be a number within +-{REWARD_LIMIT:g} (a reward is tokens/s, -ms/token "
            f"or tau), got {r:g}"
        )
    return r


def plausible_rewards(values: Any) -> bool:
    """Whether every value of ``values`` (an array) is finite and of plausible size (:data:`~adaptspec.speculator.REWARD_LIMIT`).

    >>> plausible_rewards(np.array([1.0, -3.0])), plausible_rewards(np.array([1.0, 1e300])), plausible_rewards(np.array([np.nan]))
    (True, False, False)
    """
    a = np.asarray(values, dtype=np.float64)
    return bool(a.size == 0 or np.abs(a).max() <= REWARD_LIMIT)  # NaN compares False


def mean_tau(outcome: Outcome) -> float:
    """Mean tokens committed per round; a request that ran no round raises."""
    if not outcome.rounds:
        raise AdaptspecError("outcome has no rounds: mean tau is undefined")
    return float(outcome.mean_tau)


def measured_throughput(outcome: Outcome) -> float:
    """New tokens per second of decoding (``new_tokens / decode_s``); undefined when no round ran
    (a request that ended at its prefill token: the block size played no part in it)."""
    if not outcome.rounds:
        raise AdaptspecError("no draft/verify round ran: the block size played no part in this request")
    s = float(outcome.decode_s)
    if not np.isfinite(s) or s <= 0:
        raise AdaptspecError(f"outcome has decode_s={outcome.decode_s}: throughput is undefined")
    return outcome.new_tokens / s


def measured_token_latency(outcome: Outcome) -> float:
    """Minus milliseconds of decoding per new token (higher is better)."""
    return -1000.0 / measured_throughput(outcome)


def pct_of(value: Any, reference: Any) -> Any:
    """``value`` as a percentage of ``reference``, two totals of the same reward; above 100 is
    better. For a cost-like reward (negative totals, ``token_latency``) the ratio is inverted, so
    that it still reads as relative speed.

    >>> float(pct_of(90.0, 100.0)), float(pct_of(-50.0, -40.0))
    (90.0, 80.0)
    """
    value = np.asarray(value, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(reference < 0, 100.0 * reference / value, 100.0 * value / reference)


def throughput(tokens: Any, seconds: Any) -> np.ndarray:
    """Tokens per second, elementwise (vectorised form of :func:`measured_throughput`).

    >>> throughput([100, 50], [2.0, 0.5])
    array([ 50., 100.])
    """
    return np.asarray(tokens, dtype=np.float64) / np.asarray(seconds, dtype=np.float64)


def modelled_throughput(
    mean_tau: Any, block_size: Any, profile: LatencyProfile | str, context: Any = None, batch_size: Any = 1
) -> np.ndarray:
    """Tokens per second if each round commits ``mean_tau`` tokens and costs one draft and one
    verify pass of ``block_size`` on ``profile`` (broadcasts over arrays). ``context`` defaults
    to the profile's reference context."""
    p = get_profile(profile)
    return np.asarray(mean_tau, dtype=np.float64) / p.round_s(block_size, context, batch_size)


def reward_function(
    name: str,
    profile: LatencyProfile | str | None = None,
    *,
    context_tokens: int | None = None,
    batch_size: int = 1,
) -> Callable[[Outcome], float]:
    """``reward(outcome) -> float`` for the controller: one of :data:`REWARDS`.

    >>> from adaptspec.speculator import Outcome, Round
    >>> f = reward_function("modelled", "h100-qwen3-8b")
    >>> round(f(Outcome([1] * 7, [Round(16, 6, 0.001, 0.007)], 0.008)), 1)
    701.4
    """
    check_reward_name(name)
    if name == "throughput":
        return measured_throughput
    if name == "token_latency":
        return measured_token_latency
    if name == "tau":
        return mean_tau
    if profile is None:
        raise AdaptspecError("the modelled reward needs a latency profile (--latency)")
    p = get_profile(profile)

    def modelled(outcome: Outcome) -> float:
        tau = mean_tau(outcome)
        first = outcome.rounds[0]
        arm = (
            tree_arm(first.block_size - 1) if first.tree and first.block_size > 1 else first.block_size
        )  # a tree: its cost
        return float(modelled_throughput(tau, arm, p, context_tokens, batch_size))

    return modelled


def trace_reward_name(has_timings: bool, latency: Any = None) -> str:
    """The reward ``simulate`` and ``train-head`` use when none is given: :data:`DEFAULT_REWARD`
    when the trace set has decode times, else ``modelled`` with a latency profile, else ``tau``.

    >>> trace_reward_name(True), trace_reward_name(False, "h100-qwen3-8b"), trace_reward_name(False)
    ('token_latency', 'modelled', 'tau')
    """
    return DEFAULT_REWARD if has_timings else ("modelled" if latency else "tau")


def check_reward_name(name: str) -> str:
    if name not in REWARDS:
        raise AdaptspecError(f"unknown reward {name!r}: choose one of {', '.join(REWARDS)}")
    return name


# ---------------------------------------------------------------------------- trace sets
def trace_context(traces: Any, profile: LatencyProfile) -> np.ndarray:
    """Mean context during decoding per (request, arm): prompt + half the new tokens.

    Unknown prompt lengths fall back to the profile's reference context; unknown new-token
    counts to the prompt alone.
    """
    pt = traces.prompt_tokens[:, None]
    new = traces.new_tokens_matrix()
    ctx = np.where(np.isnan(pt), float(profile.context_tokens), pt) + np.where(np.isnan(new), 0.0, new / 2.0)
    return ctx


def trace_rewards(
    traces: Any, reward: str, latency: LatencyProfile | str | None = None, batch_size: int = 1
) -> np.ndarray:
    """``(n_requests, n_arms)`` reward matrix of a :class:`~adaptspec.traces.TraceSet`."""
    check_reward_name(reward)
    tau = traces.tau_matrix()
    if reward == "tau":
        return tau
    if reward in ("throughput", "token_latency"):
        secs = traces.decode_s_matrix()
        new = traces.new_tokens_matrix()
        if secs is None or np.isnan(new).any():
            where = f" {traces.path}" if traces.path else ""
            raise AdaptspecError(
                f"trace set{where} has no measured decode times or token counts: "
                "use --reward modelled with --latency PROFILE, or --reward tau"
            )
        return throughput(new, secs) if reward == "throughput" else -1000.0 * secs / new
    if latency is None:
        raise AdaptspecError("--reward modelled needs --latency PROFILE")
    p = get_profile(latency)
    return modelled_throughput(tau, traces.arm_array[None, :], p, trace_context(traces, p), batch_size)


def trace_costs(
    traces: Any, latency: LatencyProfile | str | None = None, batch_size: int = 1
) -> tuple[np.ndarray, np.ndarray] | None:
    """Tokens and decode seconds per (request, arm), for aggregate throughput.

    With a latency profile the seconds are modelled (tokens / modelled throughput); without
    one they are the measured ones; None when neither exists. Unknown token counts count as
    one token per request, so the aggregate is then the harmonic mean of per-request throughput.
    """
    new = traces.new_tokens_matrix()
    tokens = np.where(np.isnan(new), 1.0, new)
    if latency is not None:
        return tokens, tokens / trace_rewards(traces, "modelled", latency, batch_size)
    secs = traces.decode_s_matrix()
    if secs is None or np.isnan(new).any():
        return None
    return tokens, secs
