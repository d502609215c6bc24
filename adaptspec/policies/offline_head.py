"""The offline head (BlockPilot-style): a small MLP from the prefill features to the block size.

Trained once from a full-information trace set (every block size ran on every request):

- ``mode="regression"`` (default): one output per arm, the expected reward of that arm
  (mean-squared error on all arms of every request: full information). Greedy = best predicted
  reward. Its last hidden layer and output layer are what :class:`~adaptspec.policies.
  neural_linear.NeuralLinear` starts from.
- ``mode="classification"`` (as BlockPilot): softmax over arms, cross-entropy on the best arm of
  each request. Greedy = most probable arm.

Architecture: standardised input -> ``Linear -> ReLU`` per hidden layer -> ``Linear`` to K
outputs. Training: Adam, mini-batches, early stopping on a validation split (the weights of
the best validation epoch are kept). Only training needs torch (imported lazily); inference is
numpy, so a policy that uses a head never loads torch.

A saved head is a directory: ``model.safetensors`` (the layers, the input standardiser and the
validation statistics NeuralLinear uses) and ``config.json`` (arms, sizes, mode, reward scale,
metrics).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .._util.atomic import json_default, read_descriptor, read_tensors, write_tensors
from .._util.checks import int_list, integer, number
from ..errors import AdaptspecError
from ..reward.functions import pct_of
from .base import Policy, greedy_probs

__all__ = ["HeadModel", "OfflineHead", "train_head", "head_policy", "head_fingerprint", "HEAD_FORMAT"]

#: version of the saved head format
HEAD_FORMAT = 1
MODES = ("regression", "classification")


@dataclass
class HeadModel:
    """A trained head, as numpy arrays.

    ``layers`` is a list of ``(W, b)`` with ``W`` of shape (out, in), as in ``torch.nn.Linear``;
    the last one is the output layer. ``x_mean`` / ``x_scale`` standardise the input; in
    regression the outputs are in standardised reward units (``(r - reward_mean) /
    reward_scale``). ``val_mse`` (K,) is the validation MSE per arm in those units and
    ``val_gram`` (H+1, H+1) the mean of ``[h, 1] [h, 1]^T`` over the validation split, ``h``
    the last hidden layer; ``val_cov`` (K, K) the covariance of the validation errors across
    arms (its diagonal is ``val_mse``; all used by NeuralLinear's prior).
    """

    arms: tuple[int, ...]
    layers: list[tuple[np.ndarray, np.ndarray]]
    x_mean: np.ndarray
    x_scale: np.ndarray
    mode: str = "regression"
    reward_mean: float = 0.0
    reward_scale: float = 1.0
    val_mse: np.ndarray | None = None
    val_gram: np.ndarray | None = None
    val_cov: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.arms = tuple(int(a) for a in self.arms)
        if list(self.arms) != sorted(set(self.arms)) or not self.arms or self.arms[0] < 1:
            raise AdaptspecError(
                f"head arms must be unique positive block sizes in increasing order, got {list(self.arms)}"
            )
        if self.mode not in MODES:
            raise AdaptspecError(f"head mode must be one of {MODES}, got {self.mode!r}")
        if len(self.layers) < 2:
            raise AdaptspecError("a head needs at least one hidden layer")
        self.layers = [
            (np.asarray(W, dtype=np.float64), np.asarray(b, dtype=np.float64)) for W, b in self.layers
        ]
        for i, (W, b) in enumerate(self.layers):
            if W.ndim != 2 or b.shape != (W.shape[0],):
                raise AdaptspecError(f"head layer {i} has weight {W.shape} and bias {b.shape}")
            if i and W.shape[1] != self.layers[i - 1][0].shape[0]:
                raise AdaptspecError(
                    f"head layer {i} expects {W.shape[1]} inputs, layer {i - 1} gives {self.layers[i - 1][0].shape[0]}"
                )
        if self.layers[-1][0].shape[0] != len(self.arms):
            raise AdaptspecError(f"head has {self.layers[-1][0].shape[0]} outputs for {len(self.arms)} arms")
        self.x_mean = np.asarray(self.x_mean, dtype=np.float64)
        self.x_scale = np.asarray(self.x_scale, dtype=np.float64)
        if self.x_mean.shape != (self.in_dim,) or self.x_scale.shape != (self.in_dim,):
            raise AdaptspecError("head input standardiser does not match its first layer")
        self._inv = 1.0 / self.x_scale
        self._hidden_layers = [(W.T.copy(), b) for W, b in self.layers[:-1]]

    # ------------------------------------------------------------------ shapes
    @property
    def in_dim(self) -> int:
        return int(self.layers[0][0].shape[1])

    @property
    def hidden_dim(self) -> int:
        """Width of the last hidden layer."""
        return int(self.layers[-1][0].shape[1])

    @property
    def hidden_sizes(self) -> tuple[int, ...]:
        return tuple(int(W.shape[0]) for W, _ in self.layers[:-1])

    # ------------------------------------------------------------------ inference
    def hidden(self, X: np.ndarray) -> np.ndarray:
        """Last hidden layer for contexts ``X`` (n, d) or (d,)."""
        h = (np.asarray(X, dtype=np.float64) - self.x_mean) * self._inv
        for Wt, b in self._hidden_layers:
            h = h @ Wt
            h += b
            np.maximum(h, 0.0, out=h)
        return h

    def scores(self, X: np.ndarray) -> np.ndarray:
        """Raw outputs: standardised rewards (regression) or logits (classification)."""
        W, b = self.layers[-1]
        return self.hidden(X) @ W.T + b

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Expected reward per arm (regression) or probability of being best (classification)."""
        s = self.scores(X)
        if self.mode == "regression":
            return s * self.reward_scale + self.reward_mean
        s = s - s.max(axis=-1, keepdims=True)
        e = np.exp(s)
        return e / e.sum(axis=-1, keepdims=True)

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write ``path/model.safetensors`` and ``path/config.json``; returns ``path``. A failed write
        (a full disk) is an ``OSError`` naming the file."""

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors: dict[str, np.ndarray] = {}
        for i, (W, b) in enumerate(self.layers):
            tensors[f"layers.{i}.weight"] = np.ascontiguousarray(W, dtype=np.float32)
            tensors[f"layers.{i}.bias"] = np.ascontiguousarray(b, dtype=np.float32)
        tensors["x_mean"] = self.x_mean.astype(np.float64)
        tensors["x_scale"] = self.x_scale.astype(np.float64)
        if self.val_mse is not None:
            tensors["val_mse"] = np.asarray(self.val_mse, dtype=np.float64)
        if self.val_gram is not None:
            tensors["val_gram"] = np.asarray(self.val_gram, dtype=np.float64)
        if self.val_cov is not None:
            tensors["val_cov"] = np.asarray(self.val_cov, dtype=np.float64)
        write_tensors(tensors, path / "model.safetensors")
        config = {
            "format": HEAD_FORMAT,
            "kind": "adaptspec-offline-head",
            "arms": list(self.arms),
            "mode": self.mode,
            "in_dim": self.in_dim,
            "hidden": list(self.hidden_sizes),
            "n_layers": len(self.layers),
            "reward_mean": self.reward_mean,
            "reward_scale": self.reward_scale,
            "info": self.info,
        }
        (path / "config.json").write_text(json.dumps(config, indent=2, default=json_default) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "HeadModel":
        """Read a head written by :meth:`save` (a directory, or its ``config.json``)."""
        path = Path(path)
        if path.is_file() and path.name == "config.json":
            path = path.parent
        cfg_file, st_file = path / "config.json", path / "model.safetensors"
        if not cfg_file.is_file() or not st_file.is_file():
            raise AdaptspecError(
                f"{str(path)!r} is not a saved head (needs config.json and model.safetensors)"
            )
        cfg = read_descriptor(cfg_file, "adaptspec-offline-head", HEAD_FORMAT, "offline head")
        where = str(cfg_file)
        arms = int_list(cfg.get("arms"), where, "arms", 1)
        n_layers = integer(cfg.get("n_layers"), where, "n_layers", 2)
        reward_mean = number(cfg.get("reward_mean"), where, "reward_mean")
        reward_scale = number(cfg.get("reward_scale"), where, "reward_scale", 0, lo_open=True)
        if cfg.get("mode") not in MODES:
            raise AdaptspecError(f"{where}: mode={cfg.get('mode')!r} must be one of {', '.join(MODES)}")
        if not isinstance(cfg.get("info", {}), dict):
            raise AdaptspecError(f"{where}: info={cfg['info']!r} must be an object")
        t = read_tensors(st_file)
        try:
            layers = [(t[f"layers.{i}.weight"], t[f"layers.{i}.bias"]) for i in range(n_layers)]
            return cls(
                arms=tuple(arms),
                layers=layers,
                x_mean=t["x_mean"],
                x_scale=t["x_scale"],
                mode=cfg["mode"],
                reward_mean=reward_mean,
                reward_scale=reward_scale,
                val_mse=t.get("val_mse"),
                val_gram=t.get("val_gram"),
                val_cov=t.get("val_cov"),
                info=cfg.get("info", {}),
            )
        except KeyError as e:
            raise AdaptspecError(f"{path}: saved head lacks {e}") from None
        except AdaptspecError as e:
            raise AdaptspecError(f"{path}: {e}") from None


def head_fingerprint(head: HeadModel) -> str:
    """Short hash of a head's weights (a saved policy state records which head it belongs to)."""
    h = hashlib.sha256()
    for W, b in head.layers:
        h.update(np.ascontiguousarray(W, dtype=np.float32).tobytes())
        h.update(np.ascontiguousarray(b, dtype=np.float32).tobytes())
    h.update(np.ascontiguousarray(head.x_mean).tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------- training
def train_head(
    X: np.ndarray,
    R: np.ndarray,
    arms: Sequence[int],
    mode: str = "regression",
    hidden: Sequence[int] = (64, 32),
    val_fraction: float = 0.2,
    max_epochs: int = 300,
    patience: int = 20,
    lr: float = 1e-3,
    weight_decay: float = 1e-4,
    batch_size: int = 128,
    seed: int = 0,
    info: dict[str, Any] | None = None,
    min_delta: float = 1e-4,
) -> HeadModel:
    """Train a head on contexts ``X`` (n, d) and full-information rewards ``R`` (n, K).

    ``R[i, j]`` is the reward of arm ``arms[j]`` on request ``i`` (the head's outputs follow the
    arms sorted in increasing order, as the policies' do). A seeded random
    ``val_fraction`` of the requests is held out for early stopping (stop when the validation
    loss has not improved by a relative ``min_delta`` for ``patience`` epochs; keep the best
    epoch's weights). The same seed gives the same head.
    """
    import torch

    X, R, arms, hidden = _checked(X, R, arms, mode, hidden, val_fraction)
    rng = np.random.default_rng(seed)
    val_idx, tr_idx, x_mean, x_scale, Xs, r_mean, r_scale, Y = _split_and_scale(X, R, mode, val_fraction, rng)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small MLP on mini-batches: one thread is fastest and deterministic
    try:
        model = _fit(
            torch,
            Xs,
            Y,
            tr_idx,
            val_idx,
            X.shape[1],
            hidden,
            len(arms),
            mode,
            rng,
            seed,
            lr,
            weight_decay,
            batch_size,
            max_epochs,
            patience,
            min_delta,
        )
    finally:
        torch.set_num_threads(threads)
    layers, best, best_epoch, epoch = model
    return _finish(
        X,
        R,
        arms,
        layers,
        x_mean,
        x_scale,
        mode,
        r_mean,
        r_scale,
        val_idx,
        tr_idx,
        best,
        best_epoch,
        epoch,
        seed,
        lr,
        weight_decay,
        batch_size,
        patience,
        info,
    )


def _checked(
    X: Any, R: Any, arms: Sequence[int], mode: str, hidden: Sequence[int], val_fraction: float
) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], tuple[int, ...]]:
    """train_head's inputs checked: the features, the rewards and the arms (sorted, the rewards' columns
    with them) and the hidden widths."""
    X = np.asarray(X, dtype=np.float64)
    R = np.asarray(R, dtype=np.float64)
    arms = tuple(int(a) for a in arms)
    if len(set(arms)) != len(arms) or not arms or min(arms) < 1:
        raise AdaptspecError(f"arms must be unique positive block sizes, got {list(arms)}")
    n = X.shape[0] if X.ndim == 2 else 0
    if X.ndim != 2 or n < 5:
        raise AdaptspecError(f"train_head needs a (n, d) feature matrix with n >= 5, got shape {X.shape}")
    if R.shape != (n, len(arms)):
        raise AdaptspecError(f"rewards must have shape ({n}, {len(arms)}) (requests x arms), got {R.shape}")
    if not np.isfinite(X).all():
        raise AdaptspecError("features contain NaN or infinite values")
    if not np.isfinite(R).all():
        raise AdaptspecError("rewards contain NaN or infinite values")
    if mode not in MODES:
        raise AdaptspecError(f"mode must be one of {MODES}, got {mode!r}")
    hidden = tuple(int(h) for h in hidden)
    if not hidden or min(hidden) < 1:
        raise AdaptspecError(f"hidden must list positive layer widths, got {hidden}")
    if not 0.0 < val_fraction < 1.0:
        raise AdaptspecError(f"val_fraction must be in (0, 1), got {val_fraction}")
    order = np.argsort(arms)  # the head's outputs follow the arms in increasing order, as policies do
    arms = tuple(arms[i] for i in order)
    R = R[:, order]
    return X, R, arms, hidden


