"""Ending a request's decoding early, after the round at which a condition becomes true.

The server stops generating once a stop sequence has appeared. The controller runs decoding
through the speculator protocol, which has no way to stop but ``max_new_tokens``;
:class:`HaltableSpeculator` wraps a speculator so that its ``decode`` ends after the first
round at which the current request's condition (set with :func:`halt_when` on the thread
that calls the controller) is true, and reports what was committed up to there as an
:class:`~adaptspec.speculator.Outcome` with ``finish_reason="stop"``. Tokens are never changed,
only fewer rounds run: the outcome is the prefix of the full decode up to that round.

>>> from adaptspec.serving.tiny import tiny_speculator
>>> spec = HaltableSpeculator.around(tiny_speculator(0)[0])
>>> pre = spec.prefill([72, 105])
>>> full = spec.decode(pre, 4, 20)
>>> seen = []
>>> with halt_when(lambda: len(seen) >= 5):
...     out = spec.decode(pre, 4, 20, on_round=lambda new, r: seen.extend(new))
>>> out.finish_reason, out.tokens == full.tokens[: len(out.tokens)], 6 <= len(out.tokens) < 6 + 4
('stop', True, True)

The wrapper made by :meth:`HaltableSpeculator.around` is named as the speculator it wraps, so
every message that names the speculator (the controller's checks, ``serve``'s refusals) names
the user's class, not this one:

>>> type(spec).__name__, isinstance(spec, HaltableSpeculator)
('SpeculativeDecoder', True)
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

from ...speculator import Outcome

__all__ = ["HaltableSpeculator", "halt_when"]

_condition: ContextVar[Callable[[], bool] | None] = ContextVar("adaptspec_halt_condition", default=None)


@contextmanager
def halt_when(condition: Callable[[], bool] | None) -> Iterator[None]:
    """Within this block, a :class:`HaltableSpeculator`'s decode on this thread ends once ``condition()``
    (None: it runs to its end)."""
    token = _condition.set(condition)
    try:
        yield
    finally:
        _condition.reset(token)


class _Halt(Exception):
    pass


class HaltableSpeculator:
    """A speculator (anything with the protocol's ``prefill``/``decode``) whose decode can be halted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @classmethod
    def around(cls, inner: Any) -> "HaltableSpeculator":
        """``inner`` made haltable, by a subclass of this one that bears the name of ``inner``'s class."""
        name = type(inner).__name__
        named = type(
            name, (cls,), {"__qualname__": name, "__module__": cls.__module__, "__doc__": cls.__doc__}
        )
        return named(inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def prefill(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.prefill(*args, **kwargs)

    def decode(
        self,
        prefill: Any,
        block_size: Any,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        on_round: Callable[[list[int], Any], None] | None = None,
    ) -> Outcome:
        halted = _condition.get()
        if halted is None:
            return self.inner.decode(
                prefill, block_size, max_new_tokens, temperature=temperature, seed=seed, on_round=on_round
            )
        if halted():  # the first token (chosen at prefill) already ended the output
            return Outcome(tokens=[int(prefill.first_token)], rounds=[], decode_s=0.0, finish_reason="stop")
        tokens, rounds = [int(prefill.first_token)], []

        def watch(new: list[int], r: Any) -> None:
            tokens.extend(int(t) for t in new)
            rounds.append(r)
            if on_round is not None:
                on_round(new, r)
            if halted():
                raise _Halt

        start = time.perf_counter()
        try:
            return self.inner.decode(
                prefill, block_size, max_new_tokens, temperature=temperature, seed=seed, on_round=watch
            )
        except _Halt:
            return Outcome(
                tokens=tokens, rounds=rounds, decode_s=time.perf_counter() - start, finish_reason="stop"
            )
