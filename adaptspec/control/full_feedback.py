"""Full information at serve time: what every arm would have earned on a request, from the rounds of the arm that ran.

When a request's feedback arrives with its outcome, the book of pending decisions
(:mod:`adaptspec.control.book`) asks :class:`CounterfactualPricer` for every arm's
counterfactual outcome (:func:`adaptspec.reward.counterfactual.from_outcome`: the tokens the same
rounds would have committed at each verify length, censored where a round accepted all it
verified, approximate where the arm would have drafted its own block) and prices it with the
controller's reward. The arm that ran is paid exactly the reward the bandit path gives it (the
reward function's, measured); the others their counterfactual reward, timed by the latency profile
and scaled to the measured time of what ran. This is computed once, there: the decision log keeps
it (``cf_rewards``, ``cf_tokens``, ``cf_censored``, ``cf_approximate``) and the update carries it
to the learner, which feeds a policy with ``full_feedback`` every observed arm
(:meth:`~adaptspec.policies.base.Policy.update_full`) and any other policy the arm that ran alone,
as before. Resume replays the logged vectors, so it learns the same.

Which profile prices the rounds (:func:`pricing_profile`): the controller's ``latency`` when given,
else its machine-speed reference, else the costs measured from the rounds themselves
(:class:`~adaptspec.reward.measured_costs.MeasuredCosts`: each round's ``draft_s`` and ``verify_s``,
rounds timed alone only). Until two block sizes have been timed, a request timed alone gets no
counterfactual rewards (it is learnt as a bandit learns it: pricing other sizes from one size's
rounds would carry another machine's costs into the learner for good), and a request of a batching
engine's rounds (timed with other rows) is priced on :data:`DEFAULT_PROFILE` until then. Only the
profile's relative costs of the block sizes matter (the times are scaled to the measured one); pass
``latency=PROFILE`` (``adaptspec profile-latency``) to fix them.

>>> from adaptspec.speculator import Decision, Outcome, Round
>>> d = Decision(4, 1.0, [0.0, 0.0, 1.0, 0.0], (1, 2, 4, 8), "fixed:4", decision_id="d1")
>>> out = Outcome([1] * 7, [Round(4, 3, 0.0, 0.01), Round(4, 2, 0.0, 0.01), Round(4, 1, 0.0, 0.01)], decode_s=0.03)
>>> fb = CounterfactualPricer("tau", get_profile(DEFAULT_PROFILE)).price(d, out, 2.0, context_tokens=20)
>>> fb.rewards.tolist(), fb.tokens.tolist(), fb.censored.tolist()
([1.0, 1.6666666666666667, 2.0, 2.0], [3.0, 5.0, 6.0, 6.0], [False, False, False, False])
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import AdaptspecError
from ..reward.counterfactual import from_outcome
from ..reward.functions import REWARDS
from ..reward.latency import LatencyProfile, get_profile
from ..reward.measured_costs import MeasuredCosts

log = logging.getLogger("adaptspec.control.controller")  # one logger for the controller and its parts

#: The profile counterfactual rounds are priced with when the controller has none (the bundled
#: decoder's, on which docs/evaluation.md section 9 measured the counterfactuals).
DEFAULT_PROFILE = "cpu-smollm2-fast"


@dataclass(frozen=True)
class FullFeedback:
    """Every arm's counterfactual outcome on one request, over the decision's ``arms`` (in their
    order): ``rewards`` in the reward's own (measured) unit, the arm that ran paid its own reward
    exactly, a lower bound where ``censored``; ``tokens`` the tokens the rounds would have committed
    at each arm; ``approximate`` where the arm would have drafted a block of its own."""

    arms: tuple[int, ...]
    rewards: np.ndarray
    tokens: np.ndarray
    censored: np.ndarray
    approximate: np.ndarray

    @property
    def observed(self) -> np.ndarray:
        """Arms whose reward is known (exactly or approximately): not censored."""
        return ~self.censored


def pricing_profile(latency: Any, machine_speed: Any) -> LatencyProfile | MeasuredCosts:
    """What counterfactual rounds are priced with (see the module docstring): a profile, or the
    costs measured from the rounds on :data:`DEFAULT_PROFILE`'s shape."""
    if latency is not None:
        return get_profile(latency)
    if machine_speed is not None:
        return machine_speed.profile
    return MeasuredCosts(get_profile(DEFAULT_PROFILE))


