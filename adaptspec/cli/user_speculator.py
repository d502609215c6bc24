"""``--speculator MODULE:FACTORY``: your own speculator for ``adaptspec collect``, ``profile-latency``
and ``serve``.

``FACTORY`` is a callable in the importable module ``MODULE`` (the current directory is on the
import path, as with ``python -m``); it is called with no arguments and returns a speculator:
the protocol (:class:`~adaptspec.speculator.BlockSpeculator`: ``max_block_size``, ``prefill``,
``decode``, checked as ``AdaptiveController`` checks it) and what the command needs to turn text
into token ids and back:

``codec``
    an object with ``encode(text) -> list[int]`` and ``decode(ids) -> str``: how ``collect``
    and ``profile-latency`` encode their prompts and how ``serve`` reads and writes text
    (:class:`adaptspec.serving.codec.HFCodec` wraps a Hugging Face tokenizer; an
    ``encode_chat(messages)`` also serves ``/v1/chat/completions``).

and two optional declarations (absent: None):

``vocab_size: int``
    ``serve`` refuses prompts with token ids outside ``0..vocab_size - 1`` (a 400);
``max_context: int``
    ``serve`` refuses a prompt whose tokens plus ``max_tokens`` exceed it (a 400).

Every fault is one line naming the path: a module that is not found or fails to import, a
missing attribute, something not callable, a factory that raises, or a result that is not such a
speculator.

>>> speculator_path("examples.byo_dflash:make")
'examples.byo_dflash:make'
>>> speculator_path("examples/byo_dflash.py")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected MODULE:FACTORY (an importable module and a callable in it, e.g. mypackage.spec:make), got 'examples/byo_dflash.py'
>>> load_speculator_factory("json:loads")
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: --speculator json:loads: loads() raised TypeError: loads() missing 1 required positional argument: 's'
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import AdaptspecError

__all__ = [
    "SPECULATOR_HELP",
    "UserSpeculator",
    "load_speculator_factory",
    "model_flags_given",
    "speculator_path",
]

SPECULATOR_HELP = (
    "your own speculator: MODULE:FACTORY, a callable (importable from the current directory or the "
    "Python path) returning a BlockSpeculator with a codec (docs/bring-your-own.md); instead of the "
    "bundled models"
)


def speculator_path(text: str) -> str:
    """The argparse type of ``--speculator``: the ``MODULE:FACTORY`` form (nothing is imported yet)."""
    module, sep, attr = text.partition(":")
    if not (sep and _dotted(module) and _dotted(attr)):
        raise argparse.ArgumentTypeError(
            "expected MODULE:FACTORY (an importable module and a callable in it, e.g. "
            f"mypackage.spec:make), got {text!r}"
        )
    return text


def _dotted(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


@dataclass(frozen=True)
class UserSpeculator:
    """A speculator made by ``--speculator``, with what the command reads from it, checked once."""

    path: str
    speculator: Any
    codec: Any
    vocab_size: int | None
    max_context: int | None


def load_speculator_factory(path: str) -> UserSpeculator:
    """Import ``MODULE``, call ``FACTORY()`` and check what it returns (see the module docstring)."""
    module, _, attr = speculator_path(path).partition(":")
    where = f"--speculator {path}"
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m`: a module next to the user is importable
    try:
        obj: Any = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            raise AdaptspecError(
                f"{where}: no module named {e.name!r} (not in the current directory or on the Python path)"
            ) from None
        raise AdaptspecError(f"{where}: importing {module} failed: {_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - the user's module raised while it was imported
        raise AdaptspecError(f"{where}: importing {module} raised {type(e).__name__}: {_line(e)}") from None
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = ".".join([module] + attr.split(".")[:i])
            raise AdaptspecError(f"{where}: {owner} has no attribute {part!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise AdaptspecError(
            f"{where}: {attr} is a {type(obj).__name__}, not callable (it must be a function "
            "that returns a speculator)"
        )
    try:
        spec = obj()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's factory failed
        raise AdaptspecError(f"{where}: {attr}() raised {type(e).__name__}: {_line(e)}") from None
    return _checked(where, attr, spec)


def _checked(where: str, attr: str, spec: Any) -> UserSpeculator:
    from ..control.protocol import speculator_shape

    what = f"{where}: {attr}() returned a {type(spec).__name__}"
    try:
        speculator_shape(spec)  # the protocol, as AdaptiveController checks it
    except AdaptspecError as e:
        raise AdaptspecError(f"{what}, not a speculator: {e}") from None
    codec = getattr(spec, "codec", None)
    if not all(callable(getattr(codec, m, None)) for m in ("encode", "decode")):
        raise AdaptspecError(
            f"{what} without a codec: the command needs speculator.codec with encode(text) -> "
            "list[int] and decode(ids) -> str (HFCodec(tokenizer) for a Hugging Face tokenizer)"
        )
    declared = {}
    for name in ("vocab_size", "max_context"):
        v = getattr(spec, name, None)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise AdaptspecError(f"{what} whose {name} is {v!r}: an integer >= 1, or None (not declared)")
        declared[name] = v
    return UserSpeculator(where.removeprefix("--speculator "), spec, codec, **declared)


def model_flags_given(args: argparse.Namespace, defaults: dict[str, Any]) -> None:
    """One line when ``--speculator`` comes with a flag that chooses or places adaptspec's own models
    (``defaults``: flag -> its default; a flag whose value differs from it was given)."""
    if getattr(args, "speculator", None) is None:
        return
    for flag, default in defaults.items():
        if getattr(args, flag.lstrip("-").replace("-", "_")) != default:
            raise AdaptspecError(
                f"{flag} chooses or places adaptspec's own models; --speculator brings its own "
                f"(the factory builds and places it): drop {flag}"
            )


def _line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def add_model_options(p: argparse.ArgumentParser, not_with: str) -> None:
    """The speculator a command runs: ``--speculator``, or the target and drafter and how they run
    (:func:`speculator_from_flags`); ``not_with``: the other flags ``--speculator`` excludes, as its
    help lists them."""
    from ._types import device, threads

    p.add_argument(
        "--speculator",
        type=speculator_path,
        default=None,
        metavar="MODULE:FACTORY",
        help=f"{SPECULATOR_HELP} (not with --target, --drafter, --verification, --dtype, --device{not_with})",
    )
    p.add_argument("--target", default=None, help="target model directory (default: bundled SmolLM2)")
    p.add_argument(
        "--drafter",
        default=None,
        help="drafter directory: adaptspec's own or a published DFlash v1 one (default: the bundled drafter)",
    )
    p.add_argument(
        "--verification",
        choices=["fast", "exact"],
        default="fast",
        help="fast: the model's own kernels, plain speed at B=1 (default); exact: bit-identical to one-token greedy, slower",
    )
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--device",
        type=device,
        default="cpu",
        help="cpu, cuda, cuda:N or mps (checked before the model loads)",
    )
    p.add_argument("--threads", type=threads, default=None)


def speculator_from_flags(args: argparse.Namespace) -> Any:
    """The speculator :func:`add_model_options`' target and drafter flags describe, loaded."""
    from ..models import load_speculator

    return load_speculator(
        args.target,
        args.drafter,
        dtype=args.dtype,
        device=args.device,
        threads=args.threads,
        verification=args.verification,
    )
