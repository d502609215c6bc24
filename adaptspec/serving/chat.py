"""``/v1/chat/completions``: messages through the target's chat template, answers as chat completions.

A chat request is checked by :class:`~adaptspec.serving.openai_models.ChatRequest` (messages,
stop, stream options, unsupported fields), its messages are rendered with the tokenizer's chat
template ending with the assistant's turn, and from there it is a completion request like any
other: the same limits, variant routing, decision log and metrics
(:meth:`~adaptspec.serving.service.CompletionService.request`). Answers are OpenAI
``chat.completion`` objects, or ``chat.completion.chunk`` events when streamed
(:func:`~adaptspec.serving.responses.chat_body`, :class:`~adaptspec.serving.responses.ChatChunks`).
"""

from __future__ import annotations

from .openai_models import ChatRequest, validate
from .request_error import RequestError
from .service import CompletionRequest, CompletionService

__all__ = ["parse_chat"]


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

