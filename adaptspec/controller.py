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

>>> from adaptspec.speculator import Outcome, Prefill, Round
>>> class Toy:                      # any object with prefill/decode/max_block_size
...     max_block_size = 8
...     def prefill(self, prompt_ids, **kw):
...         return Prefill(first_token=1, prompt_tokens=len(prompt_ids), features=np.ones(3, np.float32))
...     def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None):
...         b = block_size(0, []) if callable(block_size) else block_size
...         return Outcome([1] * 5, [Round(b, min(b, 4), 0.001, 0.004)], decode_s=0.005)
>>> with AdaptiveController(Toy(), "fixed:4", arms=[1, 2, 4, 8], reward="tau") as c:
...     g = c.generate([5, 6, 7], max_new_tokens=5)
...     g.decision.block_size, g.reward, c.sync().stats()["updates"]
(4, 4.0, 1)
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import inspect
import logging
import math
import tempfile
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any, Callable, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from .errors import AdaptspecError
from .featurizer import Featurizer
from .models.bundled import BUNDLED_HEAD  # the head trained on the bundled real traces, with its featurizer
from .rewards import DEFAULT_REWARD
from .speculator import Decision, Outcome, Round

__all__ = ["AdaptiveController", "Generation", "PrefillError", "DEFAULT_ARMS", "BUNDLED_HEAD", "default_policy_spec"]

log = logging.getLogger("adaptspec.controller")

#: Block sizes a policy built from a spec chooses among (those up to the drafter's maximum);
#: the same as the bundled trace set's.
DEFAULT_ARMS = (1, 2, 4, 6, 8, 10, 12, 16, 20, 24)

_FALLBACK_REASONS = ("error", "timeout", "invalid")
_FEEDBACK = ("applied", "no_reward", "duplicate", "late", "unknown", "expired", "dropped", "decode_error", "log_error")
_DONE_MEMORY = 100_000


class PrefillError(AdaptspecError):
    """The speculator refused the prompt (empty, token ids out of range, ...): the caller's input is wrong."""


class DecisionLogError(AdaptspecError):
    """A decision could not be written to the decision log (a full disk, say): it is not acknowledged,
    and the policy does not learn from it."""


def default_policy_spec(head: str | Path | None = None, speculator: Any = None) -> str:
    """The product default: NeuralLinear over ``head`` (default: the bundled head) if it exists, else UCB.

    UCB is the context-free fallback while no trained head is available, or, given
    ``speculator``, when the head does not fit it: a head trained for block sizes beyond the
    speculator's ``max_block_size``, or for prefill features of another width (another model).
    """
    h = Path(head) if head is not None else BUNDLED_HEAD
    if not (h / "config.json").is_file():
        return "ucb"
    if speculator is not None and not _head_fits(h, speculator):
        return "ucb"
    return f"neural-linear:head={h}"


def _head_fits(head: Path, speculator: Any) -> bool:
    from .policies.offline_head import HeadModel

    model = HeadModel.load(head)
    if max(model.arms) > int(getattr(speculator, "max_block_size", 0) or 0):
        return False
    width = getattr(getattr(speculator, "target", None), "feature_dim", None)
    if width is None:
        return True
    want = Featurizer.load(head).in_dim if Featurizer.exists(head) else model.in_dim
    return int(width) == int(want)


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


@dataclass
class _Pending:
    decision: Decision
    context: np.ndarray | None
    request_id: str | None
    since: float


@dataclass
class _Update:
    context: np.ndarray | None
    block_size: int
    reward: float
    decision_id: str


@dataclass
class _Counters:
    decisions: int = 0
    fallbacks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_FALLBACK_REASONS, 0))
    feedback: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_FEEDBACK, 0))
    update_errors: int = 0
    update_s: float = 0.0
    update_max_s: float = 0.0
    checkpoints: int = 0
    checkpoint_errors: int = 0
    log_errors: int = 0
    last_error: tuple[float, str] | None = None  # (time, what) of the newest failure of a checkpoint or log write


_STOP = object()
_LOCKS: "weakref.WeakKeyDictionary[Any, threading.Lock]" = weakref.WeakKeyDictionary()
_LOCKS_BY_ID: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def speculator_lock(speculator: Any) -> threading.Lock:
    """The lock every controller uses around calls into ``speculator`` (one per speculator object)."""
    with _LOCKS_GUARD:
        try:
            lock = _LOCKS.get(speculator)
            if lock is None:
                lock = _LOCKS[speculator] = threading.Lock()
        except TypeError:  # not weak-referenceable
            lock = _LOCKS_BY_ID.setdefault(id(speculator), threading.Lock())
        return lock


