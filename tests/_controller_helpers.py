"""A deterministic pure-Python speculator for controller tests (no torch, microseconds per request).

Each prompt has a hidden acceptance rate derived from its ids; ``features[0]`` reveals it, so
a contextual policy can learn which block size pays. Timings are computed, not measured, so
rewards (tokens per second) are exactly reproducible; ``sleep_s`` adds real time to decode
for concurrency tests.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from adaptspec.policies.base import Policy
from adaptspec.schedules import as_schedule
from adaptspec.speculator import Outcome, Prefill, Round


class FakeSpeculator:
    max_block_size = 16
    per_round = True  # decode asks its schedule for every round's block

    def __init__(self, dim: int = 4, sleep_s: float = 0.0, eos: int | None = None) -> None:
        self.dim = dim
        self.sleep_s = sleep_s
        self.eos = eos
        self.calls = 0

    def prefill(
        self, prompt_ids: Sequence[int], temperature: float = 0.0, seed: int | None = None, **kw: Any
    ) -> Prefill:
        ids = [int(i) for i in prompt_ids]
        rng = np.random.default_rng(ids)
        acc = float(rng.uniform(0.1, 0.9))
        f = rng.normal(size=self.dim).astype(np.float32)
        f[0] = acc
        return Prefill(first_token=sum(ids) % 97, prompt_tokens=len(ids), features=f, state={"acc": acc})

    def decode(
        self,
        prefill: Prefill,
        block_size: Any,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        on_round: Callable[[list[int], Round], None] | None = None,
    ) -> Outcome:
        return self._decode(prefill, block_size, max_new_tokens, on_round)

    def _decode(
        self,
        prefill: Prefill,
        block_size: Any,
        max_new_tokens: int,
        on_round: Callable[[list[int], Round], None] | None,
    ) -> Outcome:
        self.calls += 1
        if self.sleep_s:
            time.sleep(self.sleep_s)
        acc = prefill.state["acc"]
        schedule = as_schedule(block_size)
        tokens = [prefill.first_token]
        rounds: list[Round] = []
        finish = "length"
        while len(tokens) < max_new_tokens and finish == "length":
            b = schedule.draft_size(rounds)
            b = min(b, max_new_tokens - len(tokens))
            tau = min(b, 1 + int(acc * acc * (b - 1) + 0.5 * (len(rounds) % 2)))
            new = [(tokens[-1] + 1 + i) % 97 for i in range(tau)]
            r = Round(b, tau, 0.002 if b > 1 else 0.0, 0.010 + 0.001 * b)
            rounds.append(r)
            for t in new:
                tokens.append(t)
                if t == self.eos:
                    finish = "eos"
                    break
            if on_round is not None:
                on_round(new, r)
        return Outcome(tokens[:max_new_tokens], rounds, sum(r.draft_s + r.verify_s for r in rounds), finish)


class SplitFormOnly:
    """A speculator for controllers used only in the split form (``decide`` / ``feedback``)."""

    max_block_size = 8

    def prefill(self, prompt_ids, temperature=0.0, seed=None):  # pragma: no cover - never prefills
        raise NotImplementedError

    def decode(self, *a, **kw):  # pragma: no cover
        raise NotImplementedError


class Misbehaving(Policy):
    """A policy that raises, sleeps or answers nonsense on demand (for fallback tests)."""

    name = "misbehaving"

    def __init__(
        self,
        arms: Sequence[int],
        mode: str = "ok",
        sleep_s: float = 0.0,
        update_sleep_s: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.mode, self.sleep_s, self.update_sleep_s = mode, sleep_s, update_sleep_s
        super().__init__(arms, seed=seed)

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        if self.mode == "raise":
            raise RuntimeError("policy bug")
        if self.mode == "sleep":
            time.sleep(self.sleep_s)
        p = np.zeros(len(self.arms))
        p[0] = 1.0
        return p

    def decide(self, context: Any = None):
        d = super().decide(context)
        if self.mode == "invalid":
            from adaptspec.speculator import Decision

            return Decision(999, 1.0, d.probs, d.arms, d.policy)
        return d

    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        if self.update_sleep_s:
            time.sleep(self.update_sleep_s)
