"""The speculator protocol and the records that flow between the parts.

A speculator is anything that can prefill a prompt and then decode with a given block
size. Wrapping another engine means implementing :class:`BlockSpeculator`: two methods
and one attribute.

>>> r = [Round(block_size=8, tau=3, draft_s=0.01, verify_s=0.05),
...      Round(block_size=8, tau=5, draft_s=0.01, verify_s=0.05)]
>>> out = Outcome(tokens=[5] * 9, rounds=r, decode_s=0.12)
>>> out.new_tokens, out.mean_tau
(9, 4.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from .errors import AdaptspecError


@dataclass(frozen=True)
class TreeOutcomes:
    """What one verified draft tree tells about the same round's smaller trees and chains
    (computed by :func:`adaptspec.decoding.tree_outcomes.round_outcomes`): ``tree_tau[n]``, the
    tokens the best tree of ``n`` nodes would have committed (``n = 0 .. N``); ``chain_tau[B - 1]``
    and ``chain_floor[B - 1]``, a chain of ``B`` positions verifying a prefix of the same drafter
    pass (``B = 1 .. depth + 1``): its tokens (None where the tree does not determine them) and a
    lower bound that holds either way (the tokens themselves where determined).

    >>> out = TreeOutcomes(tree_tau=(1, 2, 2), chain_tau=(1, 2, None), chain_floor=(1, 2, 2))
    >>> out.tree(1), out.tree(99), out.chain(3), out.chain_at_least(3), out.chain(5)
    (2, 2, None, 2, None)
    """

    tree_tau: tuple[int, ...]
    chain_tau: tuple[int | None, ...]
    chain_floor: tuple[int, ...]

    def tree(self, nodes: int) -> int:
        """Tokens the best tree of ``nodes`` nodes commits (larger than the tree: the whole tree's)."""
        return self.tree_tau[min(nodes, len(self.tree_tau) - 1)]

    def chain(self, block_size: int) -> int | None:
        """Tokens a chain of ``block_size`` commits; None where the tree does not tell. Past the
        drafted depth: the longest chain's, where it stopped at a rejection (a longer one stops there too)."""
        if block_size <= len(self.chain_tau):
            return self.chain_tau[block_size - 1]
        last = self.chain_tau[-1]
        return last if last is not None and last < len(self.chain_tau) else None

    def chain_at_least(self, block_size: int) -> int:
        """A lower bound of the tokens a chain of ``block_size`` commits (its tokens where known)."""
        known = self.chain(block_size)
        return known if known is not None else self.chain_floor[min(block_size, len(self.chain_floor)) - 1]


@dataclass(frozen=True)
class Round:
    """One draft/verify round: ``tau`` tokens committed (accepted drafts + the bonus token).

    ``block_size`` positions were verified (the last committed token and ``block_size - 1``
    drafts); ``draft_s`` and ``verify_s`` are the wall seconds of its two passes (0 when the loop
    does not time them); ``drafted`` is the size of the block the drafter drafted, larger when a per-round
    schedule verified only a prefix of it (0: the same as ``block_size``). ``rows``: the
    sequences the timed passes carried (more than 1 in a batching engine, whose ``draft_s`` and
    ``verify_s`` then hold the other rows' work too). ``tree``: the ``block_size - 1`` drafts
    verified were the nodes of a draft tree (:mod:`adaptspec.decoding.tree`), not a chain, from a
    drafter pass of ``drafted`` positions (which may then be fewer than the nodes);
    ``tree_outcomes``, where the decoder gives them, what that tree tells about the round's
    smaller trees and chains (:class:`TreeOutcomes`: full information over tree and chain arms).
    """

    block_size: int
    tau: int
    draft_s: float
    verify_s: float
    drafted: int = 0
    rows: int = 1
    tree: bool = False
    tree_outcomes: TreeOutcomes | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.tau <= self.block_size:
            raise ValueError(f"tau={self.tau} outside 1..block_size={self.block_size}")
        if self.tree:
            if self.drafted and self.tau > self.drafted:
                raise ValueError(f"tau={self.tau} deeper than a tree drafted at {self.drafted} positions")
        elif self.drafted and self.drafted < self.block_size:
            raise ValueError(f"drafted={self.drafted} smaller than the verified block_size={self.block_size}")
        if self.rows < 1:
            raise ValueError(f"rows={self.rows}: a pass carries at least one sequence")

    @property
    def draft_size(self) -> int:
        """The size of the drafted block (1: a plain step, nothing drafted)."""
        return self.drafted or self.block_size


@dataclass
class Outcome:
    """What decoding one request produced.

    ``tokens`` are all new token ids (the token chosen at prefill included);
    ``decode_s`` is the wall time of the draft/verify loop, prefill excluded.
    """

    tokens: list[int]
    rounds: list[Round]
    decode_s: float
    finish_reason: str = "length"  # "length" | "eos"

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def mean_tau(self) -> float:
        """Mean tokens committed per round (nan when no round ran)."""
        if not self.rounds:
            return float("nan")
        return float(np.mean([r.tau for r in self.rounds]))

    @property
    def draft_s(self) -> float:
        return float(sum(r.draft_s for r in self.rounds))

    @property
    def verify_s(self) -> float:
        return float(sum(r.verify_s for r in self.rounds))


@dataclass
class Prefill:
    """Result of running the target on the prompt.

    ``features`` is the prefill representation (1-D float32) that policies see;
    ``state`` is the speculator's own opaque state (KV cache, hidden states, ...).
    """

    first_token: int
    prompt_tokens: int
    features: np.ndarray
    state: Any = None


@dataclass
class Decision:
    """A policy's choice of block size, with what off-policy evaluation needs.

    ``probs`` is the probability of every arm (same order as ``arms``); ``propensity`` is the
    probability of the chosen one. Treat it as read-only (``with_id`` returns a copy); it is not
    a frozen dataclass only because one is built per request on the hot path, where a frozen
    one costs four times as much to build (~1 us).
    """

    block_size: int
    propensity: float
    probs: np.ndarray
    arms: tuple[int, ...]
    policy: str
    version: int = 0
    decision_id: str | None = None
    extras: dict = field(default_factory=dict, compare=False)

    def with_id(self, decision_id: str) -> "Decision":
        """A copy of this decision carrying ``decision_id``."""
        return Decision(
            self.block_size,
            self.propensity,
            self.probs,
            self.arms,
            self.policy,
            self.version,
            decision_id,
            self.extras,
        )


def _count(v: Any, name: str, least: int) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < least:
        raise AdaptspecError(f"{name} must be an integer >= {least}, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class LoadState:
    """The serving system's load when a request is decided (batched serving), and the request's
    own size: what a policy may see besides the prefill features, and what the log keeps.

    ``rows`` is the rows decoding once this request has joined (itself included), ``queue`` the
    requests waiting behind it, ``context_tokens`` its prompt's tokens, ``temperature`` and
    ``max_tokens`` its sampling settings. Checked when made.

    >>> LoadState(rows=3, queue=0, context_tokens=12, temperature=0.0, max_tokens=64).rows
    3
    >>> LoadState(rows=0, queue=0, context_tokens=12, temperature=0.0, max_tokens=64)
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: rows must be an integer >= 1, got 0
    """

    rows: int
    queue: int
    context_tokens: int
    temperature: float
    max_tokens: int

    def __post_init__(self) -> None:
        for name, least in (("rows", 1), ("queue", 0), ("context_tokens", 1), ("max_tokens", 1)):
            object.__setattr__(self, name, _count(getattr(self, name), name, least))
        t = self.temperature
        if (
            isinstance(t, bool)
            or not isinstance(t, (int, float, np.integer, np.floating))
            or not 0 <= t < float("inf")
        ):
            raise AdaptspecError(f"temperature must be a finite number >= 0, got {t!r}")
        object.__setattr__(self, "temperature", float(t))


@dataclass(frozen=True)
class SharedRounds:
    """How a batched request's decode time was counted: ``attributed_s``, the sum of its shares
    of its rounds' time (what its reward is measured on), against ``wall_decode_s``, the wall
    time from its join to its end, over ``rounds`` rounds that held ``row_rounds`` rows in all.

    >>> SharedRounds(attributed_s=0.02, wall_decode_s=0.05, rounds=4, row_rounds=10).mean_rows
    2.5
    """

    attributed_s: float
    wall_decode_s: float
    rounds: int
    row_rounds: int

    def __post_init__(self) -> None:
        for name in ("attributed_s", "wall_decode_s"):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float, np.integer, np.floating))
                or not 0 <= v < float("inf")
            ):
                raise AdaptspecError(f"{name} must be a finite number of seconds >= 0, got {v!r}")
            object.__setattr__(self, name, float(v))
        object.__setattr__(self, "rounds", _count(self.rounds, "rounds", 0))
        object.__setattr__(self, "row_rounds", _count(self.row_rounds, "row_rounds", self.rounds))

    @property
    def mean_rows(self) -> float | None:
        """Mean rows in its rounds (itself included); None when no round ran."""
        return self.row_rounds / self.rounds if self.rounds else None


