"""Full information at serve time: what every arm would have earned on a request, from the rounds of the arm that ran.

When a request's feedback arrives with its outcome, the book of pending decisions
(:mod:`adaptspec.control.book`) asks :class:`~adaptspec.reward.pricing.CounterfactualPricer` (the
one pricer, which a trace replay calls too: :mod:`adaptspec.simulators.counterfactuals`) for every arm's
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
(:class:`~adaptspec.costs.measured.MeasuredCosts`: each round's ``draft_s`` and ``verify_s``,
rounds timed alone only). Until two block sizes have been timed, a request timed alone gets no
counterfactual rewards (it is learnt as a bandit learns it: pricing other sizes from one size's
rounds would carry another machine's costs into the learner for good), and a request of a batching
engine's rounds (timed with other rows) is priced on :data:`DEFAULT_PROFILE` until then. Only the
profile's relative costs of the block sizes matter (the times are scaled to the measured one); pass
``latency=PROFILE`` (``adaptspec profile-latency``) to fix them.
"""

from __future__ import annotations

from typing import Any

from ..costs.latency import LatencyProfile, get_profile
from ..costs.measured import MeasuredCosts
from ..reward.pricing import DEFAULT_PROFILE, CounterfactualPricer, FullFeedback

__all__ = ["DEFAULT_PROFILE", "CounterfactualPricer", "FullFeedback", "pricing_profile"]


def pricing_profile(latency: Any, machine_speed: Any) -> LatencyProfile | MeasuredCosts:
    """What counterfactual rounds are priced with (see the module docstring): a profile, or the
    costs measured from the rounds on :data:`DEFAULT_PROFILE`'s shape."""
    if latency is not None:
        return get_profile(latency)
    if machine_speed is not None:
        return machine_speed.profile
    return MeasuredCosts(get_profile(DEFAULT_PROFILE))
