"""What a pass of ``batch`` rows x ``block_size`` tokens each costs: the one interface of a cost model.

A :class:`~adaptspec.costs.latency.LatencyProfile` answers it with its fitted curves, the vLLM
plug-in's :class:`~adaptspec.vllm.step_costs.StepCosts` with the steps it measured; a batched
round's price (:func:`~adaptspec.reward.attribution.batch_round_s`) and the load rules read
either through it.

>>> from adaptspec.costs.latency import CostCurve, LatencyProfile
>>> def pass_s(costs: PassCosts, rows: int) -> float:
...     return float(costs.verify(4, costs.context_tokens, rows))
>>> pass_s(LatencyProfile("flat", draft=CostCurve((1,), (0.0,)), verify=CostCurve((1,), (0.04,))), 8)
0.04
"""

from __future__ import annotations

from typing import Any, Protocol


class PassCosts(Protocol):
    """Seconds of one drafter pass and one target pass over ``batch`` rows of ``block_size``
    positions each at ``context`` tokens of context (scalars or arrays, broadcast)."""

    @property
    def context_tokens(self) -> int:
        """The context a caller that gives none is priced at."""
        ...

    def draft(self, block_size: Any, context: Any = ..., batch: Any = ...) -> Any:
        """Seconds of the drafter's pass (0 where it runs inside the target's)."""
        ...

    def verify(self, block_size: Any, context: Any = ..., batch: Any = ...) -> Any:
        """Seconds of the target's pass."""
        ...
