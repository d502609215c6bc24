"""Distillation data for a drafter: the target's own greedy responses and its hidden states.

Prompts are processed in chunks; for each chunk the target answers every prompt greedily
(chat template, one user turn; batched with left padding), then one forward pass over
prompt + response records the hidden states at the drafter's context layers. Each chunk
is written as one shard, atomically, so generation stops and resumes at any chunk and a
trainer can start on the shards that exist while more are being written:

``shards/shard-XXXXX.npz``: ``ids`` (prompt indices), ``tokens`` (int32, the sequences
concatenated), ``lengths``, ``prompt_lens``, ``domains`` and ``hidden`` (float16,
``[sum(lengths), k * H]``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from .prompts import Prompt


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """Token ids of ``prompt`` as one user turn, ready for the assistant's answer."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def _eos_ids(model) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set() if eos is None else set(eos if isinstance(eos, (list, tuple)) else [eos])


@torch.no_grad()
def greedy_responses(
    model, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int, batch_size: int
) -> list[list[int]]:
    """Greedy answers (EOS included when reached), batched by similar prompt length."""
    eos = _eos_ids(model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos), 0)
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    out: list[list[int]] = [[] for _ in prompt_ids]
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = max(len(prompt_ids[i]) for i in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, i in enumerate(rows):
            ids[r, width - len(prompt_ids[i]) :] = torch.tensor(prompt_ids[i])
            mask[r, width - len(prompt_ids[i]) :] = 1
        gen = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
        )
        for r, i in enumerate(rows):
            for t in gen[r, width:].tolist():
                out[i].append(t)
                if t in eos:
                    break
    return out


@torch.no_grad()
def hidden_states(
    model, sequences: list[list[int]], layers: Sequence[int], batch_size: int = 8
) -> list[np.ndarray]:
    """float16 hidden states ``[len, k*H]`` at ``layers`` for each sequence (right-padded batches)."""
    out = []
    for b in range(0, len(sequences), batch_size):
        chunk = sequences[b : b + batch_size]
        width = max(map(len, chunk))
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, s in enumerate(chunk):
            ids[r, : len(s)] = torch.tensor(s)
            mask[r, : len(s)] = 1
        hs = model(
            input_ids=ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1
        ).hidden_states
        cat = torch.cat([hs[i] for i in layers], dim=-1)
        out.extend(cat[r, : len(s)].to(torch.float16).numpy() for r, s in enumerate(chunk))
    return out


def distill(
    model,
    tokenizer,
    prompts: Sequence[Prompt],
    work: Path,
    layers: Sequence[int],
    chunk: int = 64,
    batch_size: int = 16,
    max_new_tokens: int = 256,
    max_prompt_tokens: int = 384,
    reverse: bool = False,
) -> list[Path]:
    """Write one shard per chunk of ``prompts`` under ``work/shards`` (existing shards are kept).

    ``reverse`` walks the chunks from the last: a second process started that way shares the
    work with a first one (each skips the shards the other has written).
    """
    shard_dir = Path(work) / "shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    n_chunks = (len(prompts) + chunk - 1) // chunk
    order = range(n_chunks - 1, -1, -1) if reverse else range(n_chunks)
    for k in tqdm(order, desc=f"distill {Path(work).name}", unit="shard"):
        path = shard_dir / f"shard-{k:05d}.npz"
        paths.append(path)
        ids = list(range(k * chunk, min(len(prompts), (k + 1) * chunk)))
        if path.exists() and _shard_ids(path) == ids:
            continue
        p_ids = [chat_ids(tokenizer, prompts[i].prompt)[-max_prompt_tokens:] for i in ids]
        responses = greedy_responses(model, tokenizer, p_ids, max_new_tokens, batch_size)
        seqs = [p + r for p, r in zip(p_ids, responses)]
        hidden = hidden_states(model, seqs, layers)
        tmp = path.with_name(path.stem + ".tmp.npz")
        np.savez(
            tmp,
            ids=np.asarray(ids, dtype=np.int64),
            tokens=np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs]),
            lengths=np.asarray([len(s) for s in seqs], dtype=np.int64),
            prompt_lens=np.asarray([len(p) for p in p_ids], dtype=np.int64),
            domains=np.asarray([prompts[i].domain for i in ids]),
            hidden=np.concatenate(hidden),
        )
        os.replace(tmp, path)
    return paths


def _shard_ids(path: Path) -> list[int]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return z["ids"].tolist()
    except Exception:
        return []