@runtime_checkable
class RoundSchedule(Protocol):
    """Chooses, round by round inside one request, how much to draft and how much to verify.

    Before a round the decoder asks ``draft_size(rounds)`` (the rounds of this request so far):
    the block to draft, ``1`` for a plain step that drafts nothing. When ``uses_confidence`` is
    true the decoder then passes the drafter's top-1 probability of each of the ``B - 1`` drafts
    to ``verify_size(confidence, rounds)``, which returns how many block positions to verify,
    ``1..B`` (the last committed token and that many drafts minus one): a prefix of the block.
    Ready-made schedules are in :mod:`adaptspec.schedules`.
    """

    uses_confidence: bool

    def draft_size(self, rounds: Sequence[Round]) -> int: ...

    def verify_size(self, confidence: np.ndarray, rounds: Sequence[Round]) -> int: ...


def output_bounds(committed: Any, last_tau: Any) -> tuple[Any, Any]:
    """The fewest and the most tokens an honest outcome holds when its rounds committed
    ``committed`` tokens in all (the sum of their tau), the last round ``last_tau`` of them: the
    first token (chosen at prefill), every round's tokens but the last's, and the last round's
    tokens less what a stop cut from them (EOS or ``max_new_tokens``), all of them included: a
    loop that looks for the end before a round (DFlash's reference loop, ``while start <
    max_length``) runs one round past an output that is exactly full, and an engine commits a
    last round's tokens past ``max_tokens`` and cuts them. Numbers or numpy arrays alike (the
    trace readers check whole columns with it).

    >>> output_bounds(8, 3)   # 1 + 5 tokens before the last round, then 0..3 of its 3
    (6, 9)
    """
    return 1 + committed - last_tau, 1 + committed


