"""AdaptiveController: choose each request's block size with a policy, and keep learning.

One request through :meth:`AdaptiveController.generate`::

    prefill -> featurize -> decide -> decode -> reward -> update -> log

Engines that run decoding themselves use the split form: ``decision = controller.decide(
features)`` when the prefill is done, ``controller.feedback(decision.decision_id, outcome)``
when the request finishes. Feedback may arrive late, out of order, twice (the second is
ignored and counted) or never (after ``feedback_timeout_s`` the decision is logged without a
reward, dropped and counted).

Threads. Any number of threads may call ``generate`` / ``decide`` / ``feedback``:

- decisions are made on a *snapshot* of the policy by one decision thread; a call waits at
  most ``decide_timeout_s`` for it, else the request gets the fallback block size (as it does
  when the policy raises or returns something invalid): logged, counted, the request goes on;
- feedback is written to the decision log (fsync'd: once ``feedback`` returns, the decision
  and its outcome survive a crash) and queued; one update thread applies the queue to the
  learning copy of the policy in log order and publishes a fresh snapshot after each batch,
  so a slow update never delays a decision (decisions may then use a snapshot a few updates
  old);
- the update thread also writes a checkpoint every ``checkpoint_every`` updates (or
  ``checkpoint_interval_s`` seconds), expires old pending decisions and rolls the log;
- calls into the speculator (prefill and decode) are serialised by a lock shared by every
  controller over the same speculator object (the bundled decoder is not thread-safe).

Resume. With ``checkpoint_dir`` a new controller loads the newest checkpoint and then
re-applies, in order, every logged feedback after the checkpoint's last update: the learnt
state is exactly what it was after the last acknowledged feedback before a crash. (The
policy's random generator resumes from the checkpoint.)

Where the parts are: this module holds the request loop and the public API; the policy a
controller runs is built in :mod:`adaptspec.control.policy_build`, block sizes are checked
where they enter in :mod:`adaptspec.control.block_sizes`, feedback bookkeeping is
:mod:`adaptspec.control.feedback`, the threads :mod:`adaptspec.control.workers`, checkpoints
and resume :mod:`adaptspec.control.checkpoints`.

>>> from adaptspec.schedules import as_schedule
>>> from adaptspec.speculator import Outcome, Prefill, Round
>>> class Toy:                      # a BlockSpeculator: prefill, decode, max_block_size
...     max_block_size = 8
...     def prefill(self, prompt_ids, temperature=0.0, seed=None):
...         return Prefill(first_token=1, prompt_tokens=len(prompt_ids), features=np.ones(3, np.float32))
...     def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
...         b = as_schedule(block_size).draft_size([])   # an int, or a per-round schedule
...         return Outcome([1] * 5, [Round(b, min(b, 4), 0.001, 0.004)], decode_s=0.005)
>>> with AdaptiveController(Toy(), "fixed:4", arms=[1, 2, 4, 8], reward="tau") as c:
...     g = c.generate([5, 6, 7], max_new_tokens=5)
...     g.decision.block_size, g.reward, c.sync().stats()["updates"]
(4, 4.0, 1)
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from queue import SimpleQueue
from typing import Any, Callable, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from .block_sizes import check_arms, check_outcome, choose_fallback, fallback_decision, valid_decision
from .checkpoints import CheckpointsMixin, check_checkpoint_dir
from .feedback import DecisionLogError as DecisionLogError  # re-exported: the serving layer catches it
from .feedback import FeedbackMixin, _Counters, _Pending
from .policy_build import DEFAULT_ARMS, default_policy_spec, make_learner, resolve_featurizer, resolve_machine_speed
from .workers import _STOP, WorkersMixin, speculator_lock
from ..errors import AdaptspecError
from ..policies.featurizer import Featurizer
from ..models.bundled import BUNDLED_HEAD  # the head trained on the bundled default (benchmark) traces, with its featurizer
from ..reward.functions import DEFAULT_REWARD
from ..schedules import parse_schedule
from ..schedules.fixed import BlockFunction
from ..speculator import Decision, Outcome, Round

__all__ = ["AdaptiveController", "Generation", "PrefillError", "DEFAULT_ARMS", "BUNDLED_HEAD", "default_policy_spec"]

log = logging.getLogger("adaptspec.control.controller")


class PrefillError(AdaptspecError):
    """The speculator refused the prompt (empty, token ids out of range, ...): the caller's input is wrong."""


