"""Build policies from CLI spec strings: ``fixed:16``, ``random``, ``linucb:alpha=0.5,lam=2``.

A spec is ``NAME`` or ``NAME:ARGS`` where ``ARGS`` is a comma-separated list of positional
values and ``key=value`` options (values may not contain commas). ``REGISTRY`` maps each name
to a factory called as ``factory(arms, seed=seed, **options)``; a policy class whose
constructor takes ``(arms, seed=None, ...)`` is a factory as it is. Values are converted
by the factory's type hints (int, float, bool, str, paths, and ``X | None`` of those; for
``**kwargs`` the hints of the base classes' constructors); without a hint they are read as
int, float or bool when they look like one, else kept as text.

>>> make_policy("fixed:16", arms=[1, 8, 16]).label
'fixed:16'
>>> make_policy("random:epsilon=0.5", arms=[1, 8]).epsilon
0.5
>>> parse_spec("neural-linear:head=/tmp/h.pt,alpha=0.5")
('neural-linear', [], {'head': '/tmp/h.pt', 'alpha': '0.5'})
"""

from __future__ import annotations

import inspect
import os
import types
import typing
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import AdaptspecError
from .base import Policy
from .baselines import Fixed, Oracle, RandomPolicy


def _fixed(
    arms: Sequence[int], seed: int | None = None, block_size: int | None = None, *, epsilon: float = 0.0
) -> Fixed:
    if block_size is None:
        raise AdaptspecError("fixed needs a block size, e.g. fixed:16")
    return Fixed(block_size, arms=arms, seed=seed, epsilon=epsilon)


#: spec name -> factory(arms, seed=None, **options) returning a Policy
REGISTRY: dict[str, Callable[..., Policy]] = {
    "fixed": _fixed,
    "random": RandomPolicy,
    "oracle": Oracle,
}

# Learning policies (one module each: epsilon_greedy, exp3, lints, linucb, thompson, ucb,
# offline_head, neural_linear, squarecb, fi_ucb, fi_linucb,
# river_adapter); none of these imports torch or river until a policy that needs it is built.
from .epsilon_greedy import EpsilonGreedy  # noqa: E402
from .exp3 import EXP3  # noqa: E402
from .fi_linucb import FullInfoLinUCB  # noqa: E402
from .fi_ucb import FullInfoUCB  # noqa: E402
from .lints import LinTS  # noqa: E402
from .linucb import LinUCB  # noqa: E402
from .neural_linear import neural_linear_policy  # noqa: E402
from .offline_head import head_policy  # noqa: E402
from .river_adapter import river_policy  # noqa: E402
from .squarecb import SquareCB  # noqa: E402
from .thompson import ThompsonSampling  # noqa: E402
from .ucb import UCB, ucb_throughput  # noqa: E402

REGISTRY.update(
    {
        "eps-greedy": EpsilonGreedy,
        "ucb": UCB,
        "ucb-throughput": ucb_throughput,
        "ts": ThompsonSampling,
        "exp3": EXP3,
        "linucb": LinUCB,
        "lints": LinTS,
        "head": head_policy,
        "neural-linear": neural_linear_policy,
        "squarecb": SquareCB,
        "river": river_policy,
        # full information (graph feedback): learn every arm a request's rounds reveal (update_full)
        "fi-ucb": FullInfoUCB,
        "fi-linucb": FullInfoLinUCB,
    }
)


