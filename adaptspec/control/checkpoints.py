"""Checkpoints and resume: write them from the update thread, resume from the newest one and
replay the decision log after it.

A checkpoint holds the learning policy, the number of updates it has seen and the id of the
last one (:mod:`adaptspec.control.policy_checkpoint`). On resume the controller loads the newest, checks it
is for the same variant, arms and featurizer, then re-applies in order every logged feedback
after that id: the learnt state is what it was after the last acknowledged feedback.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AdaptspecError
from .feedback import _Update

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


class CheckpointsMixin:
    """Checkpoints of :class:`~adaptspec.control.controller.AdaptiveController`: runs on the update
    thread (which owns the learning copy), except :meth:`_resume` (in ``__init__``)."""

    def _checkpoint_if_due(self) -> None:
        """Checkpoint after ``checkpoint_every`` updates, or ``checkpoint_interval_s`` after the last one."""
        if self.checkpoint_dir is not None and self._n_updates > self._ckpt_updates:
            due = self._n_updates - self._ckpt_updates >= self.checkpoint_every
            if not due and self.checkpoint_interval_s is not None:
                due = time.monotonic() - self._ckpt_time >= self.checkpoint_interval_s
            if due:
                self._safe_checkpoint()

    def _safe_checkpoint(self) -> None:
        try:
            self._write_checkpoint()
        except Exception as e:
            with self._lock:
                self._counters.checkpoint_errors += 1
                self._counters.last_error = (time.time(), f"checkpoint: {e}")
            log.error("%s: checkpoint failed: %r", self.variant or "controller", e)

    def _write_checkpoint(self) -> Path:
        """Runs on the update thread (it owns the learner)."""
        from .policy_checkpoint import write_checkpoint

        try:  # the decisions' generator, so that a resumed policy draws on from there
            state = self._decider.submit(self._decision_rng_state).result(timeout=1.0)
            self._learner.rng.bit_generator.state = state
        except Exception:  # a stuck or generator-less policy: keep the learner's own
            pass
        meta = {"updates": self._n_updates, "last_decision_id": self._last_update_id, "variant": self.variant,
                "policy_label": self.policy_label, "policy_spec": self.policy_spec, "arms": list(self.arms),
                "seed": self.seed, "reward": self.reward_name}
        if self.machine_speed is not None:  # as of the last applied update, like the policy
            meta["machine_speed"] = self.machine_speed.state_dict()
        path = write_checkpoint(self.checkpoint_dir, self._learner, meta, self.featurizer)
        self._ckpt_updates = self._n_updates
        self._ckpt_time = time.monotonic()
        self._counters.checkpoints += 1
        return path

    def _decision_rng_state(self) -> dict[str, Any]:
        self._adopt()
        return self._snapshot.rng.bit_generator.state

    # ================================================================== resume
    def _resume(self) -> None:
        from .policy_checkpoint import latest_checkpoint, load_policy, read_checkpoint

        ck = latest_checkpoint(self.checkpoint_dir)
        anchor = None
        info: dict[str, Any] = {"checkpoint": None, "updates_at_checkpoint": 0, "replayed": 0}
        if ck is not None:
            meta = read_checkpoint(ck)
            if meta.get("variant") != self.variant:
                raise AdaptspecError(f"{ck}: checkpoint of variant {meta.get('variant')!r}, this controller is "
                                     f"{self.variant!r}")
            if tuple(meta.get("arms", ())) != self.arms:
                raise AdaptspecError(f"{ck}: checkpoint has arms {meta.get('arms')}, the policy has {list(self.arms)}")
            fp = None if self.featurizer is None else self.featurizer.fingerprint
            if meta.get("featurizer") != fp:
                raise AdaptspecError(f"{ck}: checkpoint was written with featurizer {meta.get('featurizer')}, "
                                     f"this controller uses {fp}")
            load_policy(ck, self._learner)
            if self.machine_speed is not None and "machine_speed" in meta:
                self.machine_speed.load_state_dict(meta["machine_speed"])
            self._n_updates = int(meta["updates"])
            anchor = meta.get("last_decision_id")
            info.update(checkpoint=str(ck), updates_at_checkpoint=self._n_updates)
        if self.log_dir is not None:
            info["replayed"] = self._replay_log(anchor)
        self.resumed = info
        if ck is not None or info["replayed"]:
            log.info("%s: resumed from %s (%d updates) and replayed %d logged feedbacks",
                     self.variant or "controller", ck, info["updates_at_checkpoint"], info["replayed"])

    def _replay_log(self, anchor: str | None) -> int:
        from ..traces.log_writer import log_rows

        rows = [r for r in log_rows(self.log_dir, ["variant", "block_size", "reward", "features", "speed_ratio"],
                                       journals=False)
                if r.get("variant") == self.variant]
        todo = [r for r in rows if r.get("reward") is not None and int(r["block_size"]) in self.arms]
        if anchor is not None:
            ids = [r["decision_id"] for r in todo]
            if anchor not in ids:
                log.warning("%s: the checkpoint's last update %s is not in %s; resuming from the checkpoint alone",
                            self.variant or "controller", anchor, self.log_dir)
                return 0
            todo = todo[ids.index(anchor) + 1:]
        for r in todo:
            f = r.get("features")
            if self._contextual and f is None:
                raise AdaptspecError(f"{self.log_dir}: logged decision {r['decision_id']} has no features: cannot "
                                     "replay it into a contextual policy (log_features was off)")
            ctx = None if f is None else np.asarray(f, dtype=np.float32).astype(np.float64)
            ratio = r.get("speed_ratio") if self.machine_speed is not None else None
            self._apply(_Update(ctx, int(r["block_size"]), float(r["reward"]), r["decision_id"], ratio))
        return len(todo)
