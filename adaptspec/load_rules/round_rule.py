"""A per-round load rule in the batched engine (``serve --batched --load-rule ...``).

Without a rule each row verifies its request's block size (its controller's decision at
join). With one (:mod:`adaptspec.load_rules`: ``fixed:B``, ``goodput``, ``learned``), every
round the engine asks the rule for every row's block size, given the load (rows in the pass,
requests waiting), and verifies ``min(rule's choice, the request's own)``; after the round
the rule gets every row's tokens and attributed time back, in one call. The rule sees a row through a
:class:`~adaptspec.load_rules.load.RowView`. :func:`make_load_rule` reads the forms of ``--load-rule``
(:data:`LOAD_RULES`), for the server and the vLLM plug-in alike.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from ..errors import AdaptspecError
from .base import LoadRule
from .load import Load, RowView

__all__ = ["RoundRule", "LOAD_RULES", "make_load_rule"]

#: what ``--load-rule`` takes (``none``: no rule; ``table:R=B,...``: a static rows -> block size table)
LOAD_RULES = ("fixed:B", "goodput", "learned", "table:R=B,...", "none")


class RoundRule:
    """Adapts a rule of :mod:`adaptspec.load_rules` to the engine: the engine's
    ``round_block_sizes`` hook (:meth:`choose`) and the feedback after a round (:meth:`feedback`)."""

    def __init__(self, rule: LoadRule, queue_length: Any) -> None:
        self.rule = rule
        self.name = getattr(rule, "name", type(rule).__name__)
        self._queue_length = queue_length  # () -> requests waiting
        self._views: dict[int, RowView] = {}
        self._asked: list[int] = []
        self._load: Load | None = None
        # the rule's own time (choose + feedback), in CPU seconds of the engine's thread: the decision
        # overhead; its wall time beside it adds the waits for the interpreter lock that the
        # server's HTTP threads hold meanwhile (at 16 clients: 0.28% against 0.58% of decode time).
        self.busy_s = 0.0
        self.busy_wall_s = 0.0
        self.row_rounds = 0

    def choose(self, rows: Sequence[Any]) -> list[int]:
        t0, w0 = time.thread_time(), time.perf_counter()
        views = []
        for row in rows:  # rows that left (finished, cancelled) are forgotten here
            h = row.handle
            v = self._views.get(h.id)
            if v is None:
                v = RowView(len(h.prompt))
                v.m = len(h.tokens)
            views.append(v)
        self._views = {row.handle.id: v for row, v in zip(rows, views)}
        self._load = Load(rows=len(rows), queue=int(self._queue_length()))
        self._asked = [int(b) for b in self.rule.choose(views, self._load)]
        if len(self._asked) != len(rows):
            raise AdaptspecError(
                f"load rule {self.name} gave {len(self._asked)} block sizes for {len(rows)} rows"
            )
        self.busy_s += time.thread_time() - t0
        self.busy_wall_s += time.perf_counter() - w0
        return self._asked

    def feedback(self, record: Any, shares: Sequence[float], handles: Sequence[Any]) -> None:
        """After the round ``record``: each row's tau and attributed seconds back to the rule
        (``handles``: the rows' request handles, in the record's order)."""
        from ..decoding.decoder import as_tree_budget

        t0, w0 = time.thread_time(), time.perf_counter()
        # a draft tree's row ran its tree, not the size asked for it (the engine sets chains only): left out
        chains = [i for i, h in enumerate(handles) if as_tree_budget(h.block_size) is None]
        views = [self._views[handles[i].id] for i in chains]
        self.rule.feedback(
            views,
            [self._asked[i] for i in chains],
            [record.taus[i] for i in chains],
            [shares[i] for i in chains],
            self._load,
        )
        for v, i in zip(views, chains):
            v.after_round(record.block_sizes[i], int(record.taus[i]), len(handles[i].tokens))
        self.row_rounds += len(record.taus)
        self.busy_s += time.thread_time() - t0
        self.busy_wall_s += time.perf_counter() - w0


def make_load_rule(
    spec: str, arms: Sequence[int], profile: Any, prior: float = 0.4, seed: int = 0, margin: float = 0.0
) -> LoadRule | None:
    """The rule ``spec`` names (``fixed:B``, ``goodput``, ``learned``; ``none``: None) over block sizes ``arms``;
    ``profile`` is the cost model of the goodput and learned rules, ``prior`` their prior
    per-draft acceptance (the learned rule starts warm from it), ``margin`` the learned rule's
    margin over plain decoding (:class:`~adaptspec.load_rules.Learned`).

    >>> make_load_rule("fixed:3", [1, 2, 4], None).name, make_load_rule("learned", [1, 2, 4], "cpu-smollm2-bf16").name
    ('fixed:3', 'learned (lints, warm, full info)')
    >>> make_load_rule("table:1=3,2=4,4=1", [1, 2, 4], None).levels      # up to 1 row: 3, 2 rows: 4, beyond: plain
    [(1, 3), (2, 4), (4, 1)]
    """
    from ..costs.latency import get_profile
    from . import Fixed, Goodput, Learned, Table

    if spec == "none":
        return None
    if spec.startswith("fixed:") and spec[len("fixed:") :].isdigit():
        b = int(spec[len("fixed:") :])
        if b < 1:
            raise AdaptspecError(f"--load-rule {spec!r}: the block size must be >= 1")
        return Fixed(b)
    if spec.startswith("table:"):
        return Table(_table(spec), name=spec)
    if spec in ("goodput", "learned"):
        prof = get_profile(profile)
        if spec == "goodput":
            return Goodput(arms, prof, prior=prior)
        return Learned(
            arms,
            prof,
            prior=prior,
            seed=seed,
            full_info=True,  # every shorter block a round shows
            margin=margin,
        )
    raise AdaptspecError(f"--load-rule {spec!r}: expected one of {', '.join(LOAD_RULES)}")


def _table(spec: str) -> dict[int, int]:
    """``table:R=B,...`` -> ``{R: B}`` (rows up to R verify B), checked."""
    table = {}
    for part in spec[len("table:") :].split(","):
        rows, eq, b = part.partition("=")
        if not (eq and rows.strip().isdigit() and b.strip().isdigit() and int(rows) >= 1 and int(b) >= 1):
            raise AdaptspecError(
                f"--load-rule {spec!r}: expected table:ROWS=BLOCK,... with integers >= 1, like table:1=3,4=1"
            )
        table[int(rows)] = int(b)
    return table
