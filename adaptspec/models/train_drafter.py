"""Train a block-diffusion drafter for a target (the DFlash recipe, scaled to a CPU).

Steps, each resumable (``adaptspec train-drafter`` runs them in order):

1. prompts: a varied pool in five domains (:mod:`adaptspec.models.prompts`), held-out ones removed;
2. responses: the target's own greedy answers (:func:`~adaptspec.models.distill.generate_responses`);
3. hidden states at the drafter's context layers, in shards;
4. training: random anchor positions in the responses, each opening a block of ``B - 1``
   masks that reads the context before the anchor; cross-entropy over the draft vocabulary
   weighted by ``exp(-(k-1)/gamma)`` at block position ``k``; AdamW with warm-up and cosine
   decay; bfloat16 autocast; checkpoints (model, optimiser, step, generator) every few
   minutes, so a killed run continues where it stopped;
5. evaluation on held-out responses: the exact greedy acceptance length at random anchors
   (on text the target generated greedily, the accepted length at an anchor is the longest
   prefix where the drafter's argmax equals the text, so no decoding loop is needed).

Checkpoints and data live in a work directory outside the repository; ``--export`` writes
the final weights (bfloat16 safetensors + config; in the DFlash v1 layout when trained with
``layout="dflash"``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
import torch.nn.functional as F

from ..decoding.drafter import BlockDiffusionDrafter, block_position_weights
from ..errors import AdaptspecError


@dataclass
class TrainConfig:
    num_layers: int = 2
    normalize_context_layers: bool = False
    # "adaptspec" or "dflash" (the DFlash v1 architecture, exported in that layout; its largest
    # block is block_size, not max_block_size, as DFlash's block_size is the trained one)
    layout: str = "adaptspec"
    mask_token_id: int | None = None  # layout dflash: None picks default_mask_token_id(target)
    block_size: int = 16
    max_block_size: int = 32
    draft_vocab_size: int | None = 8192
    seqs_per_step: int = 4
    anchors_per_seq: int = 8
    max_seq_len: int = 640
    # crop each sequence's response to its first N tokens before anchors are drawn (None: whole)
    max_response_len: int | None = None
    # > 0: learn the target's top-k next-token distribution (stored by the data stage) instead
    # of its greedy token alone
    soft_targets: int = 0
    lr: float = 6e-4
    weight_decay: float = 0.01
    warmup_steps: int = 200
    total_steps: int = 20_000
    min_lr_ratio: float = 0.1
    max_train_tokens: int | None = None  # train on the first shards holding this many response tokens
    init_from_target: bool = False  # start the drafter's layers as copies of the target's last layers
    init_from: str | None = (
        None  # start from this checkpoint directory's weights (new optimiser and schedule)
    )
    grad_clip: float = 1.0
    gamma: float | None = None
    seed: int = 0
    threads: int = 1
    bf16_autocast: bool = True
    checkpoint_every_s: float = 300.0
    eval_every: int = 500
    log_every: int = 50
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------------- data
class ShardData:
    """All sequences of the shards under ``dirs`` (float16 hidden states, in memory or memory-mapped)."""

    def __init__(self, dirs: Iterable[Path], max_response_tokens: int | None = None) -> None:
        self.dirs = [Path(d) for d in dirs]
        self.max_response_tokens = max_response_tokens  # stop adding shards past this many (a data budget)
        self.tokens: list[np.ndarray] = []
        self.hidden: list[np.ndarray] = []
        # the target's top-k next tokens at every position (ids, probs), where the data stage stored them
        self.top: list[tuple[np.ndarray, np.ndarray] | None] = []
        self.prompt_lens: list[int] = []
        self.domains: list[str] = []
        self.files: set[Path] = set()
        self.reload()

    def to(self, device: str | torch.device) -> "ShardData":
        """Hold every sequence's hidden states as a float16 tensor on ``device`` (a GPU: batches
        are then gathered there, not copied over from memory-mapped files each step); returns self.
        Shards added later by :meth:`reload` stay memory-mapped."""
        self.hidden = [torch.from_numpy(np.array(h, dtype=np.float16)).to(device) for h in self.hidden]
        return self

    def reload(self) -> int:
        """Load shards written since the last call; returns how many were added."""
        new = sorted(p for d in self.dirs for p in (d / "shards").glob("shard-*.npz") if p not in self.files)
        for path in new:
            if self.max_response_tokens is not None and self.n_tokens() >= self.max_response_tokens:
                break
            with np.load(path, allow_pickle=False) as z:
                lens, tok = z["lengths"], z["tokens"]
                # hidden states inline (distill shards) or beside, memory-mapped (context shards)
                hid = (
                    z["hidden"]
                    if "hidden" in z.files
                    else np.load(path.with_suffix(".hidden.npy"), mmap_mode="r", allow_pickle=False)
                )
                top = None
                if path.with_suffix(".topk_ids.npy").exists():
                    top = tuple(
                        np.load(path.with_suffix(f".{k}.npy"), mmap_mode="r", allow_pickle=False)
                        for k in ("topk_ids", "topk_probs")
                    )
                starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
                for s, n, pl, d in zip(starts, lens, z["prompt_lens"], z["domains"]):
                    if n - pl >= 3:  # needs at least one anchor with a label
                        self.tokens.append(tok[s : s + n])
                        self.hidden.append(hid[s : s + n])
                        self.top.append(None if top is None else (top[0][s : s + n], top[1][s : s + n]))
                        self.prompt_lens.append(int(pl))
                        self.domains.append(str(d))
            self.files.add(path)
        return len(new)

    def __len__(self) -> int:
        return len(self.tokens)

    def n_tokens(self, responses_only: bool = True) -> int:
        return int(
            sum(len(t) - (pl if responses_only else 0) for t, pl in zip(self.tokens, self.prompt_lens))
        )

    def top_k(self) -> int:
        """How many next tokens every sequence's stored distribution holds (0 where any lacks one)."""
        return min((0 if t is None else t[0].shape[1] for t in self.top), default=0)

    def token_counts(self) -> Counter:
        c: Counter = Counter()
        for t, pl in zip(self.tokens, self.prompt_lens):
            c.update(np.asarray(t[pl:]).tolist())
        return c


