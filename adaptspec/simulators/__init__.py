"""Simulators: trace replay, A/B replay, synthetic scenarios with a known optimum.

Off-policy evaluation of a served log is :mod:`adaptspec.analysis.ope`.

The names below load their module on first use, so importing one simulator (say
``adaptspec.simulators.synthetic``, which ``adaptspec synth`` needs) does not import the
policies the others need. The replay function shares its module's name, so it is not among
them (the package attribute ``replay`` is the module once anything imported it): use
``from adaptspec.simulators.replay import replay``.
"""

import importlib
from typing import Any

_WHERE = {
    **dict.fromkeys(["ABSimulation", "simulate_ab"], "ab"),
    **dict.fromkeys(["ReplayReport", "replay_log", "stream_order"], "replay"),
    **dict.fromkeys(["SCENARIOS", "generate"], "synthetic"),
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
