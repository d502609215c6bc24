"""The learning signal: what a choice of block size is paid, and what it costs.

- :mod:`~adaptspec.reward.functions`: the reward functions (throughput, token latency, ...);
- :mod:`~adaptspec.reward.latency`: the latency model, seconds of a draft and a verify pass
  by block size, context and batch (the simulator's clock);
- :mod:`~adaptspec.reward.counterfactual`: what every other block size would have earned on
  the rounds that ran (the full-information learners' feedback);
- :mod:`~adaptspec.reward.machine_speed`: how fast this machine is against a latency profile,
  learnt online, so measured rewards stay in a head's units.
"""

from .counterfactual import Counterfactuals, counterfactuals, from_outcome

__all__ = ["Counterfactuals", "counterfactuals", "from_outcome"]
