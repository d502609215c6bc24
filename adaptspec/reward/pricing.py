"""Every arm's counterfactual reward on one request, priced from the rounds of the arm that ran.

:class:`CounterfactualPricer` is the one place a request's rounds become every arm's outcome and
reward (:func:`~adaptspec.reward.counterfactual.from_outcome`, priced with a reward of
:data:`~adaptspec.reward.functions.REWARDS`): the controller's feedback path
(:mod:`adaptspec.control.full_feedback`, which says which profile prices a served request) and a
trace replay (:mod:`adaptspec.simulators.counterfactuals`, which hands it each trace row as the
outcome a decoder returned) both call it, so a replayed policy learns what a served one learns.

>>> from adaptspec.costs.latency import get_profile
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

from ..costs.latency import LatencyProfile
from ..costs.measured import MeasuredCosts
from ..errors import AdaptspecError
from .counterfactual import from_outcome
from .functions import REWARDS

log = logging.getLogger("adaptspec.reward.pricing")

#: The profile counterfactual rounds are priced with when nothing else is known (the bundled
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


class CounterfactualPricer:
    """Prices every arm's counterfactual outcome with reward ``reward`` (one of
    :data:`~adaptspec.reward.functions.REWARDS`) on ``profile``, a latency profile or costs measured
    as requests come (see the module docstring); ``prefix_drafts``: the decoder drafts one block
    every round and verifies a prefix of it (it declares ``prefix_drafts``), so no uncensored arm
    is approximate; ``batch_size``: the batch the profile's costs are taken at (a trace replay
    priced at the batch its reward matrix was modelled at; the controller's rounds: 1)."""

    def __init__(
        self,
        reward: str,
        profile: LatencyProfile | MeasuredCosts,
        prefix_drafts: bool = False,
        batch_size: int = 1,
    ) -> None:
        if reward not in REWARDS:
            raise AdaptspecError(
                f"counterfactual rewards need a named reward ({', '.join(REWARDS)}), got {reward!r}"
            )
        self.reward = reward
        self.costs = profile if isinstance(profile, MeasuredCosts) else None
        self._profile = profile.prior if isinstance(profile, MeasuredCosts) else profile
        self.prefix_drafts = bool(prefix_drafts)
        self.batch_size = int(batch_size)

    @property
    def profile(self) -> LatencyProfile:
        """The profile the next request is priced with."""
        return self._profile if self.costs is None else self.costs.profile()

    def price(
        self,
        decision: Any,
        outcome: Any,
        reward: float,
        context_tokens: int | None,
        last: bool = True,
        reward_context: float | None = None,
    ) -> FullFeedback | None:
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
            cf = from_outcome(
                outcome,
                decision.block_size,
                arms,
                ctx,
                profile,
                batch=self.batch_size,
                prefix_drafts=self.prefix_drafts,
            )
            r = cf.rewards(
                self.reward, profile, reward_context, self.batch_size
            )  # modelled: as the reward function
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
        if (
            not last and end.tau == end.block_size
        ):  # the request went on: a longer block could have gone on too
            censored |= np.asarray(arms) > end.block_size
        return FullFeedback(arms, rewards, cf.tokens[order], censored, cf.approximate[order].copy())