class AdaptiveController:
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
        A :class:`~adaptspec.featurizer.Featurizer` or the directory of a saved one. None: the
        one saved next to the policy's head if there is one, else the features unchanged.
    reward
        ``"token_latency"`` (minus measured ms per new token, default), ``"throughput"``
        (measured tokens/s), ``"modelled"`` (with ``latency``) or ``"tau"`` --
        :func:`adaptspec.rewards.reward_function`, as in the simulator -- or any
        ``f(outcome) -> float``.
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
        variant: str | None = None,
        log_dir: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = 100,
        checkpoint_interval_s: float | None = 60.0,
        fallback_block_size: int | None = None,
        decide_timeout_s: float = 0.1,
        feedback_timeout_s: float | None = 300.0,
        redecide_every: int | None = None,
        seed: int | None = 0,
        resume: bool = True,
        log_features: bool = True,
        roll_rows: int = 1000,
        roll_interval_s: float | None = 60.0,
        log_fsync: bool = True,
        blas_threads: int | None = 1,
        shared: Any = None,
    ) -> None:
        from .rewards import reward_function

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
        self._on_round = "on_round" in _parameters(speculator.decode)
        pp = _parameters(speculator.prefill)
        self._prefill_kw = [k for k in ("temperature", "seed") if k in pp or "**" in pp]

        # ---------------------------------------------------------------- policy and featurizer
        self.policy_spec: str | None = None
        if policy is None:
            policy = default_policy_spec()
        if isinstance(policy, str):
            from .policies.spec import make_policy

            self.policy_spec = policy
            cand = tuple(arms) if arms is not None else tuple(a for a in DEFAULT_ARMS if a <= self.max_block_size)
            learner = _build_policy(make_policy, policy, cand, seed)
        else:
            learner = policy
            for name in ("decide", "update", "arms"):
                if not hasattr(learner, name):
                    raise AdaptspecError(f"policy {type(learner).__name__} has no {name}: not a block-size policy")
            if arms is not None and tuple(sorted(arms)) != tuple(learner.arms):
                raise AdaptspecError(f"arms {list(arms)} differ from the policy's {list(learner.arms)}")
        self.arms: tuple[int, ...] = tuple(int(a) for a in learner.arms)
        if max(self.arms) > self.max_block_size:
            too_big = [a for a in self.arms if a > self.max_block_size]
            label = getattr(learner, "label", type(learner).__name__)
            whose = "given" if arms is not None and tuple(sorted(arms)) == self.arms else f"of policy {label}"
            raise AdaptspecError(f"block sizes {too_big} {whose} exceed the speculator's max_block_size "
                                 f"{self.max_block_size} (arms {list(self.arms)})")
        self.policy_label = str(getattr(learner, "label", type(learner).__name__))
        self._contextual = bool(getattr(learner, "contextual", True))
        self.featurizer = self._resolve_featurizer(featurizer, learner)
        dim = getattr(learner, "dim", None)
        if self.featurizer is not None and dim is not None and self._contextual and dim != self.featurizer.out_dim:
            raise AdaptspecError(f"the featurizer gives {self.featurizer.out_dim} values, policy {self.policy_label} "
                                 f"expects {dim}")
        if fallback_block_size is None:
            fallback_block_size = min(self.arms, key=lambda a: (abs(a - 8), a))
        if fallback_block_size not in self.arms:
            raise AdaptspecError(f"fallback block size {fallback_block_size} is not one of the arms {list(self.arms)}")
        self.fallback_block_size = int(fallback_block_size)
        self.reward_fn: Callable[[Outcome], float] = (
            reward if callable(reward) else reward_function(reward, latency))
        self.reward_name = reward if isinstance(reward, str) else getattr(reward, "__name__", "custom")

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
            _check_checkpoint_dir(self.checkpoint_dir)
        self._log = None
        if self.log_dir is not None:
            from .logwriter import DecisionLogWriter

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

        ``on_tokens(new_ids)`` is called with the first token after prefill and then with the
        rest: after every round when the speculator's ``decode`` takes an ``on_round``
        callback, else once when decoding ends. ``temperature`` and ``seed`` go to the
        speculator's ``prefill`` when it takes them. Exceptions from the speculator propagate
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
        given = {"temperature": temperature, "seed": seed}
        t0 = time.perf_counter()
        try:
            with self._spec_lock:
                pre = self.speculator.prefill(prompt_ids, **{k: given[k] for k in self._prefill_kw})
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
        schedule: Any = first.block_size
        if self.redecide_every is not None:
            k = self.redecide_every

            def redecide(i: int, rounds: list[Round]) -> int:
                if i > 0 and i % k == 0 and starts[-1] != i:
                    decisions.append(self._decide(ctx, request_id))
                    starts.append(i)
                return decisions[-1].block_size

            schedule = redecide

        kwargs: dict[str, Any] = {"temperature": temperature}
        if on_tokens is not None and self._on_round:
            kwargs["on_round"] = lambda new, r: on_tokens(list(new))
        t2 = time.perf_counter()
        try:
            with self._spec_lock:
                outcome = self.speculator.decode(pre, schedule, int(max_new_tokens), **kwargs)
        except BaseException:
            for d in decisions:
                self._abandon(d.decision_id, "decode_error")
            raise
        if on_tokens is not None and not self._on_round and len(outcome.tokens) > 1:
            on_tokens([int(t) for t in outcome.tokens[1:]])
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
                big = max((r.block_size for r in outcome.rounds), default=0)
                if big > p.decision.block_size:
                    raise AdaptspecError(f"outcome ran block size {big}, but decision {decision_id} chose "
                                         f"{p.decision.block_size}: report the outcome of the decided block size")
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
        """Hash of the learnt state decisions use now (see :func:`adaptspec.checkpoint.state_digest`)."""
        from .checkpoint import state_digest

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
            if not self._valid(d):
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
            probs = np.zeros(len(self.arms))
            probs[self.arms.index(self.fallback_block_size)] = 1.0
            d = Decision(self.fallback_block_size, 1.0, probs, self.arms, f"fallback:{self.fallback_block_size}",
                         version=-1, extras={"fallback": reason})
        did = uuid.uuid4().hex
        d = d.with_id(did)
        with self._lock:
            self._pending[did] = _Pending(d, ctx, request_id, time.monotonic())
            self._counters.decisions += 1
            if reason is not None:
                self._counters.fallbacks[reason] += 1
        return d

    def _decide_now(self, ctx: np.ndarray | None) -> Decision:
        """Runs on the decision thread, the only one that touches the snapshot."""
        self._adopt()
        return self._snapshot.decide(ctx)

    def _adopt(self) -> None:
        """Switch decisions to the newest published copy, carrying the random generator over."""
        nxt = self._published
        if nxt is not self._snapshot:
            rng = getattr(self._snapshot, "rng", None)
            if rng is not None and getattr(nxt, "rng", None) is not None:
                nxt.rng.bit_generator.state = rng.bit_generator.state
            self._snapshot = nxt

    def _copy_snapshot(self) -> Any:
        self._adopt()
        return self._copy(self._snapshot)

    def _valid(self, d: Any) -> bool:
        if not isinstance(d, Decision):
            return False
        try:
            b = int(d.block_size)
            if b != d.block_size or b not in self.arms or tuple(d.arms) != self.arms:
                return False
            p = np.asarray(d.probs, dtype=np.float64)
            prop = float(d.propensity)
        except (TypeError, ValueError):
            return False
        return (p.shape == (len(self.arms),) and bool(np.isfinite(p).all()) and bool((p >= -1e-12).all())
                and abs(float(p.sum()) - 1.0) <= 1e-6 and 0.0 < prop <= 1.0 + 1e-9
                and abs(p[self.arms.index(b)] - prop) <= 1e-6)

    # ================================================================== feedback
    def _feedback(self, decision_id: str, outcome: Outcome | None, reward: float | None) -> tuple[str, float | None]:
        with self._lock:
            p = self._pending.pop(decision_id, None)
            if p is None:
                prev = self._done.get(decision_id)
                status = "unknown" if prev is None else ("late" if prev in ("expired", "dropped") else "duplicate")
                self._counters.feedback[status] += 1
                return status, None
            self._remember(decision_id, "done")
        r = reward
        if r is None and outcome is not None:
            try:
                r = float(self.reward_fn(outcome))
            except Exception as e:  # e.g. no round ran: the reward is undefined, the row is still logged
                log.info("%s: no reward for decision %s: %s", self.variant or "controller", decision_id, e)
                r = None
            if r is not None and not math.isfinite(r):
                r = None
        status = "applied" if r is not None else "no_reward"
        try:
            self._commit(p, outcome, r)
        except DecisionLogError:  # not logged, so not applied either
            with self._lock:
                self._counters.feedback["log_error"] += 1
            raise
        with self._lock:
            self._counters.feedback[status] += 1
        return status, r

    def _abandon(self, decision_id: str, why: str) -> None:
        """Log a pending decision without a reward (expired, dropped at close, decode error)."""
        with self._lock:
            p = self._pending.pop(decision_id, None)
            if p is None:
                return
            self._remember(decision_id, why)
            self._counters.feedback[why] += 1
        self._commit(p, None, None)

    def _commit(self, p: _Pending, outcome: Outcome | None, reward: float | None) -> None:
        from .traces import decision_row

        row = decision_row(p.decision, features=p.context if self.log_features else None, outcome=outcome,
                           reward=reward, request_id=p.request_id, variant=self.variant)
        if outcome is not None and not outcome.rounds:
            row["mean_tau"] = None
        learn = reward is not None and p.decision.block_size in self.arms
        with self._seq_lock:  # the log's order is the order updates are applied in
            if self._log is not None:
                try:
                    self._log.append(row)
                except AdaptspecError as e:
                    with self._lock:
                        self._counters.log_errors += 1
                        self._counters.last_error = (time.time(), f"decision log: {e}")
                    log.error("%s: decision %s not logged: %s", self.variant or "controller", p.decision.decision_id, e)
                    raise DecisionLogError(f"decision {p.decision.decision_id} could not be logged: {e}") from None
            if learn:
                with self._cond:
                    self._enqueued += 1
                self._queue.put(_Update(p.context, int(p.decision.block_size), float(reward), p.decision.decision_id))

    def _remember(self, decision_id: str, status: str) -> None:
        self._done[decision_id] = status
        if len(self._done) > _DONE_MEMORY:
            self._done.popitem(last=False)

    # ================================================================== update thread
    def _work(self) -> None:
        stop = False
        while not stop:
            try:
                item = self._queue.get(timeout=self._tick)
            except Empty:
                item = None
            batch: list[_Update] = []
            requests: list[Any] = []
            while item is not None:
                if item is _STOP:
                    stop = True
                elif isinstance(item, _Update):
                    batch.append(item)
                else:
                    requests.append(item)
                if len(batch) >= 256:
                    break
                try:
                    item = self._queue.get_nowait()
                except Empty:
                    item = None
            if batch:
                for u in batch:
                    self._apply(u)
                self._published = self._copy(self._learner)
                with self._cond:
                    self._applied += len(batch)
                    self._cond.notify_all()
            try:
                self._housekeeping(force_checkpoint=stop)
                if self._shared is not None and self._shared.apply_pending(self._learner):
                    self._published = self._copy(self._learner)  # the fleet's statistics, to decisions
            except Exception as e:  # never let the update thread die
                log.error("%s: housekeeping failed: %r", self.variant or "controller", e)
            for kind, fut in requests:
                try:
                    fut.set_result(self._write_checkpoint() if kind == "checkpoint" else None)
                except Exception as e:
                    fut.set_exception(e)
            if stop:
                with self._lock:
                    left = list(self._pending)
                for did in left:
                    self._abandon(did, "dropped")
                while True:  # rows just logged: apply them so the final checkpoint has them
                    try:
                        u = self._queue.get_nowait()
                    except Empty:
                        break
                    if isinstance(u, _Update):
                        self._apply(u)
                        with self._cond:
                            self._applied += 1
                if self.checkpoint_dir is not None and self._n_updates > self._ckpt_updates:
                    self._safe_checkpoint()
                with self._cond:
                    self._cond.notify_all()

    def _apply(self, u: _Update) -> None:
        t = time.perf_counter()
        try:
            ctx = u.context if self._contextual else None
            if self._shared is not None:
                self._shared.update(self._learner, ctx, u.block_size, u.reward)
            else:
                self._learner.update(ctx, u.block_size, u.reward)
        except Exception as e:
            self._counters.update_errors += 1
            log.error("%s: policy update failed for decision %s: %r", self.variant or "controller", u.decision_id, e)
        dt = time.perf_counter() - t
        self._counters.update_s += dt
        self._counters.update_max_s = max(self._counters.update_max_s, dt)
        self._n_updates += 1
        self._last_update_id = u.decision_id

    def _housekeeping(self, force_checkpoint: bool = False) -> None:
        if self.feedback_timeout_s is not None:
            now = time.monotonic()
            with self._lock:
                old = [k for k, p in self._pending.items() if now - p.since > self.feedback_timeout_s]
            for did in old:
                self._abandon(did, "expired")
        if self.checkpoint_dir is not None and self._n_updates > self._ckpt_updates and not force_checkpoint:
            due = self._n_updates - self._ckpt_updates >= self.checkpoint_every
            if not due and self.checkpoint_interval_s is not None:
                due = time.monotonic() - self._ckpt_time >= self.checkpoint_interval_s
            if due:
                self._safe_checkpoint()
        if self._log is not None:
            self._log.maybe_roll()

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
        from .checkpoint import write_checkpoint

        try:  # the decisions' generator, so that a resumed policy draws on from there
            state = self._decider.submit(self._decision_rng_state).result(timeout=1.0)
            self._learner.rng.bit_generator.state = state
        except Exception:  # a stuck or generator-less policy: keep the learner's own
            pass
        meta = {"updates": self._n_updates, "last_decision_id": self._last_update_id, "variant": self.variant,
                "policy_label": self.policy_label, "policy_spec": self.policy_spec, "arms": list(self.arms),
                "seed": self.seed, "reward": self.reward_name}
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
        from .checkpoint import latest_checkpoint, load_policy, read_checkpoint

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
        from .logwriter import log_rows

        rows = [r for r in log_rows(self.log_dir, ["variant", "block_size", "reward", "features"], journals=False)
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
            self._apply(_Update(ctx, int(r["block_size"]), float(r["reward"]), r["decision_id"]))
        return len(todo)

    # ================================================================== helpers
    def _context_width(self) -> int | None:
        """Length of the contexts this controller logs (None: not known before the first request)."""
        if self.featurizer is not None:
            return int(self.featurizer.out_dim)
        width = getattr(getattr(self.speculator, "target", None), "feature_dim", None)
        return width if isinstance(width, (int, np.integer)) else None

    def _resolve_featurizer(self, featurizer: Any, policy: Any) -> Featurizer | None:
        if isinstance(featurizer, Featurizer):
            return featurizer
        if featurizer is not None:
            return Featurizer.load(featurizer)
        if self.policy_spec is not None:
            from .policies.spec import parse_spec

            name, args, opts = parse_spec(self.policy_spec)
            default = BUNDLED_HEAD if name in ("neural-linear", "head") else None
            for v in [opts.get("head"), opts.get("path"), *args[:1], default]:
                if v and Featurizer.exists(Path(v).expanduser()):
                    return Featurizer.load(Path(v).expanduser())
        return None

    @staticmethod
    def _copy(policy: Any) -> Any:
        head = getattr(policy, "head", None)  # read-only after training: share it
        memo = {} if head is None else {id(head): head}
        return copy.deepcopy(policy, memo)

    def _check_open(self) -> None:
        if self._closed:
            raise AdaptspecError("this AdaptiveController is closed")


def _build_policy(make_policy: Callable[..., Any], spec: str, arms: tuple[int, ...], seed: int | None) -> Any:
    from .policies.spec import parse_spec

    name, args, opts = parse_spec(spec)
    if name in ("neural-linear", "head") or (name == "squarecb" and "head" in opts):
        from .policies.offline_head import HeadModel

        h = opts.get("head") or opts.get("path") or (args[0] if args else None)
        if h is not None:  # a head decides the arms
            head_arms = HeadModel.load(Path(h).expanduser()).arms
            return make_policy(spec, head_arms, seed=seed)
    return make_policy(spec, arms, seed=seed)


def _check_checkpoint_dir(path: Path) -> None:
    """Refuse, now, a checkpoint directory no checkpoint could be written to (rather than fail
    every checkpoint later, in the background)."""
    if path.exists() and not path.is_dir():
        raise AdaptspecError(f"{path}: cannot keep checkpoints here: it is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        Path(tempfile.mkdtemp(prefix=".probe-", dir=path)).rmdir()
    except OSError as e:
        raise AdaptspecError(f"{path}: cannot keep checkpoints here ({e.strerror or e})") from None


def _parameters(fn: Callable[..., Any]) -> set[str]:
    """Names ``fn`` takes; ``"**"`` stands for a ``**kwargs`` catch-all."""
    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return {"**"}
    return {"**" if p.kind is p.VAR_KEYWORD else p.name for p in ps}


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
