"""The request fields of the OpenAI-style endpoints that are checked with pydantic.

:class:`GenerationOptions` holds what ``/v1/completions`` and ``/v1/chat/completions`` share
beyond the service's own checks (``stop``, ``stream_options``, ``model``);
:class:`ChatRequest` adds ``messages`` and the chat fields. :func:`validate` turns a body into
one of them or raises :class:`~adaptspec.serving.service.RequestError` with one line naming the
field and the value (the first problem found).

>>> validate(GenerationOptions, {"stop": "\\n\\n", "prompt": "x"}).stop
('\\n\\n',)
>>> validate(ChatRequest, {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}).chat()
[{'role': 'user', 'content': 'Hi'}]
>>> validate(ChatRequest, {"messages": [{"role": "tool", "content": "42"}]})
Traceback (most recent call last):
...
adaptspec.serving.request_error.RequestError: messages.0.role: input should be 'system', 'developer', 'user' or 'assistant', got 'tool'
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .request_error import RequestError, short as _short
from .stops import MAX_STOP_CHARS, MAX_STOPS

__all__ = ["ChatMessage", "ChatRequest", "GenerationOptions", "StreamOptions", "validate"]


class _Checked(BaseModel):
    # strict: no silent coercion ("1" is not 1, 1 is not true); other fields are the service's to check
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Checked):
    include_usage: bool = False


class GenerationOptions(_Checked):
    """Fields both endpoints take: ``stop`` (a string or up to 4), ``stream_options``, ``model``."""

    stop: tuple[str, ...] = ()
    stream_options: StreamOptions | None = None
    model: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, v: Any) -> tuple[str, ...]:
        if v is None or v == "" or v == []:
            return ()
        stops = [v] if isinstance(v, str) else v
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ValueError(f"stop must be a string or a list of strings, got {_short(v)}")
        if len(stops) > MAX_STOPS:
            raise ValueError(f"stop has {len(stops)} sequences; at most {MAX_STOPS} are allowed")
        for s in stops:
            if not s or len(s) > MAX_STOP_CHARS:
                raise ValueError(
                    f"each stop sequence must have 1..{MAX_STOP_CHARS} characters, got {_short(s)}"
                )
        return tuple(stops)


class ChatMessage(_Checked):
    """One message; ``content`` is text or a list of text parts (joined with newlines)."""

    model_config = ConfigDict(strict=True, extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: str
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, v: Any) -> str:
        if isinstance(v, str):
            return v
        if v is None:
            raise ValueError("content is required (text)")
        if not isinstance(v, list):
            raise ValueError(f"content must be a string or a list of text parts, got {_short(v)}")
        texts = []
        for i, part in enumerate(v):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ValueError(
                    f"content part {i} has type {_short(kind)}: this model takes text parts only"
                )
            if not isinstance(part.get("text"), str):
                raise ValueError(f"content part {i} needs a string 'text', got {_short(part.get('text'))}")
            texts.append(part["text"])
        return "\n".join(texts)

    @model_validator(mode="after")
    def _nothing_else(self) -> "ChatMessage":
        for key, value in (self.model_extra or {}).items():
            if value not in (None, [], {}, ""):  # a client echoing a response back sends refusal: null etc.
                raise ValueError(f"{key} is not supported by this server (no tool calls, audio or refusals)")
        return self

    def turn(self) -> dict[str, str]:
        """The message as the chat template takes it (``developer`` is the newer name of ``system``)."""
        return {"role": "system" if self.role == "developer" else self.role, "content": self.content}


#: chat fields this server does not implement, with their neutral values
_CHAT_UNSUPPORTED = {
    "n": (None, 1),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "logit_bias": (None, {}),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
}


class _Unsupported(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ChatRequest(GenerationOptions):
    """A ``/v1/chat/completions`` body (the service checks ``max_tokens``, ``temperature``, ``seed``...)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # the chat name of max_tokens

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, neutral in _CHAT_UNSUPPORTED.items():
                if name in data and not any(type(data[name]) is type(v) and data[name] == v for v in neutral):
                    raise _Unsupported(name, f"{name}={_short(data[name])} is not supported by this server")
        return data

    def chat(self) -> list[dict[str, str]]:
        return [m.turn() for m in self.messages]


def validate(model: type[_Checked], data: dict[str, Any]) -> Any:
    """``model`` checked from a request body, or a :class:`RequestError` naming the first problem."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _one_line(e.errors()[0]) from None


def _one_line(err: dict[str, Any]) -> RequestError:
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "value_error":
        msg = str(err["ctx"]["error"])
        if loc and not msg.startswith(loc):
            msg = f"{loc}: {msg}"
    elif err["type"] == "missing":
        msg = f"{loc} is required"
    else:
        text = err["msg"][:1].lower() + err["msg"][1:]
        msg = f"{loc}: {text}, got {_short(err['input'])}"
    param = getattr(err.get("ctx", {}).get("error"), "field", None) or (
        str(err["loc"][0]) if err["loc"] else None
    )
    return RequestError(msg, param=param)
