"""The optional packages (pyproject.toml's extras: Ray, the redis client, the server's fastapi and
uvicorn), imported where they are used; a missing one is one line naming what needs it and the
extra that installs it.

>>> require("json", extra="serve", needed_by="this example").dumps([1])
'[1]'
>>> require("no_such_package", extra="ray", needed_by="--ray")
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: --ray needs no_such_package, which is not installed: pip install 'adaptspec[ray]'
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import AdaptspecError


def require(module: str, *, extra: str, needed_by: str) -> ModuleType:
    """``module`` imported; an :class:`~adaptspec.errors.AdaptspecError` naming ``needed_by`` (what
    needs it: an option, a command) and the pip ``extra`` when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise AdaptspecError(
            f"{needed_by} needs {module}, which is not installed: pip install 'adaptspec[{extra}]'"
        ) from None
