"""The plug-in's settings: the ``adaptspec`` entry of vLLM's ``additional_config``, checked once.

vLLM passes ``--additional-config '{"adaptspec": {...}}'`` (or ``vllm.LLM(...,
additional_config={"adaptspec": {...}})``) to the scheduler unchanged. The entry takes
``adaptspec serve``'s settings under their option names with underscores (``--log-dir`` is
``log_dir``). :func:`plugin_settings` checks every one of them where it enters, when vLLM builds
the scheduler (the earliest point vLLM 0.32 hands a scheduler class its settings: docs/vllm.md):
an unknown key, a value of the wrong type or out of range (a negative seed, an infinite or NaN
time, an empty name or folder), a bad split, load rule, reward, profile or featurizer, or a folder
that cannot be written is one :class:`~adaptspec.errors.AdaptspecError` line naming the key, in the
entry's own words. The policy specs, which need vLLM's ``num_speculative_tokens``, are checked when
the plug-in builds its controllers, right after (:mod:`adaptspec.vllm.plugin`), in one line naming
the variant.

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
>>> plugin_settings({"adaptspec": {"variants": {"A": "fixed:2", "B": "fixed:4"}, "split": "-1,2"}})
Traceback (most recent call last):
...
adaptspec.errors.AdaptspecError: additional_config adaptspec.split: weights must be finite numbers >= 0 with a positive sum, like "50,50" (got '-1,2')
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import AdaptspecError
from ..load_rules import SPECULATION_MARGIN
from ..reward.attribution import ATTRIBUTIONS

__all__ = [
    "PluginSettings",
    "plugin_settings",
    "ENTRY",
    "MAX_DECIDE_TIMEOUT",
    "PLUGIN_PRIOR",
    "PLUGIN_PROFILE",
]

#: The key of ``additional_config`` the plug-in reads.
ENTRY = "adaptspec"
#: The cost profile of the plug-in when ``latency`` is unset: vLLM's own steps on a CPU, the median
#: step at each (requests, block size) measured (``benchmarks/fit_vllm_profile.py``), whose shape (at
#: 1 request a step verifying 3-6 tokens takes less than a plain one, at 2 a plain step more than one
#: verifying 2-3 tokens each, at 4 a 2-token step more than a plain one, at 8 every token verified
#: adds its share) is vLLM's, not adaptspec's engine's. The load rules' costs start from it before this engine
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
#: The longest ``decide_timeout`` (seconds): a decision holds vLLM's step (``schedule()``) up to this long.
MAX_DECIDE_TIMEOUT = 1.0
#: The settings that name a file, a folder or a service: an empty string would silently mean the
#: working directory or the default, so it is refused.
_NAMES = (
    "split",
    "log_dir",
    "checkpoint_dir",
    "load_rule",
    "latency",
    "reward",
    "featurizer",
    "shared",
    "replica_id",
)


class PluginSettings(BaseModel):
    """Every setting of the plug-in (docs/vllm.md lists what each does), each checked here."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    variants: dict[str, str] | None = None  # name -> policy spec; None: one variant, the default policy
    split: str | None = None  # traffic weights "50,50" (default: equal)
    log_dir: str | None = None
    checkpoint_dir: str | None = None
    arms: list[int] | None = None  # block sizes (1 + drafts); default: adaptspec's up to K + 1
    load_rule: str = "learned"  # learned | goodput | fixed:B | table:R=B,... | none
    load_features: bool = False
    load_prior: float = Field(PLUGIN_PRIOR, ge=0.0, lt=1.0)
    load_margin: float = Field(SPECULATION_MARGIN, ge=0.0, lt=1.0)  # the learned rule's margin over plain
    latency: str | None = None  # cost profile of the goodput / learned rules and modelled reward
    attribution: Literal["marginal", "tokens"] = "tokens"
    reward: str = "token_latency"
    featurizer: str | None = None
    seed: int = Field(0, ge=0)
    fallback_block_size: int | None = Field(None, ge=1)
    decide_timeout: float = Field(0.1, gt=0)
    feedback_timeout: float = Field(300.0, gt=0)
    checkpoint_every: int = Field(100, ge=1)
    checkpoint_interval: float = Field(60.0, gt=0)
    roll_rows: int = Field(1000, ge=1)
    no_fsync: bool = False
    shared: str | None = None  # redis://HOST:PORT/NAME: learn with the fleet's other replicas
    replica_id: str | None = None
    sync_every: int = Field(32, ge=1)
    sync_interval: float = Field(1.0, gt=0)
    lease_ttl: float = Field(15.0, gt=0)

    @field_validator(*_NAMES)
    @classmethod
    def _not_blank(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("an empty value: give one, or leave the key out for its default")
        return v

    @field_validator("log_dir", "checkpoint_dir")
    @classmethod
    def _writable(cls, v: str | None) -> str | None:
        if v is not None and v.strip():
            _writable_dir(Path(v).expanduser())
        return v

    @field_validator("featurizer")
    @classmethod
    def _featurizer(cls, v: str | None) -> str | None:
        from ..policies.featurizer import Featurizer

        if v is not None and v.strip() and not Featurizer.exists(Path(v).expanduser()):
            raise ValueError("no saved featurizer in that folder")
        return v

    @field_validator("arms")
    @classmethod
    def _arms(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or min(v) < 1):
            raise ValueError("block sizes must be a non-empty list of integers >= 1")
        return v

    @field_validator("decide_timeout")
    @classmethod
    def _budget(cls, v: float) -> float:
        if v > MAX_DECIDE_TIMEOUT:
            raise ValueError(
                f"at most {MAX_DECIDE_TIMEOUT:g} s: a decision holds vLLM's step up to this long"
            )
        return v

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        from ..ab.variants import check_variant_name

        if v is None:
            return v
        if not v:
            raise ValueError("give at least one NAME: SPEC, or leave the key out")
        for name, spec in v.items():
            check_variant_name(name, "the variant name")
            if not spec.strip():
                raise ValueError(f"variant {name!r} has an empty policy spec")
        return v

    @field_validator("split")
    @classmethod
    def _split(cls, v: str | None) -> str | None:
        if v is not None and v.strip():
            _weights(v)
        return v

    @field_validator("load_rule")
    @classmethod
    def _load_rule(cls, v: str) -> str:
        if v.strip():
            _check_load_rule(v)
        return v

    @model_validator(mode="after")
    def _split_fits(self) -> "PluginSettings":
        if self.split is not None:
            if self.variants is None:
                raise ValueError("split needs variants")
            n = len(_weights(self.split))
            if n != len(self.variants):
                raise ValueError(f"split has {n} weights for {len(self.variants)} variants")
        return self

    def variant_weights(self) -> dict[str, float] | None:
        """Each variant's share of the traffic (``split``'s weights; equal without one); None without variants."""
        if self.variants is None:
            return None
        weights = _weights(self.split) if self.split is not None else [1.0] * len(self.variants)
        return dict(zip(self.variants, weights))


def plugin_settings(additional_config: Mapping[str, Any] | Any) -> PluginSettings:
    """The checked settings in ``additional_config["adaptspec"]`` (defaults when it has none, or when
    ``additional_config`` is not a mapping: vLLM also takes an object there, which holds no entry)."""
    entry = additional_config.get(ENTRY, {}) if isinstance(additional_config, Mapping) else {}
    if not isinstance(entry, Mapping):
        raise AdaptspecError(
            f"additional_config {ENTRY}: expected an object of settings, got {type(entry).__name__}"
        )
    unknown = [k for k in entry if k not in PluginSettings.model_fields]
    if unknown:
        keys = ", ".join(sorted(PluginSettings.model_fields)[:2])
        raise AdaptspecError(
            f"additional_config {ENTRY}: unknown key {unknown[0]!r} (the keys are serve's options "
            f"with underscores: {keys}, ...)"
        )
    try:
        settings = PluginSettings(**entry)
    except ValidationError as e:
        raise AdaptspecError(_one_line(e.errors()[0])) from None
    _check_names(settings)
    return settings


def _one_line(err: Mapping[str, Any]) -> str:
    """pydantic's first error as one line naming the key (a model-wide check names its own)."""
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    where = ".".join(str(p) for p in err["loc"])
    if not where:  # a check of several keys: its message starts with the key it is about
        key, _, rest = msg.partition(" ")
        return f"additional_config {ENTRY}.{key} {rest}"
    given = repr(err.get("input"))
    return (
        f"additional_config {ENTRY}.{where}: {msg} (got {given if len(given) <= 80 else given[:80] + '...'})"
    )


def _weights(split: str) -> list[float]:
    """``split``'s weights ("50,50"): finite numbers >= 0 with a positive sum, else ValueError."""
    try:
        weights = [float(x) for x in split.split(",")]
    except ValueError:
        weights = []
    if not weights or not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise ValueError('weights must be finite numbers >= 0 with a positive sum, like "50,50"')
    return weights


def _check_load_rule(rule: str) -> None:
    """``rule`` is one of the load rules' forms (:data:`~adaptspec.load_rules.round_rule.LOAD_RULES`),
    with integers >= 1 where it takes numbers; else ValueError."""
    from ..load_rules.round_rule import LOAD_RULES

    kind, colon, rest = rule.partition(":")
    if not colon and kind in ("learned", "goodput", "none"):
        return
    if colon and kind == "fixed" and _positive_int(rest):
        return
    if (
        colon
        and kind == "table"
        and all(
            eq and _positive_int(rows) and _positive_int(b)
            for rows, eq, b in (part.partition("=") for part in rest.split(","))
        )
    ):
        return
    raise ValueError(
        f"expected one of {', '.join(LOAD_RULES)} (numbers: integers >= 1, e.g. fixed:2, table:1=3,4=1)"
    )


def _positive_int(text: str) -> bool:
    return text.strip().isdigit() and int(text) >= 1


def _check_names(s: PluginSettings) -> None:
    """The values that name something another part of adaptspec knows (a reward, a cost profile, a
    Redis URL), checked now; a bad one is one line naming its key."""
    from ..costs.latency import get_profile
    from ..reward.functions import check_reward_name

    checks = [("reward", lambda: check_reward_name(s.reward))]
    if s.latency is not None:
        checks.append(("latency", lambda: get_profile(s.latency)))
    if s.attribution not in ATTRIBUTIONS:  # pragma: no cover - the Literal above holds them
        raise AdaptspecError(f"additional_config {ENTRY}.attribution: one of {ATTRIBUTIONS}")
    if s.attribution == "marginal" and s.latency is None:
        raise AdaptspecError(
            f"additional_config {ENTRY}.attribution 'marginal' needs latency (the cost profile its "
            "shares are computed on)"
        )
    if s.reward == "modelled" and s.latency is None:
        raise AdaptspecError(
            f"additional_config {ENTRY}.reward 'modelled' needs latency (the cost profile it is computed on)"
        )
    if s.shared is not None:
        from ..fleet.redis_backend import parse_url

        checks.append(("shared", lambda: parse_url(s.shared)))
    for key, check in checks:
        try:
            check()
        except AdaptspecError as e:
            raise AdaptspecError(f"additional_config {ENTRY}.{key}: {e}") from None


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
