"""A client's values in the plug-in's log lines: a few characters of them, and how long they were.

A request's ``adaptspec_variant`` and its id come from the client (vLLM's OpenAI server takes the
id from the request's ``request_id`` or an ``X-Request-Id`` header), so a log line never echoes
them whole: a string shows its first :data:`SHOWN` characters (escaped, as ``repr`` writes them: no
line break gets into the log) and its length when it is longer; any other value only its type.

>>> shown("A")
"'A'"
>>> shown("x" * 10_000)
"'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (10000 characters)"
>>> shown("a\\nb"), shown(["A"] * 1000)
("'a\\\\nb'", 'a value of type list')
"""

from __future__ import annotations

from typing import Any

__all__ = ["SHOWN", "shown"]

#: The most characters of a client's string a log line shows.
SHOWN = 32


def shown(value: Any) -> str:
    """``value`` as a log line may show it (see the module docstring)."""
    if not isinstance(value, str):
        return f"a value of type {type(value).__name__}"
    if len(value) <= SHOWN:
        return repr(value)
    return f"{value[:SHOWN]!r}... ({len(value)} characters)"
