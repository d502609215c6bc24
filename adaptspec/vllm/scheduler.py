"""AdaptiveScheduler: vLLM's scheduler, with each request's speculative length chosen by adaptspec.

``--scheduler-cls adaptspec.vllm.AdaptiveScheduler`` (or ``vllm.LLM(..., scheduler_cls=...)``)
and ``--additional-config '{"adaptspec": {...}}'``. The subclass reads vLLM's objects in four of
its hooks and hands plain values to :class:`~adaptspec.vllm.plugin.AdaptspecPlugin`, which does
the work:

- ``add_request``: the request is admitted (its variant, its features);
- ``schedule``: once vLLM has made the batch, the requests whose prefill ends in this step are
  decided (before the step runs, so the drafter's pass after it drafts for their lengths; a decision
  runs on its controller's decision thread and holds the step at most ``decide_timeout``, a late or
  stuck policy's request getting the fallback length), and the
  drafts vLLM's drafter will propose after the step are as many as its requests will verify
  (vLLM's ``num_spec_tokens_to_schedule``, which its per-batch-size table sets the same way; never
  more than vLLM's own); with the worker extension ``IdleDrafterSkip`` (:mod:`adaptspec.vllm.idle_drafter`)
  a step that asks for no draft, with no prompt in it a drafting request needs, is marked so the
  worker skips the drafter's pass;
- ``update_from_output``: the step's time, each request's drafts verified and tokens committed
  (what vLLM itself counts as drafted and accepted; a prefill's token is no round), requests that
  ended fed back;
- ``update_draft_token_ids``: the drafts vLLM proposed for the next step, cut to each request's
  length before vLLM schedules them (as vLLM itself cuts them to its token budget);
- ``finish_requests``: requests aborted from outside (a client gone, a stop string) fed back.

Written for vLLM |version| (:mod:`adaptspec.vllm.version`; what differs between those releases
sits in :mod:`adaptspec.vllm.releases`): any other release is refused when this module is imported,
in one line; so is a model runner that ignores the scheduler's speculative length (vLLM's Model
Runner V2, vllm#51510: ``VLLM_USE_V2_MODEL_RUNNER=0`` on 0.32 and 0.33), when vLLM builds the
scheduler.

With asynchronous scheduling (vLLM's default on a GPU) vLLM builds ``AdaptiveScheduler`` as
:class:`AdaptiveAsyncScheduler`, its form over vLLM's ``AsyncScheduler``: there the drafts of the
next step do not pass through the scheduler (the worker keeps them) and the scheduler reserves
their slots one step ahead, so the cut applies to the slots each request reserves
(``_update_after_schedule``), decided in the same step as with synchronous scheduling.

The plug-in's own cost is timed here, where vLLM calls it: every hook's work outside vLLM's own
(``super()``), against the engine's step (from ``schedule`` to the end of ``update_from_output``,
plus ``update_draft_token_ids`` and ``finish_requests``): ``adaptspec_vllm_plugin_seconds_total``
over ``adaptspec_vllm_step_seconds_total``.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterable, Iterator

import vllm

from .releases import output_index, release_of, runner_refusal
from .version import VLLM_VERSIONS

RELEASE = release_of(vllm.__version__)  # before importing vLLM's internals, whose names move between releases

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from ..errors import AdaptspecError  # noqa: E402
from .config import plugin_settings  # noqa: E402
from .idle_drafter import MARK, enabled  # noqa: E402
from .plugin import AdaptspecPlugin, log  # noqa: E402

__all__ = ["AdaptiveAsyncScheduler", "AdaptiveScheduler", "VLLM_VERSIONS"]
__doc__ = __doc__.replace("|version|", VLLM_VERSIONS)

_FINISH = {"stop": "eos"}  # vLLM's finish reasons in adaptspec's words; every other one is "length"


class AdaptiveScheduler(Scheduler):
    """vLLM's :class:`~vllm.v1.core.sched.scheduler.Scheduler` with adaptspec's per-request lengths
    (see the module docstring). With asynchronous scheduling vLLM's config makes it an
    :class:`AdaptiveAsyncScheduler`."""

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> AdaptiveScheduler:
        if cls is AdaptiveScheduler and vllm_config.scheduler_config.async_scheduling:
            cls = AdaptiveAsyncScheduler  # vLLM builds the class it is given: the async form is chosen here
        return super().__new__(cls)

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        # vLLM builds its scheduler after its workers and the model (docs/vllm.md): the entry is checked first thing here
        with _refusal_logged():
            settings = plugin_settings(vllm_config.additional_config)
            self.check_runner(vllm_config)
        super().__init__(vllm_config, *args, **kwargs)
        spec = vllm_config.speculative_config
        with _refusal_logged():
            self.adaptspec = AdaptspecPlugin(
                settings, int(self.num_spec_tokens or 0), spec.method if spec is not None else "none"
            )
        self._step_started = self._output_done = time.perf_counter()
        #: the worker skips the drafter's pass on the steps marked (adaptspec.vllm.IdleDrafterSkip)
        self.skips_idle_drafter = enabled(vllm_config.parallel_config.worker_extension_cls)

    def check_runner(self, vllm_config: Any) -> None:
        """Refuse (one line naming the setting to change) a model runner that would ignore the
        scheduler's per-request speculative length (:func:`~adaptspec.vllm.releases.runner_refusal`)."""
        refusal = runner_refusal(RELEASE, RELEASE.has_v1_runner and bool(vllm_config.use_v2_model_runner))
        if refusal is not None:
            raise AdaptspecError(f"adaptspec.vllm cannot start: {refusal}")

    # ------------------------------------------------------------------ vLLM's hooks
    def add_request(self, request: Any) -> None:
        super().add_request(request)
        t0 = time.perf_counter()
        params = request.sampling_params
        self.adaptspec.admit(
            request.request_id, request.prompt_token_ids or [], None if params is None else params.extra_args
        )
        self.adaptspec.account(own_s=time.perf_counter() - t0)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = super().schedule(*args, **kwargs)
        t1 = time.perf_counter()
        self._step_started = t0
        try:
            self._decide_prefills_ending(out)
        except Exception as e:  # noqa: BLE001 - undecided requests run at vLLM's own length
            self.adaptspec.fault("step", e)
        try:  # vLLM's drafter proposes, after this step, only as many drafts as its requests will verify
            step = {rid: _still_prefilling(self.requests.get(rid)) for rid in out.num_scheduled_tokens}
            if step:
                out.num_spec_tokens_to_schedule = min(
                    out.num_spec_tokens_to_schedule, self.adaptspec.drafts_wanted(step)
                )
                if (
                    self.skips_idle_drafter
                    and out.num_spec_tokens_to_schedule == 0
                    and self.adaptspec.drafter_idle(
                        [rid for rid in step if _in_prompt(self.requests.get(rid))]
                    )
                ):
                    setattr(
                        out, MARK, True
                    )  # no draft wanted, no prompt a drafting request needs: no drafter pass
        except Exception as e:  # noqa: BLE001 - vLLM's own count this step
            self.adaptspec.fault("drafts", e)
        self.adaptspec.account(own_s=time.perf_counter() - t1)
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        t0 = time.perf_counter()
        step_s = t0 - self._step_started  # vLLM's schedule and the model's passes: the time the rows share
        requests = {rid: self.requests.get(rid) for rid in scheduler_output.num_scheduled_tokens}
        try:
            self.adaptspec.observe(_step_rows(scheduler_output, model_runner_output, requests), step_s)
        except Exception as e:  # noqa: BLE001 - the plug-in's fault never stops vLLM
            self.adaptspec.fault("observe", e)
        t1 = time.perf_counter()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        t2 = time.perf_counter()
        try:
            self._after_step(requests)
        except Exception as e:  # noqa: BLE001
            self.adaptspec.fault("step", e)
        t3 = self._output_done = time.perf_counter()
        self.adaptspec.account(engine_s=t3 - self._step_started, own_s=(t1 - t0) + (t3 - t2), step=True)
        return outputs

    def update_draft_token_ids(self, draft_token_ids: Any) -> None:
        t0 = time.perf_counter()
        fetch_s = (
            t0 - self._output_done
        )  # vLLM's engine fetching the drafts from its worker, after the step's output
        try:
            drafts = dict(zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids))
            cut = self.adaptspec.cut(drafts, rows=len(self.running), queue=len(self.waiting))
            for i, rid in enumerate(draft_token_ids.req_ids):
                if rid in cut:
                    draft_token_ids.draft_token_ids[i] = cut[rid]
        except Exception as e:  # noqa: BLE001 - vLLM's own lengths this step
            self.adaptspec.fault("cut", e)
        t1 = time.perf_counter()
        super().update_draft_token_ids(draft_token_ids)
        self.adaptspec.account(engine_s=time.perf_counter() - t0 + fetch_s, own_s=t1 - t0, fetch_s=fetch_s)

    def finish_requests(self, request_ids: str | Iterable[str] | None, finished_status: Any) -> Any:
        t0 = time.perf_counter()
        finished = super().finish_requests(request_ids, finished_status)
        t1 = time.perf_counter()
        for request in finished or ():
            self._finish(request)
        t2 = time.perf_counter()
        self.adaptspec.account(engine_s=t2 - t0, own_s=t2 - t1)
        return finished

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            log.info("adaptspec.vllm: %s", _summary(self.adaptspec.stats()))
            self.adaptspec.close()

    # ------------------------------------------------------------------ parts
    def _decide_prefills_ending(self, out: Any) -> None:
        """Decide each request whose prefill ends in the step just scheduled (none of its tokens
        out yet, no chunk left), unless it asks for one token (it ends at the prefill's)."""
        rows, queue = len(self.running), len(self.waiting)
        for rid in out.num_scheduled_tokens:
            request = self.requests.get(rid)
            if (
                request is None
                or request.is_prefill_chunk
                or request.num_output_tokens
                or request.max_tokens <= 1
            ):
                continue
            params = request.sampling_params
            self.adaptspec.decide(
                rid, 1, rows, queue, request.max_tokens, 0.0 if params is None else params.temperature
            )

    def _after_step(self, requests: dict[str, Any]) -> None:
        for request in requests.values():
            if request is not None and request.is_finished():
                self._finish(request)
        self.adaptspec.watch(time.perf_counter())  # the controllers' background errors, into the counters

    def _finish(self, request: Any) -> None:
        reason = request.get_finished_reason()
        name = str(getattr(reason, "name", reason)).lower()
        self.adaptspec.finish(request.request_id, list(request.output_token_ids), _FINISH.get(name, "length"))


