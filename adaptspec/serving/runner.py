"""The seam between the HTTP side and what decodes: the :class:`Runner` protocol.

A :class:`~adaptspec.serving.service.CompletionService` is built with one runner and hands it
every checked request. Two implement it: the batched engine's
(:class:`~adaptspec.serving.engine.batched.BatchedRunner`, adaptspec's own target and drafter) and
the one-request-at-a-time runner (:class:`~adaptspec.serving.engine.sequential.SequentialRunner`,
a speculator of one's own). A runner gets what it needs when it is made (the variants'
controllers) and reaches nothing of the service's; what a request needs travels in
:meth:`Runner.run`'s signature: its stream callback, its stop condition and its cancellation.

Each runs the decoding (adaptspec's engine, or a user's speculator) on a thread of its own whose
progress a watchdog checks (:class:`~adaptspec._util.guarded.GuardedThread`'s ``stall_s``, default
:data:`~adaptspec._util.guarded.STALL_S`, 60 s): busy with no progress (a round) for that long, the runner is stalled: the
requests waiting on it get 503, new ones too, its ``health`` says ``stalled``, and its
``close`` does not wait for it.

At shutdown a runner is drained (:meth:`Runner.drain`): every request it holds is answered 503
at once, whatever its decode is doing, and its ``close`` then waits for nothing it cannot bound
(:mod:`adaptspec.serving.shutdown`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

from .request_error import RequestError

if TYPE_CHECKING:
    from ..control.generation import Generation
    from .cancelling import Cancellation
    from .request import CompletionRequest

__all__ = ["Runner", "answered", "resolve"]


class Runner(Protocol):
    """Decodes checked requests through their variants' controllers."""

    @property
    def health(self) -> dict[str, Any]:
        """Its decoding thread's state for ``/health``: ``state`` (``ok``, ``degraded``, ``stalled``,
        ``failed``), ``failures`` and ``last_error`` (:meth:`GuardedThread.report
        <adaptspec._util.guarded.GuardedThread.report>`)."""
        ...

    def describe(self) -> str:
        """One line for the server's start-up message."""
        ...

    def reserve(self) -> Any:
        """Take a request's place before it runs (a 429 now when there is none), or None when
        there is nothing to reserve; :meth:`run` uses it (``req.slot``) or gives it back."""
        ...

    def run(
        self,
        req: "CompletionRequest",
        on_tokens: Callable[[list[int]], None] | None = None,
        stop_when: Callable[[], bool] | None = None,
        cancel: "Cancellation | None" = None,
    ) -> "Generation":
        """Decode ``req``; returns its generation once its decision and outcome are in the decision
        log. ``on_tokens(ids)`` gets the tokens as they are committed; ``stop_when()`` true ends it
        as ``"stop"``; ``cancel`` ends it when the client went away. Refusals are
        :class:`~adaptspec.serving.request_error.RequestError`."""
        ...

    async def run_async(
        self,
        req: "CompletionRequest",
        on_tokens: Callable[[list[int]], None] | None = None,
        stop_when: Callable[[], bool] | None = None,
        cancel: "Cancellation | None" = None,
    ) -> "Generation":
        """:meth:`run`, awaited on the server's event loop (the batched engine: no thread waits)."""
        ...

    def drain(self, reason: str) -> None:
        """Answer every request waiting or decoding with a 503 giving ``reason``, now, from the
        calling thread, and refuse new ones; a decode still running is not waited for (its
        thread is a daemon)."""
        ...

    def close(self, timeout: float) -> None:
        """Finish what it holds within ``timeout`` seconds (and only while its thread progresses),
        answer whatever is left with a 503 (:meth:`drain`), and stop (the service closes the
        controllers after)."""
        ...


def resolve(future: Any, result: Any) -> None:
    """Settle an awaited request's ``future`` with ``result`` (on the event loop), unless it is settled."""
    if not future.done():
        future.set_result(result)


def answered(result: "Generation | RequestError") -> "Generation":
    """A runner's answer to a request: the generation, or its refusal raised."""
    if isinstance(result, RequestError):
        raise result
    return result
