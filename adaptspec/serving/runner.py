"""The seam between the HTTP side and what decodes: the :class:`Runner` protocol.

A :class:`~adaptspec.serving.service.CompletionService` is built with one runner and hands it
every checked request. Two implement it: the batched engine's
(:class:`~adaptspec.serving.engine.batched.BatchedRunner`, adaptspec's own target and drafter) and
the one-request-at-a-time runner (:class:`~adaptspec.serving.engine.sequential.SequentialRunner`,
a speculator of one's own). A runner gets what it needs when it is made (the variants'
controllers) and reaches nothing of the service's; what a request needs travels in
:meth:`Runner.run`'s signature: its stream callback, its stop condition and its cancellation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from ..control.generation import Generation
    from .cancelling import Cancellation
    from .request import CompletionRequest

__all__ = ["Runner"]


class Runner(Protocol):
    """Decodes checked requests through their variants' controllers."""

    @property
    def health(self) -> dict[str, Any] | None:
        """Its own state for ``/health`` (the engine thread's), or None when it has none."""
        ...

    def describe(self) -> str:
        """One line for the server's start-up message."""
        ...

    def reserve(self) -> Any:
        """Take a request's place before it runs (a 429 now when there is none), or None when
        there is nothing to reserve; :meth:`run` uses it (``req.slot``) or gives it back."""
        ...

    def run(self, req: "CompletionRequest", on_tokens: Callable[[list[int]], None] | None = None,
            stop_when: Callable[[], bool] | None = None, cancel: "Cancellation | None" = None) -> "Generation":
        """Decode ``req``; returns its generation once its decision and outcome are in the decision
        log. ``on_tokens(ids)`` gets the tokens as they are committed; ``stop_when()`` true ends it
        as ``"stop"``; ``cancel`` ends it when the client went away. Refusals are
        :class:`~adaptspec.serving.request_error.RequestError`."""
        ...

    async def run_async(self, req: "CompletionRequest", on_tokens: Callable[[list[int]], None] | None = None,
                        stop_when: Callable[[], bool] | None = None,
                        cancel: "Cancellation | None" = None) -> "Generation":
        """:meth:`run`, awaited on the server's event loop (the batched engine: no thread waits)."""
        ...

    def close(self) -> None:
        """Finish what it holds and stop (the service closes the controllers after)."""
        ...
