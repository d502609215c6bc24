"""The shape of a drafter, and the names of its files: what both the adaptspec layout
(:mod:`adaptspec.decoding.drafter`) and the published DFlash layout
(:mod:`adaptspec.decoding.dflash_format`) read and write.

>>> DrafterConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
...               intermediate_size=128, vocab_size=256, target_layers=[1, 3]).context_width
128
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from .._util.checks import int_list, integer, number
from ..errors import AdaptspecError

CONFIG_NAME = "drafter_config.json"
WEIGHTS_NAME = "drafter.safetensors"
#: the largest block size a drafter config may declare (DFlash drafts 16; dense sets store up to 64)
MAX_BLOCK_SIZE = 64


@dataclass
class DrafterConfig:
    """Shape of a drafter. ``target_layers`` index the target's ``hidden_states`` tuple
    (0 = embeddings, i = output of decoder layer i)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's vocabulary
    target_layers: list[int]
    max_block_size: int = 32
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    draft_vocab_size: int | None = None  # None: the full target vocabulary
    target_name: str = ""
    # RMS-normalise each target layer's hidden state before fusing them. Deep layers carry
    # massive activations (|h| up to ~25,000 in SmolLM2 beside a median of ~3); in a 1,200-step
    # ablation normalising made no difference, so it is off by default.
    normalize_context_layers: bool = False
    # Per-head RMS norm of queries and keys before RoPE (as Qwen3 and the DFlash drafters do).
    qk_norm: bool = False
    # The mask is the target's embedding of this token (DFlash); None: a learned vector.
    mask_token_id: int | None = None
    # The target depth the drafter was trained for, checked on attach (None: not recorded).
    num_target_layers: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def context_width(self) -> int:
        return self.hidden_size * len(self.target_layers)


def config_from_json(raw: object, where: str) -> DrafterConfig:
    """A :class:`DrafterConfig` from the JSON of ``drafter_config.json``, every field checked
    (:func:`check_config`): a missing, unknown or mistyped field is one line naming it."""
    if not isinstance(raw, dict):
        raise AdaptspecError(f"{where}: not a drafter config (the top level must be a JSON object)")
    known = {f.name for f in fields(DrafterConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise AdaptspecError(f"{where}: unknown field {unknown[0]!r}")
    try:
        config = DrafterConfig(**raw)
    except TypeError as e:  # a required field is missing
        raise AdaptspecError(f"{where}: invalid drafter config ({e})") from None
    return check_config(config, where)


def check_config(c: DrafterConfig, where: str) -> DrafterConfig:
    """Refuse a config no drafter can have (a string where a number belongs, a block size of
    a billion, a negative epsilon); returns ``c``.

    >>> c = DrafterConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
    ...                   intermediate_size=128, vocab_size=256, target_layers=[1, 3], rms_norm_eps="1e-6")
    >>> check_config(c, "drafter_config.json")
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: drafter_config.json: rms_norm_eps='1e-6' must be a number > 0
    """
    for name in (
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
    ):
        integer(getattr(c, name), where, name, 1)
    int_list(c.target_layers, where, "target_layers", 0)
    integer(c.max_block_size, where, "max_block_size", 2, MAX_BLOCK_SIZE)
    if number(c.rms_norm_eps, where, "rms_norm_eps", 0, lo_open=True) >= 1:
        raise AdaptspecError(f"{where}: rms_norm_eps={c.rms_norm_eps!r} must be a small number in (0, 1)")
    number(c.rope_theta, where, "rope_theta", 0, lo_open=True)
    if c.draft_vocab_size is not None:
        integer(c.draft_vocab_size, where, "draft_vocab_size", 1, c.vocab_size)
    if c.mask_token_id is not None:
        integer(c.mask_token_id, where, "mask_token_id", 0, c.vocab_size - 1)
    if c.num_target_layers is not None:
        integer(c.num_target_layers, where, "num_target_layers", 1)
    if c.num_heads % c.num_kv_heads:
        raise AdaptspecError(
            f"{where}: num_heads={c.num_heads} is not a multiple of num_kv_heads={c.num_kv_heads}"
        )
    for name in ("normalize_context_layers", "qk_norm"):
        if not isinstance(getattr(c, name), bool):
            raise AdaptspecError(f"{where}: {name}={getattr(c, name)!r} must be true or false")
    if not isinstance(c.target_name, str) or not isinstance(c.extra, dict):
        bad = "target_name" if not isinstance(c.target_name, str) else "extra"
        raise AdaptspecError(f"{where}: {bad}={getattr(c, bad)!r} has the wrong type")
    return c
