"""Stop sequences: where generated text ends, and how much of it may be sent while it grows.

A request's ``stop`` strings end its output where the first of them appears as the text grows
(the one complete at the earliest character; of two complete at the same character, the
longer), before that stop string, which is not returned. This depends on the text only, not on
how it arrives: generation cannot wait to see whether a longer stop string that began earlier
would complete too. Text arrives in pieces (a speculative round commits several
tokens, a streamed chunk carries a round), so a stop string can be split across pieces:
:class:`StopScanner` searches the whole text so far and holds back a tail that could still
become the start of a stop string. :class:`StopStream` does the same over token ids through a
tokenizer and says which token completed the stop string.

>>> s = StopScanner(["END"])
>>> s.push("abc E"), s.push("N"), s.push("Dxyz"), s.stopped
('abc ', '', '', True)
>>> s = StopScanner(["END"])
>>> s.push("abc EN"), s.push("d"), s.finish()
('abc ', 'ENd', '')
"""

from __future__ import annotations

from typing import Any, Sequence

from .codec import TextStream

__all__ = ["StopScanner", "StopStream", "MAX_STOPS", "MAX_STOP_CHARS"]

#: the most stop strings a request may give (the OpenAI API's limit)
MAX_STOPS = 4
#: the longest stop string accepted (a longer one costs more to hold back than it can be worth)
MAX_STOP_CHARS = 256


class StopScanner:
    """Text appended piece by piece; :meth:`push` returns what may be sent of it.

    Sent text never contains a stop string and is always a prefix of the final output:
    the text before the first stop string to appear (all of it when none does).
    """

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self.stops = tuple(s for s in stops if s)
        self.longest = max(map(len, self.stops), default=0)
        self.text = ""
        self.sent = 0  # characters of ``text`` sent
        self.end: int | None = None  # where the output ends, once a stop string has appeared
        self.stop_end: int | None = None  # where that stop string ends

    @property
    def stopped(self) -> bool:
        return self.end is not None

    def push(self, piece: str) -> str:
        """Append ``piece``; returns the text that is now safe to send ('' once stopped)."""
        if self.end is not None:
            return ""
        # an occurrence not seen before ends in the new text, so it starts at most longest - 1 earlier
        start = max(0, len(self.text) - self.longest + 1)
        self.text += piece
        hits = [(i + len(s), i) for s in self.stops if (i := self.text.find(s, start)) >= 0]
        if hits:
            self.stop_end, self.end = min(hits)  # complete first; then the longer (it began earlier)
            return self._release(self.end)
        return self._release(len(self.text) - self._held())

    def finish(self) -> str:
        """The text held back, at the end of generation (a stop string can no longer complete)."""
        return "" if self.end is not None else self._release(len(self.text))

    @property
    def output(self) -> str:
        """The output so far: the text before the first stop string, or all of it."""
        return self.text if self.end is None else self.text[: self.end]

    def _held(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _release(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        out, self.sent = self.text[self.sent : upto], upto
        return out


class StopStream:
    """Token ids arriving in pieces -> text deltas that stop at the first stop string.

    ``push(ids)`` returns ``(text, ids)``: the text safe to send now and the ids of this piece
    that belong to the output (all of them, or those up to and including the token that
    completed the stop string). :attr:`ids` and :attr:`text` are the whole output so far.

    >>> from adaptspec.serving.codec import CharCodec
    >>> c = CharCodec(); s = StopStream(c, ["\\n\\n"])
    >>> s.push(c.encode("Hi\\n")), s.push(c.encode("\\nBye")), s.stopped, s.ids == c.encode("Hi\\n\\n")
    (('Hi', [72, 105, 10]), ('', [10]), True, True)
    """

    def __init__(self, codec: Any, stops: Sequence[str] = ()) -> None:
        self.codec = codec
        self.text_stream = TextStream(codec)
        self.scanner = StopScanner(stops)
        self.ids: list[int] = []

    @property
    def stopped(self) -> bool:
        return self.scanner.stopped

    @property
    def text(self) -> str:
        return self.scanner.output

    def push(self, ids: Sequence[int]) -> tuple[str, list[int]]:
        if self.stopped:
            return "", []
        ids = [int(i) for i in ids]
        text = self.scanner.push(self.text_stream.push(ids))
        if self.stopped:
            ids = ids[: self._completing(ids)]
        self.ids.extend(ids)
        return text, ids

    def finish(self) -> str:
        """Everything still held back, once generation has ended."""
        if self.stopped:
            return ""
        return self.scanner.push(self.text_stream.flush()) + self.scanner.finish()

    def _completing(self, ids: list[int]) -> int:
        """How many of ``ids`` (this piece) it takes for the decoded text to hold the stop string."""
        need = self.scanner.stop_end
        assert need is not None
        for k in range(1, len(ids)):
            if len(self.codec.decode(self.ids + ids[:k]).rstrip("\ufffd")) >= need:
                return k
        return len(ids)
