"""The plug-in's work, on plain values: admit, decide, cut, observe a step, finish.

:class:`~adaptspec.vllm.scheduler.AdaptiveScheduler` reads vLLM's objects and calls this class
with ids, token lists and counts, so every rule lives here once, whatever vLLM calls its hooks.

- **admit**: a new request gets its variant (``adaptspec_variant`` in its ``extra_args``, else
  the router's split) and its features (:mod:`adaptspec.vllm.features`).
- **decide**: in the step its prefill ends (before the step runs), its variant's controller decides
  its block size B (``decide(features, load=...)``; B = 1 + drafts verified, at most
  ``num_speculative_tokens`` + 1).
- **drafts_wanted**: when vLLM has made a step's batch, the most drafts any of its requests will
  verify next step: vLLM's drafter proposes that many (``num_spec_tokens_to_schedule``, as its own
  per-batch-size table sets it), so a batch whose requests all run B = 1 costs the drafter one
  token a request, not K + 1.
- **cut**: every step, before vLLM schedules the drafts it just proposed, each decided request's
  drafts are cut to B - 1, or to the load rule's smaller choice for the step's batch.
- **observe**: after the step, each request's drafts verified and tokens committed are one round;
  the step's time is attributed to its rows (:mod:`adaptspec.reward.attribution`) and the load
  rule gets the round back.
- **finish**: a request that ended (stopped, at its length, aborted) is fed back to its
  controller with its :class:`~adaptspec.speculator.Outcome`.
- **account**: the caller's clock: the engine's time and the plug-in's own time in vLLM's hooks
  (the scheduler times both, so the plug-in's cost per step is measured where vLLM pays it).

A failure of a policy, a controller or the load rule never stops vLLM, and neither does a slow
policy: a decision runs on its controller's decision thread and the hook waits for it at most
``decide_timeout`` (:mod:`adaptspec.control.decider`); a policy that raises, answers something
invalid or is late gives its request the controller's fallback length, and while a late decision
still holds that thread every later request of the variant gets it at once. A request the plug-in
itself fails on (or whose ``adaptspec_variant`` names no variant) runs at vLLM's own length from
then on (``fallback``). Every fallback is counted by variant and reason, every fault by variant and
where, the controllers' update, checkpoint and log errors among them (:meth:`AdaptspecPlugin.watch`;
:mod:`adaptspec.vllm.metrics`), and logged in a bounded line: a client's string is cut
(:mod:`adaptspec.vllm.client_text`). The controllers' decision logs keep their guarantee: an
acknowledged decision (its feedback returned) survives a SIGKILL of the engine.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import AdaptspecError
from ..reward.attribution import attribute
from ..speculator import LoadState, Outcome
from .client_text import shown
from .config import ENTRY, PLUGIN_PROFILE, PluginSettings
from .features import FEATURE_DIM, prompt_features
from .metrics import plugin_metrics
from .record import RequestRecord
from .step_costs import StepCosts

__all__ = ["AdaptspecPlugin", "DEFAULT_VARIANT", "VARIANT_ARG"]

log = logging.getLogger("adaptspec.vllm")

#: The variant of a plug-in given no ``variants``: the default policy.
DEFAULT_VARIANT = "default"
#: The per-request extra argument naming a variant (``SamplingParams(extra_args=...)``, ``vllm_xargs``).
VARIANT_ARG = "adaptspec_variant"
#: How often (seconds) the controllers' background errors are read into the counters (:meth:`AdaptspecPlugin.watch`).
WATCH_EVERY_S = 1.0
#: A controller's background counters (``stats()`` keys) and the fault each is counted as.
CONTROLLER_ERRORS = {"update_errors": "update", "checkpoint_errors": "checkpoint", "log_errors": "log"}
#: The learned rule's forced plain steps at a level come after 32, 64, ... up to this many steps
#: (``Learned(plain_every_max=...)``): its costs are this engine's measured steps, whose plain step
#: needs measuring once, not every 32 steps.
PLAIN_EVERY_MAX = 512


class AdaptspecPlugin:
    """Controllers per variant, the load rule and the requests in flight (see the module docstring).

    ``num_speculative_tokens``: vLLM's maximum drafts a step (K); the block sizes are 1..K + 1.
    ``method``: vLLM's speculative method (logged, and in ``stats()``).
    """

    def __init__(self, settings: PluginSettings, num_speculative_tokens: int, method: str) -> None:
        from ..ab.router import ABRouter
        from ..costs.latency import get_profile

        if num_speculative_tokens < 1:
            raise AdaptspecError(
                "adaptspec.vllm chooses each request's speculative length: vLLM runs without "
                "speculative decoding here (give --speculative-config with num_speculative_tokens >= 1)"
            )
        self.settings, self.method = settings, method
        self.max_block_size = num_speculative_tokens + 1
        # every block size up to K + 1: full information shows each of them from every request (a prefix of vLLM's drafts)
        arms = tuple(settings.arms) if settings.arms is not None else tuple(range(1, self.max_block_size + 1))
        if max(arms) > self.max_block_size:
            raise AdaptspecError(
                f"additional_config {ENTRY}.arms {list(arms)}: block size {max(arms)} needs "
                f"{max(arms) - 1} drafts, beyond num_speculative_tokens {num_speculative_tokens}"
            )
        if settings.fallback_block_size is not None and settings.fallback_block_size not in arms:
            raise AdaptspecError(
                f"additional_config {ENTRY}.fallback_block_size {settings.fallback_block_size} is "
                f"not one of the block sizes {list(arms)}"
            )
        fallback = settings.fallback_block_size or max(arms)
        variants = settings.variants or {DEFAULT_VARIANT: None}
        self.router = ABRouter(
            settings.variant_weights() or {DEFAULT_VARIANT: 1.0},
            {n: s or "default" for n, s in variants.items()},
        )
        self.shared_states = _shared_states(settings, list(variants))
        self.controllers: dict[str, Any] = {}
        try:
            for name, spec in variants.items():
                self.controllers[name] = _controller(
                    name,
                    spec,
                    arms,
                    fallback,
                    settings,
                    None if self.shared_states is None else self.shared_states[name],
                )
            #: this engine's measured step costs: the goodput and learned rules' cost model
            self.step_costs = StepCosts(
                get_profile(settings.latency or PLUGIN_PROFILE), max_block_size=self.max_block_size
            )
            self.rule = _load_rule(settings, arms, self.step_costs)
        except BaseException:
            self.close()
            raise
        self.arms = arms
        self.records: dict[str, RequestRecord] = {}
        self._asked: dict[str, int] = {}  # request -> the load rule's block size this step
        self._last_asked: dict[str, int] = {}  # request -> the load rule's block size at its latest cut
        self._proposed: dict[str, int] = {}  # request -> drafts vLLM proposed this step, before the cut
        self._load: Any = None
        self.counts: Counter[str] = Counter()
        self.chosen: Counter[int] = Counter()
        self.drafted = self.accepted = 0
        self.busy_s = self.step_s = self.fetch_s = 0.0
        self.step_blocks: Counter[int] = Counter()  # decode steps by their widest verified block
        self.steps = 0
        self.metrics = plugin_metrics()
        self._errors_seen: dict[tuple[str, str], int] = {}  # (variant, stats key) -> counted so far
        self._watched_s = time.perf_counter()
        #: Called with (request id, variant, Outcome) for every request that ends decided, after its
        #: feedback: how a caller in the engine's process (``adaptspec collect-vllm``) reads what
        #: each request ran. None: nobody listens.
        self.on_outcome: Callable[[str, str, Outcome], None] | None = None
        for name, c in self.controllers.items():
            log.info(
                "adaptspec.vllm: variant %s: %s over block sizes %s (%s, K = %d)",
                name,
                c.policy_choice if variants[name] is None else c.policy_label,
                list(arms),
                method,
                num_speculative_tokens,
            )

    # ------------------------------------------------------------------ the hooks' work
    def admit(self, request_id: str, prompt_ids: Sequence[int], extra_args: Mapping[str, Any] | None) -> None:
        """A new request: its variant and its features."""
        rec = RequestRecord(
            request_id, "", prompt_tokens=max(len(prompt_ids), 1), admitted_s=time.perf_counter()
        )
        self.records[request_id] = rec
        try:
            asked = (extra_args or {}).get(VARIANT_ARG)
            if asked is not None and (not isinstance(asked, str) or asked not in self.controllers):
                rec.fallback = "unknown_variant"  # the client's value: never a label, cut in the log line
                self._count_fallback("", "unknown_variant")
                log.warning(
                    "adaptspec.vllm: request %s asks for %s %s, not one of this engine's variants (%s); "
                    "vLLM runs it at its own length",
                    shown(request_id),
                    VARIANT_ARG,
                    shown(asked),
                    ", ".join(self.controllers),
                )
                return
            rec.variant = asked if asked is not None else self.router.assign()
            rec.features = prompt_features(prompt_ids)
        except Exception as e:  # noqa: BLE001 - a bad prompt costs this request its policy, never vLLM
            self._fall_back(rec, "admit", e)

    def decide(
        self, request_id: str, output_tokens: int, rows: int, queue: int, max_tokens: int, temperature: float
    ) -> None:
        """Its prefill ends (``output_tokens`` out when it has: 1, the prefill's): decide its block size."""
        rec = self.records.get(request_id)
        if rec is None or rec.decision is not None or rec.fallback is not None:
            return
        try:
            load = LoadState(
                rows=max(rows, 1),
                queue=queue,
                context_tokens=rec.prompt_tokens,
                temperature=float(temperature),
                max_tokens=max(int(max_tokens), 1),
            )
            rec.decision = self.controllers[rec.variant].decide(
                rec.features, request_id=request_id, load=load
            )
            rec.decided_s = time.perf_counter()
            rec.view.m = output_tokens
            reason = rec.decision.extras.get("fallback")
            if (
                reason is not None
            ):  # the policy raised, was late or answered something invalid: the controller's fallback
                self._count_fallback(rec.variant, str(reason))
            else:
                self.chosen[int(rec.decision.block_size)] += 1
                self.metrics["decisions"].labels(rec.variant, str(int(rec.decision.block_size))).inc()
        except Exception as e:  # noqa: BLE001
            self._fall_back(rec, "decide", e)

    def drafts_wanted(self, step: Mapping[str, bool]) -> int:
        """How many drafts vLLM's drafter should propose at the end of the step just scheduled
        (``step``: request -> whether it is still prefilling after this step): the most any of its
        requests can verify next step, at most K.

        A decided request (one whose prefill ends this step is decided before this is asked)
        wants its block size B - 1, or the load rule's choice at its latest cut when smaller (the
        rule's latest choice for the batch before its first cut); a prefill chunk wants none (vLLM
        drops a chunk's drafts), and so does a request not decided when its prefill ends (it asked
        for one token: it ends at the prefill's); an unknown or fallen-back request wants vLLM's K.
        When the rule raises a row above what was drafted, the row runs the drafts there are this
        step (the rule is fed back the block that ran) and gets its length the next."""
        k = self.max_block_size - 1
        level = max(self._last_asked.values(), default=self.max_block_size)
        wanted = 0
        for rid, prefilling in step.items():
            rec = self.records.get(rid)
            if rec is None or rec.fallback is not None:
                if rec is None or not prefilling:
                    wanted = k
            elif not prefilling and rec.block_size is not None:
                wanted = max(wanted, min(rec.block_size, self._last_asked.get(rid, level)) - 1)
            if wanted >= k:
                break
        return min(max(wanted, 0), k)

    def drafter_idle(self, prompt_rows: Sequence[str]) -> bool:
        """Whether the drafter's pass after a step that asks it for no draft may be skipped
        (:mod:`adaptspec.vllm.idle_drafter`): every request with prompt tokens in the step
        (``prompt_rows``) is decided at B = 1, so no prompt a request will draft from is missing from
        the drafter's cache. Counted (``drafter_skipped``) when it may."""
        if any((rec := self.records.get(rid)) is None or rec.block_size != 1 for rid in prompt_rows):
            return False
        self.counts["drafter_skipped"] += 1
        self.metrics["drafter_skipped"].inc()
        return True

    def cut(self, drafts: Mapping[str, list[int]], rows: int, queue: int) -> dict[str, list[int]]:
        """Each decided request's drafts for the next step cut to its length (the load rule's,
        when smaller); ``drafts``: request -> the drafts vLLM proposed. Returns the cut lists."""
        out: dict[str, list[int]] = {}
        decided = [
            (rid, rec) for rid in drafts if (rec := self.records.get(rid)) is not None and rec.block_size
        ]
        asked = self._rule_choice(decided, rows, queue)
        self._proposed = {}
        for rid, rec in decided:
            d = drafts[rid]
            self._proposed[rid] = len(d)
            keep = min(rec.block_size, asked.get(rid, rec.block_size)) - 1
            out[rid] = d[:keep] if len(d) > keep else d
        return out

    def observe(self, step: Sequence[tuple[str, int, int, int, int]], step_s: float) -> None:
        """One engine step's passes took ``step_s`` seconds; ``step``: for every request it scheduled,
        (id, tokens it put in the pass, its context, drafts verified, tokens committed: 0 for a
        prefill's row, whose token is no decode round)."""
        try:
            if step:
                blocks = [max(int(s[1]), 1) for s in step]
                shares = attribute(
                    self.settings.attribution, step_s, blocks, [max(s[2], 1) for s in step], self._profile
                )
                decode = all(s[4] >= 1 for s in step)  # no prompt in the step
                self._record_rounds(step, shares, teach_rule=decode)
                if decode:  # what a step at its block costs
                    block = 1 + max(s[3] for s in step)
                    self.step_costs.observe(len(step), block, step_s)
                    self.step_blocks[block] += 1
                    self.metrics["step_blocks"].labels(str(block)).inc()
        except Exception as e:  # noqa: BLE001 - attribution or the load rule: the rows keep their lengths' record
            self.fault("observe", e)
            self._asked = {}

    def watch(self, now: float | None = None) -> None:
        """Count the controllers' background errors (a policy update that raised, a checkpoint or a log
        write that failed, on their update threads) as faults of their variant (``update``,
        ``checkpoint``, ``log``), each once; at most every :data:`WATCH_EVERY_S` seconds unless ``now`` is
        None (then at once). The scheduler calls it every step, and :meth:`close` last."""
        if now is not None and now - self._watched_s < WATCH_EVERY_S:
            return
        self._watched_s = time.perf_counter() if now is None else now
        for name, c in self.controllers.items():
            st = c.stats()
            for key, where in CONTROLLER_ERRORS.items():
                new = int(st.get(key) or 0) - self._errors_seen.get((name, key), 0)
                if new > 0:
                    self._errors_seen[(name, key)] = int(st[key])
                    self.counts[f"faults_{where}"] += new
                    self.metrics["faults"].labels(name, where).inc(new)
                    log.warning(
                        "adaptspec.vllm: variant %s: %d more %s error(s) on its controller's update thread "
                        "(%s)",
                        name,
                        new,
                        where,
                        st.get("last_error") or "see the adaptspec.control log",
                    )

    def account(
        self, engine_s: float = 0.0, own_s: float = 0.0, step: bool = False, fetch_s: float = 0.0
    ) -> None:
        """The caller's clock: ``engine_s`` more seconds of the engine's steps, ``own_s`` of them the
        plug-in's own work in vLLM's hooks, ``fetch_s`` of them vLLM's engine fetching the drafts from
        its worker after a step; ``step``: one more engine step ended."""
        self.step_s += engine_s
        self.busy_s += own_s
        self.fetch_s += fetch_s
        if engine_s:
            self.metrics["step_seconds"].inc(engine_s)
        if own_s:
            self.metrics["plugin_seconds"].inc(own_s)
        if fetch_s:
            self.metrics["fetch_seconds"].inc(fetch_s)
        if step:
            self.steps += 1
            self.metrics["steps"].inc()

    def finish(self, request_id: str, tokens: Sequence[int], finish_reason: str) -> None:
        """The request ended: its feedback (a request never decided leaves no row)."""
        rec = self.records.pop(request_id, None)
        self._asked.pop(request_id, None)
        self._last_asked.pop(request_id, None)
        if rec is not None and rec.decision is not None:
            try:
                outcome = rec.outcome(tokens, finish_reason)
                fed = self.controllers[rec.variant].feedback(
                    rec.decision.decision_id, outcome, shared=rec.shared(time.perf_counter())
                )
                self.counts[f"feedback_{fed}"] += 1
            except Exception as e:  # noqa: BLE001
                self.fault("feedback", e, request_id, variant=rec.variant)
            else:
                if self.on_outcome is not None:
                    try:
                        self.on_outcome(request_id, rec.variant, outcome)
                    except Exception as e:  # noqa: BLE001 - the listener's failure never stops vLLM either
                        self.fault("outcome", e, request_id, variant=rec.variant)

    # ------------------------------------------------------------------ state
    def stats(self) -> dict[str, Any]:
        """Counters for an operator: block sizes chosen, drafts verified and accepted, fallbacks and
        faults, the plug-in's own time against the engine steps' (as :meth:`account` was told)."""
        return {
            "method": self.method,
            "max_block_size": self.max_block_size,
            "arms": list(self.arms),
            "in_flight": len(self.records),
            "chosen": dict(sorted(self.chosen.items())),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.accepted / self.drafted if self.drafted else None,
            "counts": dict(self.counts),
            "steps": self.steps,
            "step_s": self.step_s,
            "plugin_s": self.busy_s,
            "plugin_share": self.busy_s / self.step_s if self.step_s > 0 else None,
            "fetch_s": self.fetch_s,
            "step_blocks": dict(sorted(self.step_blocks.items())),
            "step_costs_ms": self.step_costs.stats(),
            "variants": {n: c.stats() for n, c in self.controllers.items()},
        }

    def close(self) -> None:
        """Close every controller (updates applied, checkpoints written, logs rolled), then count their
        background errors one last time."""
        for name, c in getattr(self, "controllers", {}).items():
            try:
                c.close()
            except Exception as e:  # noqa: BLE001 - the others still close
                self.fault("close", e, variant=name)
        if getattr(self, "metrics", None) is not None:
            try:
                self.watch()
            except Exception as e:  # noqa: BLE001
                self.fault("close", e)
        for s in (getattr(self, "shared_states", None) or {}).values():
            s.close()

    # ------------------------------------------------------------------ parts
    def _rule_choice(self, decided: list[tuple[str, RequestRecord]], rows: int, queue: int) -> dict[str, int]:
        """The load rule's block size for each decided row this step ({} without a rule)."""
        self._asked = {}
        if self.rule is None or not decided:
            return {}
        from ..load_rules.load import Load

        try:
            self._load = Load(rows=max(rows, 1), queue=queue)
            choice = [int(b) for b in self.rule.choose([rec.view for _, rec in decided], self._load)]
            if len(choice) != len(decided):
                raise AdaptspecError(
                    f"load rule {self.rule.name} gave {len(choice)} block sizes for {len(decided)} rows"
                )
            self._asked = {rid: b for (rid, _), b in zip(decided, choice)}
            self._last_asked.update(self._asked)
        except Exception as e:  # noqa: BLE001 - the rows keep their own lengths this step
            self.fault("load_rule", e)
        return self._asked

    def _record_rounds(
        self, step: Sequence[tuple[str, int, int, int, int]], shares: np.ndarray, teach_rule: bool
    ) -> None:
        """Each decided request's round of the step, with its share of the step's time; the load rule
        learns the step only when ``teach_rule`` (a decode step). A step with a prompt in it is left out
        of the rule as of the step costs: its rows' shares are slivers of a prefill's pass (one decode
        row beside a 150-token prompt gets 1/151 of the step by tokens); learnt, a forced plain round
        there set the level's measured-to-modelled scale to ~0.02, every block size the level had not
        played then looked ~40x faster than those it had, and at 2 clients the level-1 steps between one
        request and the next drew B = 8-9."""
        rows = len(step)
        done = []
        for (rid, _tokens, _ctx, drafted, committed), share in zip(step, shares):
            rec = self.records.get(rid)
            if rec is None or rec.decision is None or committed < 1:
                continue  # a prefill chunk, a request not decided yet, or one whose step was discarded
            done.append((rid, rec, drafted, committed, float(share)))
        drafted_sum, accepted_sum = sum(d[2] for d in done), sum(d[3] - 1 for d in done)
        self.drafted += drafted_sum
        self.accepted += accepted_sum
        if done:  # once a step, not once a row: a metric's inc takes a lock
            self.metrics["drafted"].inc(drafted_sum)
            self.metrics["accepted"].inc(accepted_sum)
        ruled = [d for d in done if d[0] in self._asked] if teach_rule else []
        if ruled and self.rule is not None:  # the rule reads the rows as they were before the round
            try:
                ran = [min(self._asked[d[0]], 1 + d[2]) for d in ruled]  # fewer drafts than asked: what ran
                self.rule.feedback(
                    [d[1].view for d in ruled], ran, [d[3] for d in ruled], [d[4] for d in ruled], self._load
                )
            except Exception as e:  # noqa: BLE001
                self.fault("load_rule", e)
        for rid, rec, drafted, committed, share in done:
            rec.add_round(drafted, self._proposed.get(rid, drafted), committed, share, rows)
        self._asked = {}

    @functools.cached_property
    def _profile(self) -> Any:
        """The cost profile of the marginal attribution (None for ``tokens``), read once."""
        if self.settings.attribution != "marginal":
            return None
        from ..costs.latency import get_profile

        return get_profile(self.settings.latency)

    def _fall_back(self, rec: RequestRecord, where: str, e: Exception) -> None:
        """The plug-in failed for ``rec`` at ``where``: vLLM runs it at its own length from now on."""
        rec.fallback = f"{where}: {type(e).__name__}: {e}"
        self._count_fallback(rec.variant, where)
        self.fault(where, e, rec.request_id, variant=rec.variant)

    def _count_fallback(self, variant: str, reason: str) -> None:
        self.counts["fallbacks"] += 1
        self.counts[f"fallbacks_{reason}"] += 1
        self.metrics["fallbacks"].labels(variant, reason).inc()

    def fault(
        self, where: str, e: Exception, request_id: str | None = None, variant: str | None = None
    ) -> None:
        """The plug-in's work at ``where`` failed (for ``request_id`` of ``variant``, when it is one
        request's): counted, and logged in one line."""
        if variant is None:
            rec = (
                self.records.get(request_id) if request_id is not None and hasattr(self, "records") else None
            )
            variant = "" if rec is None else rec.variant
        self.counts[f"faults_{where}"] += 1
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics["faults"].labels(variant, where).inc()
        log.warning(
            "adaptspec.vllm: %s failed%s (%s: %s); vLLM goes on at its own length",
            where,
            f" for request {shown(request_id)}" if request_id else "",
            type(e).__name__,
            e,
        )


def _controller(
    name: str, spec: str | None, arms: Sequence[int], fallback: int, settings: PluginSettings, shared: Any
) -> Any:
    """Variant ``name``'s controller (split form) over the engine's block sizes; a spec, head or
    checkpoint that does not fit is one line naming the variant's key."""
    from ..control.controller import AdaptiveController

    try:
        return AdaptiveController.for_engine(
            arms,
            FEATURE_DIM,
            spec,
            variant=name,
            log_dir=settings.log_dir,
            checkpoint_dir=None if settings.checkpoint_dir is None else Path(settings.checkpoint_dir) / name,
            reward=settings.reward,
            latency=settings.latency or PLUGIN_PROFILE,
            featurizer=settings.featurizer,
            seed=settings.seed,
            fallback_block_size=fallback,
            decide_timeout_s=settings.decide_timeout,
            feedback_timeout_s=settings.feedback_timeout,  # decisions on its decision thread: the hook waits decide_timeout at most
            checkpoint_every=settings.checkpoint_every,
            checkpoint_interval_s=settings.checkpoint_interval,
            roll_rows=settings.roll_rows,
            log_fsync=not settings.no_fsync,
            load_features=settings.load_features,
            shared=shared,
            prefix_drafts=True,
        )  # vLLM drafts its K and the cut verifies a prefix: exact counterfactuals
    except AdaptspecError as e:
        key = f"variants.{name}" if settings.variants else "the default policy"
        raise AdaptspecError(f"additional_config {ENTRY}.{key}: {e}") from None


def _load_rule(settings: PluginSettings, arms: Sequence[int], costs: StepCosts) -> Any:
    """The per-step load rule ``settings.load_rule`` names (None for ``none``); the goodput and learned
    rules priced by this engine's measured steps (``costs``), the others as ``serve`` makes them."""
    from ..load_rules import Goodput, Learned
    from ..load_rules.round_rule import make_load_rule

    if settings.load_rule == "goodput":
        return Goodput(arms, costs, prior=settings.load_prior)  # type: ignore[arg-type]  # a profile's interface
    if settings.load_rule == "learned":  # full information: every shorter block a step shows
        return Learned(
            arms,
            costs,
            prior=settings.load_prior,
            seed=settings.seed,
            full_info=True,  # type: ignore[arg-type]
            margin=settings.load_margin,
            plain_every_max=PLAIN_EVERY_MAX,
        )
    return make_load_rule(settings.load_rule, arms, None, prior=settings.load_prior, seed=settings.seed)


def _shared_states(settings: PluginSettings, variants: list[str]) -> dict[str, Any] | None:
    """One fleet SharedState per variant over one Redis connection (None without ``shared``)."""
    if settings.shared is None:
        return None
    import socket

    from ..fleet import claimed_states

    return claimed_states(
        settings.shared,
        settings.replica_id or f"{socket.gethostname()}:vllm",
        variants,
        sync_every=settings.sync_every,
        sync_interval_s=settings.sync_interval,
        lease_ttl_s=settings.lease_ttl,
    )