def _split_and_scale(
    X: np.ndarray, R: np.ndarray, mode: str, val_fraction: float, rng: np.random.Generator
) -> tuple:
    """The held-out and training requests (a seeded draw), the features standardized on the training
    requests, and the targets: standardized rewards (regression) or the best arm's index."""
    n = X.shape[0]
    perm = rng.permutation(n)
    n_val = min(n - 2, max(2, int(round(val_fraction * n))))
    val_idx, tr_idx = np.sort(perm[:n_val]), np.sort(perm[n_val:])
    x_mean = X[tr_idx].mean(axis=0)
    x_scale = X[tr_idx].std(axis=0)
    x_scale = np.where(x_scale > 1e-8 * np.maximum(1.0, np.abs(X).max(axis=0)), x_scale, 1.0)
    Xs = (X - x_mean) / x_scale
    if mode == "regression":
        r_mean = float(R[tr_idx].mean())
        r_scale = float(R[tr_idx].std()) or 1.0
        Y = (R - r_mean) / r_scale
    else:
        r_mean, r_scale = 0.0, 1.0
        Y = np.argmax(R, axis=1)
    return val_idx, tr_idx, x_mean, x_scale, Xs, r_mean, r_scale, Y


def _fit(
    torch: Any,
    Xs: np.ndarray,
    Y: np.ndarray,
    tr_idx: np.ndarray,
    val_idx: np.ndarray,
    d: int,
    hidden: tuple[int, ...],
    k: int,
    mode: str,
    rng: np.random.Generator,
    seed: int,
    lr: float,
    weight_decay: float,
    batch_size: int,
    max_epochs: int,
    patience: int,
    min_delta: float,
) -> tuple[Any, ...]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        sizes = (d,) + hidden
        mods: list[Any] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            mods += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        mods.append(torch.nn.Linear(sizes[-1], k))
        net = torch.nn.Sequential(*mods)
        opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
        xt = torch.from_numpy(Xs[tr_idx].astype(np.float32))
        xv = torch.from_numpy(Xs[val_idx].astype(np.float32))
        if mode == "regression":
            yt = torch.from_numpy(Y[tr_idx].astype(np.float32))
            yv = torch.from_numpy(Y[val_idx].astype(np.float32))
            loss_fn: Any = torch.nn.MSELoss()
        else:
            yt, yv = torch.from_numpy(Y[tr_idx]).long(), torch.from_numpy(Y[val_idx]).long()
            loss_fn = torch.nn.CrossEntropyLoss()
        best, best_state, best_epoch, wait, epoch = math.inf, None, 0, 0, 0
        for epoch in range(1, max_epochs + 1):
            net.train()
            order = torch.from_numpy(rng.permutation(len(tr_idx)))
            for lo in range(0, len(tr_idx), batch_size):
                b = order[lo : lo + batch_size]
                opt.zero_grad()
                loss = loss_fn(net(xt[b]), yt[b])
                loss.backward()
                opt.step()
            net.eval()
            with torch.no_grad():
                vl = float(loss_fn(net(xv), yv))
            if best_state is None or vl < best - min_delta * abs(best):
                best, best_epoch, wait = vl, epoch, 0
                best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
            else:
                wait += 1
                if wait >= patience:
                    break
        net.load_state_dict(best_state)
        linears = [m for m in net if isinstance(m, torch.nn.Linear)]
        layers = [(m.weight.detach().numpy().copy(), m.bias.detach().numpy().copy()) for m in linears]
    return layers, best, best_epoch, epoch


