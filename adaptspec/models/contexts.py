"""The drafter's context for stored token ids: the target's hidden states, recomputed once.

A distillation corpus (:mod:`adaptspec.models.corpus`) keeps only token ids. The drafter
trains on the target's hidden states at its context layers along each sequence; one
teacher-forced pass over prompt + answer gives them all at once (several times faster than
generating them, so recomputing costs a fraction of what generating did, and nothing in the
repository). The states go to a work directory outside the repository, one file per
corpus shard, in the layout :class:`~adaptspec.models.train_drafter.ShardData` reads:
``shards/shard-XXXXX.npz`` (tokens, lengths, prompt lengths, domains) and
``shards/shard-XXXXX.hidden.npy`` (float16 ``[sum(lengths), k * H]``, memory-mapped at
training time, so the corpus need not fit in memory), and, when asked, the target's top-k
next tokens at every position beside them (``.topk_ids.npy`` int32 and ``.topk_probs.npy``
float16, ``[sum(lengths), k]``: soft targets). A run computes only the shards that
are missing, so it resumes, and picks up shards a running distillation added meanwhile.

Sequences are batched by length and right-padded: under causal attention a position never
sees the padding after it, so no attention mask is needed.

:func:`benchmark_sequences` gives the evaluation side: the public benchmark prompts with the
target's greedy answers, taken from a dense trace set (never trained on).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..errors import AdaptspecError


@torch.inference_mode()
def teacher_forced_hidden(
    model, sequences: Sequence[np.ndarray], layers: Sequence[int], max_batch_tokens: int = 4096
) -> list[np.ndarray]:
    """``hidden_states[l]`` for ``l`` in ``layers`` along each sequence, concatenated: float16 ``[n, k*H]``.

    ``model`` is a Hugging Face causal LM; index 0 of ``hidden_states`` is the embeddings.
    """
    return [h for h, _ in teacher_forced(model, sequences, layers, max_batch_tokens)]


@torch.inference_mode()
def teacher_forced(
    model,
    sequences: Sequence[np.ndarray],
    layers: Sequence[int],
    max_batch_tokens: int = 4096,
    top_k: int = 0,
) -> list[tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]]:
    """Per sequence, its hidden states (as :func:`teacher_forced_hidden`) and, with ``top_k``,
    the target's ``top_k`` most likely next tokens at every position: ``(ids int32 [n, top_k],
    probs float16 [n, top_k])``, row ``p`` the distribution of the token after position ``p``
    (softmax of the LM head at temperature 1, largest first); ``None`` without ``top_k``.
    """
    out: list = [None] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    start = 0
    while start < len(order):
        stop = start + 1  # sorted by length: the batch is as wide as its last sequence
        while stop < len(order) and len(sequences[order[stop]]) * (stop - start + 1) <= max_batch_tokens:
            stop += 1
        rows = order[start:stop]
        width = len(sequences[rows[-1]])
        ids = torch.zeros(
            len(rows), width, dtype=torch.long
        )  # right padding: never seen by earlier positions
        for r, i in enumerate(rows):
            ids[r, : len(sequences[i])] = torch.as_tensor(np.asarray(sequences[i], dtype=np.int64))
        res = model.model(input_ids=ids.to(model.device), output_hidden_states=True)
        cat = torch.cat([res.hidden_states[layer] for layer in layers], dim=-1).to(torch.float16).cpu()
        for r, i in enumerate(rows):
            n = len(sequences[i])
            top = None if not top_k else _top_k(model, res.last_hidden_state[r, :n], top_k)
            out[i] = (cat[r, :n].numpy(), top)
        start = stop
    return out


def _top_k(model, last_hidden: torch.Tensor, k: int, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """The LM head's top ``k`` next tokens and their probabilities along one sequence, in
    chunks of positions (a full row of logits is the whole vocabulary)."""
    ids, probs = [], []
    for s in range(0, len(last_hidden), chunk):
        logits = model.lm_head(last_hidden[s : s + chunk]).float()
        p, i = torch.softmax(logits, dim=-1).topk(k, dim=-1)
        ids.append(i.to(torch.int32).cpu())
        probs.append(p.to(torch.float16).cpu())
    return torch.cat(ids).numpy(), torch.cat(probs).numpy()


def write_shard(
    path: Path,
    tokens: list[np.ndarray],
    prompt_lens: list[int],
    domains: list[str],
    hidden: list[np.ndarray],
    top: list[tuple[np.ndarray, np.ndarray]] | None = None,
) -> None:
    """One context shard: ``path`` (``.npz``, written last, so its presence means complete), its
    ``.hidden.npy`` and, with ``top`` (:func:`teacher_forced`'s), the target's top-k next tokens
    at every position beside them: ``.topk_ids.npy`` (int32 ``[sum(lengths), k]``) and
    ``.topk_probs.npy`` (float16)."""
    flat = np.concatenate(tokens) if tokens else np.zeros(0, np.int64)
    arrays = {"hidden": np.concatenate(hidden) if hidden else np.zeros((0, 0), np.float16)}
    if top is not None:
        arrays["topk_ids"] = np.concatenate([i for i, _ in top])
        arrays["topk_probs"] = np.concatenate([p for _, p in top])
    for name, arr in arrays.items():
        apath = path.with_suffix(f".{name}.npy")
        tmp = apath.with_name(apath.stem + ".tmp.npy")
        np.save(tmp, arr)
        os.replace(tmp, apath)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(
        tmp,
        tokens=flat.astype(np.int32),
        lengths=np.asarray([len(t) for t in tokens], dtype=np.int32),
        prompt_lens=np.asarray(prompt_lens, dtype=np.int32),
        domains=np.asarray(domains),
    )
    os.replace(tmp, path)


def build_corpus_contexts(
    corpus,
    model,
    out: str | os.PathLike,
    layers: Sequence[int],
    max_seq_len: int | None = None,
    max_batch_tokens: int = 4096,
    progress: bool = True,
    max_response_tokens: int | None = None,
    top_k: int = 0,
) -> int:
    """Context shards under ``out/shards`` for every corpus shard that has none yet; returns how many were written.

    ``max_seq_len`` cuts each sequence (prompt kept whole where it fits) to bound the pass.
    ``max_response_tokens`` stops at the first shards that hold that many response tokens
    (counted as :class:`~adaptspec.models.train_drafter.ShardData` counts them, so a
    ``--train-tokens`` budget finds all it needs); ``top_k`` also stores the target's top-k
    next tokens at every position (:func:`write_shard`).
    """
    from .corpus import read_shard

    shards = Path(out) / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    paths, total, read = [], 0, {}  # read: the shards counted for the budget, not read again below
    for path in corpus.shard_paths():
        if max_response_tokens is not None and total >= max_response_tokens:
            break
        paths.append(path)
        if max_response_tokens is not None:
            read[path] = _cut(read_shard(path), max_seq_len)
            total += sum(len(s) - pl for s, pl in zip(*read[path][:2]) if len(s) - pl >= 3)
    todo = [p for p in paths if not (shards / p.name).exists()]
    for path in tqdm(todo, desc="contexts", unit="shard", disable=not progress):
        seqs, pls, doms = read.pop(path, None) or _cut(read_shard(path), max_seq_len)
        keep = [i for i, (s, pl) in enumerate(zip(seqs, pls)) if len(s) - pl >= 2]
        seqs = [seqs[i] for i in keep]
        got = teacher_forced(model, seqs, layers, max_batch_tokens, top_k)
        write_shard(
            shards / path.name,
            seqs,
            [pls[i] for i in keep],
            [doms[i] for i in keep],
            [h for h, _ in got],
            [t for _, t in got] if top_k else None,
        )
    return len(todo)


def _cut(z, max_seq_len: int | None) -> tuple[list[np.ndarray], list[int], list[str]]:
    """A corpus shard's sequences cut to ``max_seq_len``, their prompt lengths and domains."""
    lens, toks = z["lengths"], z["tokens"].astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    seqs = [toks[s : s + n][:max_seq_len] for s, n in zip(starts, lens)]
    return seqs, [int(p) for p in z["prompt_lens"]], [str(d) for d in z["domains"]]


def benchmark_sequences(
    dense_dir: str | os.PathLike, encode, per_benchmark: int | None = None
) -> list[tuple[np.ndarray, int, str]]:
    """``(prompt + greedy answer, prompt length, benchmark)`` for the requests of a dense trace set
    collected on the public benchmark prompts (``adaptspec collect --dense --prompts benchmarks``).

    ``encode(text)`` gives a prompt's token ids in the chat template (as the collector did);
    ``per_benchmark`` keeps the first N requests of each benchmark. MT-Bench's categories are
    folded into one ``mt-bench`` domain.
    """
    from ..traces.dense import DenseTraceSet
    from .prompts import benchmark_prompts

    prompts = {f"{p.domain}-{i:04d}": p for i, p in enumerate(benchmark_prompts())}
    out: list[tuple[np.ndarray, int, str]] = []
    count: dict[str, int] = {}
    for rid, domain, req in DenseTraceSet.open(dense_dir).requests():
        if rid not in prompts:
            raise AdaptspecError(f"{dense_dir}: request {rid!r} is not one of the benchmark prompts")
        bench = domain.split("/")[0]
        if per_benchmark is not None and count.get(bench, 0) >= per_benchmark:
            continue
        count[bench] = count.get(bench, 0) + 1
        ids = np.asarray(encode(prompts[rid].prompt), dtype=np.int64)
        out.append((np.concatenate([ids, req.tokens]), len(ids), bench))
    return out


def build_benchmark_contexts(
    sequences: Iterable[tuple[np.ndarray, int, str]],
    model,
    out: str | os.PathLike,
    layers: Sequence[int],
    max_batch_tokens: int = 4096,
) -> None:
    """The evaluation side's context shard (``out/shards/shard-00000.npz``), unless it exists."""
    path = Path(out) / "shards" / "shard-00000.npz"
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    seqs = list(sequences)
    hidden = teacher_forced_hidden(model, [s for s, _, _ in seqs], layers, max_batch_tokens)
    write_shard(path, [s for s, _, _ in seqs], [pl for _, pl, _ in seqs], [d for _, _, d in seqs], hidden)