def _seconds_fault(v: Any, name: str) -> str | None:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return f"{name} is {v!r}, not a number of seconds"
    if not (math.isfinite(v) and v >= 0):
        return f"{name} is {v!r}: seconds must be finite and >= 0"
    return None


def outcome_fault(outcome: Outcome, largest: int, max_new_tokens: int | None = None) -> str | None:
    """What is wrong with ``outcome`` as a report of a request decoded with blocks of at most
    ``largest`` (and at most ``max_new_tokens`` new tokens, when given), in words; None when an
    honest loop can have produced it. The one statement of that rule: the controller's
    ``generate`` and ``feedback`` (:func:`adaptspec.control.block_sizes.check_outcome`),
    ``collect`` (:mod:`adaptspec.collect.checked`) and the trace readers (with
    :func:`output_bounds`) apply it.

    Refused: a round larger than ``largest``; more tokens than ``max_new_tokens``; more tokens
    than the first and its rounds' taus; a round that ran after the output had ended (only the
    last round's tokens may be cut, wholly or in part: :func:`output_bounds`); a time
    (``draft_s``, ``verify_s``, ``decode_s``) that is not a finite number >= 0, or a ``decode_s``
    (the wall time of the loop) under half of the time of the rounds it holds (those of one
    row: a batched round's times hold the other rows' work too).

    >>> r = Round(4, 4, 0.0, 0.01)
    >>> outcome_fault(Outcome([1] * 9, [r, r], 0.02), 4) is None
    True
    >>> outcome_fault(Outcome([1] * 9, [r, r, Round(4, 2, 0.0, 0.01)], 0.03), 4, 9) is None   # full, one round past
    True
    >>> outcome_fault(Outcome([1] * 5, [r, r, r], 0.03), 4)
    'round 2 ran after the output had ended: its first 2 rounds had committed 8 tokens after the first, the output holds 4 (only the last round may be cut)'
    >>> outcome_fault(Outcome([1] * 9, [r, r], 0.02), 2)
    'round 0 ran block size 4, larger than the 2 decided'
    >>> outcome_fault(Outcome([1] * 9, [r, Round(4, 4, -5.0, 0.01)], 0.02), 4)
    'round 1 draft_s is -5.0: seconds must be finite and >= 0'
    """
    for i, r in enumerate(outcome.rounds):
        if r.block_size > largest:
            return f"round {i} ran block size {r.block_size}, larger than the {largest} decided"
    for i, r in enumerate(outcome.rounds):
        fault = _seconds_fault(r.draft_s, f"round {i} draft_s") or _seconds_fault(
            r.verify_s, f"round {i} verify_s"
        )
        if fault is not None:
            return fault
    fault = _seconds_fault(outcome.decode_s, "decode_s")
    if fault is not None:
        return fault
    alone = sum(r.draft_s + r.verify_s for r in outcome.rounds if r.rows == 1)
    if outcome.decode_s < 0.5 * alone:
        return (
            f"decode_s is {outcome.decode_s!r}, under half of its rounds' {alone:.6g} s (decode_s is the wall "
            "time of the loop, its rounds included)"
        )
    n = len(outcome.tokens)
    if max_new_tokens is not None and n > max_new_tokens:
        return f"it has {n} tokens, more than max_new_tokens={max_new_tokens}"
    taus = [r.tau for r in outcome.rounds]
    least, most = output_bounds(sum(taus), taus[-1]) if taus else (0, 1)
    if n > most:
        return (
            f"it has {n} tokens, but its {len(taus)} rounds committed {most - 1} after the first "
            f"(tokens are the first token and each round's tau)"
        )
    if n < least:
        committed, j = 1, 0
        while committed <= n:  # the first round that started with more tokens committed than the output holds
            committed += taus[j]
            j += 1
        return (
            f"round {j} ran after the output had ended: its first {j} rounds had committed {committed - 1} "
            f"tokens after the first, the output holds {n - 1} (only the last round may be cut)"
        )
    return None


