"""AdaptiveController: choose each request's block size with a policy, and keep learning.

One request through :meth:`AdaptiveController.generate`, and which part does what::

    prefill      the speculator, under the speculator's lock (this module)
    decide       Decider: the context (Contexts), a decision on the policy snapshot, on the
                 decision thread, checked where it enters (block_sizes.check_decision), or
                 the fallback; the DecisionBook records it as pending
    decode       the speculator, under its lock, with the checked block size (this module)
    feedback     DecisionBook: claims the pending decision, computes the reward, writes the
                 row to the decision log and queues the Update, under one lock (log order)
    update       UpdateWorker (the update thread): Learner.apply in log order, publishes a
                 fresh snapshot to the Decider, housekeeping (expiry, Checkpointer, log roll)

Engines that run decoding themselves use the split form: ``decision = controller.decide(
features)`` when the prefill is done, ``controller.feedback(decision.decision_id, outcome)``
when the request finishes; :meth:`AdaptiveController.for_engine` builds such a controller from
the engine's arms and feature width, with no speculator object. A batched engine also passes the load at the decision
(``decide(features, load=LoadState(...))``: the log keeps it, and a controller made with
``load_features=True`` appends it to the policy's context) and how the request's decode time
was attributed (``feedback(..., shared=SharedRounds(...))``: the log keeps it). Feedback may arrive late, out of order, twice (the second is
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

Where the parts are (each built here from the checked settings, :mod:`adaptspec.control.config`,
and given what it needs): :mod:`~adaptspec.control.policy_build` (which policy runs),
:mod:`~adaptspec.control.context_width` (the features' width, settled once),
:mod:`~adaptspec.control.context` and :mod:`~adaptspec.control.decider` (deciding),
:mod:`~adaptspec.control.block_sizes` (the block-size checks), :mod:`~adaptspec.control.book`
(pending decisions, feedback, logging), :mod:`~adaptspec.control.updates` (the learning policy
and the update thread), :mod:`~adaptspec.control.checkpointer` (checkpoints and resume).

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

import logging
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from ..errors import AdaptspecError
from ..paths import (
    BUNDLED_HEAD,
)  # the head trained on the bundled default (benchmark) traces, with its featurizer
from ..policies.featurizer import Featurizer
from ..reward.functions import DEFAULT_REWARD, check_reward
from ..schedules.fixed import BlockFunction
from ..speculator import Decision, LoadState, Outcome, Round, SharedRounds, is_tree_arm, verified_positions
from .block_sizes import check_outcome
from .book import (
    DecisionBook,
    DecisionLogError as DecisionLogError,  # re-exported: the serving layer catches it
    open_decision_log,
)
from .checkpointer import Checkpointer
from .config import ControllerConfig
from .context import LOAD_FEATURES, Contexts
from .context_width import ContextWidth, settle_width
from .decider import Decider, copy_policy
from .full_feedback import CounterfactualPricer, pricing_profile
from .generation import FeedbackResult, Generation, PrefillError, split_outcome
from .policy_build import DEFAULT_ARMS, PolicySetup, default_policy_spec, setup_policy
from .protocol import DecoderShape, engine_shape, speculator_shape
from .updates import Learner, UpdateQueue, UpdateWorker

__all__ = [
    "AdaptiveController",
    "Generation",
    "PrefillError",
    "DecisionLogError",
    "DEFAULT_ARMS",
    "BUNDLED_HEAD",
    "default_policy_spec",
]

log = logging.getLogger("adaptspec.control.controller")  # one logger for the controller and its parts

_LOCKS: "weakref.WeakKeyDictionary[Any, threading.Lock]" = weakref.WeakKeyDictionary()
_LOCKS_BY_ID: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _host_pricing(speculator: Any) -> Callable[[], Any] | None:
    """What prices the default on this host (:func:`adaptspec.host.for_speculator`, called only
    when the bundled head is the default); None without a speculator object (an engine)."""
    if speculator is None:
        return None

    def priced() -> Any:
        from ..host import for_speculator

        return for_speculator(speculator)

    return priced


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
        A :class:`~adaptspec.speculator.BlockSpeculator`: ``max_block_size``,
        ``prefill(prompt_ids, temperature=0.0, seed=None) -> Prefill`` and ``decode(prefill,
        block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None) -> Outcome``,
        and optionally ``feature_dim`` and ``per_round``; checked now, a missing method or a
        signature that cannot take these arguments refused in one line. None for an engine that
        decodes by itself (use :meth:`for_engine`): then ``arms`` is required and
        :meth:`generate` is refused.
    policy
        A :class:`~adaptspec.policies.Policy`, a spec string (``"neural-linear:head=PATH"``,
        ``"fixed:16"``, ...) or None for the default chosen from the decoder
        (:func:`~adaptspec.control.policy_build.choose_default_policy`: NeuralLinear over the
        bundled head where it fits the decoder's block sizes and feature width, else a cold
        policy over arms up to ``max_block_size``; ``policy_choice`` says which and why). A
        policy object is owned by the controller from then on (it becomes the learning copy).
        For a speculator :func:`~adaptspec.models.load_speculator` made on the CPU the default
        is priced by this host's curve, as ``adaptspec demo`` and ``adaptspec serve`` price it
        (:func:`~adaptspec.control.policy_build.default_on_host`): the bundled head re-priced by
        the host's measured round costs, and the host's best block size as the fallback; where
        speculating cannot pay here the default is plain decoding (``fixed:1``) throughout.
        Its cost: the first such controller on a host times the host (:mod:`adaptspec.host`:
        about 15 CPU seconds, 10-40 s of wall time on a busy 2-core host, and each dtype's
        models loaded once); the record is cached under ``<cache>/host/`` and later
        controllers read it.
    arms
        Block sizes for a policy built from a spec (default:
        :func:`~adaptspec.control.policy_build.default_arms` of the speculator's maximum; a
        head-based policy uses its head's arms). For an engine: the block sizes it can decode.
        Where the speculator declares ``draft_trees``, tree arms too: ``-N``, the best draft tree
        of ``N`` nodes (:func:`~adaptspec.speculator.tree_arm`; docs/controller.md, "Draft trees
        as arms"); the default adds them only where the host's curve says they pay
        (:func:`~adaptspec.control.policy_build.tree_default`).
    feature_dim
        The length of the prefill features, for a speculator that does not declare it (or an
        engine). Known, it chooses the default policy and refuses a policy, checkpoint or
        request of another width; unknown, the first request's features fix it.
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
        them (:class:`~adaptspec.costs.machine_speed.MachineSpeed`: a uniform machine slowdown cancels,
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
        Used when the policy fails or is late (default: the chain closest to 8). Must be an arm.
    decide_timeout_s
        Time budget of one decision.
    decide_on_caller
        Decide on the calling thread instead of the decision thread (an engine whose own thread
        decides at join: one hand-off fewer per request). A decision is then not cut off at
        ``decide_timeout_s`` (no other thread can): one slower is used, counted as late
        (``stats()["fallbacks"]`` is unchanged, ``stats()["late_decisions"]``) and logged.
    feedback_timeout_s
        A decision without feedback for this long is logged without a reward and dropped
        (None: never).
    max_pending
        The most decisions waiting for feedback at once (default 10,000, about 10 MiB): beyond
        it the oldest waiting one expires early, as at ``feedback_timeout_s`` (logged without a
        reward, counted ``expired``; its feedback later is ``late``).
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
    load_features
        Append the load at decision time (:data:`~adaptspec.control.context.LOAD_FEATURES` of
        the :class:`~adaptspec.speculator.LoadState` given to :meth:`decide`) to every context
        (default False). It widens the context by 5, so it is chosen when the policy is
        created: a policy, checkpoint or decision log made without it does not fit. Then every
        :meth:`decide` needs ``load``; :meth:`generate` gives its own (one row, no queue).
    prefix_drafts
        For an engine (no speculator; a speculator declares its own): every round drafts one
        block and verifies a prefix of it, as vLLM's speculative methods under
        :mod:`adaptspec.vllm` do, so every shorter block size's counterfactual outcome is exact
        (not marked approximate; docs/controller.md, *Full information*). Default False.
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
        decide_on_caller: bool = False,
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
        load_features: bool = False,
        feature_dim: int | None = None,
        max_pending: int = 10_000,
        prefix_drafts: bool = False,
    ) -> None:
        settings = {k: v for k, v in locals().items() if k not in ("self", "speculator", "policy")}
        self.config = cfg = ControllerConfig(
            **settings
        )  # the keyword arguments as given, every one checked here
        self.shape = shape = _decoder_shape(speculator, cfg)
        self.speculator, self.max_block_size = speculator, shape.max_block_size
        self.setup = setup = setup_policy(policy, cfg, shape, host=_host_pricing(speculator))
        _check_round_choices(setup.arms, cfg)
        self.round_rule = cfg.round_schedule(self.max_block_size)
        self._spec_lock = speculator_lock(speculator) if speculator is not None else threading.Lock()
        self._requests, self._inflight, self._closed = (
            threading.Condition(),
            0,
            False,
        )  # generate calls in flight
        if policy is None:  # the controller chose: say which and why (a caller's own choice needs no words)
            log.info("%s: policy %s", variant or "controller", setup.choice)
        self._log = open_decision_log(cfg)
        try:
            self._start_learning(cfg, setup, shape)
        except BaseException:
            if self._log is not None:
                self._log.close()
            raise

    def _start_learning(self, cfg: ControllerConfig, setup: PolicySetup, shape: DecoderShape) -> None:
        """Wires the decision book, the learner (resumed from its checkpoint, then joined to the fleet's
        statistics), the decider and the update worker, and starts the worker."""
        self._updates = UpdateQueue()
        self._book = DecisionBook(
            self._updates,
            reward_fn=setup.reward_fn,
            log_writer=self._log,
            variant=cfg.variant,
            machine_speed=setup.machine_speed,
            log_features=cfg.log_features,
            feedback_timeout_s=cfg.feedback_timeout_s,
            max_pending=cfg.max_pending,
            pricer=_pricer(cfg, setup, shape),
        )
        learner = Learner(
            setup.learner,
            contextual=setup.contextual,
            machine_speed=setup.machine_speed,
            reward_name=cfg.reward_name,
            name=cfg.variant or "",
        )
        checkpointer = _checkpointer(cfg, setup)
        self.resumed = checkpointer.resume(learner) if checkpointer is not None and cfg.resume else None
        contexts = Contexts.settled(
            _width(cfg, shape, setup, self._log, learner, self.resumed),
            setup.featurizer,
            contextual=setup.contextual,
            policy_label=setup.label,
            load_features=cfg.load_features,
        )
        if cfg.shared is not None:  # after resume: the fleet's statistics replace the checkpoint's
            learner.attach(cfg.shared, cfg.variant, cfg.path("log_dir"))
        self._decider = Decider(
            copy_policy(learner.policy),
            contexts,
            arms=setup.arms,
            name=cfg.variant or "",
            fallback_block_size=setup.fallback_block_size,
            timeout_s=cfg.decide_timeout_s,
            on_caller=cfg.decide_on_caller,
        )
        self._worker = UpdateWorker(
            learner,
            self._updates,
            decider=self._decider,
            book=self._book,
            checkpointer=checkpointer,
            log_writer=self._log,
            name=cfg.variant or "",
        )
        self._worker.start()
        self._blas_limits = (
            None if cfg.blas_threads is None else threadpool_limits(cfg.blas_threads, user_api="blas")
        )

    @classmethod
    def for_engine(
        cls, arms: Sequence[int], feature_dim: int | None = None, policy: Any = None, **settings: Any
    ) -> "AdaptiveController":
        """A controller for an engine that decodes by itself (no speculator object): it calls
        :meth:`decide` with each request's prefill features and :meth:`feedback` with its
        :class:`~adaptspec.speculator.Outcome`. ``arms`` are the block sizes the engine can
        decode, ``feature_dim`` the length of its features (None: the first ``decide`` fixes
        it); ``policy`` and ``settings`` as for the constructor (``redecide_every`` and
        ``round_rule`` run inside :meth:`generate`, which such a controller does not have).

        >>> with AdaptiveController.for_engine(arms=[1, 2, 4, 8], feature_dim=3, reward="tau") as c:
        ...     d = c.decide([0.5, 0.1, 2.0])
        ...     tau = min(d.block_size, 2)
        ...     c.feedback(d.decision_id, Outcome([7] * (1 + tau), [Round(d.block_size, tau, 0.0, 0.01)], 0.01))
        FeedbackResult('applied', 2.0)
        >>> c.policy_choice
        'fi-ucb: no head fits: the bundled head has arms [1, 2, 3, 4, 6, 8, 12, 16], not all among the arms [1, 2, 4, 8]; cold start over arms [1, 2, 4, 8]'
        >>> c.generate([1, 2, 3])
        Traceback (most recent call last):
        ...
        adaptspec.errors.AdaptspecError: this controller was made for an engine that decodes by itself (no speculator): call decide() and feedback(), or build it over a speculator to use generate()
        """
        return cls(None, policy, arms=arms, feature_dim=feature_dim, **settings)

    # ================================================================== the settings, as resolved
    variant = property(lambda self: self.config.variant, doc="The A/B variant written in every log row.")
    arms = property(lambda self: self.setup.arms, doc="The block sizes the policy chooses among.")
    policy_spec = property(lambda self: self.setup.spec, doc="The policy's spec (None for a policy object).")
    policy_label = property(lambda self: self.setup.label, doc="The policy's label.")
    featurizer = property(
        lambda self: self.setup.featurizer, doc="The featurizer contexts are made with, or None."
    )
    fallback_block_size = property(
        lambda self: self.setup.fallback_block_size, doc="Used when the policy fails."
    )
    machine_speed = property(lambda self: self.setup.machine_speed, doc="The reward calibration, or None.")
    policy_choice = property(
        lambda self: str(self.setup.choice),
        doc="Which policy runs and why, in words (logged at construction).",
    )
    log_dir = property(lambda self: self.config.path("log_dir"), doc="The decision log directory, or None.")
    checkpoint_dir = property(
        lambda self: self.config.path("checkpoint_dir"), doc="The checkpoint directory, or None."
    )
    _contextual = property(lambda self: self.setup.contextual)
    _shared = property(lambda self: self._worker.learner.shared)

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
        if self.speculator is None:
            raise AdaptspecError(
                "this controller was made for an engine that decodes by itself (no speculator): "
                "call decide() and feedback(), or build it over a speculator to use generate()"
            )
        if (
            isinstance(max_new_tokens, bool)
            or not isinstance(max_new_tokens, (int, np.integer))
            or max_new_tokens < 1
        ):
            raise AdaptspecError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        with self._requests:
            if self._closed:
                raise AdaptspecError("this AdaptiveController is closed")
            self._inflight += 1
        try:
            return self._generate(prompt_ids, int(max_new_tokens), temperature, seed, request_id, on_tokens)
        finally:
            with self._requests:
                self._inflight -= 1
                self._requests.notify_all()

    def _generate(
        self,
        prompt_ids: Any,
        max_new_tokens: int,
        temperature: float,
        seed: int | None,
        request_id: str | None,
        on_tokens: Callable[[list[int]], None] | None,
    ) -> Generation:
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
        load = None
        if self.config.load_features:  # decoded alone: one row, nothing counted as queued
            load = LoadState(
                rows=1,
                queue=0,
                context_tokens=int(pre.prompt_tokens),
                temperature=float(temperature),
                max_tokens=max_new_tokens,
            )
        ctx = self._decider.context(pre.features, load)
        first = self._decide(ctx, request_id, load, int(pre.prompt_tokens))
        decisions = [first]
        starts = [0]
        schedule = self._schedule(first, decisions, starts, ctx, request_id, load, int(pre.prompt_tokens))
        kwargs: dict[str, Any] = {"temperature": temperature}
        if on_tokens is not None:
            kwargs["on_round"] = lambda new, r: on_tokens(list(new))
        t2 = time.perf_counter()
        try:
            with self._spec_lock:
                outcome = self.speculator.decode(pre, schedule, max_new_tokens, **kwargs)
        except BaseException:
            for d in decisions:
                self._book.abandon(d.decision_id, "decode_error")
            raise
        t3 = time.perf_counter()
        try:
            segments = self._segments(outcome, decisions, starts, max_new_tokens)
        except AdaptspecError:
            for d in decisions:
                self._book.abandon(d.decision_id, "decode_error")
            raise
        ends = [False] * (len(decisions) - 1) + [True]  # which re-decision's rounds end the request
        rewards = [
            self._book.feedback(d.decision_id, seg, None, last=end)[1]
            for d, seg, end in zip(decisions, segments, ends)
        ]
        t4 = time.perf_counter()
        return Generation(
            outcome, first, decisions, rewards, prefill_s=t1 - t0, overhead_s=(t2 - ta) + (t4 - t3)
        )

    def _schedule(
        self,
        first: Decision,
        decisions: list[Decision],
        starts: list[int],
        ctx: Any,
        request_id: str | None,
        load: LoadState | None,
        prompt_tokens: int,
    ) -> Any:
        """The request's block sizes round by round: the first decision's (through the round rule if
        any), or with redecide_every a fresh decision every k rounds, appended to decisions (and the
        round it starts at to starts) as decoding reaches it."""
        if self.config.redecide_every is None:
            return (
                first.block_size
                if self.round_rule is None
                else self.round_rule.with_block_size(first.block_size)
            )
        k = self.config.redecide_every

        def redecide(i: int, rounds: list[Round]) -> int:
            if i > 0 and i % k == 0 and starts[-1] != i:
                before = prompt_tokens + sum(r.tau for r in rounds)  # its rounds' context starts there
                decisions.append(self._decide(ctx, request_id, load, before))
                starts.append(i)
            return decisions[-1].block_size

        return BlockFunction(redecide)

    def _segments(
        self, outcome: Any, decisions: list[Decision], starts: list[int], max_new_tokens: int
    ) -> list[Outcome]:
        """The decoded outcome checked and split into each decision's rounds (raises AdaptspecError
        for an outcome that breaks what was decided)."""
        if not isinstance(outcome, Outcome):
            raise AdaptspecError(
                f"speculator {self.shape.name}: decode returned {type(outcome).__name__}, "
                "not an adaptspec Outcome"
            )
        largest = (
            self.max_block_size
            if self.round_rule is not None
            else max(verified_positions(d.block_size) for d in decisions)
        )
        check_outcome(outcome, decisions[0], largest, max_new_tokens)
        if len(decisions) == 1:
            return [outcome]
        segments = split_outcome(outcome, starts)
        for d, seg in zip(decisions, segments):  # each one's rounds: at most its size
            big = max((r.block_size for r in seg.rounds), default=0)
            if big > verified_positions(d.block_size):
                raise AdaptspecError(
                    f"outcome of decision {d.decision_id} refused: its rounds ran block size "
                    f"{big}, larger than the {d.block_size} decided"
                )
        return segments

    def decide(
        self,
        features: Sequence[float] | np.ndarray | None = None,
        *,
        request_id: str | None = None,
        load: LoadState | None = None,
    ) -> Decision:
        """Choose a block size for a request whose prefill gave ``features``; the decision has an id.

        ``load`` is the load at this decision (a batched engine's rows and queue, the request's
        size; None for an unbatched caller): logged with the decision, and part of the context
        with ``load_features`` (then it is required). Never raises because of the policy: a
        failing or late policy gives the fallback block size (``decision.extras["fallback"]``
        says why). Bad ``features`` raise.
        """
        self._check_open()
        if load is not None and not isinstance(load, LoadState):
            raise AdaptspecError(f"load must be an adaptspec LoadState, got {type(load).__name__}")
        return self._decide(self._decider.context(features, load), request_id, load)

    def feedback(
        self,
        decision_id: str,
        outcome: Outcome | None = None,
        *,
        reward: float | None = None,
        shared: SharedRounds | None = None,
    ) -> FeedbackResult:
        """Report how decision ``decision_id`` went: its ``outcome`` (the reward is computed from
        it) and/or an explicit ``reward``; ``shared``, from a batched engine, how the outcome's
        ``decode_s`` was attributed among the rows it shared rounds with (logged).

        Returns a :class:`~adaptspec.control.generation.FeedbackResult`: the status and the reward
        it computed (None unless applied). The status is ``"applied"`` (logged; the update is queued), ``"no_reward"`` (logged, but
        the reward was undefined, e.g. no round ran), ``"duplicate"`` (already had feedback:
        ignored), ``"late"`` (it had expired, or was dropped at ``close``: ignored) or
        ``"unknown"`` (never decided here). Once it returns, the row is in the decision log durably.
        After ``close`` nothing is logged or learnt: every decision was settled then, so the status
        is ``"late"``, ``"duplicate"`` or ``"unknown"``.

        A reward must be a real number (not a string, not a boolean), finite and of plausible size
        (:data:`~adaptspec.speculator.REWARD_LIMIT`); an outcome the decision cannot have
        produced (:func:`~adaptspec.control.block_sizes.check_outcome`) raises, and the decision is
        logged without a reward (``decode_error``), no longer pending.
        """
        if outcome is None and reward is None:
            raise AdaptspecError("feedback needs an outcome or a reward")
        if shared is not None and not isinstance(shared, SharedRounds):
            raise AdaptspecError(f"shared must be an adaptspec SharedRounds, got {type(shared).__name__}")
        if outcome is not None and not isinstance(outcome, Outcome):
            raise AdaptspecError(f"outcome must be an adaptspec Outcome, got {type(outcome).__name__}")
        if reward is not None:
            reward = check_reward(reward)  # a real number (not "5", not True), finite, of plausible size
        if self._closed:  # every pending decision was dropped at close: it is late, as an expired one
            return FeedbackResult(self._book.settled(decision_id), None)
        decision = self._book.decision(decision_id)
        if outcome is not None and decision is not None:
            try:
                check_outcome(outcome, decision)
            except (
                AdaptspecError
            ):  # an outcome no honest decode produces: logged as a failed decode, not pending
                self._book.abandon(decision_id, "decode_error")
                raise
        return FeedbackResult(*self._book.feedback(decision_id, outcome, reward, shared))

    def sync(self, timeout: float | None = 30.0) -> "AdaptiveController":
        """Wait until every queued update is applied and published to decisions."""
        self._worker.sync(timeout)
        return self

    def checkpoint(self) -> Path | None:
        """Apply queued updates and write a checkpoint now (None without ``checkpoint_dir``)."""
        if self._worker.checkpointer is None:
            return None
        self.sync()
        return self._worker.checkpoint_now()

    def stats(self) -> dict[str, Any]:
        """Counters and state, for metrics and health checks."""
        learner, ck, book, lw = self._worker.learner, self._worker.checkpointer, self._book, self._log
        applied = self._updates.applied
        out = {
            "variant": self.variant,
            "policy": self.policy_label,
            "policy_choice": self.policy_choice,
            "decisions": self._decider.decisions,
            "fallbacks": dict(self._decider.fallbacks),
            "late_decisions": self._decider.late,
            "feedback": dict(book.counts),
            "pending": book.pending,
            "updates": learner.updates,
            "queued": self._updates.waiting,
            "update_errors": learner.errors,
            "update_mean_s": learner.update_s / applied if applied else 0.0,
            "update_max_s": learner.update_max_s,
            "checkpoints": 0 if ck is None else ck.written,
            "checkpoint_errors": 0 if ck is None else ck.errors,
            "log_errors": book.log_errors + (0 if lw is None else lw.roll_errors),
            "checkpoint_updates": 0 if ck is None else ck.updates_written,
            "resumed": self.resumed,
            "machine_speed": None if self.machine_speed is None else self.machine_speed.factor,
        }
        errors = [
            book.last_error,
            None if ck is None else ck.last_error,
            None if lw is None else lw.last_error,
        ]
        newest = max((e for e in errors if e is not None), default=None)
        out["last_error"] = None if newest is None else newest[1]
        if self._shared is not None:
            out["shared"] = self._shared.status()
        if lw is not None:
            out["log"] = {
                "rows": lw.rows_written,
                "parts": lw.parts_written,
                "recovered": lw.recovered,
                "roll_errors": lw.roll_errors,
            }
        return out

    def policy_snapshot(self, timeout: float = 5.0) -> Any:
        """A private copy of the policy decisions use now (for off-policy evaluation, reports)."""
        return self._decider.snapshot(timeout)

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
        with self._requests:
            if self._closed:
                return
            self._closed = True
            self._requests.wait_for(lambda: self._inflight == 0, timeout)
        self._worker.stop()
        if self._shared is not None:
            self._shared.close()  # publishes every update applied, one last time
        self._decider.close()
        if self._log is not None:
            self._log.close()
        if self._blas_limits is not None:
            self._blas_limits.restore_original_limits()

    def __enter__(self) -> "AdaptiveController":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"AdaptiveController(policy={self.policy_label!r}, arms={list(self.arms)}, variant={self.variant!r}, "
            f"featurizer={self.featurizer!r})"
        )

    # ================================================================== helpers
    def _decide(
        self,
        ctx: np.ndarray | None,
        request_id: str | None,
        load: LoadState | None = None,
        context_tokens: int | None = None,
    ) -> Decision:
        d = self._decider.decide(ctx)  # checked, with an id; the fallback if the policy failed
        self._book.open(d, ctx, request_id, load, context_tokens)
        return d

    def _check_open(self) -> None:
        if self._closed:
            raise AdaptspecError("this AdaptiveController is closed")


def _decoder_shape(speculator: Any, cfg: ControllerConfig) -> DecoderShape:
    """The decoder's :class:`~adaptspec.control.protocol.DecoderShape` (a speculator checked
    against the protocol, or an engine's arms), with the per-round options it cannot honour
    refused."""
    if speculator is None:
        if cfg.arms is None:
            raise AdaptspecError(
                "AdaptiveController(None, ...) is a controller for an engine that decodes by itself: "
                "it needs arms, the block sizes the engine can decode (AdaptiveController.for_engine)"
            )
        shape = engine_shape(cfg.arms, cfg.feature_dim, cfg.prefix_drafts)
        if cfg.redecide_every is not None or cfg.round_rule is not None:
            raise AdaptspecError(
                "redecide_every and round_rule run inside generate(): a controller for an engine "
                "(no speculator) has none; the engine applies its own per-round rule"
            )
        return shape
    if cfg.prefix_drafts:
        raise AdaptspecError(
            "prefix_drafts is for an engine's controller (no speculator): a speculator declares "
            "its own prefix_drafts attribute"
        )
    shape = speculator_shape(speculator, cfg.feature_dim)
    if not shape.per_round:
        option = (
            f"redecide_every={cfg.redecide_every}"
            if cfg.redecide_every is not None
            else f"round_rule={cfg.round_rule!r}"
            if cfg.round_rule is not None
            else None
        )
        if option is not None:
            raise AdaptspecError(
                f"{option} needs a speculator whose decode asks its RoundSchedule every round: "
                f"speculator {shape.name} does not declare per_round = True"
            )
    return shape


def _width(
    cfg: ControllerConfig,
    shape: DecoderShape,
    setup: PolicySetup,
    log_writer: Any,
    learner: Learner,
    resumed: dict[str, Any] | None,
) -> ContextWidth:
    """The width of the features, settled from everything that knows it
    (:func:`~adaptspec.control.context_width.settle_width`): the decoder, the policy, the decision
    log (when it keeps contexts) and the policy as resumed."""
    learnt = getattr(learner.policy, "dim", None) if setup.contextual else None
    return settle_width(
        shape,
        reads=setup.reads,
        featurizer=setup.featurizer,
        given=cfg.feature_dim,
        extra=len(LOAD_FEATURES) if cfg.load_features else 0,
        label=setup.label,
        logged=log_writer.feature_dim if log_writer is not None and cfg.log_features else None,
        log_dir=cfg.path("log_dir"),
        learnt=learnt,
        checkpoint=None if resumed is None else resumed.get("checkpoint"),
    )


def _pricer(cfg: ControllerConfig, setup: PolicySetup, shape: DecoderShape) -> CounterfactualPricer | None:
    """What prices every arm's counterfactual reward for the book (None for a custom reward
    function: its value at another arm is unknown); exact for a decoder that verifies prefixes
    of one draft."""
    if not isinstance(cfg.reward, str):
        return None
    return CounterfactualPricer(
        cfg.reward, pricing_profile(cfg.latency, setup.machine_speed), shape.prefix_drafts
    )


def _checkpointer(cfg: ControllerConfig, setup: PolicySetup) -> Checkpointer | None:
    """The controller's checkpointer (its directory checked now), or None without ``checkpoint_dir``."""
    directory = cfg.path("checkpoint_dir")
    if directory is None:
        return None
    meta = {
        "variant": cfg.variant,
        "policy_label": setup.label,
        "policy_spec": setup.spec,
        "arms": list(setup.arms),
        "seed": cfg.seed,
        "reward": cfg.reward_name,
        "load_features": cfg.load_features,
    }
    return Checkpointer(
        directory,
        meta=meta,
        featurizer=setup.featurizer,
        log_dir=cfg.path("log_dir"),
        machine_speed=setup.machine_speed,
        contextual=setup.contextual,
        every=cfg.checkpoint_every,
        interval_s=cfg.checkpoint_interval_s,
    )


def _check_round_choices(arms: Sequence[Any], cfg: ControllerConfig) -> None:
    """Draft trees are chosen once per request: a rule that chooses between rounds takes chain arms only."""
    if any(is_tree_arm(a) for a in arms) and (cfg.redecide_every is not None or cfg.round_rule is not None):
        raise AdaptspecError(
            f"arms {list(arms)} hold draft trees, which redecide_every and round_rule "
            "cannot choose between rounds: give chain arms only"
        )
