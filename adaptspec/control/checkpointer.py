"""The checkpointer: write checkpoints of the learning policy, resume from the newest one and
replay the decision log after it.

A checkpoint holds the learning policy, the number of updates it has seen and the id of the
last one (the format is :mod:`adaptspec.control.policy_checkpoint`). :class:`Checkpointer`
writes one when due (``every`` updates, or ``interval_s`` after the last one if there were
updates since), on the update thread, which owns the learning policy. On resume it loads the
newest, checks it is for the same variant, arms and featurizer (its context width is checked with the
others', :mod:`adaptspec.control.context_width`), then re-applies in order every
logged reward after that id (with every arm's counterfactual reward where the row has them, as
the update thread applied it): the learnt state is what it was after the last acknowledged
feedback. Replayed rewards are in no checkpoint yet, so the next due one (or the one at close)
writes them.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AdaptspecError
from .updates import Learner, Update

log = logging.getLogger("adaptspec.control.controller")  # one logger for the controller and its parts


def check_checkpoint_dir(path: Path) -> None:
    """Refuse, now, a checkpoint directory no checkpoint could be written to (rather than fail
    every checkpoint later, in the background)."""
    if path.exists() and not path.is_dir():
        raise AdaptspecError(f"{path}: cannot keep checkpoints here: it is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        Path(tempfile.mkdtemp(prefix=".probe-", dir=path)).rmdir()
    except OSError as e:
        raise AdaptspecError(f"{path}: cannot keep checkpoints here ({e.strerror or e})") from None


class Checkpointer:
    """Checkpoints in ``directory`` (checked now) for one controller (see the module docstring).

    ``meta`` goes into every checkpoint as it is (variant, policy label and spec, arms, seed,
    reward); ``arms`` and ``featurizer`` are what a checkpoint must fit to be resumed;
    ``log_dir`` is the decision log replayed after it; ``machine_speed`` (or None) is saved and
    restored with the policy.
    """

    def __init__(
        self,
        directory: Path,
        *,
        meta: dict[str, Any],
        featurizer: Any = None,
        log_dir: Path | None = None,
        machine_speed: Any = None,
        contextual: bool = True,
        every: int = 100,
        interval_s: float | None = 60.0,
    ) -> None:
        check_checkpoint_dir(directory)
        self.directory = directory
        self.meta = meta
        self.featurizer = featurizer
        self.log_dir = log_dir
        self.machine_speed = machine_speed
        self.contextual = contextual
        self.every = every
        self.interval_s = interval_s
        self.updates_written = 0  # the updates the newest checkpoint holds
        self._time = time.monotonic()
        self.written = 0
        self.errors = 0
        self.last_error: tuple[float, str] | None = None

    # ------------------------------------------------------------------ writing (update thread)
    def due(self, updates: int) -> bool:
        """Whether a checkpoint is due after ``updates`` updates."""
        if updates <= self.updates_written:
            return False
        if updates - self.updates_written >= self.every:
            return True
        return self.interval_s is not None and time.monotonic() - self._time >= self.interval_s

    def write(
        self, policy: Any, updates: int, last_decision_id: str | None, rng_state: dict | None = None
    ) -> Path:
        """Write ``policy`` after ``updates`` updates, the last one ``last_decision_id``.
        ``rng_state`` (the decisions' random generator) becomes the policy's first, so that a
        resumed policy draws on from where decisions were."""
        from .policy_checkpoint import write_checkpoint

        if rng_state is not None:
            try:
                policy.rng.bit_generator.state = rng_state
            except Exception:  # a generator-less policy
                pass
        meta = {"updates": updates, "last_decision_id": last_decision_id, **self.meta}
        if self.machine_speed is not None:  # as of the last applied update, like the policy
            meta["machine_speed"] = self.machine_speed.state_dict()
        path = write_checkpoint(self.directory, policy, meta, self.featurizer)
        self.updates_written = updates
        self._time = time.monotonic()
        self.written += 1
        return path

    def failed(self, error: Exception) -> None:
        """Count a checkpoint that could not be written (requests go on)."""
        self.errors += 1
        self.last_error = (time.time(), f"checkpoint: {error}")

    # ------------------------------------------------------------------ resume (before the threads start)
    def resume(self, learner: Learner) -> dict[str, Any]:
        """Load the newest checkpoint into ``learner`` and replay the log after it; returns what happened."""
        from .policy_checkpoint import latest_checkpoint, load_policy, read_checkpoint

        ck = latest_checkpoint(self.directory)
        anchor = None
        info: dict[str, Any] = {"checkpoint": None, "updates_at_checkpoint": 0, "replayed": 0}
        if ck is not None:
            meta = read_checkpoint(ck)
            self._check_fits(ck, meta)
            load_policy(ck, learner.policy)  # the width it learnt: settle_width checks it against the others
            if self.machine_speed is not None and "machine_speed" in meta:
                self.machine_speed.load_state_dict(meta["machine_speed"])
            learner.updates = self.updates_written = int(meta["updates"])
            anchor = meta.get("last_decision_id")
            info.update(checkpoint=str(ck), updates_at_checkpoint=learner.updates)
        if self.log_dir is not None:
            todo = self._logged_after(anchor)
            for u in todo:
                learner.apply(u)
            info["replayed"] = len(todo)
        if ck is not None or info["replayed"]:
            log.info(
                "%s: resumed from %s (%d updates) and replayed %d logged feedbacks",
                self.meta.get("variant") or "controller",
                ck,
                info["updates_at_checkpoint"],
                info["replayed"],
            )
        return info

    def _check_fits(self, ck: Path, meta: dict[str, Any]) -> None:
        variant, arms = self.meta.get("variant"), tuple(self.meta.get("arms", ()))
        if meta.get("variant") != variant:
            raise AdaptspecError(
                f"{ck}: checkpoint of variant {meta.get('variant')!r}, this controller is {variant!r}"
            )
        if tuple(meta.get("arms", ())) != arms:
            raise AdaptspecError(f"{ck}: checkpoint has arms {meta.get('arms')}, the policy has {list(arms)}")
        load = bool(self.meta.get("load_features", False))
        if bool(meta.get("load_features", False)) != load:  # older checkpoints: written without them
            raise AdaptspecError(
                f"{ck}: checkpoint was written with load_features={not load}, this controller has "
                f"load_features={load} (chosen when the policy is created)"
            )
        fp = None if self.featurizer is None else self.featurizer.fingerprint
        if meta.get("featurizer") != fp:
            raise AdaptspecError(
                f"{ck}: checkpoint was written with featurizer {meta.get('featurizer')}, "
                f"this controller uses {fp}"
            )

    def _logged_after(self, anchor: str | None) -> list[Update]:
        """The logged rewards of this variant after decision ``anchor`` (all of them without one), in log order.

        These rows are read back from disk (checked by the log's reader), not from checked decisions."""
        from ..traces.log_writer import log_rows

        variant, arms = self.meta.get("variant"), tuple(self.meta.get("arms", ()))
        rows = [
            r
            for r in log_rows(
                self.log_dir,
                [
                    "variant",
                    "block_size",
                    "reward",
                    "features",
                    "speed_ratio",
                    "arms",
                    "cf_rewards",
                    "cf_censored",
                ],
                journals=False,
            )
            if r.get("variant") == variant
        ]
        todo = [r for r in rows if r.get("reward") is not None and int(r["block_size"]) in arms]
        if anchor is not None:
            ids = [r["decision_id"] for r in todo]
            if anchor not in ids:
                log.warning(
                    "%s: the checkpoint's last update %s is not in %s; resuming from the checkpoint alone",
                    variant or "controller",
                    anchor,
                    self.log_dir,
                )
                return []
            todo = todo[ids.index(anchor) + 1 :]
        out = []
        for r in todo:
            f = r.get("features")
            if self.contextual and f is None:
                raise AdaptspecError(
                    f"{self.log_dir}: logged decision {r['decision_id']} has no features: cannot "
                    "replay it into a contextual policy (log_features was off)"
                )
            ctx = None if f is None else np.asarray(f, dtype=np.float32).astype(np.float64)
            ratio = r.get("speed_ratio") if self.machine_speed is not None else None
            every = {}
            if (
                r.get("cf_rewards") is not None and r.get("cf_censored") is not None
            ):  # every arm's, as it was learnt
                every = {
                    "arms": tuple(int(a) for a in r["arms"]),
                    "rewards": np.asarray(r["cf_rewards"], dtype=np.float64),
                    "observed": ~np.asarray(r["cf_censored"], dtype=bool),
                }
            out.append(
                Update(ctx, int(r["block_size"]), float(r["reward"]), r["decision_id"], ratio, **every)
            )
        return out