class CounterfactualPricer:
    """Prices every arm's counterfactual outcome with reward ``reward`` (one of
    :data:`~adaptspec.reward.functions.REWARDS`) on ``profile``, a latency profile or costs measured
    as requests come (see the module docstring); ``prefix_drafts``: the decoder drafts one block
    every round and verifies a prefix of it (it declares ``prefix_drafts``), so no uncensored arm
    is approximate; ``batch_size``: the batch the profile's costs are taken at (a trace replay
    priced at the batch its reward matrix was modelled at; the controller's rounds: 1)."""

    def __init__(self, reward: str, profile: LatencyProfile | MeasuredCosts, prefix_drafts: bool = False,
                 batch_size: int = 1) -> None:
        if reward not in REWARDS:
            raise AdaptspecError(f"counterfactual rewards need a named reward ({', '.join(REWARDS)}), got {reward!r}")
        self.reward = reward
        self.costs = profile if isinstance(profile, MeasuredCosts) else None
        self._profile = profile.prior if isinstance(profile, MeasuredCosts) else profile
        self.prefix_drafts = bool(prefix_drafts)
        self.batch_size = int(batch_size)

    @property
    def profile(self) -> LatencyProfile:
        """The profile the next request is priced with."""
        return self._profile if self.costs is None else self.costs.profile()

    def price(self, decision: Any, outcome: Any, reward: float, context_tokens: int | None,
              last: bool = True, reward_context: float | None = None) -> FullFeedback | None:
        """Every arm's outcome on the request ``decision`` decided, from ``outcome``'s rounds; the
        arm that ran gets ``reward`` (the one the bandit path learns from). ``context_tokens``: the
        context before its first round (None: the profile's reference context); ``last``: its
        rounds end the request (not a re-decision followed by another: then a last round that
        accepted all it verified censors the longer arms, as any other round does);
        ``reward_context``: the context a ``modelled`` reward is timed at (None: the profile's
        reference, as the controller's reward function). None when no round ran or the rounds
        cannot be priced (said in the log; the request is then learnt from as a bandit)."""
        if not outcome.rounds:
            return None
        if self.costs is not None and self.costs.observe(outcome) and not self.costs.measured:
            return None  # timed alone, but one size's rounds cannot tell yet what another costs here
        profile = self.profile
        arms = tuple(int(a) for a in decision.arms)
        ctx = int(profile.context_tokens if context_tokens is None else context_tokens)
        try:
            cf = from_outcome(outcome, decision.block_size, arms, ctx, profile, batch=self.batch_size,
                              prefix_drafts=self.prefix_drafts)
            r = cf.rewards(self.reward, profile, reward_context, self.batch_size)  # modelled: as the reward function
        except (AdaptspecError, ValueError, ZeroDivisionError) as e:
            log.info("decision %s: no counterfactual rewards: %s", decision.decision_id, e)
            return None
        order = [cf.arms.index(a) for a in arms]  # cf.arms are sorted; the decision's arms may not be
        rewards = np.asarray(r, dtype=np.float64)[order]
        rewards[arms.index(decision.block_size)] = float(reward)  # a checked decision: an int among its arms
        if not np.all(np.isfinite(rewards)):
            log.info("decision %s: no counterfactual rewards: a non-finite one", decision.decision_id)
            return None
        censored = cf.censored[order].copy()
        end = outcome.rounds[-1]
        if not last and end.tau == end.block_size:  # the request went on: a longer block could have gone on too
            censored |= np.asarray(arms) > end.block_size
        return FullFeedback(arms, rewards, cf.tokens[order], censored, cf.approximate[order].copy())
