"""A DFlash-style block-diffusion drafter: one forward pass drafts a whole block.

Input: ``[last committed token, MASK x (B-1)]``. Attention inside the block is bidirectional;
the target's context enters every drafter layer as extra keys/values, computed from a
learned projection of the target's hidden states at a few of its layers. The drafter has no
embedding or LM head of its own: it uses the target's (frozen), optionally restricted to a
reduced draft vocabulary whose ids map back to the target's.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
...                   num_attention_heads=4, num_key_value_heads=2)
>>> target = LlamaForCausalLM(cfg)
>>> drafter = BlockDiffusionDrafter.for_target(target, num_layers=1, seed=0)
>>> drafter.config.target_layers
[1]
>>> ctx = torch.randn(5, drafter.context_width)       # hidden states of 5 committed positions
>>> state = drafter.new_state(ctx)
>>> drafter.draft_logits(state, last_token=7, block_size=4).shape   # B - 1 drafted positions
torch.Size([3, 64])
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import AdaptspecError
from .drafter_config import CONFIG_NAME, WEIGHTS_NAME, DrafterConfig

#: Architectures :meth:`BlockDiffusionDrafter.for_target` builds (``TrainConfig.layout``).
LAYOUTS = ("adaptspec", "dflash")


def default_mask_token_id(target: nn.Module) -> int:
    """The mask token of a fresh DFlash-layout drafter: the target's pad token if it has one,
    else its last vocabulary id. (DFlash adds a dedicated mask token to the target's
    vocabulary; the drafter only reads that token's frozen embedding, as the input of block
    positions 1..B-1, so an existing id serves; pass ``mask_token_id`` to choose another.)"""
    tc = target.config
    pad = getattr(tc, "pad_token_id", None)
    if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < tc.vocab_size:
        return pad
    return tc.vocab_size - 1


def default_target_layers(num_target_layers: int, k: int = 5) -> list[int]:
    """``k`` layers spread evenly from layer 1 to layer L-3 (as DFlash does).

    >>> default_target_layers(30)
    [1, 8, 14, 20, 27]
    """
    hi = max(1, num_target_layers - 3)
    k = min(k, hi)
    if k == 1:
        return [hi]
    return [round(1 + i * (hi - 1) / (k - 1)) for i in range(k)]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (half-split form) of ``x[..., T, D]`` at ``positions[T]``
    (or ``positions[N, T]`` for a batch)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[..., None] * inv  # [..., T, D/2]
    ang = torch.cat([ang, ang], dim=-1)
    if ang.dim() == 3:  # [N, T, D] -> [N, 1, T, D] to broadcast over heads
        ang = ang[:, None]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class LayerwiseRMSNorm(nn.Module):
    """RMSNorm applied separately to each of ``k`` concatenated ``dim``-wide slices."""

    def __init__(self, k: int, dim: int, eps: float) -> None:
        super().__init__()
        self.k, self.dim, self.eps = k, dim, eps
        self.weight = nn.Parameter(torch.ones(k, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.float().reshape(*shape[:-1], self.k, self.dim)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).reshape(shape)


class DrafterLayer(nn.Module):
    """Pre-norm transformer layer whose attention also sees the context's keys/values."""

    def __init__(self, c: DrafterConfig) -> None:
        super().__init__()
        self.c = c
        h, hd = c.hidden_size, c.head_dim
        self.input_norm = RMSNorm(h, c.rms_norm_eps)
        self.q_proj = nn.Linear(h, c.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(h, c.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, c.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.num_heads * hd, h, bias=False)
        self.post_norm = RMSNorm(h, c.rms_norm_eps)
        self.q_norm = RMSNorm(hd, c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(hd, c.rms_norm_eps) if c.qk_norm else None
        self.gate_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, h, bias=False)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:  # [N, T, n*hd] -> [N, n, T, hd]
        return x.view(x.shape[0], x.shape[1], n, self.c.head_dim).transpose(1, 2)

    def _queries(self, hx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q = self._heads(self.q_proj(hx), self.c.num_heads)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return rotate(q, positions, self.c.rope_theta)

    def _keys(self, hx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        k = self._heads(self.k_proj(hx), self.c.num_kv_heads)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return rotate(k, positions, self.c.rope_theta)

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values of projected context features ``ctx[N, T, H]``."""
        return self._keys(ctx, positions), self._heads(self.v_proj(ctx), self.c.num_kv_heads)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        c = self.c
        hx = self.input_norm(x)
        q = self._queries(hx, positions)
        k = self._keys(hx, positions)
        v = self._heads(self.v_proj(hx), c.num_kv_heads)
        k = torch.cat([ctx_k, k], dim=2)
        v = torch.cat([ctx_v, v], dim=2)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        x = x + self.o_proj(att.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))
        hx = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(hx)) * self.up_proj(hx))


class DraftState:
    """The drafter's own cache for one sequence: per-layer context keys/values.

    Target hidden states of newly committed positions are queued by :meth:`append` and
    projected lazily at the next draft, so rounds that draft nothing (B = 1) cost nothing.
    """

    def __init__(self, pending: torch.Tensor | None = None) -> None:
        self.keys: list[torch.Tensor] | None = None
        self.values: list[torch.Tensor] | None = None
        self.projected = 0
        self.pending: list[torch.Tensor] = [] if pending is None else [pending]

    @property
    def length(self) -> int:
        """Number of committed context positions (projected + queued)."""
        return self.projected + sum(p.shape[0] for p in self.pending)

    def append(self, hidden: torch.Tensor) -> None:
        """Queue target hidden states ``[t, k*H]`` of newly committed positions."""
        if hidden.shape[0]:
            self.pending.append(hidden)

    def crop(self, length: int) -> None:
        """Forget context positions from ``length`` on (after a rejection or a rollback)."""
        if length >= self.length:
            return
        if length >= self.projected:
            keep, out = length - self.projected, []
            for p in self.pending:
                out.append(p[:keep])
                keep -= out[-1].shape[0]
            self.pending = [p for p in out if p.shape[0]]
            return
        self.pending = []
        self.projected = length
        if self.keys is not None:
            self.keys = [k[:, :, :length] for k in self.keys]
            self.values = [v[:, :, :length] for v in self.values]


class BlockDiffusionDrafter(nn.Module):
    """Drafts ``B - 1`` tokens in one pass from the target's context (DFlash-style)."""

    def __init__(self, config: DrafterConfig, draft_vocab: torch.Tensor | None = None) -> None:
        super().__init__()
        c = self.config = config
        k = len(c.target_layers)
        self.layer_norm = (
            LayerwiseRMSNorm(k, c.hidden_size, c.rms_norm_eps) if c.normalize_context_layers else None
        )
        self.fc = nn.Linear(c.context_width, c.hidden_size, bias=False)
        self.context_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        # A learned mask vector, or (mask_token_id set) the target's embedding of that token.
        self.mask_embedding = nn.Parameter(torch.zeros(c.hidden_size)) if c.mask_token_id is None else None
        if draft_vocab is not None:
            draft_vocab = torch.as_tensor(draft_vocab, dtype=torch.long)
            if c.draft_vocab_size != len(draft_vocab):
                raise AdaptspecError("draft_vocab length does not match config.draft_vocab_size")
        self.register_buffer("draft_vocab", draft_vocab, persistent=False)
        # The target's embedding and LM head, attached by attach(): kept outside the module
        # tree so they are neither trained, nor saved, nor moved by .to().
        self.__dict__["_shared"] = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def for_target(
        cls,
        target: nn.Module,
        num_layers: int = 2,
        target_layers: Sequence[int] | None = None,
        num_target_layers: int = 5,
        max_block_size: int = 32,
        draft_vocab: Sequence[int] | None = None,
        seed: int | None = None,
        normalize_context_layers: bool = False,
        layout: str = "adaptspec",
        mask_token_id: int | None = None,
    ) -> "BlockDiffusionDrafter":
        """A fresh drafter shaped after ``target`` (a Hugging Face causal LM).

        ``layout="dflash"`` builds the architecture of the published DFlash v1 drafters, which
        :func:`~adaptspec.decoding.dflash_format.save` can write: per-head q/k RMS norm, the
        mask is the target's embedding of ``mask_token_id`` (default: :func:`default_mask_token_id`),
        the target's depth recorded. ``"adaptspec"`` (default): no q/k norm and a learned mask
        vector, unless ``mask_token_id`` is given.
        """
        config = _config_for(
            target,
            num_layers,
            target_layers,
            num_target_layers,
            max_block_size,
            draft_vocab,
            normalize_context_layers,
            layout,
            mask_token_id,
        )
        if seed is not None:
            torch.manual_seed(seed)
        drafter = cls(config, None if draft_vocab is None else torch.as_tensor(list(draft_vocab)))
        drafter.apply(drafter._init_weights)
        final_norm = _final_norm(target)
        if final_norm is not None:
            with torch.no_grad():
                drafter.norm.weight.copy_(final_norm.weight.float())
        if drafter.mask_embedding is not None:
            with torch.no_grad():
                emb = target.get_input_embeddings().weight
                drafter.mask_embedding.copy_(emb.float().mean(0))
        drafter.attach(target)
        return drafter

    def _init_weights(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)

    def attach(self, target: nn.Module) -> "BlockDiffusionDrafter":
        """Share ``target``'s token embedding and LM head (frozen). Checks that they fit."""
        tc, c = target.config, self.config
        if tc.vocab_size != c.vocab_size:
            raise AdaptspecError(
                f"vocab_size: drafter was built for a vocabulary of {c.vocab_size} tokens, "
                f"the target has {tc.vocab_size}"
            )
        if tc.hidden_size != c.hidden_size:
            raise AdaptspecError(f"hidden_size: drafter {c.hidden_size} != target {tc.hidden_size}")
        if c.num_target_layers is not None and c.num_target_layers != tc.num_hidden_layers:
            raise AdaptspecError(
                f"num_target_layers: drafter was trained on a target of {c.num_target_layers} layers, "
                f"this target has {tc.num_hidden_layers}"
            )
        if max(c.target_layers) > tc.num_hidden_layers:
            raise AdaptspecError(
                f"drafter reads target layer {max(c.target_layers)}, target has {tc.num_hidden_layers}"
            )
        if c.mask_token_id is not None and not 0 <= c.mask_token_id < tc.vocab_size:
            raise AdaptspecError(
                f"mask_token_id {c.mask_token_id} outside the target's vocabulary 0..{tc.vocab_size - 1}"
            )
        self.__dict__["_shared"] = (target.get_input_embeddings(), target.get_output_embeddings().weight)
        return self

    @property
    def _embed(self) -> nn.Module:
        self._check_attached()
        return self._shared[0]

    @property
    def context_width(self) -> int:
        return self.config.context_width

    @property
    def max_block_size(self) -> int:
        return self.config.max_block_size

    def _check_attached(self) -> None:
        if self._shared is None:
            raise AdaptspecError("drafter is not attached to a target: call drafter.attach(target_model)")

    def lm_weight(self) -> torch.Tensor:
        """LM-head rows of the draft vocabulary ``[V_draft, H]`` (all rows if no reduced vocab)."""
        self._check_attached()
        w = self._shared[1]
        if self.draft_vocab is None:
            return w
        # gathered once and reused: the gather costs as much as the matmul it feeds (docs/dflash.md);
        # the key notices a moved draft vocabulary, another head and any in-place change to it
        key = (w.data_ptr(), w._version, w.device, w.dtype, self.draft_vocab.data_ptr())
        cached = self.__dict__.get("_lm_rows")
        if cached is None or cached[0] != key:
            cached = (key, w[self.draft_vocab.to(w.device)])
            self.__dict__["_lm_rows"] = cached
        return cached[1]

    def mask_vector(self) -> torch.Tensor:
        """The input vector of a masked block position ``[H]``, in the drafter's dtype and device."""
        if self.mask_embedding is not None:
            return self.mask_embedding
        p = self.fc.weight
        tok = torch.tensor([self.config.mask_token_id], device=self._embed.weight.device)
        return self._embed(tok)[0].to(device=p.device, dtype=p.dtype)

    # ------------------------------------------------------------------ inference
    def new_state(self, context_hidden: torch.Tensor | None = None) -> DraftState:
        """A cache for one sequence, seeded with the prompt's target hidden states ``[T, k*H]``."""
        return DraftState(context_hidden)

    def _project(self, hidden: torch.Tensor) -> torch.Tensor:
        p = self.fc.weight
        hidden = hidden.to(device=p.device)
        if self.layer_norm is not None:
            hidden = self.layer_norm(hidden)
        return self.context_norm(self.fc(hidden.to(p.dtype)))

    def _sync(self, state: DraftState) -> None:
        """Project queued context positions into every layer's keys/values."""
        if not state.pending:
            return
        hidden = torch.cat(state.pending, dim=0)[None]  # [1, t, kH]
        ctx = self._project(hidden)
        pos = torch.arange(state.projected, state.projected + ctx.shape[1], device=ctx.device)
        kv = [layer.context_kv(ctx, pos) for layer in self.layers]
        if state.keys is None:
            state.keys = [k for k, _ in kv]
            state.values = [v for _, v in kv]
        else:
            state.keys = [torch.cat([a, k], dim=2) for a, (k, _) in zip(state.keys, kv)]
            state.values = [torch.cat([a, v], dim=2) for a, (_, v) in zip(state.values, kv)]
        state.projected += ctx.shape[1]
        state.pending = []

    @torch.no_grad()
    def draft_logits(self, state: DraftState, last_token: int, block_size: int) -> torch.Tensor:
        """Logits ``[B-1, V_draft]`` for the block positions after ``last_token``.

        The block sits right after the ``state.length`` committed context positions.
        Map draft-vocabulary indices to target ids with :meth:`to_target_ids`.
        """
        if not 2 <= block_size <= self.config.max_block_size:
            raise AdaptspecError(f"block size {block_size} outside 2..{self.config.max_block_size}")
        self._check_attached()
        self._sync(state)
        if state.keys is None:
            raise AdaptspecError("the drafter needs at least one context position")
        p = self.mask_vector()
        tok = torch.tensor([[last_token]], device=self._embed.weight.device)
        first = self._embed(tok).to(device=p.device, dtype=p.dtype)  # [1, 1, H]
        x = torch.cat([first, p.expand(1, block_size - 1, -1)], dim=1)
        pos = torch.arange(state.length, state.length + block_size, device=p.device)
        for layer, k, v in zip(self.layers, state.keys, state.values):
            x = layer(x, pos, k, v)
        h = self.norm(x[0, 1:])
        w = self.lm_weight()
        return h.to(w.dtype) @ w.T

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices -> target token ids."""
        if self.draft_vocab is None:
            return draft_ids
        return self.draft_vocab.to(draft_ids.device)[draft_ids]

    def target_probs(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """Probabilities over the draft vocabulary ``[n, V_draft]`` -> over the target's ``[n, V]``."""
        if self.draft_vocab is None:
            return draft_probs
        out = draft_probs.new_zeros(draft_probs.shape[0], self.config.vocab_size)
        out[:, self.draft_vocab.to(out.device)] = draft_probs
        return out

    # ------------------------------------------------------------------ training
    def forward_train(
        self,
        context_hidden: torch.Tensor,
        tokens: torch.Tensor,
        anchors: torch.Tensor,
        block_size: int,
    ) -> torch.Tensor:
        """Hidden states ``[N, A, B-1, H]`` (after the final norm) for blocks at ``anchors``.

        ``context_hidden[N, T, k*H]`` are the target's hidden states, ``tokens[N, T]`` the
        sequences, ``anchors[N, A]`` block start positions. Block ``a`` reads context positions
        ``< a`` and itself (bidirectionally), never other blocks: one pass trains many blocks.
        """
        self._check_attached()
        n, t = tokens.shape
        a = anchors.shape[1]
        ctx = self._project(context_hidden)  # [N, T, H]
        ctx_pos = torch.arange(t, device=ctx.device).expand(n, t)
        offs = torch.arange(block_size, device=ctx.device)
        blk_pos = (anchors[:, :, None] + offs).reshape(n, a * block_size)  # [N, A*B]
        first = self._embed(tokens.gather(1, anchors)).to(ctx.dtype)  # [N, A, H]
        x = self.mask_vector().to(ctx.dtype).expand(n, a, block_size, -1).clone()
        x[:, :, 0] = first
        x = x.reshape(n, a * block_size, -1)
        # Attention mask [N, 1, A*B, T + A*B]: context before the anchor, and the own block.
        q_anchor = anchors.repeat_interleave(block_size, dim=1)  # [N, A*B]
        see_ctx = ctx_pos[:, None, :] < q_anchor[:, :, None]
        blk_id = torch.arange(a, device=ctx.device).repeat_interleave(block_size)
        see_blk = (blk_id[:, None] == blk_id[None, :]).expand(n, -1, -1)
        mask = torch.cat([see_ctx, see_blk], dim=2)[:, None]
        for layer in self.layers:
            k, v = layer.context_kv(ctx, ctx_pos)
            x = layer(x, blk_pos, k, v, mask)
        h = self.norm(x.view(n, a, block_size, -1)[:, :, 1:])
        return h

    # ------------------------------------------------------------------ save / load
    def save_pretrained(self, path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> None:
        """Write ``drafter_config.json`` and ``drafter.safetensors`` (shared target weights excluded)."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}
        if self.draft_vocab is not None:
            tensors["draft_vocab"] = self.draft_vocab.cpu().to(torch.int64)
        tmp = path / (WEIGHTS_NAME + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, path / WEIGHTS_NAME)
        (path / (CONFIG_NAME + ".tmp")).write_text(json.dumps(asdict(self.config), indent=2))
        os.replace(path / (CONFIG_NAME + ".tmp"), path / CONFIG_NAME)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        target: nn.Module | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> "BlockDiffusionDrafter":
        """Load a drafter saved by :meth:`save_pretrained`, or a published DFlash v1 checkpoint
        (``config.json`` naming ``DFlashDraftModel`` + ``model.safetensors``, see
        :mod:`adaptspec.decoding.dflash_format`), as it is; attach it to ``target`` if given."""
        from .._util.checks import read_json_object, read_safetensors
        from . import dflash_format
        from .drafter_config import config_from_json

        path = Path(path)
        if (path / CONFIG_NAME).exists():
            config = config_from_json(
                read_json_object(path / CONFIG_NAME, "drafter config"), str(path / CONFIG_NAME)
            )
            if not (path / WEIGHTS_NAME).is_file():
                raise AdaptspecError(f"{path}: no {WEIGHTS_NAME} beside {CONFIG_NAME}")
            tensors = read_safetensors(path / WEIGHTS_NAME, "drafter weights file")
        elif dflash_format.is_dflash_dir(path):
            config, tensors = dflash_format.load(path)
        else:
            raise AdaptspecError(
                f"{path}: not a drafter: neither {CONFIG_NAME} (adaptspec) nor a config.json "
                f"naming {dflash_format.ARCHITECTURE} (DFlash v1)"
            )
        draft_vocab = tensors.pop("draft_vocab", None)
        drafter = cls(config, draft_vocab)
        _check_tensors(path, drafter, tensors)
        drafter.load_state_dict({k: v.to(dtype) for k, v in tensors.items()})
        drafter.to(device=device, dtype=dtype)
        if target is not None:
            drafter.attach(target)
        return drafter.eval()


def _check_tensors(path: Path, drafter: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """One clear line when the stored tensors do not fit the config (before load_state_dict)."""
    want = {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
    missing = sorted(set(want) - set(tensors))
    extra = sorted(set(tensors) - set(want))
    if missing or extra:
        raise AdaptspecError(
            f"{path}: weights do not fit the config: missing {missing[:4]}, unexpected {extra[:4]}"
        )
    for k, shape in want.items():
        if tuple(tensors[k].shape) != shape:
            raise AdaptspecError(
                f"{path}: tensor {k} has shape {tuple(tensors[k].shape)}, the config implies {shape}"
            )


def _final_norm(target: nn.Module) -> nn.Module | None:
    inner = getattr(target, "model", None)
    norm = getattr(inner, "norm", None)
    return norm if norm is not None and hasattr(norm, "weight") else None


def block_position_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """DFlash's loss weights ``exp(-(k-1)/gamma)`` over drafted positions ``k = 1..B-1``.

    >>> block_position_weights(4, gamma=1.0)
    tensor([1.0000, 0.3679, 0.1353])
    """
    if gamma is None:
        gamma = {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size * 7.0 / 16))
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


__all__ = [
    "BlockDiffusionDrafter",
    "DrafterConfig",
    "DraftState",
    "LAYOUTS",
    "block_position_weights",
    "default_mask_token_id",
    "default_target_layers",
]


def _config_for(
    target: nn.Module,
    num_layers: int,
    target_layers: Sequence[int] | None,
    num_target_layers: int,
    max_block_size: int,
    draft_vocab: Sequence[int] | None,
    normalize_context_layers: bool,
    layout: str,
    mask_token_id: int | None,
) -> DrafterConfig:
    """A drafter's configuration shaped after target's (BlockDiffusionDrafter.for_target), checked:
    the layout, the target layers it reads, the mask token, and the dflash layout's own rules."""
    if layout not in LAYOUTS:
        raise AdaptspecError(f"layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
    tc = target.config
    L = tc.num_hidden_layers
    layers = list(target_layers) if target_layers is not None else default_target_layers(L, num_target_layers)
    if any(not 0 <= i <= L for i in layers):
        raise AdaptspecError(f"target_layers {layers} outside 0..{L}")
    dflash = layout == "dflash"
    if dflash and mask_token_id is None:
        mask_token_id = default_mask_token_id(target)
    if mask_token_id is not None and not 0 <= mask_token_id < tc.vocab_size:
        raise AdaptspecError(
            f"mask_token_id {mask_token_id} outside the target's vocabulary 0..{tc.vocab_size - 1}"
        )
    heads = tc.num_attention_heads
    rope = getattr(tc, "rope_parameters", None) or {}
    config = DrafterConfig(
        hidden_size=tc.hidden_size,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=getattr(tc, "num_key_value_heads", None) or heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // heads,
        intermediate_size=tc.intermediate_size,
        vocab_size=tc.vocab_size,
        target_layers=layers,
        max_block_size=max_block_size,
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-5),
        rope_theta=float(rope.get("rope_theta", getattr(tc, "rope_theta", 10000.0))),
        draft_vocab_size=None if draft_vocab is None else len(draft_vocab),
        target_name=getattr(tc, "_name_or_path", "") or tc.model_type,
        normalize_context_layers=normalize_context_layers,
        qk_norm=dflash,
        mask_token_id=mask_token_id,
        num_target_layers=L if dflash else None,
        extra={"max_position_embeddings": tc.max_position_embeddings}
        if dflash and isinstance(getattr(tc, "max_position_embeddings", None), int)
        else {},
    )
    if dflash:  # the layout's own rules, in one place
        from .dflash_format import unsupported

        why = unsupported(config)
        if why is not None:
            raise AdaptspecError(f"layout dflash: {why}")
    return config
