"""vLLM's per-batch-size table (``num_speculative_tokens_per_batch_size``) tuned from trace sets.

vLLM takes ``[[range_start, range_end, num_speculative_tokens], ...]``: inclusive batch-size
ranges, sorted, not overlapping, the first starting at 1 (its parser,
``vllm.v1.spec_decode.dynamic.utils.validate_and_normalize_dynamic_sd_schedule``); every step
all its requests draft that many tokens. K = B - 1 in adaptspec's words (B = 1 + the drafts
verified; K = 0: no draft verified).

Each batch size's K is the block size with the most tokens a second for the whole batch, found
one of two ways:

- **measured** (:func:`measured_levels`): trace sets collected at several concurrencies
  (``adaptspec collect-vllm --concurrency C``; ``meta.json``'s ``concurrency``, 1 when absent);
  each gives its batch size's block size with the highest aggregate throughput, all the tokens
  the requests decoded after their first over all their decode time. The time of a batched step
  is attributed to its requests, so these sums are the engine's own tokens and seconds. A batch
  size between two measured ones takes the smaller one's choice;
- **modelled** (:func:`modelled_levels`): one trace set's acceptance (its mean tokens a round at
  each block size, no model of it) re-timed at every batch size by a latency profile's batched
  round (:func:`adaptspec.reward.attribution.batch_round_s`): ``rows x E[tau_B] / t(rows, B)``;
- **learned** (:func:`rule_levels`): what a learned load rule (:class:`adaptspec.load_rules.Learned`,
  the plug-in's ``load_rule: learned``) prefers at each batch size now, from Python (the rule
  lives in the process that runs it: the plug-in's is ``scheduler.adaptspec.rule``).

>>> table_ranges([(1, 4), (4, 2), (16, 1)], max_batch=64)
[[1, 3, 3], [4, 15, 1], [16, 64, 0]]
>>> table_ranges([(1, 3), (2, 3), (8, 1)], max_batch=32)     # equal neighbours merge
[[1, 7, 2], [8, 32, 0]]
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import AdaptspecError

__all__ = ["Level", "measured_levels", "modelled_levels", "rule_levels", "table_ranges", "speculative_entry"]

#: A level of a table: (its smallest batch size, its block size, every arm's tokens a second, the arms).
Level = tuple[int, int, list[float], list[int]]


def measured_levels(trace_sets: Sequence[Any]) -> list[Level]:
    """One level per trace set, at its ``concurrency``: the block size with the most tokens a
    second over all its requests (see the module docstring)."""
    levels = {}
    for ts in trace_sets:
        where = ts.path or "a trace set"
        c = ts.meta.get("concurrency", 1)
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise AdaptspecError(f"{where}: meta.json concurrency {c!r} is not an integer >= 1")
        if c in levels:
            raise AdaptspecError(
                f"{where}: a second trace set at concurrency {c} ({levels[c][0]} is the first): "
                "give one a concurrency"
            )
        secs = ts.decode_s_matrix()
        if secs is None:
            raise AdaptspecError(
                f"{where}: no decode times (collect it with adaptspec collect-vllm or collect), or "
                "give --latency to re-time its acceptance"
            )
        tokens = np.clip(
            ts.new_tokens_matrix() - 1, 0, None
        )  # after the first: the prefill's, in no decode time
        if np.isnan(tokens).any():
            raise AdaptspecError(f"{where}: new_tokens missing for some requests")
        rate = tokens.sum(axis=0) / secs.sum(axis=0)
        levels[c] = (where, _level(c, rate, ts.arms))
    return [lvl for _, (_, lvl) in sorted(levels.items())]


def modelled_levels(
    ts: Any, profile: Any, batch_sizes: Sequence[int], max_new_tokens: int | None = None
) -> list[Level]:
    """One level per batch size of ``batch_sizes``: ``ts``'s mean tokens a round at each block
    size, timed by ``profile``'s batched round at that many rows, each at the set's mean context
    (prompt plus half the new tokens)."""
    from ..reward.attribution import batch_round_s

    rounds, taus = ts.rounds_matrix(), ts.tau_matrix()
    if np.isnan(rounds).any():
        raise AdaptspecError(f"{ts.path or 'the trace set'}: rounds missing for some requests")
    per_round = (rounds * taus).sum(axis=0) / rounds.sum(
        axis=0
    )  # E[tau_B]: tokens over rounds, every request
    new = ts.new_tokens_matrix()
    context = float(
        np.nanmean(ts.prompt_tokens) + 0.5 * (np.nanmean(new) if max_new_tokens is None else max_new_tokens)
    )
    levels = []
    for rows in sorted(set(int(r) for r in batch_sizes)):
        rate = np.array(
            [
                rows * tau / batch_round_s(profile, [b] * rows, [context] * rows)
                for b, tau in zip(ts.arms, per_round)
            ]
        )
        levels.append(_level(rows, rate, ts.arms))
    return levels


def rule_levels(rule: Any, batch_sizes: Sequence[int]) -> list[tuple[int, int]]:
    """``(batch size, block size)`` for each of ``batch_sizes`` where ``rule`` prefers one (its
    ``preference(rows)``: a learned load rule's highest expected reward at that many rows in
    flight); a batch size where every block size ties (a cold rule before its first round) is
    left out. :func:`table_ranges` takes the result."""
    levels = []
    for rows in sorted(set(int(r) for r in batch_sizes)):
        if rows < 1:
            raise AdaptspecError(f"batch sizes must be >= 1, got {rows}")
        b = rule.preference(rows)
        if b is not None:
            levels.append((rows, int(b)))
    return levels


def _level(rows: int, rate: np.ndarray, arms: Sequence[int]) -> Level:
    best = int(np.argmax(rate))  # the smallest block size on a tie
    return rows, int(arms[best]), [float(x) for x in rate], [int(a) for a in arms]


def table_ranges(levels: Sequence[tuple], max_batch: int) -> list[list[int]]:
    """vLLM's ``[[start, end, K], ...]`` from levels ``(smallest batch size, block size, ...)``:
    each level holds up to the next one's start, the last up to ``max_batch``, the first from 1
    (the smallest level's choice below it); equal neighbours merge. Guaranteed: the ranges are
    sorted, contiguous, from 1 to ``max_batch``, no two neighbours with the same K, every K >= 0.
    Levels with a start < 1, a repeated start, a start beyond ``max_batch`` or a block size < 1
    are refused."""
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise AdaptspecError(f"the largest batch must be an integer >= 1, got {max_batch!r}")
    if not levels:
        raise AdaptspecError("a table needs at least one level")
    starts = sorted((int(lv[0]), int(lv[1])) for lv in levels)
    for (a, _), (b, _) in zip(starts, starts[1:]):
        if a == b:
            raise AdaptspecError(f"two levels start at batch size {a}: one block size a batch size")
    if starts[0][0] < 1 or min(b for _, b in starts) < 1:
        raise AdaptspecError(f"levels need batch sizes >= 1 and block sizes >= 1, got {starts}")
    if starts[-1][0] > max_batch:
        raise AdaptspecError(
            f"a level starts at batch size {starts[-1][0]}, beyond the largest batch {max_batch}"
        )
    ranges: list[list[int]] = []
    for i, (start, b) in enumerate(starts):
        lo = 1 if i == 0 else start
        hi = starts[i + 1][0] - 1 if i + 1 < len(starts) else max_batch
        if ranges and ranges[-1][2] == b - 1:
            ranges[-1][1] = hi
        else:
            ranges.append([lo, hi, b - 1])
    return ranges


def speculative_entry(ranges: list[list[int]]) -> dict[str, Any]:
    """The ``speculative_config`` keys that give vLLM ``ranges``: its ``num_speculative_tokens``
    (the largest K, at least 1: vLLM needs one) and the table."""
    return {
        "num_speculative_tokens": max(1, max(k for _, _, k in ranges)),
        "num_speculative_tokens_per_batch_size": ranges,
    }
