"""A river object's learnt state as data only (numbers, strings, arrays), and back: no pickle.

:func:`dump` walks a river object (a bandit policy, a regressor pipeline) and writes what it
holds as nested plain values: scalars as they are, numpy arrays, and one-key dicts for the rest
(``{"obj": {attr: ...}, "type": "module.Class", "id": n}``, ``{"map": [[key, value], ...], "id":
n}``, ``{"list": [...]}``, ``{"tuple": [...]}``, ``{"set": [...]}``, ``{"random": [version,
ints, gauss]}``; ``{"ref": n}`` for an object or mapping met before in the same walk, so that
what the river object shares stays shared; ``{"keep": True}`` for what is not state: methods,
functions, classes).

:func:`fill` reads such a value *into a fresh clone of the policy's own template*: every object
it sets attributes on already exists in that clone (or is made by the clone's own factories,
such as a ``defaultdict``'s), and must be of the type the state names; the state never names a
type to build or a function to call. So a state file, whatever it holds, can only set numbers,
strings and arrays on objects the adapter built itself; anything else is one
:class:`~adaptspec.errors.AdaptspecError`.

>>> from river import bandit
>>> trained = bandit.UCB(delta=1.0, seed=0)
>>> for arm, r in ((4, 1.0), (8, 0.0), (4, 0.5)):
...     trained.update(arm, r)
>>> fresh = fill(bandit.UCB(delta=1.0, seed=0), dump(trained))
>>> fresh._n, fresh._rewards[4].get(), dict(fresh._counts)
(3, 0.75, {4: 2, 8: 1})
>>> fill(bandit.UCB(delta=1.0, seed=0), {"obj": {}, "type": "os.system", "id": 0})
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: river state: holds a os.system where the policy has a river.bandit.ucb.UCB
"""

from __future__ import annotations

import functools
import random
import types
from typing import Any

import numpy as np

from ..errors import AdaptspecError

__all__ = ["dump", "fill"]

_SCALARS = (bool, int, float, str, type(None))
_MAX_DEPTH = 48
_KEEP = {"keep": True}
_CODE = (
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.BuiltinMethodType,
    type,
    functools.partial,
)


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _map_like(obj: Any) -> bool:
    """A dict, or a mapping object without attributes of its own (river's ``VectorDict``)."""
    return isinstance(obj, dict) or (
        not hasattr(obj, "__dict__") and all(hasattr(obj, m) for m in ("items", "clear", "__setitem__"))
    )


def dump(obj: Any) -> Any:
    """``obj``'s state as plain values (see the module docstring); an object with no data-only form raises."""
    return _dump(obj, {}, 0)


