"""The learning signal: what a choice of block size is paid.

- :mod:`~adaptspec.reward.functions`: the reward functions (throughput, token latency, ...);
- :mod:`~adaptspec.reward.counterfactual`: what every other block size would have earned on
  the rounds that ran (the full-information learners' feedback);
- :mod:`~adaptspec.reward.pricing`, :mod:`~adaptspec.reward.attribution`,
  :mod:`~adaptspec.reward.load_scale`: those rewards priced on a cost model
  (:mod:`adaptspec.costs`).
"""

from .counterfactual import Counterfactuals, counterfactuals, from_outcome

__all__ = ["Counterfactuals", "counterfactuals", "from_outcome"]
