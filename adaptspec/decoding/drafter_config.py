"""The shape of a drafter, and the names of its files: what both the adaptspec layout
(:mod:`adaptspec.decoding.drafter`) and the published DFlash layout
(:mod:`adaptspec.decoding.dflash_format`) read and write.

>>> DrafterConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
...               intermediate_size=128, vocab_size=256, target_layers=[1, 3]).context_width
128
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONFIG_NAME = "drafter_config.json"
WEIGHTS_NAME = "drafter.safetensors"


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