# ---------------------------------------------------------------------- rewards
#: The largest size of a reward anything learns from, read from a log or given by a caller:
#: ``|reward| <= REWARD_LIMIT``. A reward is tokens per second (one request decodes at most some
#: thousands, on any machine), minus milliseconds per token (a billion is 11.6 days a token) or
#: tokens per round (at most the block size), so a billion is past every honest reward by orders
#: of magnitude, and what is beyond it is a corrupted value or a unit error. It keeps a learner's
#: sums finite: a squared reward is at most 1e18, and float64 holds 1.8e308.
REWARD_LIMIT = 1e9


# ---------------------------------------------------------------------- arms
#: An **arm** is what a decision chooses for a request: a chain block size ``B >= 1``, or, for a
#: speculator that declares ``draft_trees``, the best draft tree of ``N`` nodes, written as the
#: negative int ``-N`` (:func:`tree_arm`). Arms stay ints wherever they go (policies, decision
#: logs' ``block_size`` column, trace sets), so a chain-only user never meets a tree.
#: A tree arm drafts ``TREE_ARM_DEPTH + 1`` positions a round (the depth its nodes may reach).
TREE_ARM_DEPTH = 15
#: The largest tree arm: a target pass of 257 positions.
MAX_TREE_NODES = 256


def tree_arm(nodes: int) -> int:
    """The arm of the best draft tree of ``nodes`` nodes.

    >>> tree_arm(16), is_tree_arm(-16), tree_nodes(-16), arm_label(-16), arm_label(4)
    (-16, True, 16, 'tree:16', '4')
    >>> verified_positions(-16), verified_positions(4), drafted_positions(-16), drafted_positions(1)
    (17, 4, 16, 1)
    """
    return -int(nodes)