@dataclass
class Generation:
    """What :meth:`AdaptiveController.generate` returns.

    ``decision`` is the decision made after prefill; ``decisions`` holds it and any
    re-decisions (``redecide_every``), ``rewards`` their rewards (None where the reward was
    undefined). ``overhead_s`` is the controller's own time: featurize + decide + reward +
    log + enqueueing the update (the update itself runs on the update thread).
    """

    outcome: Outcome
    decision: Decision
    decisions: list[Decision]
    rewards: list[float | None]
    prefill_s: float
    overhead_s: float

    @property
    def tokens(self) -> list[int]:
        return self.outcome.tokens

    @property
    def reward(self) -> float | None:
        """The reward of the whole request (of the first decision when there were re-decisions)."""
        return self.rewards[0]

    @property
    def fallback(self) -> str | None:
        """Why the first decision fell back to the fallback block size, or None."""
        return self.decision.extras.get("fallback")


class AdaptiveController(FeedbackMixin, WorkersMixin, CheckpointsMixin):
    """Wrap a speculator and a policy; decide, decode, learn and log (see the module docstring).

    Parameters
    ----------
    speculator
        Any object with ``max_block_size``, ``prefill(prompt_ids, **kw) -> Prefill`` and
        ``decode(prefill, block_size, max_new_tokens, temperature, seed) -> Outcome``.
    policy
        A :class:`~adaptspec.policies.Policy`, a spec string (``"neural-linear:head=PATH"``,
        ``"fixed:16"``, ...) or None for :func:`default_policy_spec`. A policy object is owned
        by the controller from then on (it becomes the learning copy).
    arms
        Block sizes for a policy built from a spec (default: :data:`DEFAULT_ARMS` up to the
        speculator's maximum; a head-based policy uses its head's arms).
    featurizer
        A :class:`~adaptspec.policies.featurizer.Featurizer` or the directory of a saved one. None: the
        one saved next to the policy's head if there is one, else the features unchanged.
    reward
        ``"token_latency"`` (minus measured ms per new token, default), ``"throughput"``
        (measured tokens/s), ``"modelled"`` (with ``latency``) or ``"tau"`` --
        :func:`adaptspec.reward.functions.reward_function`, as in the simulator -- or any
        ``f(outcome) -> float``.
    speed_reference
        A latency profile the measured rewards are calibrated to before the policy learns from
        them (:class:`~adaptspec.reward.machine_speed.MachineSpeed`: a uniform machine slowdown cancels,
        what differs between arms on this machine stays). ``"auto"`` (default): the profile the
        policy's head was trained with, if it records one (the bundled head does); None: learn
        from the measured rewards as they are. The log keeps the measured reward and the
        ``speed_ratio``; ``stats()["machine_speed"]`` is the current factor.
    variant
        Name written in the log's ``variant`` column (the A/B variant); also the log writer's name.
    log_dir
        Decision log directory (rows appended durably, rolled into Parquet parts).
    checkpoint_dir
        Where checkpoints go and whence the controller resumes.
    checkpoint_every, checkpoint_interval_s
        Checkpoint after this many updates, or this long after the last checkpoint if there
        were updates since.
    fallback_block_size
        Used when the policy fails or is late (default: the arm closest to 8). Must be an arm.
    decide_timeout_s
        Time budget of one decision.
    feedback_timeout_s
        A decision without feedback for this long is logged without a reward and dropped
        (None: never).
    redecide_every
        Decide again every k rounds inside one request (off by default). Each re-decision is
        its own decision, logged and rewarded on its own rounds.
    round_rule
        A per-round schedule (:mod:`adaptspec.schedules`, or its spec: ``"history"``,
        ``"confidence:0.4"``) that runs inside every request, starting from (or drafting) the
        block size the policy chose; a choice of 1 is plain decoding throughout. Off by default:
        on the benchmark prompts no round rule beat the per-request choice (docs/controller.md).
    seed
        Seed of a policy built from a spec.
    resume
        Load the newest checkpoint and replay the log after it (default True).
    log_features
        Write each decision's context into the log (needed for off-policy evaluation of
        contextual policies and for replay on resume).
    roll_rows, roll_interval_s
        When the log journal becomes a Parquet part.
    log_fsync
        ``fsync`` every logged row before ``feedback`` returns (default): acknowledged decisions
        survive a machine crash. Without it they survive a crash of the process (the rows are
        in the operating system's cache), and feedback is a few milliseconds cheaper.
    blas_threads
        Threads numpy's and scipy's BLAS may use while the controller is open (default 1; None
        leaves them alone). A policy's matrices are small; more threads only compete with the
        decoder for the same cores. With two on 2 cores, NeuralLinear's update took 7 ms of
        wall time in place of 0.5 ms. The previous limits come back at ``close``. torch's own
        threads are not touched.
    shared
        A :class:`~adaptspec.fleet.SharedState`: learn with the other replicas of a fleet
        (statistics published and merged off the decision path; see docs/serving.md#fleet).
        None (default): this process learns alone.
    """

    def __init__(
        self,
        speculator: Any,
        policy: Any = None,
        *,
        arms: Sequence[int] | None = None,
        featurizer: Featurizer | str | Path | None = None,
        reward: str | Callable[[Outcome], float] = DEFAULT_REWARD,
        latency: Any = None,
        speed_reference: Any = "auto",
        variant: str | None = None,
        log_dir: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = 100,
        checkpoint_interval_s: float | None = 60.0,
        fallback_block_size: int | None = None,
        decide_timeout_s: float = 0.1,
        feedback_timeout_s: float | None = 300.0,
        redecide_every: int | None = None,
        round_rule: Any = None,
        seed: int | None = 0,
        resume: bool = True,
        log_features: bool = True,
        roll_rows: int = 1000,
        roll_interval_s: float | None = 60.0,
        log_fsync: bool = True,
        blas_threads: int | None = 1,
        shared: Any = None,
    ) -> None:
        from ..reward.functions import reward_function

        for name in ("prefill", "decode"):
            if not callable(getattr(speculator, name, None)):
                raise AdaptspecError(f"speculator {type(speculator).__name__} has no {name}() method")
        max_b = getattr(speculator, "max_block_size", None)
        if not isinstance(max_b, (int, np.integer)) or max_b < 1:
            raise AdaptspecError(f"speculator {type(speculator).__name__} needs an integer max_block_size >= 1")
        if blas_threads is not None and (int(blas_threads) != blas_threads or blas_threads < 1):
            raise AdaptspecError(f"blas_threads must be a positive integer or None, got {blas_threads!r}")
        self.speculator = speculator
        self.max_block_size = int(max_b)
        self.variant = variant
        self._spec_lock = speculator_lock(speculator)

        # ---------------------------------------------------------------- policy and featurizer
        self.policy_spec, learner = make_learner(policy, arms, self.max_block_size, seed)
        self.arms: tuple[int, ...] = check_arms(learner, arms, self.max_block_size)
        self.policy_label = str(getattr(learner, "label", type(learner).__name__))
        self._contextual = bool(getattr(learner, "contextual", True))
        self.featurizer = resolve_featurizer(featurizer, self.policy_spec)
        dim = getattr(learner, "dim", None)
        if self.featurizer is not None and dim is not None and self._contextual and dim != self.featurizer.out_dim:
            raise AdaptspecError(f"the featurizer gives {self.featurizer.out_dim} values, policy {self.policy_label} "
                                 f"expects {dim}")
        self.fallback_block_size = choose_fallback(fallback_block_size, self.arms)
        self.reward_fn: Callable[[Outcome], float] = (
            reward if callable(reward) else reward_function(reward, latency))
        self.reward_name = reward if isinstance(reward, str) else getattr(reward, "__name__", "custom")
        self.machine_speed = resolve_machine_speed(speed_reference, learner, reward)

        # ---------------------------------------------------------------- settings
        if not decide_timeout_s > 0:
            raise AdaptspecError(f"decide_timeout_s must be > 0, got {decide_timeout_s}")
        if feedback_timeout_s is not None and not feedback_timeout_s > 0:
            raise AdaptspecError(f"feedback_timeout_s must be > 0 or None, got {feedback_timeout_s}")
        if redecide_every is not None and (int(redecide_every) != redecide_every or redecide_every < 1):
            raise AdaptspecError(f"redecide_every must be a positive integer or None, got {redecide_every}")
        if int(checkpoint_every) != checkpoint_every or checkpoint_every < 1:
            raise AdaptspecError(f"checkpoint_every must be a positive integer, got {checkpoint_every}")
        self.decide_timeout_s = float(decide_timeout_s)
        self.feedback_timeout_s = feedback_timeout_s
        self.redecide_every = None if redecide_every is None else int(redecide_every)
        if isinstance(round_rule, str):
            round_rule = parse_schedule(round_rule, self.max_block_size)
        if round_rule is not None and not callable(getattr(round_rule, "with_block_size", None)):
            raise AdaptspecError(f"round_rule must be a schedule with with_block_size (adaptspec.schedules), got {round_rule!r}")
        if round_rule is not None and redecide_every is not None:
            raise AdaptspecError("round_rule and redecide_every cannot be combined: a round rule already decides every round")
        self.round_rule = round_rule
        self.checkpoint_every = int(checkpoint_every)
        self.checkpoint_interval_s = checkpoint_interval_s
        self.log_features = bool(log_features)
        self.seed = seed

        # ---------------------------------------------------------------- state
        self._lock = threading.Lock()       # pending decisions, counters
        self._seq_lock = threading.Lock()   # log order == update order
        self._cond = threading.Condition()  # enqueued / applied counts
        self._pending: dict[str, _Pending] = {}
        self._done: OrderedDict[str, str] = OrderedDict()
        self._counters = _Counters()
        self._queue: SimpleQueue = SimpleQueue()
        self._enqueued = 0
        self._applied = 0
        self._inflight = 0
        self._closed = False
        self._learner = learner
        self._n_updates = 0                 # updates consumed since the policy was new (incl. before a restart)
        self._last_update_id: str | None = None
        self._ckpt_updates = 0
        self._ckpt_time = time.monotonic()
        self.resumed: dict[str, Any] | None = None
        self._shared: Any = None            # SharedState once attached (after resume: replayed feedback is this replica's own)

        self.log_dir = None if log_dir is None else Path(log_dir)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        if self.checkpoint_dir is not None:
            check_checkpoint_dir(self.checkpoint_dir)
        self._log = None
        if self.log_dir is not None:
            from ..traces.log_writer import DecisionLogWriter

            self._log = DecisionLogWriter(self.log_dir, name=variant or "default", roll_rows=roll_rows,
                                          roll_interval_s=roll_interval_s, fsync=log_fsync)
        try:
            dim_log = None if self._log is None else self._log.feature_dim
            dim_now = self._context_width()
            if dim_log is not None and dim_now is not None and self.log_features and dim_log != dim_now:
                source = "the featurizer" if self.featurizer is not None else "the speculator's prefill"
                raise AdaptspecError(f"{self.log_dir}: this decision log holds contexts of {dim_log} features, "
                                     f"{source} gives {dim_now}: use another log directory")
            if self.checkpoint_dir is not None and resume:
                self._resume()
            if shared is not None:  # after resume: the fleet's statistics replace the checkpoint's
                shared.attach(self._learner, variant, self.log_dir, self._contextual)
                self._shared = shared
            # replayed updates are in no checkpoint yet: the next due one (or the one at close) writes them
            self._ckpt_updates = self._n_updates if not self.resumed else self.resumed["updates_at_checkpoint"]
            self._snapshot = self._copy(self._learner)
            self._published = self._snapshot
            self._decider = cf.ThreadPoolExecutor(1, thread_name_prefix=f"adaptspec-decide-{variant or ''}")
            self._tick = 0.25 if feedback_timeout_s is None else min(0.25, feedback_timeout_s / 4)
            self._worker = threading.Thread(target=self._work, name=f"adaptspec-update-{variant or ''}", daemon=True)
            self._worker.start()
            self._blas_limits = None if blas_threads is None else threadpool_limits(int(blas_threads), user_api="blas")
        except BaseException:
            if self._log is not None:
                self._log.close()
            raise

    # ================================================================== public API
    def generate(
        self,
        prompt_ids: Sequence[int] | Any,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        seed: int | None = None,
        *,
        request_id: str | None = None,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> Generation:
        """Prefill, decide, decode, learn and log one request.

        ``on_tokens(new_ids)`` is called with the first token after prefill and then after
        every round with the tokens it committed (through ``decode``'s ``on_round``).
        ``temperature`` and ``seed`` go to the speculator's ``prefill``, ``temperature`` to its
        ``decode`` (the protocol, :class:`~adaptspec.speculator.BlockSpeculator`). Exceptions from the speculator propagate
        (a prefill's ``AdaptspecError`` as :class:`PrefillError`; after a decision, the decision
        is logged without a reward). Re-decisions (``redecide_every``) run
        inside decode and count in its time.
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise AdaptspecError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        with self._cond:
            if self._closed:
                raise AdaptspecError("this AdaptiveController is closed")
            self._inflight += 1
        try:
            return self._generate(prompt_ids, int(max_new_tokens), temperature, seed, request_id, on_tokens)
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    def _generate(self, prompt_ids: Any, max_new_tokens: int, temperature: float, seed: int | None,
                  request_id: str | None, on_tokens: Callable[[list[int]], None] | None) -> Generation:
        t0 = time.perf_counter()
        try:
            with self._spec_lock:
                pre = self.speculator.prefill(prompt_ids, temperature=temperature, seed=seed)
        except AdaptspecError as e:
            raise PrefillError(str(e)) from None
        t1 = time.perf_counter()
        if on_tokens is not None:
            on_tokens([int(pre.first_token)])
        ta = time.perf_counter()
        ctx = self._context(pre.features)
        first = self._decide(ctx, request_id)
        decisions = [first]
        starts = [0]
        schedule: Any = first.block_size if self.round_rule is None else self.round_rule.with_block_size(first.block_size)
        if self.redecide_every is not None:
            k = self.redecide_every

            def redecide(i: int, rounds: list[Round]) -> int:
                if i > 0 and i % k == 0 and starts[-1] != i:
                    decisions.append(self._decide(ctx, request_id))
                    starts.append(i)
                return decisions[-1].block_size

            schedule = BlockFunction(redecide)

        kwargs: dict[str, Any] = {"temperature": temperature}
        if on_tokens is not None:
            kwargs["on_round"] = lambda new, r: on_tokens(list(new))
        t2 = time.perf_counter()
        try:
            with self._spec_lock:
                outcome = self.speculator.decode(pre, schedule, int(max_new_tokens), **kwargs)
        except BaseException:
            for d in decisions:
                self._abandon(d.decision_id, "decode_error")
            raise
        t3 = time.perf_counter()
        segments = [outcome] if len(decisions) == 1 else _split(outcome, starts)
        rewards = [self._feedback(d.decision_id, seg, None)[1] for d, seg in zip(decisions, segments)]
        t4 = time.perf_counter()
        return Generation(outcome, first, decisions, rewards, prefill_s=t1 - t0, overhead_s=(t2 - ta) + (t4 - t3))

    def decide(self, features: Sequence[float] | np.ndarray | None = None, *, request_id: str | None = None) -> Decision:
        """Choose a block size for a request whose prefill gave ``features``; the decision has an id.

        Never raises because of the policy: a failing or late policy gives the fallback
        block size (``decision.extras["fallback"]`` says why). Bad ``features`` raise.
        """
        self._check_open()
        return self._decide(self._context(features), request_id)

    def feedback(self, decision_id: str, outcome: Outcome | None = None, *, reward: float | None = None) -> str:
        """Report how decision ``decision_id`` went: its ``outcome`` (the reward is computed from
        it) and/or an explicit ``reward``.

        Returns ``"applied"`` (logged; the update is queued), ``"no_reward"`` (logged, but
        the reward was undefined, e.g. no round ran), ``"duplicate"`` (already had feedback:
        ignored), ``"late"`` (it had expired: ignored) or ``"unknown"`` (never decided here).
        Once it returns, the row is in the decision log durably.
        """
        if outcome is None and reward is None:
            raise AdaptspecError("feedback needs an outcome or a reward")
        if outcome is not None and not isinstance(outcome, Outcome):
            raise AdaptspecError(f"outcome must be an adaptspec Outcome, got {type(outcome).__name__}")
        if reward is not None:
            try:
                reward = float(reward)
            except (TypeError, ValueError):
                raise AdaptspecError(f"reward must be a number, got {reward!r}") from None
            if not math.isfinite(reward):
                raise AdaptspecError(f"reward must be finite, got {reward!r}")
        self._check_open()
        if outcome is not None:
            with self._lock:
                p = self._pending.get(decision_id)
            if p is not None:
                check_outcome(outcome, p.decision)
        return self._feedback(decision_id, outcome, reward)[0]

    def sync(self, timeout: float | None = 30.0) -> "AdaptiveController":
        """Wait until every queued update is applied and published to decisions."""
        with self._cond:
            target = self._enqueued
            if not self._cond.wait_for(lambda: self._applied >= target or not self._worker.is_alive(), timeout):
                raise AdaptspecError(f"updates not applied within {timeout} s")
        return self

    def checkpoint(self) -> Path | None:
        """Apply queued updates and write a checkpoint now (None without ``checkpoint_dir``)."""
        if self.checkpoint_dir is None:
            return None
        self.sync()
        done: cf.Future = cf.Future()
        self._queue.put(("checkpoint", done))
        return done.result(timeout=60)

    def stats(self) -> dict[str, Any]:
        """Counters and state, for metrics and health checks."""
        c = self._counters
        with self._lock:
            pending = len(self._pending)
            out = {
                "variant": self.variant,
                "policy": self.policy_label,
                "decisions": c.decisions,
                "fallbacks": dict(c.fallbacks),
                "feedback": dict(c.feedback),
                "pending": pending,
                "updates": self._n_updates,
                "queued": self._enqueued - self._applied,
                "update_errors": c.update_errors,
                "update_mean_s": c.update_s / self._applied if self._applied else 0.0,
                "update_max_s": c.update_max_s,
                "checkpoints": c.checkpoints,
                "checkpoint_errors": c.checkpoint_errors,
                "log_errors": c.log_errors + (0 if self._log is None else self._log.roll_errors),
                "checkpoint_updates": self._ckpt_updates,
                "resumed": self.resumed,
                "machine_speed": None if self.machine_speed is None else self.machine_speed.factor,
            }
        errors = [c.last_error, None if self._log is None else self._log.last_error]
        newest = max((e for e in errors if e is not None), default=None)
        out["last_error"] = None if newest is None else newest[1]
        if self._shared is not None:
            out["shared"] = self._shared.status()
        if self._log is not None:
            out["log"] = {"rows": self._log.rows_written, "parts": self._log.parts_written,
                          "recovered": self._log.recovered, "roll_errors": self._log.roll_errors}
        return out

    def policy_snapshot(self, timeout: float = 5.0) -> Any:
        """A private copy of the policy decisions use now (for off-policy evaluation, reports)."""
        return self._decider.submit(self._copy_snapshot).result(timeout=timeout)

    def policy_digest(self) -> str:
        """Hash of the learnt state decisions use now (see :func:`adaptspec.control.policy_checkpoint.state_digest`)."""
        from .policy_checkpoint import state_digest

        return state_digest(self.policy_snapshot())

    def pending_log_rows(self) -> list[dict[str, Any]]:
        """Log rows written durably but not yet rolled into a Parquet part."""
        return [] if self._log is None else self._log.pending_rows()

    def close(self, timeout: float = 120.0) -> None:
        """Let running ``generate`` calls finish (up to ``timeout`` s), apply queued updates, write a
        final checkpoint, roll the log. Idempotent.

        Decisions still waiting for feedback are logged without a reward (counted as dropped).
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.wait_for(lambda: self._inflight == 0, timeout)
        self._queue.put(_STOP)
        self._worker.join()
        if self._shared is not None:
            self._shared.close()  # publishes every update applied, one last time
        self._decider.shutdown(wait=False, cancel_futures=True)
        if self._log is not None:
            self._log.close()
        if self._blas_limits is not None:
            self._blas_limits.restore_original_limits()

    def __enter__(self) -> "AdaptiveController":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"AdaptiveController(policy={self.policy_label!r}, arms={list(self.arms)}, variant={self.variant!r}, "
                f"featurizer={self.featurizer!r})")

    # ================================================================== deciding
    def _context(self, features: Any) -> np.ndarray | None:
        if features is None:
            if self._contextual:
                raise AdaptspecError(f"policy {self.policy_label} is contextual: it needs the prefill features")
            return None
        if self.featurizer is not None:
            return self.featurizer(features)
        try:
            x = np.asarray(features, dtype=np.float32)
        except (TypeError, ValueError):
            raise AdaptspecError(f"features must be a vector of numbers, got {type(features).__name__}") from None
        if x.ndim != 1 or x.size == 0:
            raise AdaptspecError(f"features must be a non-empty 1-D vector, got shape {x.shape}")
        if not np.isfinite(x).all():
            raise AdaptspecError("features have NaN or infinite values")
        return x.astype(np.float64)

    def _decide(self, ctx: np.ndarray | None, request_id: str | None) -> Decision:
        reason = None
        try:
            d = self._decider.submit(self._decide_now, ctx if self._contextual else None).result(self.decide_timeout_s)
            if not valid_decision(d, self.arms):
                reason = "invalid"
                log.warning("%s: policy %s returned an invalid decision %r; using block size %d",
                            self.variant or "controller", self.policy_label, d, self.fallback_block_size)
        except cf.TimeoutError:
            reason = "timeout"
            log.warning("%s: policy %s took longer than %.3f s to decide; using block size %d",
                        self.variant or "controller", self.policy_label, self.decide_timeout_s, self.fallback_block_size)
        except Exception as e:  # the policy failed: the request must still succeed
            reason = "error"
            log.warning("%s: policy %s raised %r; using block size %d", self.variant or "controller",
                        self.policy_label, e, self.fallback_block_size)
        if reason is not None:
            d = fallback_decision(self.fallback_block_size, self.arms, reason)
        did = uuid.uuid4().hex
        d = d.with_id(did)
        with self._lock:
            self._pending[did] = _Pending(d, ctx, request_id, time.monotonic())
            self._counters.decisions += 1
            if reason is not None:
                self._counters.fallbacks[reason] += 1
        return d

    # ================================================================== helpers
    def _context_width(self) -> int | None:
        """Length of the contexts this controller logs (None: not known before the first request)."""
        if self.featurizer is not None:
            return int(self.featurizer.out_dim)
        width = getattr(getattr(self.speculator, "target", None), "feature_dim", None)
        return width if isinstance(width, (int, np.integer)) else None

    def _check_open(self) -> None:
        if self._closed:
            raise AdaptspecError("this AdaptiveController is closed")


def _split(outcome: Outcome, starts: list[int]) -> list[Outcome]:
    """One outcome per re-decision: its rounds, their tokens, its share of the decode time."""
    rounds = outcome.rounds
    bounds = starts + [len(rounds)]
    busy = [r.draft_s + r.verify_s for r in rounds]
    total = sum(busy)
    out = []
    pos = 1
    for j in range(len(starts)):
        rs = rounds[bounds[j]:bounds[j + 1]]
        n = sum(r.tau for r in rs)
        toks = (outcome.tokens[:1] if j == 0 else []) + outcome.tokens[pos:pos + n]
        pos += n
        share = sum(busy[bounds[j]:bounds[j + 1]]) / total if total > 0 else len(rs) / max(1, len(rounds))
        last = j == len(starts) - 1
        out.append(Outcome(toks, list(rs), outcome.decode_s * share, outcome.finish_reason if last else "length"))
    return out
