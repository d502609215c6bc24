"""Every body the server answers a request with, in one place: completions and chat completions,
whole or as streamed chunks, the model list, and the errors.

A whole answer is built from the checked request, its generation and its :class:`Output` (the text
up to the first stop sequence); a stream's chunks by a :class:`ChunkFormat` (one per endpoint),
which :func:`~adaptspec.serving.streaming.events` drives. Every answer ends with the ``adaptspec``
object (:func:`info`): what was decided and how it went.

>>> from adaptspec.serving.request import CompletionRequest
>>> req = CompletionRequest([1, 2, 3], 4, 0.0, None, False, "A", None)
>>> usage(req, Output([5, 6], "hi", "length"))
{'prompt_tokens': 3, 'completion_tokens': 2, 'total_tokens': 5}

**Errors.** A refused request's body is :func:`error_body` of its
:class:`~adaptspec.serving.request_error.RequestError`: a 4xx names the field and the client's own
value; a 503 gives a reason in the server's own words. What failed inside (an exception's
text: a speculator's, a policy's, an OSError naming a file) may carry a user's paths or
secrets: it goes to the server's log, with the request's id, never into a body
(:func:`unavailable`, :func:`server_fault`).

>>> import logging; logging.getLogger("adaptspec.serving").disabled = True
>>> e = unavailable("the speculator's decode failed on this request", RuntimeError("boom at /home/u/secret.txt"),
...                 "cmpl-1")
>>> error_body(e)["error"]["message"]
"the speculator's decode failed on this request (the server's log has the error, request cmpl-1)"
>>> logging.getLogger("adaptspec.serving").disabled = False
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from .request import CompletionRequest, Output
from .request_error import RequestError

if TYPE_CHECKING:
    from ..control.generation import Generation

__all__ = [
    "ChatChunks",
    "ChunkFormat",
    "CompletionChunks",
    "chat_body",
    "completion_body",
    "error_body",
    "finish_reason",
    "info",
    "models_body",
    "server_fault",
    "unavailable",
    "usage",
]

log = logging.getLogger("adaptspec.serving")


def error_body(e: RequestError) -> dict[str, Any]:
    """The body of a refused request, OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = "invalid_request_error" if e.status < 500 else "server_error"
    return {"error": {"message": str(e), "type": kind, "param": e.param, "code": e.status}}


def unavailable(
    reason: str, error: BaseException | None = None, request_id: str | None = None
) -> RequestError:
    """The 503 of a request the server could not complete: ``reason`` in the server's own words;
    ``error`` (what failed, whose text may name a user's paths) is logged with its traceback and
    ``request_id``, and the reason says where to look."""
    if error is None:
        return RequestError(reason, 503)
    log.error("request %s: %s", request_id or "-", reason, exc_info=error)
    where = "the server's log has the error" + ("" if request_id is None else f", request {request_id}")
    return RequestError(f"{reason} ({where})", 503)


def server_fault(e: BaseException, request_id: str | None = None) -> RequestError:
    """The 503 that an unexpected failure while running a request answers with (never a 500): a
    reason, the error logged (:func:`unavailable`); the server keeps serving and the client may retry."""
    return unavailable("the server could not complete this request", e, request_id)


def finish_reason(decoded: str) -> str:
    """The OpenAI ``finish_reason`` of a decode that ended for ``decoded`` (eos, a stop sequence, length)."""
    return "length" if decoded == "length" else "stop"


def usage(req: CompletionRequest, output: Output) -> dict[str, int]:
    n = len(output.ids)
    return {
        "prompt_tokens": len(req.prompt_ids),
        "completion_tokens": n,
        "total_tokens": len(req.prompt_ids) + n,
    }