def make_batch(
    data: ShardData,
    idx: np.ndarray,
    cfg: TrainConfig,
    rng: np.random.Generator,
    vocab_map: torch.Tensor | None,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Sequences ``idx`` truncated to ``max_seq_len``, with random anchors in their responses.

    With ``cfg.max_response_len`` each response is first cropped to its first that many
    tokens: no anchor, label or context position lies past them. With ``cfg.soft_targets = K``
    the batch also holds ``soft_ids`` (draft indices, 0 where unused) and ``soft_probs``
    ``[N, A, B-1, K]``: at each labelled position ``t``, the target's top ``K`` next tokens
    after ``t - 1`` that the draft vocabulary holds, probabilities renormalised over them.

    On the CPU the hidden states are float32; on another ``device`` they stay float16 (as
    stored; the drafter's first layer casts them) and are gathered there when
    :meth:`ShardData.to` put them there.
    """
    b, a = cfg.block_size, cfg.anchors_per_seq
    device = torch.device(device)
    k_soft = cfg.soft_targets
    seqs, tops = _windows(data, idx, cfg, rng)
    width = max(len(t) for t, _, _ in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    hidden = torch.zeros(
        len(seqs),
        width,
        seqs[0][1].shape[1],
        device=device,
        dtype=torch.float32 if device.type == "cpu" else torch.float16,
    )
    anchors = torch.zeros(len(seqs), a, dtype=torch.long)
    labels = torch.full((len(seqs), a, b - 1), -100, dtype=torch.long)
    if k_soft:
        soft_ids = torch.zeros(len(seqs), a, b - 1, k_soft, dtype=torch.long)
        soft_probs = torch.zeros(len(seqs), a, b - 1, k_soft, dtype=torch.float32)
    for r, (tok, hid, pl) in enumerate(seqs):
        n = len(tok)
        tokens[r, :n] = torch.from_numpy(tok)
        hidden[r, :n] = (
            hid if isinstance(hid, torch.Tensor) else torch.from_numpy(np.asarray(hid, dtype=np.float32))
        )
        cand = np.arange(pl, n - 1)  # the anchor token must have at least one label after it
        pick = np.sort(rng.choice(cand, size=a, replace=len(cand) < a))
        anchors[r] = torch.from_numpy(pick)
        after = pick[:, None] + np.arange(
            1, b
        )  # the b - 1 positions each block drafts; past the end: no label
        labels[r] = torch.from_numpy(np.where(after < n, tok[np.minimum(after, n - 1)], -100))
        if k_soft:
            soft_ids[r], soft_probs[r] = _soft_row(tops[r], after, n, k_soft)
    if vocab_map is not None:
        labels = torch.where(labels >= 0, vocab_map[labels.clamp_min(0)], labels)
    batch = {
        "tokens": tokens.to(device),
        "hidden": hidden,
        "anchors": anchors.to(device),
        "labels": labels.to(device),
    }
    if k_soft:
        if vocab_map is not None:  # tokens the draft vocabulary lacks cannot be drafted: no mass
            mapped = vocab_map[soft_ids]
            soft_probs = torch.where(mapped >= 0, soft_probs, 0.0)
            soft_ids = mapped.clamp_min(0)
        soft_probs = soft_probs / soft_probs.sum(-1, keepdim=True).clamp_min(1e-12)
        batch |= {"soft_ids": soft_ids.to(device), "soft_probs": soft_probs.to(device)}
    return batch


def _windows(
    data: ShardData, idx: np.ndarray, cfg: TrainConfig, rng: np.random.Generator
) -> tuple[list[tuple[np.ndarray, Any, int]], list[tuple[int, Any]]]:
    """Each sequence's tokens, hidden states and prompt length, cropped to its response's first
    max_response_len tokens and then to a random window of max_seq_len positions that still holds
    response tokens; with soft targets, each window's start and the sequence's top tokens."""
    seqs, tops = [], []
    for i in idx:
        tok, hid, pl = data.tokens[i], data.hidden[i], data.prompt_lens[i]
        top = data.top[i] if cfg.soft_targets else None
        if cfg.max_response_len is not None:  # the response's first max_response_len tokens
            tok, hid = tok[: pl + cfg.max_response_len], hid[: pl + cfg.max_response_len]
        n, m = len(tok), cfg.max_seq_len
        lo = 0
        if n > m:  # a window of m positions that still holds response tokens to anchor on
            lo = int(rng.integers(max(0, pl + 2 - m), n - m + 1))
            tok, hid, pl = tok[lo : lo + m], hid[lo : lo + m], max(1, pl - lo)
        seqs.append((np.asarray(tok, dtype=np.int64), hid, max(1, pl)))
        if (
            cfg.soft_targets
        ):  # row t - 1 predicts position t; the window's first position has no row before it
            tops.append((lo, top))
    return seqs, tops


def _soft_row(
    top: tuple[int, Any], after: np.ndarray, n: int, k_soft: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's soft targets at its labelled positions after (anchors x positions): the target's
    top k_soft tokens and their probabilities (0 past the sequence's end)."""
    lo, (top_ids, top_probs) = top
    a, w = after.shape
    rows = lo + np.minimum(after, n - 1) - 1  # the distribution each labelled token was drawn from
    ids = torch.from_numpy(np.asarray(top_ids[rows.ravel(), :k_soft], dtype=np.int64)).view(a, w, k_soft)
    p = torch.from_numpy(np.asarray(top_probs[rows.ravel(), :k_soft], dtype=np.float32)).view(a, w, k_soft)
    return ids, p * torch.from_numpy(after < n)[..., None]


def draft_vocabulary(counts: Counter, size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The ``size`` most frequent response tokens (plus ``always``), sorted by id."""
    keep = set(always)
    for t, _ in counts.most_common():
        if len(keep) >= size:
            break
        keep.add(int(t))
    return torch.tensor(sorted(keep), dtype=torch.long)


def vocab_index(draft_vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Target id -> draft index (-100 for ids outside the draft vocabulary)."""
    m = torch.full((vocab_size,), -100, dtype=torch.long)
    m[draft_vocab] = torch.arange(len(draft_vocab))
    return m


def copy_target_layers(drafter: BlockDiffusionDrafter, target) -> list[int]:
    """Start each drafter layer as a copy of one of the target's last layers; returns their ids.

    A drafter layer has a target layer's shapes (same width, heads and MLP), so the target's
    last layers, which turn hidden states into next-token predictions, are a pretrained
    starting point where random initialisation has only the distilled data to learn from.
    """
    from ..decoding.dflash_format import LAYER_MODULES  # the target's names are DFlash's (Qwen3/Llama)

    layers = target.model.layers
    ids = list(range(len(layers) - len(drafter.layers), len(layers)))
    with torch.no_grad():
        for mine, i in zip(drafter.layers, ids):
            theirs = dict(layers[i].named_modules())
            for their_name, my_name in LAYER_MODULES.items():
                module = getattr(mine, my_name)
                if module is not None and their_name in theirs:
                    module.weight.copy_(theirs[their_name].weight.float())
    return ids


# ---------------------------------------------------------------------- loss and eval
def block_loss(
    drafter: BlockDiffusionDrafter, batch: dict, weights: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """Position-weighted cross-entropy of a batch, and its top-1 accuracy on valid labels.

    Against the greedy labels, or, where the batch holds ``soft_ids``/``soft_probs``
    (:func:`make_batch` with ``soft_targets``), against the target's top-k distribution:
    ``-sum_j p_j log q(id_j)`` at each position, weighted as the greedy loss (the positions
    whose greedy token the draft vocabulary holds).
    """
    h = drafter.forward_train(batch["hidden"], batch["tokens"], batch["anchors"], weights.numel() + 1)
    logits = (h @ drafter.lm_weight().T.to(h.dtype)).float()  # [N, A, B-1, Vd]
    labels = batch["labels"]
    if "soft_ids" in batch:
        logq = torch.log_softmax(logits, dim=-1).gather(-1, batch["soft_ids"])
        ce = -(batch["soft_probs"] * logq).sum(-1)
    else:
        ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), ignore_index=-100, reduction="none")
        ce = ce.view(labels.shape)
    valid = (labels >= 0).float()
    w = weights.view(1, 1, -1) * valid
    loss = (ce * w).sum() / w.sum().clamp_min(1e-6)
    acc = float(((logits.argmax(-1) == labels).float() * valid).sum() / valid.sum().clamp_min(1))
    return loss, acc


@torch.no_grad()
def greedy_acceptance(
    drafter: BlockDiffusionDrafter,
    data: ShardData,
    block_sizes: Iterable[int] = (4, 8, 16),
    anchors_per_seq: int = 8,
    max_seqs: int = 200,
    seed: int = 0,
) -> dict:
    """Exact T=0 acceptance length per block size on held-out greedy text, overall and per domain.

    At an anchor, tau = 1 + the longest prefix of drafted positions whose argmax equals the
    text (which is the target's greedy continuation).
    """
    rng = np.random.default_rng(seed)
    bmax = max(block_sizes)
    cfg = TrainConfig(block_size=bmax, anchors_per_seq=anchors_per_seq, max_seq_len=10_000)
    per: dict[int, dict[str, list[float]]] = {b: {} for b in block_sizes}
    n = min(len(data), max_seqs)
    for i in range(n):
        batch = make_batch(data, np.array([i]), cfg, rng, None, device=drafter.fc.weight.device)
        h = drafter.forward_train(batch["hidden"], batch["tokens"], batch["anchors"], bmax)
        pred = drafter.to_target_ids((h @ drafter.lm_weight().T.to(h.dtype)).argmax(-1))[
            0
        ].cpu()  # [A, bmax-1]
        labels = batch["labels"][0].cpu()
        for b in block_sizes:
            ok = (pred[:, : b - 1] == labels[:, : b - 1]) & (labels[:, : b - 1] >= 0)
            tau = 1 + ok.int().cumprod(1).sum(1)
            # at the end of a response fewer than b-1 drafts can be checked; a tail still counts
            per[b].setdefault(data.domains[i], []).extend(tau.tolist())
    out = {}
    for b, doms in per.items():
        allv = [v for vs in doms.values() for v in vs]
        out[b] = {"all": float(np.mean(allv))} | {d: float(np.mean(v)) for d, v in sorted(doms.items())}
    return out


# ---------------------------------------------------------------------- training loop
def build_drafter(
    target,
    cfg: dict,
    draft_vocab: torch.Tensor | None,
    target_layers: list[int] | None,
    seed: int | None = None,
) -> BlockDiffusionDrafter:
    """A fresh drafter shaped as ``cfg`` says (``asdict(TrainConfig)``, or a checkpoint's ``cfg``,
    which also records the layout and mask token it was trained with; older ones are the
    adaptspec layout). DFlash's ``block_size`` is the trained one, so layout dflash's largest
    block is ``block_size``; the adaptspec layout's is ``max_block_size``."""
    layout = cfg.get("layout", "adaptspec")
    return BlockDiffusionDrafter.for_target(
        target,
        num_layers=cfg["num_layers"],
        max_block_size=cfg["block_size"] if layout == "dflash" else cfg["max_block_size"],
        target_layers=target_layers,
        draft_vocab=None if draft_vocab is None else draft_vocab.tolist(),
        seed=seed,
        normalize_context_layers=cfg.get("normalize_context_layers", False),
        layout=layout,
        mask_token_id=cfg.get("mask_token_id"),
    )


def load_state(path: Path) -> dict:
    """A training checkpoint (``state.pt``), tensors and plain values only: ``weights_only=True``,
    so a hostile file cannot run code; anything else is one line naming the file."""
    import pickle

    try:
        st = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise AdaptspecError(
            f"{path}: holds objects other than tensors and plain values; refused "
            "(loading them could run code)"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0]
        raise AdaptspecError(f"{path}: not a readable training checkpoint ({msg})") from None
    if not isinstance(st, dict):
        raise AdaptspecError(f"{path}: not a training checkpoint (holds a {type(st).__name__}, not a dict)")
    return st


_ARCHITECTURE = (
    "num_layers",
    "layout",
    "normalize_context_layers",
    "mask_token_id",
    "block_size",
    "max_block_size",
)


def weights_to_start_from(path: Path, target, target_layers: list[int] | None, seed: int | None = None):
    """``(drafter, draft_vocab, architecture, steps trained)`` from another run's checkpoint
    directory (``state.pt``) or an exported drafter (``save_pretrained``'s or the DFlash layout,
    e.g. the bundled weights; steps from its ``training.json`` card, 0 without one)."""
    if (path / "state.pt").is_file():
        st = load_state(path / "state.pt")
        drafter = build_drafter(target, st["cfg"], st["draft_vocab"], target_layers, seed)
        drafter.load_state_dict(st["model"])
        earlier = st["cfg"].get("extra", {}).get("steps_before", 0)
        return (
            drafter,
            st["draft_vocab"],
            {k: st["cfg"][k] for k in _ARCHITECTURE if k in st["cfg"]},
            int(st["step"]) + int(earlier),
        )
    try:
        drafter = BlockDiffusionDrafter.from_pretrained(path, target, dtype=torch.float32)
    except AdaptspecError:
        raise AdaptspecError(
            f"{path}: neither a training checkpoint (state.pt) nor an exported drafter"
        ) from None
    c = drafter.config
    if target_layers is not None and list(c.target_layers) != list(target_layers):
        raise AdaptspecError(
            f"{path}: the drafter reads target layers {c.target_layers}, the contexts hold {target_layers}"
        )
    card_path = path / "training.json"
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    trained = int(card.get("steps", 0)) + int(
        card.get("steps_before", card.get("config", {}).get("extra", {}).get("steps_before", 0))
    )
    arch = {
        "num_layers": c.num_layers,
        "normalize_context_layers": c.normalize_context_layers,
        "mask_token_id": c.mask_token_id,
        "max_block_size": c.max_block_size,
    } | trained_architecture(drafter)
    if arch["layout"] == "dflash":  # DFlash's block_size is the trained (and largest) one
        arch["block_size"] = c.max_block_size
    elif "block_size" in card.get("config", {}):
        arch["block_size"] = card["config"]["block_size"]
    return drafter, drafter.draft_vocab, arch, trained


def trained_architecture(drafter: BlockDiffusionDrafter) -> dict:
    """The layout and mask token a checkpoint records (what :func:`build_drafter` reads back)."""
    return {
        "layout": "dflash" if drafter.config.qk_norm else "adaptspec",
        "mask_token_id": drafter.config.mask_token_id,
    }


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def train(
    target,
    train_dirs: list[Path],
    eval_dirs: list[Path],
    ckpt_dir: Path,
    cfg: TrainConfig,
    max_minutes: float | None = None,
    log=print,
    target_layers: list[int] | None = None,
    vocab_prior: Counter | None = None,
    evaluate=None,
    device: str | torch.device = "cpu",
) -> BlockDiffusionDrafter:
    """Train (or resume) a drafter for ``target``; returns it. Checkpoints go to ``ckpt_dir``.

    On a ``device`` other than the CPU (a GPU: ``target`` must be there already), the
    training sequences' hidden states are moved there once (:meth:`ShardData.to`), batches
    are gathered there and the steps run under that device's bfloat16 autocast.

    The draft vocabulary is fixed at the first step from the response tokens present (and
    ``vocab_prior`` counts, e.g. of all prompts, when training starts before distillation ends).
    ``evaluate(drafter, held)`` gives the held-out figures logged every ``eval_every`` steps
    (default: :func:`greedy_acceptance` on 120 sequences).
    """
    device = torch.device(device)
    _check_target_device(target, device)
    torch.set_num_threads(cfg.threads)
    evaluate = evaluate or (lambda d, h: greedy_acceptance(d, h, max_seqs=120))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    data, held = _training_data(train_dirs, eval_dirs, cfg, device)
    run = _start(target, data, ckpt_dir / "state.pt", cfg, device, log, target_layers, vocab_prior)
    log(f"position weights (gamma {cfg.gamma or 'default'}): {[round(float(w), 3) for w in run.weights]}")
    log(
        f"training on {len(data)} sequences, {data.n_tokens()} response tokens; step {run.step}/{cfg.total_steps}"
    )
    with open(ckpt_dir / "train_log.jsonl", "a") as logf:
        _train_steps(run, data, held, evaluate, max_minutes, log, logf)
        run.save()
    return run.drafter.eval()


def _check_target_device(target, device: torch.device) -> None:
    """Refuse a target that is not on the training device."""
    emb_device = target.get_input_embeddings().weight.device
    if emb_device.type != device.type:
        raise AdaptspecError(f"training on {device}, but the target is on {emb_device}: move it there first")


def _training_data(
    train_dirs: list[Path], eval_dirs: list[Path], cfg: TrainConfig, device: torch.device
) -> tuple[ShardData, ShardData | None]:
    """The training sequences (on ``device``) and the held-out ones (None without ``eval_dirs``),
    refused when they cannot fill a step or lack the soft targets ``cfg`` asks for."""
    data = ShardData(train_dirs, cfg.max_train_tokens)
    held = ShardData(eval_dirs) if eval_dirs else None
    if len(data) == 0:
        raise RuntimeError(f"no training shards under {train_dirs}")
    if cfg.seqs_per_step > len(data):
        raise AdaptspecError(f"{cfg.seqs_per_step} sequences a step, but the training data holds {len(data)}")
    if cfg.soft_targets and data.top_k() < cfg.soft_targets:
        have = data.top_k()
        raise AdaptspecError(
            f"soft targets of {cfg.soft_targets} tokens, but "
            + (
                f"the training contexts store {have}"
                if have
                else "some training contexts store no top-k distribution (run the data stage with --soft-targets)"
            )
        )
    if device.type != "cpu":
        data.to(device)
    return data, held


class _TrainingRun:
    """What the training loop changes and a checkpoint saves: the drafter, its optimiser, the step
    reached, the generator of batches and the CPU time of the steps; and the losses and accuracies
    summed since they were last logged."""

    def __init__(
        self, drafter, draft_vocab, vocab_size: int, step: int, st: dict | None, rng, cfg, device, state_path
    ):
        self.drafter, self.draft_vocab, self.step, self.rng, self.cfg = drafter, draft_vocab, step, rng, cfg
        self.device, self.state_path = device, state_path
        self.params = [p for p in drafter.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
        if st is not None:
            self.opt.load_state_dict(st["opt"])
        self.vmap = None if draft_vocab is None else vocab_index(draft_vocab, vocab_size)
        self.weights = block_position_weights(cfg.block_size, cfg.gamma).to(device)
        self.cpu_s = float(st.get("train_cpu_s", 0.0)) if st is not None else 0.0  # not evaluations
        self.run_loss = self.run_acc = 0.0

    def train_step(self, data: ShardData) -> None:
        """One optimiser step on a batch of ``seqs_per_step`` random sequences, timed in CPU seconds."""
        cfg = self.cfg
        c0 = time.process_time()
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.step, cfg)
        idx = self.rng.choice(len(data), size=cfg.seqs_per_step, replace=False)
        batch = make_batch(data, idx, cfg, self.rng, self.vmap, self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
            loss, acc = block_loss(self.drafter, batch, self.weights)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        self.opt.step()
        self.step += 1
        self.cpu_s += time.process_time() - c0
        self.run_loss += float(loss.detach())
        self.run_acc += acc

    def running_means(self, t_start: float) -> dict:
        """The record of the last ``log_every`` steps (mean loss and accuracy); the sums restart."""
        every = self.cfg.log_every
        rec = {
            "step": self.step,
            "loss": self.run_loss / every,
            "acc": self.run_acc / every,
            "lr": lr_at(self.step, self.cfg),
            "elapsed_s": time.time() - t_start,
            "cpu_s": self.cpu_s,
        }
        self.run_loss = self.run_acc = 0.0
        return rec

    def evaluation(self, held: ShardData, evaluate) -> dict:
        """The record of ``evaluate(drafter, held)``, run with the drafter in eval mode."""
        self.drafter.eval()
        ev = evaluate(self.drafter, held)
        self.drafter.train()
        return {"step": self.step, "cpu_s": self.cpu_s, "eval_tau": ev}

    def save(self) -> None:
        """The checkpoint (``state.pt``), written whole or not at all."""
        tmp = self.state_path.with_suffix(".tmp")
        torch.save(
            {
                "model": self.drafter.state_dict(),
                "opt": self.opt.state_dict(),
                "step": self.step,
                "rng": self.rng.bit_generator.state,
                "draft_vocab": self.draft_vocab,
                "cfg": asdict(self.cfg) | trained_architecture(self.drafter),
                "train_cpu_s": self.cpu_s,
            },
            tmp,
        )
        os.replace(tmp, self.state_path)


def _start(
    target, data: ShardData, state_path: Path, cfg: TrainConfig, device, log, target_layers, vocab_prior
) -> _TrainingRun:
    """Where training starts: resumed from the checkpoint at ``state_path`` if there is one, else
    from the weights ``cfg.init_from`` names, else a fresh drafter."""
    rng = np.random.default_rng(cfg.seed)
    if state_path.exists():
        drafter, draft_vocab, step, st = _resume(target, state_path, cfg, rng, log, target_layers)
    elif cfg.init_from is not None:
        drafter, draft_vocab = _start_from_weights(target, cfg, log, target_layers)
        step, st = 0, None
    else:
        drafter, draft_vocab = _fresh_drafter(target, data, cfg, log, target_layers, vocab_prior)
        step, st = 0, None
    for p in target.parameters():  # the target stays as it is; the drafter trains on the device
        p.requires_grad_(False)
    drafter.to(device).train()
    vocab_size = target.config.vocab_size
    return _TrainingRun(drafter, draft_vocab, vocab_size, step, st, rng, cfg, device, state_path)


def _resume(target, state_path: Path, cfg: TrainConfig, rng, log, target_layers):
    """``(drafter, draft_vocab, step, checkpoint)`` from the run's own checkpoint, whose
    architecture replaces ``cfg``'s; ``rng`` continues where it stopped."""
    st = load_state(state_path)
    draft_vocab = st["draft_vocab"]
    saved = st["cfg"]
    if (cfg.layout, cfg.num_layers) != (saved.get("layout", "adaptspec"), saved["num_layers"]):
        log(
            f"the checkpoint was trained with {saved['num_layers']} layers, layout "
            f"{saved.get('layout', 'adaptspec')}; continuing with it"
        )
    for k in _ARCHITECTURE:  # the architecture is the checkpoint's (block_size included: it sets the loss)
        if k in saved:
            setattr(cfg, k, saved[k])
    drafter = build_drafter(target, saved, draft_vocab, target_layers, cfg.seed)
    drafter.load_state_dict(st["model"])
    step = st["step"]
    rng.bit_generator.state = st["rng"]
    log(f"resumed from step {step}")
    return drafter, draft_vocab, step, st


def _start_from_weights(target, cfg: TrainConfig, log, target_layers):
    """``(drafter, draft_vocab)`` from the weights of ``cfg.init_from``, whose architecture
    replaces ``cfg``'s; ``cfg.extra`` records the source and the steps it was trained."""
    drafter, draft_vocab, arch, trained = weights_to_start_from(
        Path(cfg.init_from), target, target_layers, cfg.seed
    )
    for k, v in arch.items():  # the architecture is the source's
        setattr(cfg, k, v)
    cfg.extra = {**cfg.extra, "steps_before": trained, "init_from": str(cfg.init_from)}
    log(f"starting from the weights of {cfg.init_from} (trained {trained} steps), new optimiser and schedule")
    return drafter, draft_vocab


def _fresh_drafter(target, data: ShardData, cfg: TrainConfig, log, target_layers, vocab_prior):
    """``(drafter, draft_vocab)``: a new drafter, its draft vocabulary the response tokens (counted
    10 times) and ``vocab_prior`` most frequent, end-of-sequence tokens always in."""
    draft_vocab = None
    if cfg.draft_vocab_size:
        eos = target.generation_config.eos_token_id
        always = [eos] if isinstance(eos, int) else list(eos or [])
        counts = data.token_counts()
        weighted = Counter({t: 10 * c for t, c in counts.items()})
        weighted.update(vocab_prior or {})
        draft_vocab = draft_vocabulary(weighted, cfg.draft_vocab_size, always)
        cover = sum(counts[int(t)] for t in draft_vocab) / max(1, sum(counts.values()))
        log(f"draft vocabulary: {len(draft_vocab)} tokens cover {cover:.2%} of response tokens")
    drafter = build_drafter(target, asdict(cfg), draft_vocab, target_layers, cfg.seed)
    if cfg.init_from_target:
        log(f"drafter layers start as copies of the target's layers {copy_target_layers(drafter, target)}")
    return drafter, draft_vocab


def _train_steps(run: _TrainingRun, data: ShardData, held, evaluate, max_minutes, log, logf) -> None:
    """Steps until ``total_steps`` (or ``max_minutes``): the running means logged every
    ``log_every`` steps, the held-out figures every ``eval_every``, a checkpoint every
    ``checkpoint_every_s`` seconds, after which shards written meanwhile join the data."""
    cfg = run.cfg
    t_start = last_ckpt = time.time()
    while run.step < cfg.total_steps:
        if max_minutes is not None and time.time() - t_start > max_minutes * 60:
            break
        run.train_step(data)
        if run.step % cfg.log_every == 0:
            _log_record(run.running_means(t_start), log, logf)
        if held is not None and run.step % cfg.eval_every == 0:
            _log_record(run.evaluation(held, evaluate), log, logf)
        if time.time() - last_ckpt > cfg.checkpoint_every_s:
            run.save()
            last_ckpt = time.time()
            if data.reload():  # shards written meanwhile by a running distillation
                log(f"now {len(data)} sequences, {data.n_tokens()} response tokens")


def _log_record(rec: dict, log, logf) -> None:
    """``rec`` logged and appended to the training log, flushed."""
    log(json.dumps(rec))
    logf.write(json.dumps(rec) + "\n")
    logf.flush()


# ---------------------------------------------------------------------- pipeline
def prepare_data(
    work: Path,
    per_domain: int = 800,
    eval_prompts: int = 100,
    max_new_tokens: int = 256,
    threads: int = 1,
    target: str | None = None,
    seed: int = 0,
    num_target_layers: int = 5,
    reverse: bool = False,
) -> None:
    """Prompts -> greedy responses -> hidden-state shards, for training and held-out evaluation."""
    from ..decoding.drafter import default_target_layers
    from ..decoding.loading import load_target
    from .distill import distill
    from .prompts import build_prompt_pool, split_pool, write_jsonl

    torch.set_num_threads(threads)
    model, tok = load_target(target, dtype="bfloat16")
    layers = default_target_layers(model.config.num_hidden_layers, num_target_layers)
    train_p, held_p = split_pool(build_prompt_pool(per_domain, seed=seed))
    # held-out evaluation: a balanced subset, never trained on
    by_dom: dict[str, list] = {}
    for p in held_p:
        by_dom.setdefault(p.domain, []).append(p)
    k = max(1, eval_prompts // max(1, len(by_dom)))
    held_eval = [p for ps in by_dom.values() for p in ps[:k]]
    write_jsonl(train_p, work / "train_prompts.jsonl")
    write_jsonl(held_eval, work / "heldout_prompts.jsonl")
    (work / "data.json").write_text(
        json.dumps({"layers": layers, "max_new_tokens": max_new_tokens, "per_domain": per_domain})
    )
    distill(model, tok, held_eval, work / "heldout", layers, max_new_tokens=max_new_tokens)
    distill(model, tok, train_p, work / "train", layers, max_new_tokens=max_new_tokens, reverse=reverse)


def export(drafter: BlockDiffusionDrafter, out: Path, card: dict | None = None) -> str:
    """Write the drafter's weights (bfloat16) and config; ``card`` goes to ``training.json``.

    In the DFlash v1 layout (``config.json`` + ``model.safetensors``) when the drafter's
    architecture allows it (``layout="dflash"``), else in adaptspec's (``save_pretrained``).
    Returns the layout written.
    """
    from ..decoding import dflash_format

    if dflash_format.unsupported(drafter.config) is None:
        dflash_format.save(drafter, out, dtype=torch.bfloat16)
        layout = "dflash"
    else:
        drafter.save_pretrained(out, dtype=torch.bfloat16)
        layout = "adaptspec"
    if card is not None:
        (Path(out) / "training.json").write_text(json.dumps(card, indent=2))
    return layout