def is_tree_arm(arm: int) -> bool:
    """Whether ``arm`` is a draft tree (:data:`TREE_ARM_DEPTH`'s comment)."""
    return int(arm) < 0


def tree_nodes(arm: int) -> int:
    """A tree arm's node count."""
    return -int(arm)


def arm_label(arm: int) -> str:
    """``"B"`` for a chain, ``"tree:N"`` for a tree: how an arm is written in messages and specs."""
    return f"tree:{-int(arm)}" if int(arm) < 0 else str(int(arm))


def parse_arm(text: str) -> int:
    """An arm from its label (``"4"``, ``"tree:16"``); what is not one raises one line.

    >>> parse_arm("tree:16"), parse_arm(" 4 ")
    (-16, 4)
    """
    t = str(text).strip()
    body = t[5:] if t.startswith("tree:") else t
    if not body.isdigit() or int(body) < 1:
        raise AdaptspecError(f"{text!r} is not an arm: a block size >= 1 or tree:N with N >= 1 nodes")
    return -int(body) if t.startswith("tree:") else int(body)


def verified_positions(arm: Any) -> Any:
    """Positions a round of ``arm`` verifies: ``B`` for a chain, ``N + 1`` for a tree (ints or arrays)."""
    a = np.asarray(arm)
    out = np.where(a < 0, 1 - a, a)
    return int(out) if out.ndim == 0 else out


def drafted_positions(arm: Any) -> Any:
    """Positions a round of ``arm`` drafts: ``B`` for a chain (1: nothing, a plain step),
    ``TREE_ARM_DEPTH + 1`` for a tree (ints or arrays)."""
    a = np.asarray(arm)
    out = np.where(a < 0, TREE_ARM_DEPTH + 1, a)
    return int(out) if out.ndim == 0 else out


def check_block_sizes(
    arms: Sequence[int],
    max_block_size: int,
    *,
    name: str | None = None,
    whose: str = "the speculator's",
    trees: bool = False,
) -> tuple[int, ...]:
    """``arms`` as sorted ints, checked to be distinct block sizes from 1 to ``max_block_size``
    (a larger block cannot be drafted), and, where ``trees`` (the speculator declares
    ``draft_trees``), tree arms of 1 to :data:`MAX_TREE_NODES` nodes. ``name`` and ``whose`` word
    the error.

    >>> check_block_sizes([8, 2, 4], 16)
    (2, 4, 8)
    >>> check_block_sizes([4, 32], 16, name="--arms 4,32", whose="the --tiny model's")
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: --arms 4,32: the --tiny model's max_block_size is 16, so block sizes [32] cannot be drafted
    >>> check_block_sizes([4, tree_arm(16)], 16, trees=True)
    (-16, 4)
    >>> check_block_sizes([4, tree_arm(16)], 16)
    Traceback (most recent call last):
    ...
    adaptspec.errors.AdaptspecError: arms [4, -16]: tree arms [tree:16] need a speculator that declares draft_trees
    """
    out = tuple(sorted(int(a) for a in arms))
    name = name or f"arms {list(arms)}"
    if not out or 0 in out or len(set(out)) != len(out):
        raise AdaptspecError(f"{name}: block sizes must be distinct integers >= 1")
    bad = [arm_label(a) for a in out if a < 0]
    if bad and not trees:
        raise AdaptspecError(
            f"{name}: tree arms [{', '.join(bad)}] need a speculator that declares draft_trees"
        )
    if out[0] < -MAX_TREE_NODES:
        raise AdaptspecError(
            f"{name}: a tree arm has at most {MAX_TREE_NODES} nodes, got {arm_label(out[0])}"
        )
    if out[-1] > max_block_size:
        raise AdaptspecError(
            f"{name}: {whose} max_block_size is {max_block_size}, so block sizes "
            f"{[a for a in out if a > max_block_size]} cannot be drafted"
        )
    return out


