"""Dense collection: one prompt's dense trace from a real decoder, and a resumable collection.

What a dense trace is, and how it is stored and replayed: :mod:`adaptspec.traces.dense`.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from tqdm import tqdm

from ..decoding.acceptance import draft_acceptance
from ..errors import AdaptspecError
from ..traces.dense import _NOT_GREEDY_KEYS, DenseRequest, DenseTraceSet


@torch.inference_mode()
def dense_request(
    decoder,
    prompt_ids,
    max_new_tokens: int,
    max_block_size: int,
    chunk: int = 128,
    greedy: DenseRequest | None = None,
) -> DenseRequest:
    """The dense trace of one prompt on a :class:`~adaptspec.decoding.SpeculativeDecoder`.

    ``greedy``: this prompt's trace from an earlier dense set of the same target and settings;
    its greedy output is reused instead of decoded again (the output does not depend on the
    drafter), so only the teacher-forced pass and the drafter passes run.
    """
    pre = decoder.prefill(prompt_ids)
    if greedy is None:
        out = decoder.decode(pre, 1, max_new_tokens)  # the greedy output
        tokens, finish_reason = out.tokens, out.finish_reason
    elif greedy.prompt_tokens != pre.prompt_tokens:
        raise AdaptspecError(
            f"the reused greedy output was made for a prompt of {greedy.prompt_tokens} tokens, "
            f"this one has {pre.prompt_tokens}: not the same prompt"
        )
    else:
        tokens, finish_reason = greedy.tokens.tolist(), greedy.finish_reason
    context = decoder.teacher_forced_context(pre, tokens[:-1])  # positions < T + L - 1
    seq = torch.cat([torch.as_tensor(list(prompt_ids)), torch.tensor(tokens)])
    accept, top1, entropy = draft_acceptance(
        decoder.drafter,
        context,
        seq,
        pre.prompt_tokens,
        range(2, max_block_size + 1),
        chunk,
        confidences=True,
    )
    return DenseRequest(
        np.asarray(tokens, dtype=np.int64),
        accept,
        top1,
        entropy,
        np.asarray(pre.features, dtype=np.float32),
        pre.prompt_tokens,
        finish_reason,
    )


def collect_dense(
    decoder,
    prompts,
    out,
    max_new_tokens: int = 128,
    max_block_size: int = 16,
    rows_per_part: int = 8,
    meta: dict | None = None,
    progress: bool = True,
    greedy_from: str | os.PathLike | None = None,
) -> DenseTraceSet:
    """Dense traces of ``prompts`` (``(request_id, domain, token_ids)`` triples) into ``out``,
    skipping requests already there (resumable).

    ``greedy_from``: a dense set of the same target and settings (any drafter) whose greedy
    outputs are reused for the requests it holds, so a new drafter's dense traces cost a
    teacher-forced pass and drafter passes per request instead of a decode; requests it lacks
    are decoded.
    """
    if not 2 <= max_block_size <= decoder.max_block_size:
        raise AdaptspecError(f"max block size {max_block_size} outside 2..{decoder.max_block_size}")
    meta = {
        "max_new_tokens": max_new_tokens,
        "max_block_size": max_block_size,
        "verification": decoder.verification,
        **(meta or {}),
    }
    lent: dict[str, DenseRequest] = {}
    if greedy_from is not None:
        src = DenseTraceSet.open(greedy_from)
        mine = {k: v for k, v in meta.items() if k not in _NOT_GREEDY_KEYS}
        theirs = {k: v for k, v in src.meta.items() if k not in _NOT_GREEDY_KEYS}
        if mine != theirs:
            diff = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
            raise AdaptspecError(
                f"{greedy_from}: its greedy outputs were made with other settings ({', '.join(diff)})"
            )
        lent = {rid: r for rid, _, r in src.requests()}
        meta["greedy_from"] = str(greedy_from)
    ds = DenseTraceSet.create(out, meta)
    done = ds.request_ids()
    todo = [p for p in prompts if p[0] not in done]
    rows: list = []
    for rid, domain, ids in tqdm(todo, desc="collect --dense", unit="prompt", disable=not progress):
        rows.append(
            (rid, domain, dense_request(decoder, ids, max_new_tokens, max_block_size, greedy=lent.get(rid)))
        )
        if len(rows) == rows_per_part:
            ds.write_part(rows)
            rows = []
    if rows:
        ds.write_part(rows)
    return ds
