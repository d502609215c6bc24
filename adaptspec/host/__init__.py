"""The host the engine runs on: its round costs measured (short, cached), the dtype and the
block sizes priced by them, and the bundled head's prior re-priced by them.

- :mod:`~adaptspec.host.identity`: the key of a measurement (CPU, flags, torch, its kernels);
- :mod:`~adaptspec.host.timing`: the short timing of the engine's rounds;
- :mod:`~adaptspec.host.costs`: the cached record of one host's profiles by dtype;
- :mod:`~adaptspec.host.pricing`: block sizes and dtypes priced by a curve; a head re-priced;
- :mod:`~adaptspec.host.choice`: what runs here (:func:`choose`), said in one line.

:func:`for_models` is what ``adaptspec demo`` and ``adaptspec serve`` call at start.
"""

from __future__ import annotations

from typing import Any, Callable

from .choice import HostChoice, choose
from .costs import HostCosts, host_costs
from .identity import host_key

__all__ = ["HostChoice", "HostCosts", "choose", "for_models", "host_costs", "host_key", "measure_and_choose"]


def measure_and_choose(load: Callable[[str], Any], models: str, threads: int, dtype: str | None = None,
                       remeasure: bool = False) -> HostChoice:
    """This host's costs for ``models`` at ``threads`` torch threads (cached, or timed on
    ``load(dtype)`` for each dtype), and the choice on them (``dtype``: ``--dtype``)."""
    return choose(host_costs(load, host_key(models, threads), remeasure=remeasure), dtype)


def for_models(target: str | None, drafter: str | None, verification: str, threads: int, dtype: str | None = None,
               remeasure: bool = False) -> HostChoice:
    """:func:`measure_and_choose` for the models :func:`~adaptspec.models.load_speculator` loads from
    ``target`` and ``drafter`` (None: the bundled ones) in ``verification``, on the CPU."""
    import os

    from ..models import load_speculator

    models = " ".join(f"{k}={os.path.abspath(v) if v else 'bundled'}" for k, v in
                      (("target", target), ("drafter", drafter))) + f" verification={verification}"
    return measure_and_choose(lambda d: load_speculator(target, drafter, dtype=d, verification=verification),
                              models, threads, dtype, remeasure)
