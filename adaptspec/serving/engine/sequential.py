"""Serving a speculator that is not adaptspec's own: one request at a time, through its controller.

A speculator given with ``adaptspec serve --speculator MODULE:FACTORY`` (docs/bring-your-own.md)
has no batched engine: :class:`SequentialRunner` runs each request through its variant's
controller's own decide -> decode -> feedback (:meth:`AdaptiveController.generate
<adaptspec.control.controller.AdaptiveController.generate>`), which holds the speculator for one
request at a time. It has the batched runner's interface (:class:`~adaptspec.serving.engine.batched.BatchedRunner`),
so the service does not tell them apart.

A stop sequence halts decoding after the round in which it completes: the controllers decode
through a :class:`~adaptspec.serving.engine.halting.HaltableSpeculator`, and the condition reaches it
with :func:`~adaptspec.serving.engine.halting.halt_when` (the speculator protocol's ``decode`` has no
parameter for it). A cancelled request runs to its end (the protocol has no way to stop it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from ...control.controller import AdaptiveController
from ..cancelling import Cancellation
from .halting import halt_when
from ..request_error import RequestError

if TYPE_CHECKING:
    from ...control.generation import Generation
    from ..request import CompletionRequest

__all__ = ["SequentialRunner"]


class SequentialRunner:
    """Runs checked requests through ``controllers`` (variant -> controller), one at a time."""

    health = None  # no engine thread to report on

    def __init__(self, controllers: Mapping[str, AdaptiveController]) -> None:
        self.controllers = dict(controllers)

    def describe(self) -> str:
        return "one request at a time (a speculator of your own)"

    def reserve(self) -> None:
        """Nothing to reserve: a request waits for the speculator on its own thread."""
        return None

    def close(self) -> None:
        """Nothing of its own to stop (the service closes the controllers)."""

    def run(self, req: "CompletionRequest", on_tokens: Callable[[list[int]], None] | None = None,
            stop_when: Callable[[], bool] | None = None, cancel: Cancellation | None = None) -> "Generation":
        """Decode ``req`` through its variant's controller; returns the
        :class:`~adaptspec.control.generation.Generation`, its decision and outcome logged."""
        from ...control.controller import DecisionLogError, PrefillError

        ctrl = self.controllers[req.variant]
        try:
            with halt_when(stop_when):
                return ctrl.generate(req.prompt_ids, max_new_tokens=req.max_tokens, temperature=req.temperature,
                                     seed=req.seed, request_id=req.request_id, on_tokens=on_tokens)
        except PrefillError as e:  # the speculator refused this prompt
            raise RequestError(str(e), param="prompt") from None
        except DecisionLogError as e:  # not acknowledged: the client may retry
            raise RequestError(f"the decision log cannot be written, the request was not recorded: {e}", 503) from None

    async def run_async(self, req: "CompletionRequest", on_tokens: Callable[[list[int]], None] | None = None,
                        stop_when: Callable[[], bool] | None = None,
                        cancel: Cancellation | None = None) -> "Generation":
        """:meth:`run` on a worker thread (the speculator's decode blocks), awaited."""
        import asyncio

        return await asyncio.to_thread(self.run, req, on_tokens, stop_when, cancel)
