"""Featurizer: the one map from a speculator's prefill features to a policy's context.

A speculator's prefill representation is wide (the bundled target gives 1,153 numbers: the
last and the mean hidden state and the log prompt length), on very different scales, and a
contextual policy learns faster on a few well-scaled numbers. The featurizer is fitted once,
offline, on a trace set's features and then frozen, so the same object maps features in
replay, in training the head and online:

- ``identity``: the features as they are (only checked);
- ``standardize``: ``z = (x - mean) / scale`` per feature (constant features get scale 1);
- ``pca`` (default for :meth:`Featurizer.fit`): standardise, then project on the leading
  principal components of the fitted features, whitened (each output has unit variance on the
  fitted set), optionally followed by some raw columns kept as they are, standardised (``keep``:
  e.g. ``[-1]``, the log prompt length, which must not be lost in a low-variance direction).

Outputs are float64 arrays whose values are rounded to float32, because contexts are stored
as float32 in trace sets and decision logs: a context read back from a log is bit for bit the
context the policy saw online, and a row is mapped the same whether it comes alone
(:meth:`__call__`) or in a batch (:meth:`transform`; the product is computed with a kernel
whose rows do not depend on the batch).

Standardisation happens here and only here for raw features. The policies keep their own
affine maps (the offline head's ``x_mean`` / ``x_scale``, LinUCB's ``Standardizer``) because
they cannot assume a featurizer ran; fitted on this featurizer's (already whitened) output
they come out as mean ~0 and scale ~1, i.e. a no-op, so nothing is standardised twice in
effect, and their reward standardisation, which the featurizer does not do, stays with them.

>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(200, 6)) * [1, 10, 100, 1, 1, 1]
>>> f = Featurizer.fit(X, dim=3, keep=[-1])
>>> f.kind, f.in_dim, f.out_dim
('pca', 6, 4)
>>> Z = f.transform(X)
>>> bool(np.allclose(Z.std(axis=0), 1.0, atol=1e-3)), bool(np.array_equal(f(X[7]), Z[7]))
(True, True)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .._util.atomic import fsync_path, json_default, read_descriptor, read_tensors
from ..errors import AdaptspecError

__all__ = ["Featurizer", "FEATURIZER_FORMAT", "KINDS"]

#: version of the saved featurizer format
FEATURIZER_FORMAT = 1
KINDS = ("identity", "standardize", "pca")
_JSON = "featurizer.json"
_TENSORS = "featurizer.safetensors"


class Featurizer:
    """A frozen affine map ``x -> round_f32(((x - mean) / scale)[...] @ P)`` (see the module docstring).

    Build one with :meth:`fit`, :meth:`fit_traces`, :meth:`identity` or :meth:`load`.
    """

    def __init__(
        self,
        kind: str,
        mean: np.ndarray,
        scale: np.ndarray,
        components: np.ndarray | None = None,
        keep: Sequence[int] = (),
        info: dict[str, Any] | None = None,
    ) -> None:
        if kind not in KINDS:
            raise AdaptspecError(f"featurizer kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.kind = kind
        self.mean = np.ascontiguousarray(mean, dtype=np.float64).ravel()
        self.scale = np.ascontiguousarray(scale, dtype=np.float64).ravel()
        d = self.mean.shape[0]
        if d < 1 or self.scale.shape != (d,):
            raise AdaptspecError(
                f"featurizer mean {self.mean.shape} and scale {self.scale.shape} must be two (d,) arrays"
            )
        if not (np.isfinite(self.mean).all() and np.isfinite(self.scale).all() and (self.scale > 0).all()):
            raise AdaptspecError("featurizer needs finite means and positive finite scales")
        self.keep = tuple(int(k) % d if -d <= int(k) < d else _bad_keep(k, d) for k in keep)
        if kind == "pca":
            if components is None:
                raise AdaptspecError("a pca featurizer needs its components")
            P = np.ascontiguousarray(components, dtype=np.float64)
            if P.ndim != 2 or P.shape[0] != d or P.shape[1] < 1 or not np.isfinite(P).all():
                raise AdaptspecError(f"pca components must be a finite ({d}, k) array, got shape {P.shape}")
            self.components: np.ndarray | None = P
        else:
            if components is not None:
                raise AdaptspecError(f"a {kind} featurizer has no components")
            if keep:
                raise AdaptspecError("keep= only applies to a pca featurizer (the others keep every feature)")
            self.components = None
        self.info = dict(info or {})
        self._inv = 1.0 / self.scale
        self._keep = np.asarray(self.keep, dtype=np.int64)

    # ------------------------------------------------------------------ construction
    @classmethod
    def identity(cls, dim: int) -> "Featurizer":
        """Pass ``dim`` features through unchanged (they are still checked)."""
        if int(dim) != dim or dim < 1:
            raise AdaptspecError(f"identity featurizer needs a positive dimension, got {dim!r}")
        return cls("identity", np.zeros(int(dim)), np.ones(int(dim)))

    @classmethod
    def fit(
        cls,
        X: np.ndarray,
        kind: str = "pca",
        dim: int = 32,
        whiten: bool = True,
        keep: Sequence[int] = (),
        info: dict[str, Any] | None = None,
    ) -> "Featurizer":
        """Fit on features ``X`` (n, d): means and scales, and for ``pca`` the ``dim`` leading components.

        ``dim`` is capped at ``min(n - 1, d)``; components are sign-normalised (largest loading
        positive), so the same data always gives the same featurizer.
        """
        if kind not in KINDS:
            raise AdaptspecError(f"featurizer kind must be one of {', '.join(KINDS)}, got {kind!r}")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[0] < 2 or X.shape[1] < 1:
            raise AdaptspecError(
                f"Featurizer.fit needs an (n, d) feature matrix with n >= 2, got shape {X.shape}"
            )
        if not np.isfinite(X).all():
            row = int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])
            raise AdaptspecError(f"features of row {row} have NaN or infinite values")
        n, d = X.shape
        if kind == "identity":
            return cls.identity(d)
        mean = X.mean(axis=0)
        sd = X.std(axis=0)
        scale = np.where(sd > 1e-8 * np.maximum(1.0, np.abs(X).max(axis=0)), sd, 1.0)
        meta = {"n_fit": int(n), **(info or {})}
        if kind == "standardize":
            return cls("standardize", mean, scale, info=meta)
        if int(dim) != dim or dim < 1:
            raise AdaptspecError(f"pca dim must be a positive integer, got {dim!r}")
        k = int(min(dim, n - 1, d))
        Z = (X - mean) / scale
        _, s, Vt = np.linalg.svd(Z, full_matrices=False)
        V = Vt[:k].T.copy()
        sign = np.sign(V[np.argmax(np.abs(V), axis=0), np.arange(k)])
        V *= np.where(sign == 0, 1.0, sign)
        sv = s[:k] / math.sqrt(n)  # standard deviation of each component on the fitted set
        if whiten:
            V /= np.where(sv > 1e-12, sv, 1.0)
        total = float(np.sum(s**2))
        meta.update(
            dim=k,
            whiten=bool(whiten),
            explained_variance=round(float(np.sum(s[:k] ** 2)) / total, 6) if total > 0 else None,
        )
        return cls("pca", mean, scale, V, keep=keep, info=meta)

    @classmethod
    def fit_traces(
        cls, traces: Any, kind: str = "pca", dim: int = 32, whiten: bool = True, keep: Sequence[int] = ()
    ) -> "Featurizer":
        """Fit on a :class:`~adaptspec.traces.TraceSet`'s request features."""
        X = traces.features
        if X is None:
            where = f" {traces.path}" if getattr(traces, "path", None) else ""
            raise AdaptspecError(f"trace set{where} has no features to fit a featurizer on")
        from ..traces import path_label

        src = path_label(getattr(traces, "path", None))
        return cls.fit(X, kind=kind, dim=dim, whiten=whiten, keep=keep, info={"traces": src})

    # ------------------------------------------------------------------ shapes
    @property
    def in_dim(self) -> int:
        return int(self.mean.shape[0])

    @property
    def out_dim(self) -> int:
        if self.components is None:
            return self.in_dim
        return int(self.components.shape[1]) + len(self.keep)

    # ------------------------------------------------------------------ mapping
    def transform(self, X: np.ndarray) -> np.ndarray:
        """Contexts ``(n, out_dim)`` for features ``X`` ``(n, in_dim)``; rows are checked."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise AdaptspecError(f"features must be an (n, {self.in_dim}) array, got shape {X.shape}")
        if X.shape[1] != self.in_dim:
            raise AdaptspecError(f"features have {X.shape[1]} values, the featurizer expects {self.in_dim}")
        if not np.isfinite(X).all():
            row = int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])
            raise AdaptspecError(f"features of row {row} have NaN or infinite values")
        if self.kind == "identity":
            out = X
        else:
            Z = (X - self.mean) * self._inv
            if self.components is None:
                out = Z
            else:
                # einsum's own loop: each row's sums run in the same order whatever the batch
                # size (BLAS gemm and gemv do not), so one row alone equals the same row in a batch
                out = np.einsum("nd,dk->nk", Z, self.components, optimize=False)
                if len(self.keep):
                    out = np.concatenate([out, Z[:, self._keep]], axis=1)
        return out.astype(np.float32).astype(np.float64)

    def __call__(self, x: Sequence[float] | np.ndarray) -> np.ndarray:
        """The context of one feature vector (1-D in, 1-D out)."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 1:
            raise AdaptspecError(f"features must be a 1-D vector, got shape {x.shape}")
        return self.transform(x[None, :])[0]

    def transform_traces(self, traces: Any) -> Any:
        """A copy of a trace set whose ``features`` are this featurizer's contexts.

        Train a head on the result (``adaptspec train-head``) and it sees exactly the
        contexts the controller will give it online.
        """
        import pyarrow as pa

        from ..traces import TraceSet

        X = traces.features
        if X is None:
            raise AdaptspecError("this trace set has no features to transform")
        Z = self.transform(X).astype(np.float32)
        req = traces.requests
        col = pa.FixedSizeListArray.from_arrays(pa.array(Z.ravel()), Z.shape[1]).cast(pa.list_(pa.float32()))
        req = req.set_column(req.column_names.index("features"), "features", col)
        meta = dict(traces.meta)
        meta["featurizer"] = {
            "fingerprint": self.fingerprint,
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
        }
        return TraceSet(req, traces.outcomes, meta)

    # ------------------------------------------------------------------ identity and files
    @property
    def fingerprint(self) -> str:
        """Short hash of the map (a checkpoint records which featurizer its contexts came from)."""
        h = hashlib.sha256(self.kind.encode())
        for a in (self.mean, self.scale, self.components, self._keep):
            if a is not None:
                h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()[:16]

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``path/featurizer.json`` and ``path/featurizer.safetensors`` (``path`` may be a head's directory)."""
        from .._util.atomic import write_tensors

        path = Path(path)
        tensors = {"mean": self.mean, "scale": self.scale}
        if self.components is not None:
            tensors["components"] = self.components
        cfg = {
            "format": FEATURIZER_FORMAT,
            "kind": "adaptspec-featurizer",
            "map": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "keep": list(self.keep),
            "fingerprint": self.fingerprint,
            "info": self.info,
        }
        try:
            path.mkdir(parents=True, exist_ok=True)
            tmp_t, tmp_j = path / f".{_TENSORS}.tmp", path / f".{_JSON}.tmp"
            write_tensors(tensors, tmp_t)
            tmp_j.write_text(json.dumps(cfg, indent=2, default=json_default) + "\n")
            fsync_path(tmp_t)
            fsync_path(tmp_j)
            os.replace(tmp_t, path / _TENSORS)
            os.replace(tmp_j, path / _JSON)
        except OSError as e:
            raise AdaptspecError(f"{path}: cannot write the featurizer ({e.strerror or e})") from None
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Featurizer":
        """Read a featurizer written by :meth:`save` (its directory or its ``featurizer.json``)."""
        path = Path(path)
        if path.is_file() and path.name == _JSON:
            path = path.parent
        cfg_file, st_file = path / _JSON, path / _TENSORS
        if not cfg_file.is_file() or not st_file.is_file():
            raise AdaptspecError(f"{path}: no saved featurizer ({_JSON} and {_TENSORS})")
        cfg = read_descriptor(cfg_file, "adaptspec-featurizer", FEATURIZER_FORMAT, "featurizer")
        t = read_tensors(st_file)
        try:
            f = cls(
                cfg["map"],
                t["mean"],
                t["scale"],
                t.get("components"),
                keep=cfg.get("keep", ()),
                info=cfg.get("info", {}),
            )
        except KeyError as e:
            raise AdaptspecError(f"{path}: saved featurizer lacks {e}") from None
        if cfg.get("fingerprint") not in (None, f.fingerprint):
            raise AdaptspecError(f"{path}: featurizer files do not match each other (fingerprint)")
        return f

    @staticmethod
    def exists(path: str | os.PathLike) -> bool:
        """Whether ``path`` holds a saved featurizer."""
        p = Path(path)
        return (p / _JSON).is_file() and (p / _TENSORS).is_file()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Featurizer) and other.fingerprint == self.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        return f"Featurizer(kind={self.kind!r}, in_dim={self.in_dim}, out_dim={self.out_dim})"


