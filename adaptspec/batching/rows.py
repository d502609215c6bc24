"""Per-request state: the handle a caller holds, and the row the engine decodes.

A :class:`RequestHandle` is returned by :meth:`BatchEngine.submit
<adaptspec.batching.engine.BatchEngine.submit>`: it shows the tokens committed so far and,
when the request ends, its :class:`~adaptspec.speculator.Outcome` or its own
:class:`~adaptspec.errors.AdaptspecError` (a failing request never touches the others).

>>> h = RequestHandle(7, prompt=[1, 2], block_size=4, max_new_tokens=8, temperature=0.0, seed=None)
>>> h.done, h.tokens
(False, [])
>>> h.cancel(); h.cancelled
True
>>> h.end_cancelled(); h.done, h.error is not None
(True, True)
>>> s = RequestHandle(8, prompt=[1], block_size=1, max_new_tokens=8, temperature=0.0, seed=None)
>>> s.finish("stop"); s.end_cancelled(); s.done, s.error, s.finish_reason
(True, None, 'stop')
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..decoding.sampling import SampleKeys
from ..errors import AdaptspecError
from ..speculator import Outcome, Round


class RequestHandle:
    """One submitted request, as its caller sees it."""

    def __init__(
        self,
        request_id: int,
        prompt: Sequence[int] | torch.Tensor,
        block_size: int,
        max_new_tokens: int,
        temperature: float,
        seed: int | None,
    ) -> None:
        self.id = request_id
        self.prompt = prompt
        self.block_size = block_size
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed
        self.tokens: list[int] = []  # committed so far (the token chosen at prefill first)
        self.rounds: list[Round] = []
        self.finish_reason: str | None = None  # "length" | "eos" (| finish()'s reason) once done
        self.error: AdaptspecError | None = None
        self.cancelled = False
        self.finish_requested: str | None = None  # set by finish(): the reason a cancel ends with
        self.choose: Callable[[Any], int] | None = None  # features -> block size, called at join
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.decode_s = 0.0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def cancel(self) -> None:
        """Stop this request at the next round boundary (it ends with an error saying so)."""
        self.cancelled = True

    def finish(self, reason: str = "stop") -> None:
        """End this request at the next round boundary as finished with ``reason`` (a stop
        sequence appeared): it keeps the tokens committed so far and ends without an error."""
        self.finish_requested = reason
        self.cancelled = True

    def end_cancelled(self) -> None:
        """What a cancel comes to at a round boundary: finished as :meth:`finish` asked, else failed."""
        if self.finish_requested is not None:
            self.finish_reason = self.finish_requested
            self.finished_at = time.perf_counter()
        else:
            self.fail(AdaptspecError(f"request {self.id} cancelled"))

    def result(self) -> Outcome:
        """The request's :class:`Outcome`; raises its :class:`AdaptspecError` if it failed."""
        if self.error is not None:
            raise self.error
        if self.finish_reason is None:
            raise AdaptspecError(f"request {self.id} is not finished yet")
        return Outcome(
            tokens=list(self.tokens),
            rounds=list(self.rounds),
            decode_s=self.decode_s,
            finish_reason=self.finish_reason,
        )

    def fail(self, error: AdaptspecError) -> None:
        self.error = error
        self.finished_at = time.perf_counter()

    def __repr__(self) -> str:
        state = "failed" if self.error else (self.finish_reason or "running")
        return f"RequestHandle({self.id}, {state}, {len(self.tokens)} tokens)"


@dataclass
class Row:
    """What the engine keeps for an active request besides its KV slot."""

    handle: RequestHandle
    draft: Any  # the drafter's DraftState, or None without a drafter
    keys: SampleKeys | None  # the request's sampling keys (temperature > 0): its samples ignore the batch
    started_at: float = field(default_factory=time.perf_counter)

    @property
    def last(self) -> int:
        return self.handle.tokens[-1]

    @property
    def room(self) -> int:
        return self.handle.max_new_tokens - len(self.handle.tokens)


@dataclass
class Filling:
    """A joining request whose prompt is being prefilled in chunks (:mod:`adaptspec.batching.fills`)."""

    handle: RequestHandle
    ids: torch.Tensor  # the prompt's token ids, checked
    done: int = 0  # prompt tokens prefilled so far
    hidden: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # layer -> each chunk's [c, H] so far
    started: bool = False  # its prompt has run and its row is being started (no longer joining)

    @property
    def left(self) -> int:
        return int(self.ids.numel()) - self.done

    def layer(self, i: int) -> torch.Tensor:
        """The prompt's hidden states ``[n, H]`` at layer ``i`` (once every chunk has run)."""
        return torch.cat(self.hidden[i])
