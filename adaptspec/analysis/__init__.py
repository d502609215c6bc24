"""Analysis of served decision logs: off-policy estimates, the A/B report and its statistics.

A simulation replays policies on traces (:mod:`adaptspec.simulators`); an analysis reads what a
real server logged: :mod:`~adaptspec.analysis.ope` estimates a policy's value from another
policy's log, :mod:`~adaptspec.analysis.ab` reports an A/B test of the variants a server ran,
with the sequential test and intervals of :mod:`~adaptspec.analysis.statistics`.

The names below load their module on first use, so importing the statistics does not import
the policies that off-policy evaluation needs.
"""

import importlib
from typing import Any

_WHERE = {
    **dict.fromkeys(
        [
            "ESTIMATORS",
            "Estimate",
            "dm",
            "dr",
            "evaluate",
            "evaluate_log",
            "fit_reward_model",
            "ips",
            "policy_probs",
            "snips",
            "switch_dr",
        ],
        "ope",
    ),
    **dict.fromkeys(["ABReport", "analyze", "rows_to_arrays"], "ab"),
    **dict.fromkeys(
        [
            "SequentialTest",
            "mean_interval",
            "quantile_interval",
            "ratio_interval",
            "sequential_test",
            "welch_p",
        ],
        "statistics",
    ),
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