def parse_spec(spec: str) -> tuple[str, list[str], dict[str, str]]:
    """Split a spec into its name, positional values and ``key=value`` options (all text)."""
    if not isinstance(spec, str) or not spec.strip():
        raise AdaptspecError(f"empty policy spec {spec!r}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip().lower()
    args: list[str] = []
    kwargs: dict[str, str] = {}
    if rest.strip():
        for part in rest.split(","):
            part = part.strip()
            if not part:
                raise AdaptspecError(f"policy spec {spec!r}: empty value between commas")
            if "=" in part:
                k, _, v = part.partition("=")
                k = k.strip().replace("-", "_")
                if not k.isidentifier():
                    raise AdaptspecError(f"policy spec {spec!r}: bad option name {k!r}")
                if k in kwargs:
                    raise AdaptspecError(f"policy spec {spec!r}: option {k!r} given twice")
                kwargs[k] = v.strip()
            else:
                if kwargs:
                    raise AdaptspecError(
                        f"policy spec {spec!r}: positional value {part!r} after key=value options"
                    )
                args.append(part)
    return name, args, kwargs


def _params(factory: Callable[..., Any]) -> tuple[list[inspect.Parameter], dict[str, Any], bool]:
    """Options a factory takes after (arms, seed): parameters, type hints, and whether it has **kwargs."""
    target = factory.__init__ if inspect.isclass(factory) else factory
    sig = inspect.signature(target)
    ps = [p for p in sig.parameters.values() if p.name not in ("self", "arms", "seed")]
    var_kw = any(p.kind is p.VAR_KEYWORD for p in ps)
    ps = [p for p in ps if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    hints = _hints(target)
    if var_kw and inspect.isclass(factory):  # options forwarded to base classes
        for base in factory.__mro__[1:]:
            init = base.__dict__.get("__init__")
            if init is None or base is object:
                continue
            bsig = inspect.signature(init)
            bh = _hints(init)
            for p in bsig.parameters.values():
                if p.name in ("self", "arms", "seed") or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                    continue
                if all(q.name != p.name for q in ps):
                    ps.append(p.replace(kind=p.KEYWORD_ONLY))
                    if p.name in bh:
                        hints[p.name] = bh[p.name]
            if not any(p.kind is p.VAR_KEYWORD for p in bsig.parameters.values()):
                var_kw = False
                break
    return ps, hints, var_kw


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back to guessing
        return {}


def _convert(value: str, hint: Any, where: str) -> Any:
    if hint is None or hint is Any:
        return _guess(value)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        opts = [a for a in typing.get_args(hint) if a is not type(None)]
        if value.lower() in ("none", "null") and len(opts) < len(typing.get_args(hint)):
            return None
        errors = []
        for a in opts:
            try:
                return _convert(value, a, where)
            except AdaptspecError as e:
                errors.append(str(e))
        raise AdaptspecError(errors[0] if len(errors) == 1 else f"{where}: cannot read {value!r}")
    if hint is bool:
        v = value.lower()
        if v in ("1", "true", "yes", "on"):
            return True
        if v in ("0", "false", "no", "off"):
            return False
        raise AdaptspecError(f"{where} must be true or false, got {value!r}")
    if hint is int:
        try:
            return int(value)
        except ValueError:
            raise AdaptspecError(f"{where} must be an integer, got {value!r}") from None
    if hint is float:
        try:
            return float(value)
        except ValueError:
            raise AdaptspecError(f"{where} must be a number, got {value!r}") from None
    if hint in (Path, os.PathLike) or (inspect.isclass(hint) and issubclass(hint, os.PathLike)):
        return Path(value).expanduser()
    if hint is str:
        return value
    return _guess(value)


def _guess(value: str) -> Any:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    return value


def make_policy(spec: str, arms: Sequence[int], seed: int | None = None, **kwargs: Any) -> Policy:
    """Build the policy a spec names, for ``arms``; ``kwargs`` add or override options."""
    factory, values = check_spec(spec)
    values.update(kwargs)
    try:
        return factory(tuple(arms), seed=seed, **values)
    except TypeError as e:
        raise AdaptspecError(f"policy spec {spec!r}: {e}") from None


def check_spec(spec: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The factory a spec names and its options, converted: everything about a spec that can be
    checked without arms or a model (an unknown policy or option, a value of the wrong type).

    >>> check_spec("ucb:c=x")
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: ucb: c must be a number, got 'x'
    """
    name, args, opts = parse_spec(spec)
    factory = REGISTRY.get(name)
    if factory is None:
        raise AdaptspecError(
            f"unknown policy {name!r} in spec {spec!r}: known policies are {', '.join(sorted(REGISTRY))}"
        )
    params, hints, var_kw = _params(factory)
    names = [p.name for p in params]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(args) > len(positional):
        takes = ", ".join(p.name for p in positional) or "no positional values"
        raise AdaptspecError(f"policy spec {spec!r}: too many positional values ({name} takes {takes})")
    values: dict[str, Any] = {}
    for p, v in zip(positional, args):
        values[p.name] = _convert(v, hints.get(p.name), f"{name}: {p.name}")
    for k, v in opts.items():
        if k not in names and not var_kw:
            raise AdaptspecError(
                f"policy spec {spec!r}: unknown option {k!r} ({name} takes {', '.join(names) or 'none'})"
            )
        if k in values:
            raise AdaptspecError(f"policy spec {spec!r}: {k!r} given twice")
        values[k] = _convert(v, hints.get(k), f"{name}: {k}")
    return factory, values


def describe(name: str) -> str:
    """``name:opt=default,...`` for help texts."""
    params, _, _ = _params(REGISTRY[name])
    opts = [p.name if p.default is p.empty else f"{p.name}={p.default}" for p in params]
    return f"{name}:{','.join(opts)}" if opts else name
