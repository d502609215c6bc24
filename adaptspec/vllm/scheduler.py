"""AdaptiveScheduler: vLLM's scheduler, with each request's speculative length chosen by adaptspec.

``--scheduler-cls adaptspec.vllm.AdaptiveScheduler`` (or ``vllm.LLM(..., scheduler_cls=...)``)
and ``--additional-config '{"adaptspec": {...}}'``. The subclass reads vLLM's objects in four of
its hooks and hands plain values to :class:`~adaptspec.vllm.plugin.AdaptspecPlugin`, which does
the work:

- ``add_request``: the request is admitted (its variant, its features);
- ``schedule``: the step starts its clock when the batch is made, and the drafts vLLM's drafter
  will propose after it are as many as its requests will verify (vLLM's
  ``num_spec_tokens_to_schedule``, which its per-batch-size table sets the same way; never more
  than vLLM's own);
- ``update_from_output``: the step's time, each request's drafts verified and tokens committed
  (what vLLM itself counts as drafted and accepted), requests whose prefill ended decided,
  requests that ended fed back;
- ``update_draft_token_ids``: the drafts vLLM proposed for the next step, cut to each request's
  length before vLLM schedules them (as vLLM itself cuts them to its token budget);
- ``finish_requests``: requests aborted from outside (a client gone, a stop string) fed back.

Built against vLLM |version| (:mod:`adaptspec.vllm.version`): any other release is refused when
this module is imported, in one line. It needs synchronous scheduling (vLLM's CPU platform forces
it; on a GPU give ``--no-async-scheduling``): with asynchronous scheduling vLLM schedules the
next step's draft slots before the drafts exist, so they cannot be cut per request.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

import vllm

from .version import VLLM_VERSION, check_vllm_version

check_vllm_version(vllm.__version__)  # before importing vLLM's internals, whose names move between releases

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from ..errors import AdaptspecError  # noqa: E402
from .config import plugin_settings  # noqa: E402
from .plugin import AdaptspecPlugin, log  # noqa: E402

__all__ = ["AdaptiveScheduler", "VLLM_VERSION"]
__doc__ = __doc__.replace("|version|", VLLM_VERSION)

_FINISH = {"stop": "eos"}  # vLLM's finish reasons in adaptspec's words; every other one is "length"


class AdaptiveScheduler(Scheduler):
    """vLLM's :class:`~vllm.v1.core.sched.scheduler.Scheduler` with adaptspec's per-request lengths
    (see the module docstring)."""

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        settings = plugin_settings(vllm_config.additional_config)  # a bad entry: one line, before vLLM builds anything
        if vllm_config.scheduler_config.async_scheduling:
            raise AdaptspecError("adaptspec.vllm needs synchronous scheduling (--no-async-scheduling): with "
                                 "asynchronous scheduling vLLM reserves draft slots before the drafts exist")
        super().__init__(vllm_config, *args, **kwargs)
        spec = vllm_config.speculative_config
        self.adaptspec = AdaptspecPlugin(settings, int(self.num_spec_tokens or 0),
                                         spec.method if spec is not None else "none")
        self._step_started = time.perf_counter()

    # ------------------------------------------------------------------ vLLM's hooks
    def add_request(self, request: Any) -> None:
        super().add_request(request)
        params = request.sampling_params
        self.adaptspec.admit(request.request_id, request.prompt_token_ids or [],
                             None if params is None else params.extra_args)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        out = super().schedule(*args, **kwargs)
        self._step_started = time.perf_counter()
        try:  # vLLM's drafter proposes, after this step, only as many drafts as its requests will verify
            step = {rid: _still_prefilling(self.requests.get(rid)) for rid in out.num_scheduled_tokens}
            if step:
                out.num_spec_tokens_to_schedule = min(out.num_spec_tokens_to_schedule,
                                                      self.adaptspec.drafts_wanted(step))
        except Exception as e:  # noqa: BLE001 - vLLM's own count this step
            self.adaptspec.fault("drafts", e)
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        step_s = time.perf_counter() - self._step_started
        requests = {rid: self.requests.get(rid) for rid in scheduler_output.num_scheduled_tokens}
        try:
            self.adaptspec.observe(_step_rows(scheduler_output, model_runner_output, requests), step_s)
        except Exception as e:  # noqa: BLE001 - the plug-in's fault never stops vLLM
            self.adaptspec.fault("observe", e)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        try:
            self._after_step(requests)
        except Exception as e:  # noqa: BLE001
            self.adaptspec.fault("step", e)
        return outputs

    def update_draft_token_ids(self, draft_token_ids: Any) -> None:
        try:
            drafts = dict(zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids))
            cut = self.adaptspec.cut(drafts, rows=len(self.running), queue=len(self.waiting))
            for i, rid in enumerate(draft_token_ids.req_ids):
                if rid in cut:
                    draft_token_ids.draft_token_ids[i] = cut[rid]
        except Exception as e:  # noqa: BLE001 - vLLM's own lengths this step
            self.adaptspec.fault("cut", e)
        super().update_draft_token_ids(draft_token_ids)

    def finish_requests(self, request_ids: str | Iterable[str] | None, finished_status: Any) -> Any:
        finished = super().finish_requests(request_ids, finished_status)
        for request in finished or ():
            self._finish(request)
        return finished

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            log.info("adaptspec.vllm: %s", _summary(self.adaptspec.stats()))
            self.adaptspec.close()

    # ------------------------------------------------------------------ parts
    def _after_step(self, requests: dict[str, Any]) -> None:
        rows, queue = len(self.running), len(self.waiting)
        for rid, request in requests.items():
            if request is None:
                continue
            if request.is_finished():
                self._finish(request)
            elif request.num_output_tokens >= 1 and not request.is_prefill_chunk:
                params = request.sampling_params
                self.adaptspec.decide(rid, request.num_output_tokens, rows, queue, request.max_tokens,
                                      0.0 if params is None else params.temperature)

    def _finish(self, request: Any) -> None:
        reason = request.get_finished_reason()
        name = str(getattr(reason, "name", reason)).lower()
        self.adaptspec.finish(request.request_id, list(request.output_token_ids), _FINISH.get(name, "length"))


def _still_prefilling(request: Any) -> bool:
    """Whether the request is still in its prefill after the step just scheduled (vLLM has counted
    the step's tokens as computed when ``schedule`` returns)."""
    return request is not None and bool(request.is_prefill_chunk)


def _step_rows(scheduler_output: Any, model_runner_output: Any, requests: dict[str, Any]) -> list[tuple]:
    """For every request the step scheduled: (id, tokens in the pass, context, drafts verified,
    tokens committed), as vLLM's own ``update_from_output`` counts drafted and accepted."""
    sampled = model_runner_output.sampled_token_ids
    index = model_runner_output.req_id_to_index
    spec = scheduler_output.scheduled_spec_decode_tokens
    invalid = scheduler_output.num_invalid_spec_tokens or {}
    rows = []
    for rid, n in scheduler_output.num_scheduled_tokens.items():
        request = requests.get(rid)
        i = index.get(rid)
        if request is None or i is None:
            continue
        committed = len(sampled[i]) if sampled else 0
        drafted = len(spec.get(rid, ())) - invalid.get(rid, 0)
        rows.append((rid, int(n), int(request.num_computed_tokens), max(drafted, 0), committed))
    return rows


def _summary(stats: dict[str, Any]) -> str:
    share = stats["plugin_share"]
    return (f"{stats['steps']} steps, block sizes chosen {stats['chosen']}, acceptance "
            f"{stats['acceptance'] if stats['acceptance'] is None else round(stats['acceptance'], 3)}, "
            f"counts {stats['counts']}, plug-in time {'n/a' if share is None else f'{100 * share:.2f}%'} of the steps'")
