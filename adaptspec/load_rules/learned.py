"""The learned rule under load: a contextual bandit choosing each round's block size for the whole
batch, its context the load level, warm from the goodput model or cold."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..costs.pass_costs import PassCosts
from ..errors import AdaptspecError
from ..reward.attribution import batch_round_s, batch_rounds_s
from .goodput import predicted_speedup

#: Load levels (rows in flight) the learned rule tells apart: 1, 2, 3-4, 5-8, 9-16, 17-32, 33+.
LEVELS = (1, 2, 4, 8, 16, 32)


#: Plain rounds over which the learned rule averages a level's measured / modelled plain round time
#: (then a moving average over as many).
SCALE_ROUNDS = 16
#: The learned rule verifies a plain round at a level after this many rounds without one there (and
#: at its first round there), to keep that ratio measured.
PLAIN_EVERY = 32

#: Rounds a learned rule's decision holds while the load stays at its level (then one update).
HOLD_ROUNDS = 4

#: The rows each level stands for when the cost model predicts its rewards: its largest count (64 for 33+).
LEVEL_ROWS = (*LEVELS, 2 * LEVELS[-1])

#: The standard deviation of one row's reward the learned rule assumes at every block size (its
#: posterior's noise, in the reward's unit). Measured in simulation (the 336 benchmark traces, both
#: profiles, 1-64 rows): 0.23-0.69 for B = 2-8, and exactly 0 for plain decoding, whose row commits
#: one token in the modelled time; an estimate pooled over the arms is dragged down by plain rounds
#: until no other arm is drawn again (0.048 after a cold warm-up run at 2 rows on the CPU profile).
ROW_NOISE = 0.5
#: A cold rule's prior: every block size as fast as plain decoding (1.0), weighted as this many
#: row-rounds: next to nothing, so a block size never tried is still drawn when another one has
#: shown several times plain's speed (with 1 row-round a toy whose best block is far ahead of the
#: others settled on a worse one; tests/test_load_sim.py).
COLD_WEIGHT = 0.01
#: A cold rule's prior weight, in row-rounds, that a level's reward is its block size's reward at
#: every level (the shared term): a level seen little borrows from the levels seen, a level seen
#: much has its own. In simulation (CPU batched profile, 16 clients, 3 seeds, with full
#: information) a run draining from 16 rows to 1 cost 1.2% with no shared term (a level's own
#: term alone: the drain's levels explored afresh), 0.5% at a weight of 4, 0.0% at 16.
LEVEL_WEIGHT = 16.0
#: The margin a speculating block size must clear over plain decoding, as ``adaptspec serve``
#: (``--load-margin``) and the vLLM plug-in (``load_margin``) run the rule by default
#: (``Learned(margin=...)``; 0 when not given): each speculating row's reward is divided by
#: ``1 + margin`` before it is learnt. A round's reward sees only that round, and speculation has
#: costs no round shows: requests it lets finish at different steps stop sharing their prefill
#: steps, a draining batch's last rows each pay a whole step, the drafter's bookkeeping: in vLLM on a
#: CPU at 4 requests B = 2's decode steps beat plain's while the whole run did not (more prefill
#: steps, 1-row tail steps), and without the margin adaptspec's own server ran B = 2 at 4 clients
#: below plain (BENCHMARKS.md, "The served default under load" and "The vLLM plug-in").
SPECULATION_MARGIN = 0.10


def level_index(rows: int) -> int:
    """The load level of ``rows`` rows in flight (0 for 1 row, ... 6 for 33 or more)."""
    return int(np.searchsorted(LEVELS, rows))


class Learned:
    """A contextual bandit choosing each round's block size, one for the whole batch.

    The engine pads every row's block to the round's widest (:mod:`adaptspec.batching.target_pass`),
    so a round costs its rows times its widest block: rows at different block sizes pay for the
    widest anyway, and one row exploring a long block slows every other row. The rule therefore
    draws **one** block size per round, for every row (each row's own cap, its request's block
    size and the tokens it has left, still applies), and learns from the round as a whole.

    Context: the load level (one-hot over :data:`LEVELS`). Reward: each row's speed-up in the
    round over its share of a plain round, ``tau x (t_plain(rows) / rows) / attributed seconds``,
    where ``t_plain`` is the cost model's plain round over the same rows and the attributed
    seconds are the row's share of the measured round (:mod:`adaptspec.reward.attribution`): 1.0
    = as fast as plain decoding, on one scale at every load. Every row of the round is one
    observation of the round's block size, so a round of 16 rows counts 16 times: at high load
    the posterior narrows as fast as the evidence grows (learning from the round's mean once,
    with one noise level for every load, explored too much at 8-16 rows: below batched plain
    decoding end to end). The machine may run uniformly slower or faster than the cost model
    (a server's HTTP and streaming threads share the cores: its rounds take longer than the
    engine's alone), which would put measured rewards on another scale than the prior's and send the
    rule after every arm it has not tried yet. So each level keeps the ratio of measured to
    modelled *plain* round time (over its last :data:`SCALE_ROUNDS` plain rounds; a plain round
    is verified at a level's first round and after ``plain_every`` rounds without one, default
    :data:`PLAIN_EVERY`) and
    rewards are multiplied by it: a row's reward is then its tokens over its share of the round
    against its share of a plain round as this machine runs it. What stays is the cost model's
    error between block sizes, which is what the rule should learn (measuring the scale on the
    arm being played would cancel exactly that). With ``plain_every_max`` the gap doubles after
    each forced plain round at a level, up to that many rounds: where the cost model is the
    engine's own measured steps (the vLLM plug-in's :class:`~adaptspec.vllm.step_costs.StepCosts`)
    the ratio stays near 1 once plain steps are measured, and a forced plain step at one or two
    requests commits one token where the played block commits ~1.5 (in vLLM at one client, about 5
    of its ~135 steps a run were forced plain: ~2% of its tokens/s).

    **A decision holds** for ``hold`` rounds (default :data:`HOLD_ROUNDS`) while the load stays
    at its level, and the rows of those rounds are learnt in one update when it ends: on the
    server the rule's numpy work runs between two model passes that have evicted it from the
    caches, where one round's decision and update cost ~5x what a micro-benchmark shows (0.7-1%
    of decode time at 16 rows, deciding every round); a plain round forced for the scale is one
    round, not held. ``policy``: a spec for
    :func:`~adaptspec.policies.spec.make_policy` (LinTS by default: one posterior draw per
    round, no propensity sampling, which keeps the rule's time per round well under a
    millisecond).

    **Warm start** (``prior``, a per-draft acceptance, as the product's offline head starts its
    bandit): each arm's model at each level starts at the goodput model's reward there
    (:func:`predicted_speedup` at the level's :data:`LEVEL_ROWS`, ``context`` tokens of context,
    default the profile's), weighted as ``prior_weight`` row-rounds, in the reward's own unit
    (raw rewards, no standardising warm-up). Before its first round it prefers the goodput
    model's block size at every level; measured rounds then outweigh the prior, so a wrong cost
    model is corrected. The weight, 32 row-rounds: in simulation on the measured CPU cost model
    (``cpu-smollm2-batched``, the 336 benchmark traces, one run each) 8, 32 and 128 were within
    noise of each other at every level and over the day; against a cost model that thinks long
    blocks are free
    (tests/test_load_rules.py) 32 unlearns it within two runs of 32 requests at 16 rows.

    **Cold start** (no ``prior``): every block size starts as fast as plain decoding (1.0) at
    every level, so nothing is preferred. The model is the level's term plus a term every level
    shares, both per block size (the context: the level's one-hot vector and a constant 1): the
    shared term starts at 1.0 with the weight of :data:`COLD_WEIGHT` row-rounds, a level's own at
    0 with :data:`LEVEL_WEIGHT`, so a level seen little borrows what the others showed (a run
    that drains from 16 rows to 1 does not try 8-token blocks at 5-8 rows again) and a level seen
    much has its own estimate. The posterior's noise is :data:`ROW_NOISE` at every block size.
    (It used to start from a standardiser fitted on its first 60 row rewards, 8-24 an arm from
    the first rounds of the first requests, and to estimate the noise pooled over the arms: at 2
    rows on the CPU profile the speculating arms' first means were 0.80-0.95 against 1.03-1.09
    over a run, plain's rewards, exactly 1, pulled the noise to 0.048, and the rule played plain
    or B = 2 for the rest, below the best fixed size.)

    **A margin over plain** (``margin``, 0 by default; :data:`SPECULATION_MARGIN` as
    ``adaptspec serve --load-margin`` and the vLLM plug-in's ``load_margin`` give it by default): every speculating row's reward, played or counterfactual, and a warm
    prior's speculating sizes, are divided by ``1 + margin``, so a block size above 1 is preferred
    only where its rounds beat plain decoding's by the margin: what speculation costs outside its
    own rounds (see :data:`SPECULATION_MARGIN`) is charged to it, and where speculating only breaks
    even the rule decodes plainly.

    **Full information** (``full_info``): a round that verified ``B`` positions of a row and
    committed ``tau`` would have committed ``min(tau, B')`` at ``B' < B`` (a prefix of the same
    drafts: approximate, as :mod:`adaptspec.reward.counterfactual` says). Each such size's round
    would have taken the measured round's time times the cost model's ratio of the two rounds
    (:func:`~adaptspec.reward.attribution.batch_round_s`, rows capped below ``B`` by their own
    request keep their cap), each row's share scaled alike; every shorter size then learns its
    rows' rewards as if it had run, so one round informs every block size up to the one it
    verified. Longer sizes learn only when played: their outcome is known on a row only when it
    rejected a draft, so learning them from those rows alone (as this rule first did) sees only
    the rounds that went badly and drives the estimates of long blocks down (at 2 rows on the CPU
    profile rounds at B = 2 teach B = 3-8 0.62-0.73, below plain, where their own means are
    0.95-1.09: ``benchmarks/bench_load_rule_diagnosis.py``, BENCHMARKS.md, "What was tried and
    did not pay").

    >>> from adaptspec.costs.latency import get_profile
    >>> gpu = get_profile("h100-qwen3-8b")
    >>> warm = Learned([1, 2, 3, 4, 6, 8], gpu, prior=0.41)
    >>> [warm.preference(rows) for rows in (1, 8, 64)]     # before any round: the goodput model's choice
    [6, 4, 3]
    >>> from adaptspec.load_rules.load import Load
    >>> len(set(warm.choose([None] * 5, Load(rows=5, queue=0))))   # one block size for the whole round
    1
    """

    def __init__(
        self,
        arms: Sequence[int],
        profile: PassCosts,
        policy: str = "lints",
        seed: int = 0,
        prior: float | None = None,
        prior_weight: float = 32.0,
        context: float | None = None,
        hold: int = HOLD_ROUNDS,
        full_info: bool = False,
        noise: float = ROW_NOISE,
        level_weight: float = LEVEL_WEIGHT,
        margin: float = 0.0,
        plain_every: int = PLAIN_EVERY,
        plain_every_max: int | None = None,
    ) -> None:
        from ..policies.spec import make_policy

        self.arms = sorted(int(a) for a in arms)
        self.profile = profile
        for what, v in (("noise", noise), ("level_weight", level_weight)):
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise AdaptspecError(f"{what} must be > 0, got {v!r}")
        if not (isinstance(margin, (int, float)) and 0 <= margin < 1):
            raise AdaptspecError(f"margin must be in [0, 1), got {margin!r}")
        #: what a speculating row's reward is multiplied by before it is learnt (plain's: 1)
        self.discount = 1.0 / (1.0 + float(margin))
        fast = {"mc_samples": 1} if policy.split(":")[0] == "lints" else {}
        fast["noise"] = float(noise)
        self.shared = prior is None
        mean, precision, dim, self.name = _prior_belief(
            policy, self.arms, profile, prior, prior_weight, context, level_weight, self.discount
        )
        self.policy = make_policy(
            policy,
            self.arms,
            seed=seed,
            standardize=False,
            fit_intercept=False,
            dim=dim,
            prior_mean=mean,
            prior_precision=precision,
            **fast,
        )
        if not isinstance(hold, int) or hold < 1:
            raise AdaptspecError(f"hold must be an int >= 1, got {hold!r}")
        self.plain_every_max = _checked_plain_every(plain_every, plain_every_max)
        self.hold = hold
        self.full_info = bool(full_info)
        if self.full_info:
            self.name = self.name[:-1] + ", full info)"
        self._cf: dict[int, list[float]] = {}  # full info: rewards of the other block sizes, not learnt yet
        self._round: tuple | None = (
            None  # level, block size, rows, modelled plain round s, contexts: the round in progress
        )
        self._held: tuple | None = None  # level, block size, rounds left: the decision holding
        self._pending: list[float] = []  # rewards of the held decision's rows, not learnt yet
        self._plain_cache: dict[tuple[int, int], float] = {}
        # per level: measured / modelled plain round time (1 until a plain round is measured), and
        # rounds since the last plain one (a plain round is forced after the level's gap without one)
        self._scale = np.ones(len(LEVELS) + 1)
        self._plain_n = np.zeros(len(LEVELS) + 1, dtype=np.int64)
        self._plain_gap = np.full(
            len(LEVELS) + 1, plain_every, dtype=np.int64
        )  # rounds between forced plain ones
        self._since_plain = self._plain_gap.copy()  # the first round is plain

    @staticmethod
    def context(level: int) -> np.ndarray:
        """The one-hot vector of load level ``level`` (:func:`level_index`)."""
        x = np.zeros(len(LEVELS) + 1)
        x[level] = 1.0
        return x

    def features(self, level: int) -> np.ndarray:
        """What the policy sees of load level ``level``: its one-hot vector, and for a cold rule a
        constant 1 after it (the term every level shares)."""
        x = self.context(level)
        return np.append(x, 1.0) if self.shared else x

    def preference(self, rows: int) -> int | None:
        """The block size with the highest expected reward at ``rows`` rows in flight now (None while
        every block size ties, as a cold rule's do before its first round)."""
        mu = self.policy.predict(self.features(level_index(rows))[None])[0]
        return None if np.ptp(mu) == 0 else self.arms[int(np.argmax(mu))]

    def choose(self, rows: Sequence[Any], load: Any) -> list[int]:
        level = level_index(load.rows)
        held = self._held
        if held is not None and held[0] != level:  # the load moved: the held decision ends here
            self._learn()
            held = self._held = None
        self._since_plain[level] += 1
        if (
            self._since_plain[level] > self._plain_gap[level]
        ):  # time to measure a plain round again (one round)
            b = 1
            self._plain_gap[level] = min(2 * self._plain_gap[level], self.plain_every_max)
        elif held is not None and held[2] > 0:  # (a held decision is at this level: see above)
            b = held[1]
            self._held = (level, b, held[2] - 1)
        else:
            self._learn()
            b = int(self.policy.decide(self.features(level)).block_size)
            self._held = (level, b, self.hold - 1)
        if b == 1:
            self._since_plain[level] = 0
        n = len(rows)
        contexts = [getattr(r, "context", self.profile.context_tokens) for r in rows]
        context = sum(contexts) / n if n else 0.0
        self._round = (level, b, n, self._plain_s(n, context), contexts)
        return [b] * n

    def feedback(
        self,
        rows: Sequence[Any],
        block_sizes: Sequence[int],
        taus: Sequence[int],
        attributed_s: Sequence[float],
        load: Any,
    ) -> None:
        """Keep the rewards of the round :meth:`choose` chose last (one a row); they are learnt
        when its decision ends. A plain round updates the level's scale first."""
        if self._round is None:
            return
        level, b, n, plain_s, contexts = self._round
        self._round = None
        spent = sum(attributed_s)
        if not (len(taus) == n and plain_s > 0 and spent > 0):
            return
        if b == 1:  # a plain round: how much slower (or faster) than the model this machine runs
            seen = self._plain_n[level] = self._plain_n[level] + 1
            self._scale[level] += (spent / plain_s - self._scale[level]) / min(seen, SCALE_ROUNDS)
        unit = (
            plain_s / n * float(self._scale[level])
        )  # a row's share of a plain round, as this machine runs it
        paid = unit * (
            self.discount if b > 1 else 1.0
        )  # a speculating row clears the margin (SPECULATION_MARGIN)
        rewards = [t * paid / s for t, s in zip(taus, attributed_s) if s > 0]  # speed-up over it, row by row
        cf = (
            self.counterfactual_rewards(b, block_sizes, taus, attributed_s, contexts, unit)
            if self.full_info
            else {}
        )
        held = self._held
        if held is not None and held[:2] == (level, b):
            self._pending.extend(rewards)
            for a, r in cf.items():
                self._cf.setdefault(a, []).extend(r)
        else:  # a forced plain round, or the decision moved on: learnt now
            self.policy.update_repeated(self.features(level), b, rewards)
            for a, r in cf.items():
                self.policy.update_repeated(self.features(level), a, r)

    def counterfactual_rewards(
        self,
        b: int,
        block_sizes: Sequence[int],
        taus: Sequence[int],
        attributed_s: Sequence[float],
        contexts: Sequence[float],
        unit: float,
    ) -> dict[int, list[float]]:
        """Every other block size's rewards, row by row, from a round the rule ran at ``b`` (see
        the class docstring, full information); sizes censored in this round are left out."""
        v = np.asarray(block_sizes, dtype=np.int64)
        t = np.asarray(taus, dtype=np.int64)
        s = np.asarray(attributed_s, dtype=np.float64)
        if b <= 1 or v.size == 0 or not (s > 0).all():
            return {}
        shorter = np.array(
            [a for a in self.arms if a < b]
        )  # longer blocks: censored where a row accepted all b
        if shorter.size == 0:
            return {}
        blocks = np.where(
            v[None, :] < b, np.minimum(shorter[:, None], v[None, :]), shorter[:, None]
        )  # arms x rows
        ran = batch_round_s(self.profile, v, contexts)
        ratio = batch_rounds_s(self.profile, blocks, contexts) / ran
        paid = np.where(shorter > 1, unit * self.discount, unit)
        rewards = np.minimum(t[None, :], blocks) * (paid / ratio)[:, None] / s[None, :]
        return {int(a): r.tolist() for a, r in zip(shorter, rewards)}

    def _plain_s(self, rows: int, context: float) -> float:
        """The cost model's plain round over ``rows`` rows (``batch_round_s`` with every block at 1:
        the target pass alone), the context rounded to 8 tokens, cached."""
        if rows == 0:
            return 0.0
        key = (rows, int(context) // 8)
        t = self._plain_cache.get(key)
        if t is None:
            if len(self._plain_cache) > 4096:
                self._plain_cache.clear()
            t = self._plain_cache[key] = float(self.profile.verify(1, 8 * key[1] + 4, rows))
        return t

    def _learn(self) -> None:
        """Learn the held decision's rows, in one update (one per block size they show)."""
        if self._held is not None and self._pending:
            level, b, _ = self._held
            self.policy.update_repeated(self.features(level), b, self._pending)
            for a, r in self._cf.items():
                self.policy.update_repeated(self.features(level), a, r)
        self._pending = []
        self._cf = {}
        self._held = None


def _prior_belief(
    policy: str,
    arms: list[int],
    profile: PassCosts,
    prior: float | None,
    prior_weight: float,
    context: float | None,
    level_weight: float,
    discount: float,
) -> tuple[np.ndarray, np.ndarray | float, int, str]:
    """The policy's prior (mean, precision, context width) and the rule's name. Cold (no prior
    acceptance): every block size as fast as plain at every level, through a shared term. Warm: the
    profile's predicted speed-up at each level for the prior acceptance, held with prior_weight."""
    dim = len(LEVELS) + 1
    if prior is None:
        # every block size as fast as plain at every level (the shared term), no preference;
        # a level's own term starts at 0 and is held there with the weight of LEVEL_WEIGHT rows
        mean = np.zeros((len(arms), dim + 1))
        mean[:, -1] = 1.0
        precision = np.full((len(arms), dim + 1), float(level_weight))
        precision[:, -1] = COLD_WEIGHT
        return mean, precision, dim + 1, f"learned ({policy})"
    if not 0.0 <= prior < 1.0:
        raise AdaptspecError(f"prior acceptance must be in [0, 1), got {prior!r}")
    if not (prior_weight > 0 and math.isfinite(prior_weight)):
        raise AdaptspecError(f"prior_weight must be > 0, got {prior_weight!r}")
    ctx = float(profile.context_tokens if context is None else context)
    mean = np.stack([predicted_speedup(profile, arms, prior, rows, ctx) for rows in LEVEL_ROWS], axis=1)
    mean[np.asarray(arms) > 1] *= discount
    return mean, float(prior_weight), dim, f"learned ({policy}, warm)"


def _checked_plain_every(plain_every: int, plain_every_max: int | None) -> int:
    """The longest gap between forced plain rounds (plain_every when not given), both checked."""
    top = plain_every if plain_every_max is None else plain_every_max
    for what, v in (("plain_every", plain_every), ("plain_every_max", top)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise AdaptspecError(f"{what} must be an int >= 1, got {v!r}")
    if top < plain_every:
        raise AdaptspecError(f"plain_every_max {top} is below plain_every {plain_every}")
    return top