@runtime_checkable
class BlockSpeculator(Protocol):
    """What :class:`adaptspec.AdaptiveController` needs from a speculative decoder.

    Two methods and one attribute, with exactly these arguments (the controller checks the
    signatures when it is built, ``adaptspec.control.protocol``)::

        max_block_size: int
        prefill(prompt_ids, temperature=0.0, seed=None) -> Prefill
        decode(prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None) -> Outcome

    ``decode`` takes a block size or a :class:`RoundSchedule`; a speculator that cannot change
    the block size between rounds may ask the schedule once, and one that has no drafter
    confidences may ignore ``verify_size`` (verifying the whole block). ``on_round(tokens,
    round)``, when given, is called after every round with the tokens it committed (streaming).
    At ``temperature > 0`` the first token is sampled at ``prefill`` from a generator seeded by
    ``seed``. The :class:`Outcome`'s ``tokens`` are the first token and then each round's
    committed tokens, cut at EOS or ``max_new_tokens``; its rounds are the rounds that ran, the
    last one's tokens possibly cut, some or all (the controller refuses an outcome no honest loop
    produces: :func:`outcome_fault`).

    Four optional declarations (class or instance attributes; absent means the default):

    ``feature_dim: int | None = None``
        The length of ``Prefill.features``. Declared, it chooses the default policy before the
        first request (the bundled head only where its width matches) and features of another
        length are refused; undeclared, the first request's features fix it.
    ``per_round: bool = False``
        True when ``decode`` asks a :class:`RoundSchedule` for every round's block
        (``draft_size(rounds)`` before each round). The controller's per-round options
        (``redecide_every``, ``round_rule``) need it; they are refused otherwise.
    ``prefix_drafts: bool = False``
        True when every round that speculates drafts one block, the same whatever block size it
        verifies, and verifies a prefix of it (``SpeculativeDecoder(..., draft_length=D)``, its
        ``max_block_size`` then ``D``): what a round would have committed at any shorter block is
        then exact, not approximate (:func:`adaptspec.reward.counterfactual.counterfactuals`'s
        ``prefix_drafts``). A round's :attr:`Round.drafted` records the drafted block.
    ``draft_trees: bool = False``
        True when ``decode`` takes a tree arm (a negative ``block_size``, ``-N``: the best draft
        tree of ``N`` nodes every round, :func:`tree_arm`) besides block sizes, and reports its
        rounds with :attr:`Round.tree` and, for full information over tree and chain arms,
        :attr:`Round.tree_outcomes` (``SpeculativeDecoder`` with a drafter does). Policies may then
        hold tree arms (``check_block_sizes(..., trees=True)``).
    """

    max_block_size: int

    def prefill(
        self, prompt_ids: Sequence[int], temperature: float = 0.0, seed: int | None = None
    ) -> Prefill: ...

    def decode(
        self,
        prefill: Prefill,
        block_size: "int | RoundSchedule",
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        on_round: "Callable[[list[int], Round], None] | None" = None,
    ) -> Outcome: ...