def _dump(obj: Any, seen: dict[int, int], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise AdaptspecError("river state: nested too deep to save")
    if isinstance(obj, _SCALARS):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biufc":
            raise AdaptspecError(f"river state: an array of {obj.dtype} has no data-only form")
        return {
            "array": obj.copy(order="K")
        }  # the memory order too (river updates some in place, Fortran-ordered)
    if isinstance(obj, random.Random):
        version, ints, gauss = obj.getstate()
        return {"random": [version, list(ints), gauss]}
    if isinstance(obj, _CODE):
        return _KEEP  # a method, a function, a class: part of the code, not of the state
    if id(obj) in seen:
        return {"ref": seen[id(obj)]}  # written where it was met first
    d = depth + 1
    if isinstance(obj, (list, tuple)):
        return {"list" if isinstance(obj, list) else "tuple": [_dump(v, seen, d) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        if not all(isinstance(v, _SCALARS) for v in obj):
            raise AdaptspecError("river state: a set of objects has no data-only form")
        return {"set": sorted(obj, key=repr)}
    if _map_like(obj):
        n = seen[id(obj)] = len(seen)
        return {"map": [[_dump_key(k), _dump(v, seen, d)] for k, v in obj.items()], "id": n}
    if hasattr(obj, "__dict__"):
        n = seen[id(obj)] = len(seen)
        return {"obj": {k: _dump(v, seen, d) for k, v in vars(obj).items()}, "type": _type_name(obj), "id": n}
    raise AdaptspecError(f"river state: a {_type_name(obj)} has no data-only form")


def _dump_key(key: Any) -> Any:
    if isinstance(key, _SCALARS):
        return key
    if isinstance(key, tuple) and all(isinstance(k, _SCALARS) for k in key):
        return {"tuple": list(key)}
    raise AdaptspecError(f"river state: a dict key {type(key).__name__} has no data-only form")


def fill(current: Any, node: Any) -> Any:
    """The value ``node`` describes, read into ``current`` (an object of the fresh clone) where it is one."""
    return _fill(current, node, {}, 0)


def _fill(cur: Any, node: Any, memo: dict[int, Any], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise AdaptspecError("river state: nested too deep")
    if isinstance(node, _SCALARS):
        if not isinstance(cur, _SCALARS + (np.generic,)):
            raise AdaptspecError(f"river state: a value {node!r} where the policy has a {_type_name(cur)}")
        return node
    if not isinstance(node, dict) or not 1 <= len(node) <= 3:
        raise AdaptspecError(f"river state: unexpected {type(node).__name__} in the state")
    kind = next(iter(node))
    d = depth + 1
    if kind == "keep" and node == _KEEP:
        return cur
    if kind == "ref":
        if set(node) != {"ref"} or not isinstance(node["ref"], int) or node["ref"] not in memo:
            raise AdaptspecError("river state: a reference to nothing read before")
        return memo[node["ref"]]
    if kind == "array":
        arr = node["array"]
        if (
            not isinstance(arr, np.ndarray)
            or arr.dtype.kind not in "biufc"
            or not isinstance(cur, (np.ndarray, type(None)))
        ):
            raise AdaptspecError("river state: an array where the policy has none")
        return np.array(arr, order="K")
    if kind == "random":
        return _fill_random(cur, node["random"])
    if kind in ("list", "tuple"):
        items = node[kind]
        if not isinstance(items, list):
            raise AdaptspecError(f"river state: {kind} is not a list")
        old = list(cur) if isinstance(cur, (list, tuple)) and len(cur) == len(items) else [None] * len(items)
        out = [_fill(o, v, memo, d) for o, v in zip(old, items)]
        return out if kind == "list" else tuple(out)
    if kind == "set":
        items = node["set"]
        if not isinstance(items, list) or not all(isinstance(v, _SCALARS) for v in items):
            raise AdaptspecError("river state: a set of other than plain values")
        return frozenset(items) if isinstance(cur, frozenset) else set(items)
    if kind in ("map", "obj") and not (isinstance(node.get("id"), int) and node["id"] not in memo):
        raise AdaptspecError(f"river state: a {kind} without its own id")
    if kind == "map" and set(node) == {"map", "id"}:
        return _fill_map(cur, node["map"], memo, node["id"], d)
    if kind == "obj" and set(node) == {"obj", "type", "id"}:
        if cur is None or _type_name(cur) != node["type"] or not hasattr(cur, "__dict__"):
            raise AdaptspecError(
                f"river state: holds a {node['type']} where the policy has a "
                f"{'nothing' if cur is None else _type_name(cur)}"
            )
        attrs = node["obj"]
        if not isinstance(attrs, dict):
            raise AdaptspecError("river state: an object's attributes are not a mapping")
        memo[node["id"]] = cur
        for name, value in attrs.items():
            if (
                not isinstance(name, str)
                or not name.isidentifier()
                or (name.startswith("__") and name.endswith("__"))
            ):
                raise AdaptspecError(f"river state: attribute name {name!r}")
            setattr(cur, name, _fill(getattr(cur, name, None), value, memo, d))
        return cur
    raise AdaptspecError(f"river state: unknown entry {kind!r}")


def _fill_random(cur: Any, state: Any) -> random.Random:
    if not isinstance(cur, random.Random):
        raise AdaptspecError("river state: a random generator's state where the policy has none")
    try:
        version, ints, gauss = state
        if not (isinstance(ints, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ints)):
            raise TypeError("not integers")
        cur.setstate((version, tuple(ints), gauss))
    except (TypeError, ValueError, OverflowError) as e:
        raise AdaptspecError(f"river state: not a random generator's state ({e})") from None
    return cur


def _fill_map(cur: Any, pairs: Any, memo: dict[int, Any], ident: int, depth: int) -> Any:
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise AdaptspecError("river state: a mapping is not a list of [key, value] pairs")
    if cur is None:
        cur = {}
    elif not _map_like(cur):
        raise AdaptspecError(f"river state: a mapping where the policy has a {_type_name(cur)}")
    memo[ident] = cur
    factory = getattr(cur, "default_factory", None)
    items = []
    for knode, vnode in pairs:
        key = _key(knode)
        old = cur[key] if key in cur else (factory() if factory is not None else None)
        items.append((key, _fill(old, vnode, memo, depth)))
    cur.clear()
    for key, value in items:
        cur[key] = value
    return cur


def _key(node: Any) -> Any:
    if isinstance(node, _SCALARS):
        return node
    if (
        isinstance(node, dict)
        and set(node) == {"tuple"}
        and isinstance(node["tuple"], list)
        and all(isinstance(k, _SCALARS) for k in node["tuple"])
    ):
        return tuple(node["tuple"])
    raise AdaptspecError("river state: a mapping key that is not a plain value")
