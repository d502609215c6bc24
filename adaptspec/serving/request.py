"""A checked completion request (:class:`CompletionRequest`) and what it answers (:class:`Output`).

:meth:`CompletionService.request <adaptspec.serving.service.CompletionService.request>` makes the
request once every field is checked; from there the runner, the stream and the response read it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine.loop import Reservation

__all__ = ["CompletionRequest", "Output"]


@dataclass
class CompletionRequest:
    """A checked completion request."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    seed: int | None
    stream: bool
    variant: str
    user: str | None
    stop: tuple[str, ...] = ()
    include_usage: bool = False  # stream_options.include_usage
    slot: "Reservation | None" = (
        None  # the batched engine's place in its queue, held from the checks to the run
    )
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    received: float = field(default_factory=time.perf_counter)


@dataclass
class Output:
    """What a request answers: the ids and text up to the first stop sequence (or the end), and why it ended."""

    ids: list[int]
    text: str
    finish_reason: str  # "stop" (EOS or a stop sequence) | "length"
