"""The cost surface of a batched round: draft and verify seconds over rows x tokens per row x context.

Two ways to measure it:

- :func:`measure_rounds` runs the engine itself (:class:`~adaptspec.batching.engine.BatchEngine`)
  on real prompts at every (rows, block size) and keeps each round's measured times: everything a
  round costs in serving (the passes, acceptance, the KV commit, the drafter catching up on the
  committed tokens' context), so this is what a load rule should be warm-started from;
- :func:`measure_surface` times the engine's own passes (the per-row drafter calls and one
:func:`~adaptspec.batching.target_pass.verify_rows` pass) on synthetic rows: one prompt of
``context`` tokens prefilled once and copied into every row's KV slot. Nothing is
committed, so every pass sees the same context.
The result is a list of round records (``block_size``, ``batch_size``, ``context_tokens``,
``draft_s``, ``verify_s``) that :func:`adaptspec.costs.latency.fit_profile` fits.
Each figure is the fastest of ``repeats`` passes (after one warm-up pass): on a shared
machine the slower ones include waits for a core.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from adaptspec.decoding import BlockDiffusionDrafter, TargetModel
>>> torch.manual_seed(0) and None
>>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
...                   num_attention_heads=4, num_key_value_heads=2)
>>> model = LlamaForCausalLM(cfg).eval()
>>> drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0)
>>> rows = measure_surface(TargetModel(model), drafter, rows=[1, 3], tokens=[1, 4], contexts=[8], repeats=1)
>>> [(r["batch_size"], r["block_size"], r["context_tokens"]) for r in rows]
[(1, 1, 8), (1, 4, 8), (3, 1, 8), (3, 4, 8)]
>>> rows[0]["draft_s"], rows[1]["draft_s"] > 0
(0.0, True)
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ..decoding.decoder import _now
from ..decoding.drafter import BlockDiffusionDrafter
from ..decoding.target import TargetModel
from .draft_pass import draft_logits_rows
from .target_pass import new_store, prefill_layers, verify_rows


@torch.inference_mode()
def measure_surface(
    target: TargetModel,
    drafter: BlockDiffusionDrafter | None,
    rows: Sequence[int] = (1, 2, 4, 8, 16),
    tokens: Sequence[int] = (1, 2, 4, 8, 16),
    contexts: Sequence[int] = (64, 256),
    repeats: int = 3,
    seed: int = 0,
    cpu_time: bool = False,
) -> list[dict]:
    """Draft and verify seconds of one round for every (context, rows, tokens per row).

    The drafter runs as the engine runs it: one pass for all rows in fast verification, one
    per row in exact verification. ``cpu_time`` (CPU only) counts the process's CPU seconds
    instead of wall seconds: with one intra-op thread that is the pass's own time, without
    the waits for a core that a shared machine adds."""
    clock = time.process_time if cpu_time else None
    batched = target.verification == "fast"
    if drafter is not None:
        drafter.attach(target.model)
        target.context_layers = list(drafter.config.target_layers)
    dev = target.device
    g = torch.Generator().manual_seed(seed)
    out = []
    for context in contexts:
        prompt = torch.randint(target.vocab_size, (context,), generator=g)
        tp = target.prefill(prompt)
        layers = prefill_layers(tp.cache)
        for m in rows:
            store = new_store(target, m, context + max(tokens), context + max(tokens))
            for i in range(m):
                store.load(i, layers)
            states = [drafter.new_state(tp.context_hidden) for _ in range(m)] if drafter is not None else []
            for b in tokens:
                blocks = torch.randint(target.vocab_size, (m, b), generator=g).to(dev)
                draft_s, verify_s = [], []
                last = blocks[:, 0].tolist()
                for _ in range(repeats + 1):  # the first pass warms up
                    t0 = clock() if clock else _now(dev)
                    if b > 1 and drafter is not None and batched:
                        for x in draft_logits_rows(drafter, states, last, [b] * m):
                            x.argmax(-1)
                    elif b > 1 and drafter is not None:
                        for s, t in zip(states, last):
                            drafter.draft_logits(s, t, b).argmax(-1)
                    t1 = clock() if clock else _now(dev)
                    with target.prepacked.on():
                        verify_rows(target, store, blocks, context=drafter is not None)
                    t2 = clock() if clock else _now(dev)
                    draft_s.append(t1 - t0)
                    verify_s.append(t2 - t1)
                out.append(
                    dict(
                        block_size=b,
                        batch_size=m,
                        context_tokens=context,
                        draft_s=min(draft_s[1:]),
                        verify_s=min(verify_s[1:]),
                    )
                )
    return out


@torch.inference_mode()
def measure_rounds(
    target: TargetModel,
    drafter: BlockDiffusionDrafter | None,
    prompts: Sequence[Sequence[int]],
    rows: Sequence[int] = (1, 2, 4, 8, 16),
    block_sizes: Sequence[int] = (1, 2, 3, 4, 6, 8),
    rounds: int = 8,
    warmup: int = 2,
) -> list[dict]:
    """Measured rounds of the engine at every (rows, block size): ``rows`` requests from
    ``prompts`` (in turn) decode together at one block size; after ``warmup`` rounds, ``rounds``
    rounds are kept. Each kept round is a record for
    :func:`~adaptspec.costs.latency.fit_profile`: ``draft_s`` the drafter phase, ``verify_s``
    the rest of the round less its prefills (the target pass, acceptance, commit), at the rows'
    mean context (at B = 1 all of it: there is no drafter pass). Requests are long enough not to
    finish during the measurement, and end-of-sequence tokens are ignored while it runs.

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from adaptspec.decoding import BlockDiffusionDrafter, TargetModel
    >>> torch.manual_seed(0) and None
    >>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                   num_attention_heads=4, num_key_value_heads=2, eos_token_id=None)
    >>> model = LlamaForCausalLM(cfg).eval()
    >>> drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0)
    >>> rs = measure_rounds(TargetModel(model), drafter, [[1, 2, 3], [4, 5]], rows=[1, 2], block_sizes=[1, 3], rounds=2)
    >>> [(r["batch_size"], r["block_size"]) for r in rs]
    [(1, 1), (1, 1), (1, 3), (1, 3), (2, 1), (2, 1), (2, 3), (2, 3)]
    >>> all(r["verify_s"] > 0 for r in rs), [r["draft_s"] > 0 for r in rs][::2]
    (True, [False, True, False, True])
    """

    if not prompts:
        raise ValueError("measure_rounds needs at least one prompt")
    out: list[dict] = []
    longest = max(len(p) for p in prompts)
    eos, target.eos_token_ids = (
        target.eos_token_ids,
        set(),
    )  # no row may end early: every round has all its rows
    try:
        _measure_rounds(target, drafter, prompts, rows, block_sizes, rounds, warmup, longest, out)
    finally:
        target.eos_token_ids = eos
    return out


def _measure_rounds(target, drafter, prompts, rows, block_sizes, rounds, warmup, longest, out) -> None:
    from .engine import BatchEngine

    for m in rows:
        for b in block_sizes:
            if b > 1 and drafter is None:
                continue
            need = (warmup + rounds + 1) * b
            engine = BatchEngine(target, drafter, max_rows=m, capacity=longest + need + 8)
            handles = [
                engine.submit(prompts[i % len(prompts)], block_size=b, max_new_tokens=need) for i in range(m)
            ]
            while engine.waiting or engine.joining:  # the prompts' pass: every row starts after it
                engine.step()
            for i in range(warmup + rounds):
                record = engine.step()
                if record is None or record.rows < m:
                    break
                if i >= warmup:
                    ctx = sum(len(h.prompt) + len(h.tokens) for h in handles) / m
                    draft = record.draft_s if b > 1 else 0.0  # a plain round has no drafter pass
                    out.append(
                        dict(
                            block_size=b,
                            batch_size=m,
                            context_tokens=ctx,
                            draft_s=draft,
                            verify_s=record.round_s - record.join_s - draft,
                        )
                    )
            for h in handles:
                h.cancel()
            engine.run_until_done()


def surface_table(rounds: list[dict], field: str = "verify_s") -> str:
    """Markdown table of ``field`` in ms: rows x tokens per row, one block per context.

    >>> print(surface_table([dict(block_size=1, batch_size=1, context_tokens=8, draft_s=0.0, verify_s=0.01)]))
    context 8: verify_s, ms
    | rows \\ tokens per row | 1 |
    |---|---:|
    | 1 | 10.0 |
    """
    lines = []
    for c in sorted({r["context_tokens"] for r in rounds}):
        rs = [r for r in rounds if r["context_tokens"] == c]
        bs = sorted({r["block_size"] for r in rs})
        ms = sorted({r["batch_size"] for r in rs})
        val = {(r["batch_size"], r["block_size"]): r[field] for r in rs}
        lines += [
            f"context {c}: {field}, ms",
            "| rows \\ tokens per row | " + " | ".join(map(str, bs)) + " |",
            "|---|" + "---:|" * len(bs),
        ]
        for m in ms:
            lines.append(
                f"| {m} | " + " | ".join(f"{1e3 * val[m, b]:.1f}" if (m, b) in val else "" for b in bs) + " |"
            )
    return "\n".join(lines)


def round_table(rounds: list[dict]) -> str:
    """Markdown table of the median round (draft + verify) in ms: rows x block size, all contexts.

    >>> print(round_table([dict(block_size=2, batch_size=1, context_tokens=9, draft_s=0.004, verify_s=0.04)] * 3))
    median round, ms
    | rows \\ block size | 2 |
    |---|---:|
    | 1 | 44.0 |
    """
    import numpy as np

    bs = sorted({r["block_size"] for r in rounds})
    ms = sorted({r["batch_size"] for r in rounds})
    cell: dict[tuple[int, int], list[float]] = {}
    for r in rounds:
        cell.setdefault((r["batch_size"], r["block_size"]), []).append(r["draft_s"] + r["verify_s"])
    lines = [
        "median round, ms",
        "| rows \\ block size | " + " | ".join(map(str, bs)) + " |",
        "|---|" + "---:|" * len(bs),
    ]
    for m in ms:
        lines.append(
            f"| {m} | "
            + " | ".join(f"{1e3 * float(np.median(cell[m, b])):.1f}" if (m, b) in cell else "" for b in bs)
            + " |"
        )
    return "\n".join(lines)


def fit_errors(profile, rounds: list[dict], totals: bool = False) -> dict[str, float]:
    """Median and largest relative error of ``profile``'s draft and verify predictions on
    measured ``rounds`` (how well the latency model's batch axis fits the surface); ``totals``:
    of its whole-round predictions (``round_median``, ``round_max``).

    >>> from adaptspec.costs.latency import fit_profile
    >>> rs = [dict(block_size=b, batch_size=m, context_tokens=c, draft_s=0.001 * b * m, verify_s=0.02 + 0.001 * b * m)
    ...       for b in (1, 2, 4) for m in (1, 2) for c in (8, 16)]
    >>> {k: round(v, 3) for k, v in fit_errors(fit_profile(rs), rs).items()}
    {'verify_median': 0.0, 'verify_max': 0.0, 'draft_median': 0.0, 'draft_max': 0.0}
    """
    import numpy as np

    out = {}
    if totals:
        err = [
            abs(
                float(profile.round_s(r["block_size"], r["context_tokens"], r["batch_size"]))
                / (r["draft_s"] + r["verify_s"])
                - 1
            )
            for r in rounds
        ]
        return {"round_median": float(np.median(err)), "round_max": float(np.max(err))}
    for name in ("verify", "draft"):
        rs = [r for r in rounds if name == "verify" or r["block_size"] > 1]
        if not rs:
            continue
        fn = getattr(profile, f"{name}_s")
        err = [
            abs(float(fn(r["block_size"], r["context_tokens"], r["batch_size"])) / r[f"{name}_s"] - 1)
            for r in rs
        ]
        out[f"{name}_median"], out[f"{name}_max"] = float(np.median(err)), float(np.max(err))
    return out
