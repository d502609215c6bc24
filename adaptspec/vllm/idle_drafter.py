"""The drafter's pass skipped on the steps after which no request verifies a draft: a vLLM worker extension.

vLLM 0.32 runs its drafter after every step of a speculative engine, also when the scheduler asks
it for no draft (``num_spec_tokens_to_schedule`` 0: vLLM's own per-batch-size table at K = 0, or
the plug-in with every request of the step at B = 1): EAGLE and DFlash still push the step's
context through the drafter so that its cache misses no position (``llm_base_proposer.propose``),
a draft model still runs its forward. Measured on this 2-core CPU with the bundled pair
(``benchmarks/bench_vllm_steps.py``, ``benchmarks/results/vllm-steps.json``): a step that verifies
nothing took longer than a step without speculation (1 and 8 requests), so an engine whose requests
all run B = 1 is that much slower than vLLM without speculation, whatever the plug-in chooses; with
this extension such a step costs what a plain one does. No seam of vLLM 0.32 skips it: the scheduler's output carries one number for the
drafter (``num_spec_tokens_to_schedule``), and the model runner runs the drafter whenever the batch
fits its length limit (``_input_fits_in_drafter``).

Given to vLLM as its worker extension (``--worker-extension-cls adaptspec.vllm.IdleDrafterSkip``,
``worker_extension_cls=`` in Python), the class is looked up by that name in vLLM's worker process,
and looking it up (this module's ``IdleDrafterSkip``, or the package's) wraps one method of vLLM's
model runner, ``GPUModelRunner.propose_draft_token_ids`` (the CPU runner's too: it inherits it);
importing the module alone patches nothing and needs no vLLM: on a step the plug-in marked (:data:`MARK` on vLLM's
``SchedulerOutput``, which reaches the worker with the step), it returns what vLLM's own drafter
returns at K = 0, no draft for any request, without running the drafter; every other step runs
vLLM's code unchanged. The plug-in marks a step only when it asks for no draft and no request in it
is in its prefill unless it is decided at B = 1 (it never drafts again): a prompt always enters
the drafter's cache.

What a skipped step costs: the drafter's cache misses that step's positions. A request decided at
B = 1 never drafts again, so nothing is lost; a request whose block size is above 1 but which the
load rule capped to B = 1 on the skipped steps drafts, when the rule raises it again, from a
context with those positions missing: its acceptance may drop, never its output (the target
verifies every draft; the lossless tests run with the extension). This is a patch of vLLM's
internals, written for the releases the plug-in checks at start (:mod:`adaptspec.vllm.version`) that
ship vLLM's V1 runner (0.32, 0.33); it refuses to install, in one line, where the runner it patches
would not run (:func:`install`).
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["IdleDrafterSkip", "MARK", "install", "skipped_passes"]  # noqa: F822 (IdleDrafterSkip: the module's __getattr__)

#: The attribute the plug-in sets (True) on a ``SchedulerOutput`` whose drafter pass may be skipped.
MARK = "adaptspec_idle_drafter"
#: The worker extension's qualified name, as vLLM's ``worker_extension_cls`` takes it.
QUALNAME = "adaptspec.vllm.IdleDrafterSkip"

_skipped = [0]  # drafter passes skipped in this process


def skipped_passes() -> int:
    """Drafter passes skipped in this process (the worker's) so far."""
    return _skipped[0]


def install() -> None:
    """Wrap ``GPUModelRunner.propose_draft_token_ids`` (once a process; see the module docstring).

    The runner it patches is checked first: a release without vLLM's V1 runner (0.34), or a worker
    whose config picks Model Runner V2, where the wrapped method never runs, is one line naming the
    setting to change (:mod:`adaptspec.vllm.releases`), never a silent no-op."""
    import vllm

    from ..errors import AdaptspecError
    from .releases import release_of, runner_refusal, v1_runner_class

    release = release_of(vllm.__version__)
    GPUModelRunner = v1_runner_class(release)  # noqa: N806 - vLLM's class
    refusal = runner_refusal(release, _worker_uses_v2_model_runner())
    if refusal is not None:
        raise AdaptspecError(f"adaptspec.vllm.IdleDrafterSkip cannot run here: {refusal}")
    original = GPUModelRunner.propose_draft_token_ids
    if getattr(original, "adaptspec_original", None) is not None:
        return

    @functools.wraps(original)
    def propose_draft_token_ids(
        self: Any, scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if getattr(scheduler_output, MARK, False) and scheduler_output.num_spec_tokens_to_schedule == 0:
            _skipped[0] += 1
            if isinstance(sampled_token_ids, list):  # drafters on the CPU lists (n-gram, suffix): lists back
                return [[] for _ in sampled_token_ids]
            import torch

            return torch.empty((self.input_batch.num_reqs, 0), dtype=torch.int64, device=self.device)
        return original(self, scheduler_output, sampled_token_ids, *args, **kwargs)

    propose_draft_token_ids.adaptspec_original = original  # type: ignore[attr-defined]
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids


def _worker_uses_v2_model_runner() -> bool:
    """Whether the worker looking the extension up runs Model Runner V2: its config's choice when
    vLLM has set it as the current one, else ``VLLM_USE_V2_MODEL_RUNNER`` as given (vLLM resolves the
    extension before it sets the config; where vLLM would pick MRV2 itself, the scheduler, which
    reads the same config, has refused to start: :mod:`adaptspec.vllm.releases`)."""
    from vllm import envs
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    if config is not None:
        return bool(config.use_v2_model_runner)
    return bool(envs.VLLM_USE_V2_MODEL_RUNNER)


class _IdleDrafterSkip:
    """vLLM's worker extension (``--worker-extension-cls adaptspec.vllm.IdleDrafterSkip``): looked up by
    that name, it has the worker skip the drafter's pass on the steps the plug-in marks (see the
    module docstring). Its one method is callable through ``collective_rpc``."""

    def adaptspec_skipped_drafter_passes(self) -> int:
        """Drafter passes this worker skipped so far."""
        return skipped_passes()


def enabled(worker_extension_cls: Any) -> bool:
    """Whether vLLM's ``worker_extension_cls`` setting is this extension (its name or the class)."""
    if worker_extension_cls is _IdleDrafterSkip:
        return True
    return isinstance(worker_extension_cls, str) and worker_extension_cls in (
        QUALNAME,
        f"{__name__}.IdleDrafterSkip",
    )


def __getattr__(name: str) -> Any:
    if name == "IdleDrafterSkip":  # vLLM's worker looks the extension up by name: the patch goes in then
        install()
        return _IdleDrafterSkip
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
