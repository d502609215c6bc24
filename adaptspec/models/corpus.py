"""A distillation corpus that grows across runs: prompts and the target's greedy answers, as token ids.

A drafter learns to predict the target's own greedy continuation. The corpus stores only
token ids (2 bytes a token); the target's hidden states, which the drafter reads, are
recomputed by one teacher-forced pass at training time instead of being stored (5.8 kB a
token for SmolLM2's five context layers: 17 GB for 3 M tokens).

Layout of a corpus directory: ``corpus.json`` (what made it) and ``shard-XXXXX.npz``, each
written atomically, with ``prompts`` and ``domains`` (text), ``tokens`` (uint16 or int32,
prompt and answer of every sequence concatenated), ``lengths``, ``prompt_lens`` and
``finished`` (the answer ended with EOS). Shard ``k`` draws its prompts from the target
itself (:mod:`adaptspec.models.self_instruct`) except every fourth, which takes the next
template prompts (:func:`adaptspec.models.prompts.build_prompt_pool`, training split).
A run adds the missing shards in order and stops at a token budget; several workers share
the work by shard index (``k % workers == worker``); instructions already in the corpus,
and any that share a 13-gram with a public benchmark prompt, are skipped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from .._util.checks import integer, read_json_object, read_npz
from ..errors import AdaptspecError
from .prompts import Prompt

FORMAT = "adaptspec-distill-corpus/1"
PROMPTS_PER_SHARD = 32
TEMPLATE_EVERY = 4  # shard k with k % 4 == 3 takes template prompts


@dataclass(frozen=True)
class DistilledSequence:
    tokens: np.ndarray  # prompt + answer
    prompt_len: int
    domain: str
    finished: bool


class Corpus:
    """The shards under ``path`` (read-only view; :func:`extend` adds to it)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        meta = self.path / "corpus.json"
        if not meta.exists():
            raise AdaptspecError(f"{self.path}: not a distillation corpus (no corpus.json)")
        self.meta = read_json_object(meta, "distillation corpus description")
        if self.meta.get("format") != FORMAT:
            raise AdaptspecError(f"{meta}: format {self.meta.get('format')!r}, expected {FORMAT!r}")
        for key in ("max_new_tokens", "max_prompt_tokens"):
            integer(self.meta.get(key), str(meta), key, 1)

    def shard_paths(self) -> list[Path]:
        return sorted(self.path.glob("shard-*.npz"))

    def sequences(self) -> Iterator[DistilledSequence]:
        for path in self.shard_paths():
            z = read_shard(path)
            lens, toks = z["lengths"], z["tokens"]
            starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
            for s, n, pl, d, f in zip(starts, lens, z["prompt_lens"], z["domains"], z["finished"]):
                yield DistilledSequence(toks[s : s + n].astype(np.int64), int(pl), str(d), bool(f))

    def prompts(self, skip: set[Path] = frozenset()) -> list[str]:
        """The prompts of every shard (but those in ``skip``), in shard order."""
        out: list[str] = []
        for path in self.shard_paths():
            if path not in skip:
                out.extend(str(p) for p in read_shard(path)["prompts"])
        return out

    def stats(self) -> dict:
        n_seq = resp = 0
        by: dict[str, int] = {}
        for s in self.sequences():
            n_seq += 1
            r = len(s.tokens) - s.prompt_len
            resp += r
            by[s.domain] = by.get(s.domain, 0) + r
        return {
            "shards": len(self.shard_paths()),
            "sequences": n_seq,
            "response_tokens": resp,
            "by_domain": by,
        }


_SHARD_KINDS = {
    "prompts": "U",
    "domains": "U",
    "tokens": "iu",
    "lengths": "iu",
    "prompt_lens": "iu",
    "finished": "b",
}