class AdaptiveAsyncScheduler(AdaptiveScheduler, AsyncScheduler):
    """:class:`AdaptiveScheduler` over vLLM's ``AsyncScheduler`` (asynchronous scheduling: vLLM builds
    ``AdaptiveScheduler`` as this class when its config asks for it).

    vLLM's asynchronous scheduler schedules step n + 1 before step n's output is back: when it has
    scheduled a step, it reserves for each request in it that many draft slots for the next step
    (placeholders the worker fills with its own drafts, never passing them to the scheduler), as
    many as the step asks the drafter for. Here each request's reserved slots are cut to its length
    right after vLLM reserves them, the requests whose prefill ends in the step being decided first,
    so the next step verifies for each request as many drafts as with synchronous scheduling. The
    drafts a request is scheduled never exceed its slots (vLLM trims the worker's drafts to them).
    ``IdleDrafterSkip`` marks no step here (the worker's drafter pass feeds the next step's slots)."""

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, *args, **kwargs)
        self.skips_idle_drafter = False

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        super()._update_after_schedule(
            scheduler_output
        )  # vLLM's: every decoding request reserves the step's slots
        t0 = time.perf_counter()
        try:
            self._decide_prefills_ending(scheduler_output)
        except Exception as e:  # noqa: BLE001 - undecided requests run at vLLM's own length
            self.adaptspec.fault("step", e)
        try:
            slots = {
                rid: request.spec_token_ids
                for rid in scheduler_output.num_scheduled_tokens
                if (request := self.requests.get(rid)) is not None and not request.is_prefill_chunk
            }
            cut = self.adaptspec.cut(slots, rows=len(self.running), queue=len(self.waiting))
            for rid, kept in cut.items():
                self.requests[rid].spec_token_ids = kept  # a new list: vLLM shares one placeholder list
        except Exception as e:  # noqa: BLE001 - vLLM's own slots this step
            self.adaptspec.fault("cut", e)
        self.adaptspec.account(own_s=time.perf_counter() - t0)


