"""How fast this machine decodes compared with a latency profile, learnt online.

A head is trained on rewards timed by a latency profile (the bundled head: ``cpu-smollm2-fast``,
a quiet 2-core machine). The machine that serves is rarely that machine: another CPU, other
programs sharing the cores, a thermal limit. A uniform slowdown makes every arm's measured
reward worse than the head predicted; a bandit that sees the arm it tried come out slower than
predicted moves to an arm it has not tried, though nothing changed between the arms. On the
bundled trace set, timings 35% slower made the default policy choose plain decoding for 7-9 of
24 requests where it otherwise chose it for 0-1 (four noise seeds, ``tests/test_machine_speed.py``).

:class:`MachineSpeed` keeps a running estimate ``k`` of measured decode time over the profile's
time for the same rounds (a discounted mean of the log ratios, half-life ``half_life``
requests, over all arms alike) and divides it out of the measured reward before the policy
learns from it: ``token_latency / k``, ``throughput * k``. What the policy sees is then in the
profile's units, as its head was trained, and a uniform factor cancels; what differs between
arms on this machine (a block size relatively dearer here than in the profile) still comes
through, because ``k`` is pooled over all arms rather than taken from the request itself.

>>> from adaptspec.speculator import Outcome, Round
>>> speed = MachineSpeed("cpu-smollm2-fast")
>>> rounds = [Round(4, 2, 0.0, 0.0)] * 10
>>> modelled = speed.profile_s(rounds)          # the profile's seconds for these rounds
>>> slow = Outcome([0] * 20, rounds, decode_s=1.5 * modelled)
>>> speed.observe(speed.ratio(slow))
>>> round(speed.factor, 3)
1.5
>>> round(speed.calibrate("token_latency", -1500.0 * modelled / 20) / (-1000.0 * modelled / 20), 3)
1.0
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import AdaptspecError
from .latency import LatencyProfile, get_profile

#: Rewards measured on the machine (the ones a machine-speed factor multiplies).
MEASURED_REWARDS = ("token_latency", "throughput")


class MachineSpeed:
    """Running ratio of measured to ``profile`` decode time; 1.0 until the first observation."""

    def __init__(self, profile: LatencyProfile | str, half_life: float = 16.0) -> None:
        if not (half_life > 0 and math.isfinite(half_life)):
            raise AdaptspecError(f"half_life must be > 0 requests, got {half_life}")
        self.profile = get_profile(profile)
        self.half_life = float(half_life)
        self._decay = 0.5 ** (1.0 / self.half_life)
        self._sum = 0.0  # discounted sum of log ratios
        self._weight = 0.0  # discounted count

    @property
    def factor(self) -> float:
        """Measured time over the profile's time: above 1 on a slower machine."""
        return math.exp(self._sum / self._weight) if self._weight > 0 else 1.0

    def profile_s(self, rounds: Sequence[Any]) -> float:
        """The profile's seconds for ``rounds`` (draft at each round's drafted size, verify at its
        verified size, at the profile's reference context)."""
        drafted = np.fromiter((r.draft_size for r in rounds), dtype=np.float64, count=len(rounds))
        verified = np.fromiter((r.block_size for r in rounds), dtype=np.float64, count=len(rounds))
        return float(self.profile.draft_s(drafted).sum() + self.profile.verify_s(verified).sum())

    def ratio(self, outcome: Any) -> float | None:
        """Measured over the profile's decode time for ``outcome``; None when undefined (no round ran)."""
        if not outcome.rounds:
            return None
        measured, modelled = float(outcome.decode_s), self.profile_s(outcome.rounds)
        if not (measured > 0 and modelled > 0 and math.isfinite(measured)):
            return None
        return measured / modelled

    def observe(self, ratio: float | None) -> None:
        """Fold one request's ratio into the estimate (None: nothing to learn)."""
        if ratio is None or not (ratio > 0 and math.isfinite(ratio)):
            return
        self._sum = self._decay * self._sum + math.log(ratio)
        self._weight = self._decay * self._weight + 1.0

    def calibrate(self, reward_name: str, reward: float) -> float:
        """``reward`` (measured on this machine) in the profile's units."""
        if reward_name == "token_latency":
            return reward / self.factor
        if reward_name == "throughput":
            return reward * self.factor
        raise AdaptspecError(
            f"a machine-speed factor applies to measured rewards ({', '.join(MEASURED_REWARDS)}), "
            f"not {reward_name!r}"
        )

    def replay(self, reward_name: str) -> "LogCalibration":
        """A fresh factor of the same profile and half-life, to calibrate a decision log's rewards
        again in log order, as a learner starting from nothing calibrated them."""
        return LogCalibration(MachineSpeed(self.profile, self.half_life), reward_name)

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, float]:
        return {"sum": self._sum, "weight": self._weight, "half_life": self.half_life}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if float(state.get("half_life", self.half_life)) != self.half_life:
            raise AdaptspecError(
                f"checkpoint's machine-speed half-life {state.get('half_life')} differs from "
                f"this controller's {self.half_life}"
            )
        self._sum, self._weight = float(state["sum"]), float(state["weight"])


class LogCalibration:
    """Logged rewards calibrated again in log order: each row's ``speed_ratio`` folded into the
    factor (:meth:`row`), then that row's reward, or its vector of counterfactual rewards (one
    factor for every arm), divided or multiplied by it, as the learner did when it applied the row.
    A row without a ratio is learnt as logged."""

    def __init__(self, speed: MachineSpeed, reward_name: str) -> None:
        self.speed = speed
        self.reward_name = reward_name

    def row(self, ratio: float | None) -> Callable[[Any], Any]:
        """Fold one row's ratio into the factor; returns what calibrates that row's rewards."""
        if ratio is None:
            return _as_logged
        self.speed.observe(ratio)
        return lambda reward: self.speed.calibrate(self.reward_name, reward)  # used before the next row


def _as_logged(reward: Any) -> Any:
    return reward
