"""Switchback A/B design for the batched server (``serve --batched --ab-design switchback``).

In the batched engine the variants share rounds: a round's pass is as wide as its widest
block, so one variant's long blocks slow every other row, and a per-request comparison
measures each variant *mixed with the others*. A switchback test randomises time instead:

- rounds are grouped into **slices** of ``slice_rounds`` consecutive rounds;
- each slice's variant comes from :func:`slice_variant`: the slices are taken in blocks of
  ``k`` (the number of variants) and each block holds every variant once, in an order drawn
  from ``seed`` and the block's index (balanced, and reproducible from the seed alone);
- every request that **joins** during a slice is that slice's variant: :meth:`Switchback.assign`
  (called by the request's chooser at join, on the engine's thread) overrides the router's
  choice, and that variant's controller decides its block size, as in a per-request test;
- with per-variant load rules (:class:`SliceRule`), the slice's variant's rule sets every
  row's block size in the slice's rounds, the carried-over rows included;
- after every round, :meth:`Switchback.after_round` adds the round to its slice; when the slice
  ends its record (variant, first and last round, rounds, tokens, decode seconds, row-rounds,
  the row-rounds of rows carried over from an earlier slice, the requests that joined, and
  the same figures round by round for a burn-in at analysis time) goes to the slice log
  (:class:`~adaptspec.traces.slice_log.SliceLogWriter`), fsync'd.

Rows that joined in one slice and are still decoding in the next are *carried over*: they
keep the block size their own variant's controller chose. Each record counts their
row-rounds (``carried_row_rounds``), so a report can say how much of a slice was the other
variant's, and ``ab-report --slice-burn-in K`` can drop each slice's first ``K`` rounds.

>>> "".join(slice_variant(("A", "B"), seed=1, index=i) for i in range(12))   # each pair holds A and B
'ABABBAABBAAB'
>>> sb = Switchback(("A", "B"), slice_rounds=2, seed=1)
>>> sb.assign("r1")                      # round 0 is in slice 0
'A'
>>> from adaptspec.batching.records import RoundRecord
>>> for _ in range(3):
...     sb.after_round(RoundRecord(requests=(7,), block_sizes=(4,), taus=(3,), draft_s=0, verify_s=0, round_s=0.1), 0.1)
>>> r = sb.records[0]; (r["variant"], r["rounds"], r["tokens"], r["first_round"], r["last_round"], r["requests"])
('A', 2, 6, 0, 1, ['r1'])
>>> sb.assign("r2"), sb.slice            # round 3 is in slice 1
('B', 1)
>>> sb.close(); r = sb.records[-1]; (r["slice"], r["complete"], r["rounds"], r["carried_row_rounds"])
(1, False, 1, 1)
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Mapping, Sequence

import numpy as np

from ...errors import AdaptspecError

__all__ = ["AB_DESIGNS", "DEFAULT_SLICE_ROUNDS", "SliceRule", "Switchback", "slice_variant"]

log = logging.getLogger("adaptspec.serving")

#: what ``--ab-design`` takes: ``requests`` (each request routed on its own, the default) or ``switchback``
AB_DESIGNS = ("requests", "switchback")
#: rounds per slice unless told (``--slice-rounds``)
DEFAULT_SLICE_ROUNDS = 32


def slice_variant(variants: Sequence[str], seed: int, index: int) -> str:
    """The variant of slice ``index``: slices come in blocks of ``len(variants)``, each block
    a random order of all the variants (drawn from ``seed`` and the block's number)."""
    k = len(variants)
    block, pos = divmod(int(index), k)
    order = np.random.default_rng([int(seed), block]).permutation(k)
    return variants[int(order[pos])]


class Switchback:
    """The slice schedule and the slice records of one engine (see the module docstring).

    ``writer``: a :class:`~adaptspec.traces.slice_log.SliceLogWriter` (None: records are kept in
    :attr:`records` only, the newest 1,000). Methods are called on the engine's thread, except
    :meth:`close` (any thread, after the engine's thread has stopped).
    """

    def __init__(
        self,
        variants: Sequence[str],
        slice_rounds: int = DEFAULT_SLICE_ROUNDS,
        seed: int = 0,
        writer: Any = None,
    ) -> None:
        variants = tuple(variants)
        if len(variants) < 2 or len(set(variants)) != len(variants):
            raise AdaptspecError(
                f"a switchback test needs at least 2 distinct variants, got {list(variants)}"
            )
        if isinstance(slice_rounds, bool) or not isinstance(slice_rounds, int) or slice_rounds < 1:
            raise AdaptspecError(f"slice_rounds must be an int >= 1, got {slice_rounds!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise AdaptspecError(f"the switchback seed must be an int, got {seed!r}")
        self.variants = variants
        self.slice_rounds = slice_rounds
        self.seed = seed
        self.writer = writer
        self.records: deque[dict[str, Any]] = deque(maxlen=1000)
        self.write_errors = 0
        self.round = 0  # rounds run so far: the next round's index
        self._lock = threading.Lock()
        self._joined_in: dict[int, int] = {}  # engine request id -> slice it joined in (rows now decoding)
        self._open: dict[str, Any] | None = None

    # ------------------------------------------------------------------ the engine's thread
    @property
    def slice(self) -> int:
        """The slice of the next round (the round a request joining now decodes in first)."""
        return self.round // self.slice_rounds

    @property
    def variant(self) -> str:
        """The variant of the current slice."""
        return slice_variant(self.variants, self.seed, self.slice)

    def assign(self, request_id: str | None = None) -> str:
        """The variant of a request joining now (its chooser calls this at join); the request
        is recorded with the slice."""
        with self._lock:
            rec = self._current()
            if request_id is not None:
                rec["requests"].append(str(request_id))
            return rec["variant"]

    def after_round(self, record: Any, decode_s: float) -> None:
        """Add round ``record`` (its decode time ``decode_s``, prefills excluded) to the current
        slice; write the slice when this was its last round."""
        with self._lock:
            rec = self._current()
            s = rec["slice"]
            carried = 0
            joined = {}
            for rid in record.requests:
                j = self._joined_in.get(rid, s)  # first seen now: it joined at the start of this round
                joined[rid] = j
                carried += j != s
            self._joined_in = joined  # rows that left are forgotten
            tokens = int(sum(record.taus))
            rec["round_tokens"].append(tokens)
            rec["round_decode_s"].append(float(decode_s))
            rec["round_rows"].append(len(record.requests))
            rec["round_carried"].append(carried)
            self.round += 1
            if self.round % self.slice_rounds == 0:
                self._finish(complete=True)

    # ------------------------------------------------------------------ any thread
    def close(self) -> None:
        """Write the slice in progress (``complete: false``) and close the writer."""
        with self._lock:
            if self._open is not None and self._open["round_tokens"]:
                self._finish(complete=False)
            self._open = None
        if self.writer is not None:
            self.writer.close()

    def stats(self) -> dict[str, Any]:
        return {
            "design": "switchback",
            "slice_rounds": self.slice_rounds,
            "slice": self.slice,
            "variant": self.variant,
            "slices_written": len(self.records),
            "write_errors": self.write_errors,
        }

    # ------------------------------------------------------------------ internals
    def _current(self) -> dict[str, Any]:
        s = self.slice
        if self._open is None or self._open["slice"] != s:
            self._open = {
                "slice": s,
                "variant": slice_variant(self.variants, self.seed, s),
                "first_round": self.round,
                "started": time.time(),
                "requests": [],
                "round_tokens": [],
                "round_decode_s": [],
                "round_rows": [],
                "round_carried": [],
            }
        return self._open

    def _finish(self, complete: bool) -> None:
        o = self._open
        self._open = None
        n = len(o["round_tokens"])
        rec = {
            "slice": o["slice"],
            "variant": o["variant"],
            "complete": complete,
            "first_round": o["first_round"],
            "last_round": o["first_round"] + n - 1,
            "rounds": n,
            "tokens": sum(o["round_tokens"]),
            "decode_s": sum(o["round_decode_s"]),
            "row_rounds": sum(o["round_rows"]),
            "carried_row_rounds": sum(o["round_carried"]),
            "requests": o["requests"],
            "started": o["started"],
            "ended": time.time(),
            "slice_rounds": self.slice_rounds,
            "seed": self.seed,
            "variants": list(self.variants),
            **{k: o[k] for k in ("round_tokens", "round_decode_s", "round_rows", "round_carried")},
        }
        self.records.append(rec)
        if self.writer is not None:
            try:
                self.writer.append(rec)
            except AdaptspecError as e:  # a full disk: serving goes on; the operator sees the count
                self.write_errors += 1
                log.error("switchback: slice %d was not recorded (%s)", rec["slice"], e)


class SliceRule:
    """Per-variant round rules under a switchback design: each round, the slice's variant's
    rule (a :class:`~adaptspec.load_rules.round_rule.RoundRule`, or None: every row keeps its own
    block size) chooses every row's block size and gets that round's feedback. Presents the
    interface of a single ``RoundRule`` to the engine loop."""

    def __init__(self, switchback: Switchback, rules: Mapping[str, Any]) -> None:
        unknown = sorted(set(rules) - set(switchback.variants))
        if unknown:
            raise AdaptspecError(
                f"a load rule for unknown variant {unknown[0]!r}: the variants are "
                f"{', '.join(switchback.variants)}"
            )
        self.switchback = switchback
        self.rules = {v: rules.get(v) for v in switchback.variants}
        self.name = "per variant: " + ", ".join(
            f"{v}={'none' if r is None else r.name}" for v, r in self.rules.items()
        )
        self._chose: Any = None

    @property
    def busy_s(self) -> float:
        return sum(r.busy_s for r in self.rules.values() if r is not None)

    @property
    def busy_wall_s(self) -> float:
        return sum(r.busy_wall_s for r in self.rules.values() if r is not None)

    def choose(self, rows: Sequence[Any]) -> list[int]:
        self._chose = self.rules[self.switchback.variant]
        if self._chose is None:
            return [row.handle.block_size for row in rows]
        return self._chose.choose(rows)

    def feedback(self, record: Any, shares: Sequence[float], handles: Sequence[Any]) -> None:
        if self._chose is not None:
            self._chose.feedback(record, shares, handles)
