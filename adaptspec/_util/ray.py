r"""Connecting to Ray (the ``ray`` extra), shared by the Ray collectors
(:mod:`adaptspec.collect.ray_tasks`) and the Ray replay sweeps (:mod:`adaptspec.simulators.ray_sweep`); private.

``--ray [ADDRESS]``: no address (or ``local``) starts a local Ray with this machine's CPUs; an
address joins a running cluster. Errors from Ray (not installed, unreachable, a task that
failed) become one-line :class:`~adaptspec.errors.AdaptspecError`\ s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from typing import Any

from ..errors import AdaptspecError
from .optional import require

#: what ``--ray`` accepts: nothing (a local Ray with this machine's CPUs), ``local``, ``auto`` (the
#: cluster this machine is part of), ``ray://HOST:PORT`` (Ray Client) or ``HOST:PORT`` (a head's GCS)
ADDRESS_HELP = (
    "run as Ray tasks: no ADDRESS (or 'local') starts a local Ray with this machine's CPUs; "
    "'auto' joins the cluster this machine belongs to; ray://HOST:PORT or HOST:PORT a remote one"
)
_HOSTPORT = re.compile(r"^(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


def parse_address(text: str) -> str:
    """An argparse type for ``--ray``: ``local``, ``auto``, ``ray://HOST:PORT`` or ``HOST:PORT``.

    >>> parse_address("auto"), parse_address("ray://head:10001"), parse_address("10.0.0.2:6379")
    ('auto', 'ray://head:10001', '10.0.0.2:6379')
    >>> parse_address("traces/mine")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected local, auto, ray://HOST:PORT or HOST:PORT, got 'traces/mine' (a positional argument goes before --ray)
    """
    import argparse

    if text in ("local", "auto") or _HOSTPORT.match(text):
        return text
    raise argparse.ArgumentTypeError(
        f"expected local, auto, ray://HOST:PORT or HOST:PORT, got {text!r} "
        "(a positional argument goes before --ray)"
    )


def connect(address: str | None = "local"):
    """``ray``, initialised: the running Ray when there is one, else a new local one (``address``
    None or ``local``: this machine's CPUs) or the cluster at ``address``. Returns
    ``(ray, started)``; ``started`` says this call started it (see :func:`session`)."""
    ray = require("ray", extra="ray", needed_by="--ray")
    if ray.is_initialized():
        return ray, False
    kw: dict[str, Any] = dict(log_to_driver=False, logging_level=logging.ERROR)
    try:
        if address in (None, "local"):
            ray.init(address="local", include_dashboard=False, **kw)
        else:
            if address != "auto":
                _reachable(address)
            with _quiet_stderr():  # Ray's C++ client logs a line per retry to fd 2
                ray.init(address=address, **kw)
    except AdaptspecError:
        raise
    except Exception as e:  # noqa: BLE001  (Ray raises ConnectionError, ValueError, RuntimeError, ...)
        msg = " ".join(str(e).split())[:300] or type(e).__name__
        raise AdaptspecError(f"cannot start or join Ray at {address or 'local'}: {msg}") from None
    return ray, True


@contextlib.contextmanager
def _quiet_stderr():
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse an address nothing answers at, at once (Ray itself retries for minutes)."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise AdaptspecError(
            f"cannot start or join Ray at {address}: nothing answers there ({e.strerror or type(e).__name__})"
        ) from None


@contextlib.contextmanager
def session(address: str | None = "local"):
    """:func:`connect` for the span of a command: shuts Ray down after it if it started it."""
    ray, started = connect(address)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def _cause(e: BaseException) -> BaseException:
    """A task's own exception (an AdaptspecError or OSError: the user's to fix) out of Ray's wrapper."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, (AdaptspecError, OSError)):
        return cause
    return e


def get(ray, refs):
    try:
        return ray.get(refs)
    except Exception as e:  # noqa: BLE001
        c = _cause(e)
        if c is e:
            raise
        raise c from None


def cluster_slots(ray, gpu: bool = False) -> int:
    """How many one-CPU (or one-GPU) tasks the cluster runs at once."""
    res = ray.cluster_resources()
    return max(1, int(res.get("GPU" if gpu else "CPU", 1)))
