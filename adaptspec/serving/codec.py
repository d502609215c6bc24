"""Text <-> token ids for the server, and incremental decoding for streamed text.

The bundled target brings its Hugging Face tokenizer (:class:`HFCodec`). Models without a
tokenizer take token-id prompts only (the OpenAI completions API accepts a list of ids as
``prompt``); the tiny development model uses :class:`CharCodec`, one token per printable
ASCII character, built offline.

>>> c = CharCodec()
>>> c.encode("Hi!"), c.decode([72, 105, 33, 3])
([72, 105, 33], 'Hi!')
>>> s = TextStream(c); s.push([72, 105]) + s.push([33])
'Hi!'
>>> c.decode(c.encode_chat([{"role": "user", "content": "Hi"}]))
'<user>Hi\\n<assistant>'
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from ..errors import AdaptspecError

__all__ = ["Codec", "CharCodec", "HFCodec", "TextStream"]


class Codec(Protocol):
    """What the server needs of a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class CharCodec:
    """Printable ASCII, tab and newline as their code points; anything else is ``unk`` (0).

    Ids 0-8 and 11-31 other than ``eos`` decode to nothing; ``eos`` is 3 (ASCII end of text).
    """

    vocab_size = 128
    unk = 0
    eos = 3

    def encode(self, text: str) -> list[int]:
        return [o if (32 <= (o := ord(ch)) < 127 or o in (9, 10)) else self.unk for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids if 32 <= i < 127 or i in (9, 10))

    #: a minimal chat template (the tiny model has no trained one); like many real ones it refuses some orders
    chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
        "{{ raise_exception('a system message must come first') }}{% endif %}"
        "<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Ids of ``messages`` rendered with :attr:`chat_template`, ending with the assistant's turn."""
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, _ = render_jinja_template(
            [messages], chat_template=self.chat_template, add_generation_prompt=True
        )
        return self.encode(rendered[0])


class HFCodec:
    """A Hugging Face tokenizer; with ``chat=True`` a text prompt becomes one user turn of the chat template."""

    def __init__(self, tokenizer: Any, chat: bool = False) -> None:
        self.tokenizer = tokenizer
        self.chat = bool(chat)
        if self.chat and not getattr(tokenizer, "chat_template", None):
            raise AdaptspecError("this tokenizer has no chat template: serve without --chat")

    def encode(self, text: str) -> list[int]:
        if self.chat:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        return [int(i) for i in self.tokenizer(text)["input_ids"]]

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Ids of ``messages`` in the tokenizer's chat template, ending with the assistant's turn."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise AdaptspecError("this model's tokenizer has no chat template: use /v1/completions")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


class TextStream:
    """Turns token ids arriving in pieces into text deltas that add up to ``decode(all ids)``.

    A delta is held back while the text ends in an incomplete character (U+FFFD).
    """

    def __init__(self, codec: Codec | None) -> None:
        self.codec = codec
        self.ids: list[int] = []
        self.sent = ""

    def push(self, ids: Sequence[int]) -> str:
        self.ids.extend(int(i) for i in ids)
        if self.codec is None:
            return ""
        text = self.codec.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        return self._delta(text)

    def flush(self) -> str:
        """Whatever is left (at the end of the stream)."""
        if self.codec is None:
            return ""
        return self._delta(self.codec.decode(self.ids))

    def _delta(self, text: str) -> str:
        if text.startswith(self.sent):
            delta = text[len(self.sent) :]
        else:  # the tokenizer re-spelled earlier text (rare): send nothing new for it
            delta = text[len(self.sent) :] if len(text) > len(self.sent) else ""
        self.sent = text if len(text) >= len(self.sent) else self.sent
        return delta