def _finish(
    X: np.ndarray,
    R: np.ndarray,
    arms: tuple[int, ...],
    layers: list,
    x_mean: np.ndarray,
    x_scale: np.ndarray,
    mode: str,
    r_mean: float,
    r_scale: float,
    val_idx: np.ndarray,
    tr_idx: np.ndarray,
    best: float,
    best_epoch: int,
    epoch: int,
    seed: int,
    lr: float,
    weight_decay: float,
    batch_size: int,
    patience: int,
    info: dict[str, Any] | None,
) -> HeadModel:
    n_val = len(val_idx)
    model = HeadModel(arms, layers, x_mean, x_scale, mode, r_mean, r_scale)
    Xv, Rv = X[val_idx], R[val_idx]
    s = model.scores(Xv)
    pick = np.argmax(s, axis=1)
    got = Rv[np.arange(len(Rv)), pick]
    metrics: dict[str, Any] = {
        "n_train": int(len(tr_idx)),
        "n_val": int(n_val),
        "best_epoch": int(best_epoch),
        "epochs": int(epoch),
        "val_loss": float(best),
        "seed": int(seed),
        "lr": lr,
        "weight_decay": weight_decay,
        "batch_size": batch_size,
        "patience": patience,
        "val_accuracy": float(np.mean(pick == np.argmax(Rv, axis=1))),
        "val_pct_oracle": float(pct_of(got.mean(), Rv.max(axis=1).mean())),
        "val_pct_best_fixed": float(pct_of(got.mean(), Rv.mean(axis=0).max())),
    }
    if mode == "regression":
        err = s - (Rv - r_mean) / r_scale
        model.val_cov = err.T @ err / len(err)  # errors are correlated across arms (request-level part)
        model.val_mse = np.diag(model.val_cov).copy()
        metrics["val_mse"] = model.val_mse.tolist()
    H = np.concatenate([model.hidden(Xv), np.ones((len(Xv), 1))], axis=1)
    model.val_gram = H.T @ H / len(H)
    model.info = {**metrics, **(info or {})}
    return model


