"""A controller's settings, checked once.

:class:`ControllerConfig` holds the keyword arguments of
:class:`~adaptspec.control.controller.AdaptiveController` exactly as they were given (as
scikit-learn estimators hold their parameters) and checks every one of them when it is built,
in :meth:`ControllerConfig._check`: a bad value raises one :class:`~adaptspec.errors.AdaptspecError`
naming the setting and the value. The parts of the controller read their settings from here and
check nothing again. What can only be checked against the speculator or the policy (the arms,
the fallback block size, the featurizer's width) is checked where those are resolved
(:mod:`adaptspec.control.policy_build`, :mod:`adaptspec.control.block_sizes`).

>>> ControllerConfig(decide_timeout_s=0.05).decide_timeout_s
0.05
>>> ControllerConfig(checkpoint_every=0)
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: checkpoint_every must be a positive integer, got 0
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import AdaptspecError
from ..reward.functions import DEFAULT_REWARD
from ..speculator import Outcome


@dataclass(frozen=True)
class ControllerConfig:
    """The settings of one controller, as given (see ``AdaptiveController`` for what each means)."""

    arms: Sequence[int] | None = None
    featurizer: Any = None
    reward: str | Callable[[Outcome], float] = DEFAULT_REWARD
    latency: Any = None
    speed_reference: Any = "auto"
    variant: str | None = None
    log_dir: str | Path | None = None
    checkpoint_dir: str | Path | None = None
    checkpoint_every: int = 100
    checkpoint_interval_s: float | None = 60.0
    fallback_block_size: int | None = None
    decide_timeout_s: float = 0.1
    decide_on_caller: bool = False
    feedback_timeout_s: float | None = 300.0
    max_pending: int = 10_000
    redecide_every: int | None = None
    round_rule: Any = None
    seed: int | None = 0
    resume: bool = True
    log_features: bool = True
    roll_rows: int = 1000
    roll_interval_s: float | None = 60.0
    log_fsync: bool = True
    blas_threads: int | None = 1
    shared: Any = None
    load_features: bool = False
    feature_dim: int | None = None
    prefix_drafts: bool = False

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        """Every setting that can be checked on its own, checked here and nowhere else."""
        _positive_int(self.checkpoint_every, "checkpoint_every")
        _positive_int(self.roll_rows, "roll_rows")
        _positive_int(self.blas_threads, "blas_threads", none=True)
        _positive_int(self.redecide_every, "redecide_every", none=True)
        _positive_int(self.feature_dim, "feature_dim", none=True)
        _positive_int(self.max_pending, "max_pending")
        _positive_number(self.decide_timeout_s, "decide_timeout_s")
        if not isinstance(self.decide_on_caller, bool):
            raise AdaptspecError(f"decide_on_caller must be True or False, got {self.decide_on_caller!r}")
        for name in ("feedback_timeout_s", "checkpoint_interval_s", "roll_interval_s"):
            _positive_number(getattr(self, name), name, none=True)
        if self.fallback_block_size is not None and (
            not _is_int(self.fallback_block_size) or self.fallback_block_size == 0
        ):
            raise AdaptspecError(
                f"fallback_block_size must be a block size >= 1 or a tree arm (-N), "
                f"got {self.fallback_block_size!r}"
            )
        if self.arms is not None and (
            isinstance(self.arms, (str, bytes))
            or not len(self.arms)
            or not all(_is_int(a) and a != 0 for a in self.arms)
        ):
            raise AdaptspecError(
                f"arms must be a non-empty list of block sizes >= 1 or tree arms (-N: the best draft "
                f"tree of N nodes), got {self.arms!r}"
            )
        if self.seed is not None and not _is_int(self.seed):
            raise AdaptspecError(f"seed must be an integer or None, got {self.seed!r}")
        if not (callable(self.reward) or isinstance(self.reward, str)):
            raise AdaptspecError(
                f"reward must be a reward name or a function of the outcome, got {self.reward!r}"
            )
        if not isinstance(self.prefix_drafts, (bool, np.bool_)):
            raise AdaptspecError(f"prefix_drafts must be True or False, got {self.prefix_drafts!r}")
        if not isinstance(self.load_features, (bool, np.bool_)):
            raise AdaptspecError(f"load_features must be True or False, got {self.load_features!r}")
        if self.variant is not None and not isinstance(self.variant, str):
            raise AdaptspecError(f"variant must be a string or None, got {self.variant!r}")
        rule = self.round_rule
        if (
            rule is not None
            and not isinstance(rule, str)
            and not callable(getattr(rule, "with_block_size", None))
        ):
            raise AdaptspecError(
                f"round_rule must be a schedule with with_block_size (adaptspec.schedules), got {rule!r}"
            )
        if rule is not None and self.redecide_every is not None:
            raise AdaptspecError(
                "round_rule and redecide_every cannot be combined: a round rule already decides every round"
            )
        _separate_dirs(self.log_dir, self.checkpoint_dir)

    # ------------------------------------------------------------------ derived, never re-checked
    @property
    def reward_name(self) -> str:
        """The reward's name (written into checkpoints)."""
        return self.reward if isinstance(self.reward, str) else getattr(self.reward, "__name__", "custom")

    def round_schedule(self, max_block_size: int) -> Any:
        """The per-round rule as a schedule (a spec string parsed for this drafter), or None."""
        if isinstance(self.round_rule, str):
            from ..schedules import parse_schedule

            return parse_schedule(self.round_rule, max_block_size)
        return self.round_rule

    def path(self, name: str) -> Path | None:
        """``log_dir`` or ``checkpoint_dir`` as a Path (None when not set)."""
        value = getattr(self, name)
        return None if value is None else Path(value)


def _separate_dirs(log_dir: Any, checkpoint_dir: Any) -> None:
    """Refuse a checkpoint directory that is the decision log's directory, or inside it, or holds
    it: the log's directory holds the log alone (a restart would refuse the checkpoints in it)."""
    if log_dir is None or checkpoint_dir is None:
        return
    try:
        log, ck = Path(log_dir).expanduser().resolve(), Path(checkpoint_dir).expanduser().resolve()
    except (TypeError, OSError, RuntimeError) as e:
        raise AdaptspecError(f"log_dir {log_dir!r} / checkpoint_dir {checkpoint_dir!r}: {e}") from None
    why = "the decision log's directory must hold the log alone: give them separate directories"
    if log == ck:
        raise AdaptspecError(f"log_dir and checkpoint_dir are the same directory ({log}): {why}")
    if log in ck.parents:
        raise AdaptspecError(f"checkpoint_dir {ck} is inside log_dir {log}: {why}")
    if ck in log.parents:
        raise AdaptspecError(f"log_dir {log} is inside checkpoint_dir {ck}: {why}")


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _positive_int(v: Any, name: str, none: bool = False) -> None:
    if v is None and none:
        return
    if not _is_int(v) or v < 1:
        raise AdaptspecError(f"{name} must be a positive integer{' or None' if none else ''}, got {v!r}")


def _positive_number(v: Any, name: str, none: bool = False) -> None:
    if v is None and none:
        return
    ok = (
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and v > 0
    )  # NaN is not > 0
    if not ok:
        raise AdaptspecError(f"{name} must be > 0{' or None' if none else ''}, got {v!r}")