def info(req: CompletionRequest, gen: "Generation") -> dict[str, Any]:
    """The ``adaptspec`` part of a response: what was decided and how it went."""
    out = gen.outcome
    d = gen.decision
    return {
        "variant": req.variant,
        "decision_id": d.decision_id,
        "decisions": [x.decision_id for x in gen.decisions],
        "policy": d.policy,
        "policy_version": d.version,
        "block_size": d.block_size,
        "propensity": d.propensity,
        "fallback": gen.fallback,
        "reward": gen.reward,
        "mean_tau": None if not out.rounds else round(out.mean_tau, 4),
        "rounds": len(out.rounds),
        "decode_s": round(out.decode_s, 6),
        "tokens_per_s": round(out.new_tokens / out.decode_s, 3) if out.decode_s > 0 else None,
    }


def models_body(model_ids: list[str], created: float) -> dict[str, Any]:
    """``GET /v1/models``: the served model and, with several variants, ``MODEL:VARIANT`` for each."""
    return {
        "object": "list",
        "data": [
            {"id": m, "object": "model", "created": int(created), "owned_by": "adaptspec"} for m in model_ids
        ],
    }


def completion_body(model: str, req: CompletionRequest, gen: "Generation", output: Output) -> dict[str, Any]:
    """A whole ``text_completion``."""
    return {
        "id": f"cmpl-{req.request_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": output.text,
                "token_ids": output.ids,
                "logprobs": None,
                "finish_reason": output.finish_reason,
            }
        ],
        "usage": usage(req, output),
        "adaptspec": info(req, gen),
    }


def chat_body(model: str, req: CompletionRequest, gen: "Generation", output: Output) -> dict[str, Any]:
    """A whole ``chat.completion``."""
    return {
        "id": f"chatcmpl-{req.request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": output.text},
                "logprobs": None,
                "finish_reason": output.finish_reason,
            }
        ],
        "usage": usage(req, output),
        "adaptspec": info(req, gen),
    }


class ChunkFormat(Protocol):
    """How one endpoint's streamed chunks look."""

    def piece(self, text: str, ids: list[int]) -> dict[str, Any] | None: ...  # None: no chunk

    def final(self, gen: "Generation", output: Output, tail: str) -> list[dict[str, Any]]: ...


class CompletionChunks:
    """``text_completion`` chunks; the final one has ``usage`` and ``adaptspec``."""

    def __init__(self, model: str, req: CompletionRequest) -> None:
        self.model, self.req = model, req

    def _chunk(self, text: str, ids: list[int], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": f"cmpl-{self.req.request_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {"index": 0, "text": text, "token_ids": ids, "logprobs": None, "finish_reason": finish}
            ],
        }

    def piece(self, text: str, ids: list[int]) -> dict[str, Any]:
        return self._chunk(text, ids)

    def final(self, gen: "Generation", output: Output, tail: str) -> list[dict[str, Any]]:
        last = self._chunk(tail, [], output.finish_reason)
        last.update({"usage": usage(self.req, output), "adaptspec": info(self.req, gen)})
        return [last]


class ChatChunks:
    """``chat.completion.chunk`` events of one request: the first carries ``delta.role``, the last
    ``finish_reason`` and the ``adaptspec`` object, and with ``stream_options.include_usage`` one
    more with empty ``choices`` and the ``usage``."""

    def __init__(self, model: str, req: CompletionRequest) -> None:
        self.model, self.req = model, req
        self.created = int(time.time())
        self.started = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": f"chatcmpl-{self.req.request_id}",
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self.req.include_usage:
            chunk["usage"] = None
        return chunk

    def _delta(self, text: str) -> dict[str, Any]:
        delta = {} if self.started else {"role": "assistant"}
        self.started = True
        if text or "role" in delta:
            delta["content"] = text
        return delta

    def piece(self, text: str, ids: list[int]) -> dict[str, Any] | None:
        return (
            self._chunk(self._delta(text)) if text else None
        )  # ids whose text is held back: nothing to say yet

    def final(self, gen: "Generation", output: Output, tail: str) -> list[dict[str, Any]]:
        last = self._chunk(self._delta(tail), output.finish_reason)
        last["adaptspec"] = info(self.req, gen)
        chunks = [last]
        if self.req.include_usage:
            end = self._chunk({})
            end["choices"] = []
            end["usage"] = usage(self.req, output)
            chunks.append(end)
        return chunks
