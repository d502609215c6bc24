"""adaptspec inside vLLM: each request's speculative length chosen and learnt by an AdaptiveController.

Give vLLM the scheduler class and the plug-in's settings (docs/vllm.md)::

    python -m vllm.entrypoints.openai.api_server --model TARGET \\
      --speculative-config '{"method": "dflash", "model": DRAFTER, "num_speculative_tokens": 8}' \\
      --scheduler-cls adaptspec.vllm.AdaptiveScheduler \\
      --additional-config '{"adaptspec": {"log_dir": "runs/log", "checkpoint_dir": "runs/ckpt"}}'

The parts, one concept a module:

- :mod:`~adaptspec.vllm.version`: the vLLM releases the plug-in is written for, checked at start;
- :mod:`~adaptspec.vllm.releases`: what differs between those releases (the model runners, the
  model's output, the runner ``IdleDrafterSkip`` patches), in one place;
- :mod:`~adaptspec.vllm.config`: the ``adaptspec`` entry of ``additional_config``, checked once;
- :mod:`~adaptspec.vllm.features`: the context of a request, from its prompt's tokens;
- :mod:`~adaptspec.vllm.record`: one request's decision, rounds and attributed time;
- :mod:`~adaptspec.vllm.metrics`: the Prometheus counters an operator watches (decisions, fallbacks
  and faults by variant, the plug-in's time);
- :mod:`~adaptspec.vllm.client_text`: a client's values as a log line may show them (cut);
- :mod:`~adaptspec.vllm.plugin`: the controllers, the load rule and the records, driven by plain
  values (no vLLM object), so every rule is written once and tested without an engine;
- :mod:`~adaptspec.vllm.scheduler`: :class:`AdaptiveScheduler`, the subclass of vLLM's scheduler
  that calls the plug-in from vLLM's hooks (:class:`AdaptiveAsyncScheduler` its form over vLLM's
  asynchronous scheduler, which vLLM builds when asynchronous scheduling is on);
- :mod:`~adaptspec.vllm.idle_drafter`: ``IdleDrafterSkip``, vLLM's worker extension that skips
  the drafter's pass on the steps after which no draft is verified (a patch of vLLM's model runner,
  opt-in, put in when the class is looked up). These two alone import vLLM, when first named here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AdaptiveAsyncScheduler", "AdaptiveScheduler", "IdleDrafterSkip"]


def __getattr__(name: str) -> Any:
    if name in (
        "AdaptiveScheduler",
        "AdaptiveAsyncScheduler",
    ):  # imports vLLM: only when vLLM asks for the class
        from . import scheduler

        return getattr(scheduler, name)
    if name == "IdleDrafterSkip":  # vLLM's worker looks it up by this name: the patch goes in then
        from .idle_drafter import IdleDrafterSkip

        return IdleDrafterSkip
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