def featurizer_for(
    specs: Sequence[str],
    feature_dim: int | None,
    choice: str | None = "auto",
    default_head: str | Path | None = None,
) -> Featurizer | None:
    """The featurizer replay should apply for these policy specs (``choice``: auto, none or a path).

    ``auto``: the featurizer saved with a head the specs name (``head=`` / ``path=``; one at
    most), else ``default_head``'s (default: the bundled head's; for a bundled trace set, the
    head trained on it: :func:`adaptspec.models.bundled.paired_head`) when it fits
    ``feature_dim``, else none (features as they are).
    """
    if choice in (None, "none"):
        return None
    if choice != "auto":
        return Featurizer.load(choice)
    from ..paths import BUNDLED_HEAD
    from .spec import parse_spec

    home = Path(default_head) if default_head is not None else BUNDLED_HEAD
    found = set()
    for spec in specs:
        name, args, opts = parse_spec(spec)
        head = (
            opts.get("head")
            or opts.get("path")
            or (BUNDLED_HEAD if name in ("neural-linear", "head") else None)
        )
        if head and Featurizer.exists(Path(head).expanduser()):
            found.add(Path(head).expanduser().resolve())
    if len(found) > 1:
        raise AdaptspecError(
            f"the policies' heads have different featurizers ({', '.join(map(str, sorted(found)))}); "
            "pass --featurizer PATH"
        )
    if found:
        return Featurizer.load(found.pop())
    if feature_dim is not None and Featurizer.exists(home):
        f = Featurizer.load(home)
        if f.in_dim == feature_dim:
            return f
    return None


def _bad_keep(k: Any, d: int) -> int:
    raise AdaptspecError(f"keep index {k} outside -{d}..{d - 1}")
