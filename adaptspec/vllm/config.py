"""The plug-in's settings: the ``adaptspec`` entry of vLLM's ``additional_config``, checked once.

vLLM passes ``--additional-config '{"adaptspec": {...}}'`` (or ``vllm.LLM(...,
additional_config={"adaptspec": {...}})``) to the scheduler unchanged. The entry takes
``adaptspec serve``'s settings under their option names with underscores (``--log-dir`` is
``log_dir``). :func:`plugin_settings` checks every one of them when the engine starts: an unknown
key, a value of the wrong type, a bad policy spec or a folder that cannot be written is one
:class:`~adaptspec.errors.AdaptspecError` line naming the key.

>>> s = plugin_settings({"adaptspec": {"variants": {"A": "fi-ucb", "B": "fixed:4"}, "load_rule": "none"}})
>>> sorted(s.variants), s.load_rule, s.attribution
(['A', 'B'], 'none', 'tokens')
>>> plugin_settings({"adaptspec": {"log-dir": "runs/log"}})
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: additional_config adaptspec: unknown key 'log-dir' (the keys are serve's options with underscores: arms, attribution, ...)
>>> plugin_settings({"adaptspec": {"checkpoint_every": 0}})
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: additional_config adaptspec.checkpoint_every: Input should be greater than or equal to 1 (got 0)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import AdaptspecError
from ..load_rules import SPECULATION_MARGIN
from ..reward.attribution import ATTRIBUTIONS

__all__ = ["PluginSettings", "plugin_settings", "ENTRY", "PLUGIN_PRIOR", "PLUGIN_PROFILE"]

#: The key of ``additional_config`` the plug-in reads.
ENTRY = "adaptspec"
#: The cost profile of the plug-in when ``latency`` is unset: vLLM's own steps on a CPU, the median
#: step at each (requests, block size) measured (``benchmarks/fit_vllm_profile.py``), whose shape (at
#: 1 request a step verifying 3-6 tokens takes less than a plain one, at 2 a plain step more than one
#: verifying 2-3 tokens each, at 4 a 2-token step 1.25x a plain one, at 8 every token verified adds
#: ~3 ms) is vLLM's, not adaptspec's engine's. The load rules' costs start from it before this engine
#: has run a block size (:mod:`adaptspec.vllm.step_costs`), the learned rule's warm prior is priced on
#: it, and the controllers price each request's shorter block sizes (full information) on it.
PLUGIN_PROFILE = "vllm-cpu-smollm2"
#: The load rules' prior per-draft acceptance when ``load_prior`` is unset: the bundled pair's in
#: vLLM (``benchmarks/results/vllm-tau.json``: 31% of the drafts accepted at the first position, tau
#: 1.42 at B = 4, a geometric 0.30), as the profile above is its steps. At 0.4 (adaptspec's own
#: decoder on held-out prompts) the learned rule's warm prior saw B = 2 at 4 requests faster than
#: plain after the margin and a cold server speculated on a fifth to two fifths of its 4-client
#: steps, where every fixed length ran below plain (BENCHMARKS.md); at 0.3 on the profile above it
#: prefers plain at 4 and 8 requests, B = 2-3 at 2, B = 4-6 at 1 (``tests/test_vllm_profile.py``).
PLUGIN_PRIOR = 0.3


class PluginSettings(BaseModel):
    """Every setting of the plug-in (docs/vllm.md lists what each does)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    variants: dict[str, str] | None = None          # name -> policy spec; None: one variant, the default policy
    split: str | None = None                        # traffic weights "50,50" (default: equal)
    log_dir: str | None = None
    checkpoint_dir: str | None = None
    arms: list[int] | None = None                   # block sizes (1 + drafts); default: adaptspec's up to K + 1
    load_rule: str = "learned"                      # learned | goodput | fixed:B | table:R=B,... | none
    load_features: bool = False
    load_prior: float = Field(PLUGIN_PRIOR, ge=0.0, lt=1.0)
    load_margin: float = Field(SPECULATION_MARGIN, ge=0.0, lt=1.0)  # the learned rule's margin over plain
    latency: str | None = None                      # cost profile of the goodput / learned rules and modelled reward
    attribution: Literal["marginal", "tokens"] = "tokens"
    reward: str = "token_latency"
    featurizer: str | None = None
    seed: int = 0
    fallback_block_size: int | None = Field(None, ge=1)
    decide_timeout: float = Field(0.1, gt=0)
    feedback_timeout: float = Field(300.0, gt=0)
    checkpoint_every: int = Field(100, ge=1)
    checkpoint_interval: float = Field(60.0, gt=0)
    roll_rows: int = Field(1000, ge=1)
    no_fsync: bool = False
    shared: str | None = None                       # redis://HOST:PORT/NAME: learn with the fleet's other replicas
    replica_id: str | None = None
    sync_every: int = Field(32, ge=1)
    sync_interval: float = Field(1.0, gt=0)
    lease_ttl: float = Field(15.0, gt=0)

    @field_validator("log_dir", "checkpoint_dir")
    @classmethod
    def _writable(cls, v: str | None) -> str | None:
        if v is not None:
            _writable_dir(Path(v).expanduser())
        return v

    @field_validator("arms")
    @classmethod
    def _arms(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or min(v) < 1):
            raise ValueError(f"block sizes must be a non-empty list of integers >= 1, got {v}")
        return v


