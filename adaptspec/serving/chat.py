"""``/v1/chat/completions``: messages through the target's chat template, answers as chat completions.

A chat request is checked by :class:`~adaptspec.serving.openai_models.ChatRequest` (messages,
stop, stream options, unsupported fields), its messages are rendered with the tokenizer's chat
template ending with the assistant's turn, and from there it is a completion request like any
other: the same limits, variant routing, decision log and metrics
(:meth:`~adaptspec.serving.service.CompletionService.request`). Answers are OpenAI
``chat.completion`` objects, or ``chat.completion.chunk`` events when streamed: the first
carries ``delta.role``, the last ``finish_reason`` and the ``adaptspec`` object, and with
``stream_options.include_usage`` one more with empty ``choices`` and the ``usage``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .openai_models import ChatRequest, validate
from .request_error import RequestError
from .service import CompletionRequest, CompletionService, Output

if TYPE_CHECKING:
    from ..control.generation import Generation

__all__ = ["ChatChunks", "chat_body", "parse_chat"]


def parse_chat(service: CompletionService, body: bytes, variant_header: str | None = None) -> CompletionRequest:
    """Check a ``/v1/chat/completions`` body; raises :class:`RequestError` naming the problem."""
    data = service.read_json(body)
    chat = validate(ChatRequest, data)
    encode_chat = getattr(service.codec, "encode_chat", None)
    if encode_chat is None:
        raise RequestError("this model has no tokenizer with a chat template: use /v1/completions", param="messages")
    try:
        ids = encode_chat(chat.chat())
    except Exception as e:  # noqa: BLE001 - the template refusing these messages (raise_exception, types)
        why = " ".join(str(e).split()) or type(e).__name__
        raise RequestError(f"messages cannot be rendered with this model's chat template: {why}",
                           param="messages") from None
    if chat.max_completion_tokens is not None:
        data = {**data, "max_tokens": chat.max_completion_tokens}
    return service.request(data, ids, variant_header, options=chat)


def chat_body(service: CompletionService, req: CompletionRequest, gen: "Generation", output: Output) -> dict[str, Any]:
    """A non-streamed answer."""
    return {
        "id": f"chatcmpl-{req.request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": service.model_name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": output.text},
                     "logprobs": None, "finish_reason": output.finish_reason}],
        "usage": service.usage(req, output),
        "adaptspec": service.info(req, gen),
    }


class ChatChunks:
    """``chat.completion.chunk`` events of one request (a :class:`~adaptspec.serving.streaming.ChunkFormat`)."""

    def __init__(self, service: CompletionService, req: CompletionRequest) -> None:
        self.service, self.req = service, req
        self.created = int(time.time())
        self.started = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": f"chatcmpl-{self.req.request_id}", "object": "chat.completion.chunk", "created": self.created,
            "model": self.service.model_name,
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
        return self._chunk(self._delta(text)) if text else None  # ids whose text is held back: nothing to say yet

    def final(self, gen: "Generation", output: Output, tail: str) -> list[dict[str, Any]]:
        last = self._chunk(self._delta(tail), output.finish_reason)
        last["adaptspec"] = self.service.info(self.req, gen)
        chunks = [last]
        if self.req.include_usage:
            usage = self._chunk({})
            usage["choices"] = []
            usage["usage"] = self.service.usage(self.req, output)
            chunks.append(usage)
        return chunks