def read_shard(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A corpus shard's arrays, checked: a truncated file, a missing or mistyped array, or lengths
    that do not add up is one line naming the file, the array and the sequence (row)."""
    z = read_npz(path, "distillation corpus shard", tuple(_SHARD_KINDS))
    for key, kinds in _SHARD_KINDS.items():
        if z[key].ndim != 1 or (z[key].size and z[key].dtype.kind not in kinds):  # an empty shard's are float
            raise AdaptspecError(
                f"{path}: array {key!r} has dtype {z[key].dtype} and shape {z[key].shape}, "
                f"expected a 1-D {'text' if kinds == 'U' else 'boolean' if kinds == 'b' else 'integer'} array"
            )
    n = len(z["lengths"])
    for key in ("prompts", "prompt_lens", "domains", "finished"):
        if len(z[key]) != n:
            raise AdaptspecError(f"{path}: array {key!r} has {len(z[key])} entries, 'lengths' has {n}")
    lens, pls = z["lengths"].astype(np.int64), z["prompt_lens"].astype(np.int64)
    bad = np.flatnonzero((lens < 1) | (pls < 0) | (pls > lens))
    if bad.size:
        r = int(bad[0])
        raise AdaptspecError(
            f"{path}: row {r}: length {lens[r]} and prompt_lens {pls[r]} "
            f"(need 0 <= prompt_lens <= length, length >= 1)"
        )
    if int(lens.sum()) != len(z["tokens"]):
        raise AdaptspecError(
            f"{path}: array 'tokens' holds {len(z['tokens'])} tokens, 'lengths' add up to {int(lens.sum())}"
        )
    if len(z["tokens"]) and int(z["tokens"].min()) < 0:
        raise AdaptspecError(f"{path}: array 'tokens' holds a negative token id {int(z['tokens'].min())}")
    return z


def create(path: str | os.PathLike, target: str, max_new_tokens: int, max_prompt_tokens: int) -> Corpus:
    """An empty corpus at ``path`` (or the existing one, if it was made for the same settings)."""
    path = Path(path)
    meta = {
        "format": FORMAT,
        "target": target,
        "max_new_tokens": max_new_tokens,
        "max_prompt_tokens": max_prompt_tokens,
        "prompts_per_shard": PROMPTS_PER_SHARD,
    }
    if (path / "corpus.json").exists():
        old = json.loads((path / "corpus.json").read_text())
        if old != meta:
            raise AdaptspecError(f"{path}: a corpus made with other settings ({old}); use another directory")
        return Corpus(path)
    if path.exists() and any(path.iterdir()):
        raise AdaptspecError(f"{path}: exists and is not a distillation corpus; refusing to write into it")
    path.mkdir(parents=True, exist_ok=True)
    (path / "corpus.json").write_text(json.dumps(meta, indent=2) + "\n")
    return Corpus(path)


def extend(
    corpus: Corpus,
    model,
    tokenizer,
    until_tokens: int,
    worker: int = 0,
    workers: int = 1,
    batch_size: int = 32,
    seed: int = 0,
    instruction_tokens: int = 128,
) -> int:
    """Add shards until the corpus holds ``until_tokens`` response tokens; returns shards written."""
    from .distill import chat_ids
    from .distill_generator import generate
    from .prompts import build_prompt_pool, split_pool
    from .self_instruct import Decontaminator, clean_instruction, normalise, sample_instructions

    meta = corpus.meta
    eos = {tokenizer.eos_token_id} | ({model.generation_config.eos_token_id} - {None})
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos))
    dirty = Decontaminator()
    templates: list[Prompt] | None = None
    total = corpus.stats()["response_tokens"]
    seen: set[str] = set()  # normalised prompts already in the corpus, other workers' shards included
    read: set[Path] = set()
    written = 0
    bar = tqdm(
        total=until_tokens, initial=min(total, until_tokens), unit="tok", desc=f"distill {corpus.path.name}"
    )
    k = worker
    while total < until_tokens:
        path = corpus.path / f"shard-{k:05d}.npz"
        if path.exists():
            k += workers
            continue
        fresh = set(corpus.shard_paths()) - read
        seen.update(normalise(p) for p in corpus.prompts(skip=read))
        read |= fresh
        if k % TEMPLATE_EVERY == TEMPLATE_EVERY - 1:
            if templates is None:
                templates = [
                    p for p in split_pool(build_prompt_pool(2000, seed=seed))[0] if p.prompt not in dirty
                ]
            j = (k // TEMPLATE_EVERY) * PROMPTS_PER_SHARD
            chosen = [p for p in templates[j : j + PROMPTS_PER_SHARD] if normalise(p.prompt) not in seen]
        else:
            chosen = []
            for text in sample_instructions(
                model,
                tokenizer,
                PROMPTS_PER_SHARD * 3 // 2,
                seed=seed * 100_003 + k,
                max_new_tokens=instruction_tokens,
                batch_size=batch_size,
            ):
                text = clean_instruction(text)
                if text is None or normalise(text) in seen or text in dirty:
                    continue
                seen.add(normalise(text))
                chosen.append(Prompt(text, "self-instruct"))
                if len(chosen) == PROMPTS_PER_SHARD:
                    break
        ids = [chat_ids(tokenizer, p.prompt)[-meta["max_prompt_tokens"] :] for p in chosen]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # less padding per batch
        answers: list[list[int]] = [[] for _ in ids]
        for b in range(0, len(order), batch_size):
            rows = order[b : b + batch_size]
            for i, a in zip(
                rows, generate(model, [ids[i] for i in rows], meta["max_new_tokens"], eos, pad_id=pad)
            ):
                answers[i] = a
        _write_shard(path, chosen, ids, answers, eos)
        got = sum(map(len, answers))
        total += got
        written += 1
        bar.update(min(got, max(0, until_tokens - bar.n)))
        k += workers
    bar.close()
    return written


def _write_shard(
    path: Path, prompts: list[Prompt], ids: list[list[int]], answers: list[list[int]], eos: set[int]
) -> None:
    seqs = [p + a for p, a in zip(ids, answers)]
    flat = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs]) if seqs else np.zeros(0, np.int64)
    dtype = np.uint16 if flat.size == 0 or flat.max() < 2**16 else np.int32
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez_compressed(
        tmp,
        prompts=np.asarray([p.prompt for p in prompts]),
        domains=np.asarray([p.domain for p in prompts]),
        tokens=flat.astype(dtype),
        lengths=np.asarray([len(s) for s in seqs], dtype=np.int32),
        prompt_lens=np.asarray([len(p) for p in ids], dtype=np.int32),
        finished=np.asarray([bool(a) and a[-1] in eos for a in answers]),
    )
    os.replace(tmp, path)