# ---------------------------------------------------------------------------------- policy
class OfflineHead(Policy):
    """A trained head used alone, greedily: the arm with the best predicted reward (or class).

    Does not learn online (``update`` only validates and counts); ``epsilon`` adds a uniform
    floor for off-policy evaluation. Build it from a :class:`HeadModel`, a saved head directory,
    or train one with :meth:`fit`.

    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(400, 3))
    >>> R = np.stack([X[:, 0], -X[:, 0]], axis=1) + rng.normal(0, 0.1, size=(400, 2))
    >>> pol = OfflineHead.fit(X, R, arms=[4, 8], hidden=(16, 8), max_epochs=60, seed=0)
    >>> pol.decide([2.0, 0.0, 0.0]).block_size, pol.decide([-2.0, 0.0, 0.0]).block_size
    (4, 8)
    """

    name = "head"
    contextual = True
    learning = False

    def __init__(
        self,
        head: HeadModel | str | Path,
        epsilon: float = 0.0,
        seed: int | None = None,
        arms: Sequence[int] | None = None,
    ) -> None:
        self.head = head if isinstance(head, HeadModel) else HeadModel.load(head)
        if arms is not None and tuple(sorted(int(a) for a in arms)) != tuple(sorted(self.head.arms)):
            raise AdaptspecError(f"the head was trained for arms {list(self.head.arms)}, not {list(arms)}")
        super().__init__(self.head.arms, seed=seed, epsilon=epsilon, dim=self.head.in_dim)
        self.fingerprint = head_fingerprint(self.head)

    @classmethod
    def fit(
        cls,
        X: np.ndarray,
        R: np.ndarray,
        arms: Sequence[int],
        epsilon: float = 0.0,
        seed: int = 0,
        **train_kwargs: Any,
    ) -> "OfflineHead":
        """Train a head (see :func:`train_head`) and wrap it as a policy."""
        return cls(train_head(X, R, arms, seed=seed, **train_kwargs), epsilon=epsilon, seed=seed)

    def save(self, path: str | Path) -> Path:
        return self.head.save(path)

    def _probs(self, context: np.ndarray | None) -> np.ndarray:
        return greedy_probs(self.head.scores(context))

    def _probs_batch(self, X: np.ndarray | None, n: int) -> np.ndarray:
        s = self.head.scores(X)
        m = s == s.max(axis=1, keepdims=True)
        return self._mix(m / m.sum(axis=1, keepdims=True))

    def _choose_batch(self, X: np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
        probs = self._probs_batch(X, n)
        idx = self._draw_many(probs)
        return idx, probs[np.arange(n), idx]

    def _update(self, context: np.ndarray | None, arm: int, reward: float) -> None:
        pass

    def _update_batch(self, X: np.ndarray | None, idx: np.ndarray, rewards: np.ndarray) -> None:
        pass

    def _state(self) -> dict[str, Any]:
        return {"head": self.fingerprint}

    def _load_state(self, state: dict[str, Any]) -> None:
        if state.get("head") != self.fingerprint:
            raise AdaptspecError(
                f"state was saved with head {state.get('head')!r}, this policy uses {self.fingerprint!r}"
            )

    def __repr__(self) -> str:
        return f"OfflineHead(arms={list(self.arms)}, mode={self.head.mode!r}, hidden={list(self.head.hidden_sizes)})"


def head_policy(
    arms: Sequence[int], seed: int | None = None, path: Path | None = None, epsilon: float = 0.0
) -> OfflineHead:
    """Factory of the ``head:PATH`` (or ``head:path=PATH``) spec."""
    if path is None:
        raise AdaptspecError("head needs the path of a trained head, e.g. head:path=runs/head")
    return OfflineHead(path, epsilon=epsilon, seed=seed, arms=arms)