def plugin_settings(additional_config: Mapping[str, Any] | None) -> PluginSettings:
    """The checked settings in ``additional_config["adaptspec"]`` (defaults when it has none)."""
    entry = (additional_config or {}).get(ENTRY, {})
    if not isinstance(entry, Mapping):
        raise AdaptspecError(f"additional_config {ENTRY}: expected an object of settings, got {type(entry).__name__}")
    unknown = [k for k in entry if k not in PluginSettings.model_fields]
    if unknown:
        keys = ", ".join(sorted(PluginSettings.model_fields)[:2])
        raise AdaptspecError(f"additional_config {ENTRY}: unknown key {unknown[0]!r} (the keys are serve's options "
                             f"with underscores: {keys}, ...)")
    try:
        settings = PluginSettings(**entry)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise AdaptspecError(f"additional_config {ENTRY}.{where}: {err['msg'].removeprefix('Value error, ')} "
                             f"(got {err.get('input')!r})") from None
    _check_specs(settings)
    return settings


def _check_specs(s: PluginSettings) -> None:
    """The specs and rules checked now, before any request: a bad one is one line naming its key."""
    from ..policies.variants import check_variant_name
    from ..reward.functions import reward_function
    from ..serving.engine.round_rule import make_load_rule
    from ..serving.router import ABRouter

    if s.variants is not None:
        if not s.variants:
            raise AdaptspecError(f"additional_config {ENTRY}.variants: give at least one NAME: SPEC, or leave it out")
        for name in s.variants:
            check_variant_name(name)
        ABRouter.parse([f"{n}={spec}" for n, spec in s.variants.items()], s.split)
    elif s.split is not None:
        raise AdaptspecError(f"additional_config {ENTRY}.split needs variants")
    if s.attribution not in ATTRIBUTIONS:  # pragma: no cover - the Literal above holds them
        raise AdaptspecError(f"additional_config {ENTRY}.attribution: one of {ATTRIBUTIONS}")
    if s.attribution == "marginal" and s.latency is None:
        raise AdaptspecError(f"additional_config {ENTRY}.attribution 'marginal' needs latency (the cost profile its "
                             "shares are computed on)")
    try:
        reward_function(s.reward, s.latency)
        make_load_rule(s.load_rule, [1, 2], s.latency or PLUGIN_PROFILE, prior=s.load_prior)
    except AdaptspecError as e:
        raise AdaptspecError(f"additional_config {ENTRY}: {e}") from None
    if s.shared is not None:
        from ..fleet.redis_backend import parse_url

        try:
            parse_url(s.shared)
        except AdaptspecError as e:
            raise AdaptspecError(f"additional_config {ENTRY}.shared: {e}") from None


def _writable_dir(path: Path) -> None:
    """``path`` is a directory this process can write, or can be made one."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"{probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{probe} cannot be written by this process")