@contextlib.contextmanager
def _refusal_logged() -> Iterator[None]:
    """A refusal to start (a bad ``adaptspec`` entry) logged as one ERROR line before it is raised: in a
    served vLLM the engine's process logs its traceback and the front end raises its own error last."""
    try:
        yield
    except AdaptspecError as e:
        log.error("adaptspec.vllm: vLLM cannot start: %s", e)
        raise


def _still_prefilling(request: Any) -> bool:
    """Whether the request is still in its prefill after the step just scheduled (vLLM has counted
    the step's tokens as computed when ``schedule`` returns)."""
    return request is not None and bool(request.is_prefill_chunk)


def _in_prompt(request: Any) -> bool:
    """Whether the step just scheduled holds prompt tokens of the request (none of its tokens out yet)."""
    return request is None or not request.num_output_tokens


def _step_rows(scheduler_output: Any, model_runner_output: Any, requests: dict[str, Any]) -> list[tuple]:
    """For every request the step scheduled: (id, tokens in the pass, context, drafts verified,
    tokens committed), as vLLM's own ``update_from_output`` counts drafted and accepted; a prefill's
    row (no token out before the step: its sampled token is the prefill's, no decode round)
    commits 0."""
    sampled = model_runner_output.sampled_token_ids
    index = output_index(RELEASE, model_runner_output)
    spec = scheduler_output.scheduled_spec_decode_tokens
    invalid = scheduler_output.num_invalid_spec_tokens or {}
    rows = []
    for rid, n in scheduler_output.num_scheduled_tokens.items():
        request = requests.get(rid)
        i = index.get(rid)
        if request is None or i is None:
            continue
        committed = len(sampled[i]) if sampled and request.num_output_tokens else 0
        drafted = len(spec.get(rid, ())) - invalid.get(rid, 0)
        rows.append((rid, int(n), int(request.num_computed_tokens), max(drafted, 0), committed))
    return rows


def _summary(stats: dict[str, Any]) -> str:
    share = stats["plugin_share"]
    return (
        f"{stats['steps']} steps, block sizes chosen {stats['chosen']}, acceptance "
        f"{stats['acceptance'] if stats['acceptance'] is None else round(stats['acceptance'], 3)}, "
        f"counts {stats['counts']}, plug-in time {'n/a' if share is None else f'{100 * share:.2f}%'} of the steps'"
    )
