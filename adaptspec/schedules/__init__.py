"""Per-round schedules: how much to draft and verify in each round of one request.

A per-request policy chooses a request's block size once, after prefill; a schedule
(:class:`~adaptspec.speculator.RoundSchedule`) then decides every round from what has happened
inside the request (the rounds so far) and, when it ``uses_confidence``, from the drafter's
top-1 probability of each draft before the target verifies them. The decoder
(:class:`~adaptspec.decoding.SpeculativeDecoder`), the dense-trace replay
(:func:`adaptspec.traces.dense.replay`) and :class:`~adaptspec.AdaptiveController` (``round_rule=``) all
take them. Each schedule is one small file:

- :class:`FixedBlock` -- the same block size every round (what a plain ``int`` means);
- :class:`ConfidenceThreshold` -- verify the prefix of drafts whose cumulative top-1 probability
  stays above a threshold; back off to plain steps while the drafter stays unsure;
- :class:`AcceptanceHistory` -- grow the block after a fully accepted round, shrink it after a
  rejection (transformers' "heuristic" assistant schedule), down to plain decoding.

Schedules hold no per-request state (everything is read from ``rounds``), so one object serves
any number of requests and threads; ``with_block_size(b)`` gives the same rule at another
block size, which is how a per-request policy's choice and a per-round rule combine.
"""

from .confidence import ConfidenceThreshold
from .fixed import FixedBlock, as_schedule
from .history import AcceptanceHistory
from .parse import parse_schedule

__all__ = ["AcceptanceHistory", "ConfidenceThreshold", "FixedBlock", "as_schedule", "parse_schedule"]
