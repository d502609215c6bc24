"""The host the engine runs on: its round costs measured (short, cached), the dtype and the
block sizes priced by them, and the bundled head's prior re-priced by them.

- :mod:`~adaptspec.host.identity`: the key of a measurement (CPU, flags, torch, its kernels);
- :mod:`~adaptspec.host.timing`: the short timing of the engine's rounds;
- :mod:`~adaptspec.host.costs`: the cached record of one host's profiles by dtype;
- :mod:`~adaptspec.host.pricing`: block sizes and dtypes priced by a curve; a head re-priced;
- :mod:`~adaptspec.host.choice`: what runs here (:func:`choose`), said in one line.

:func:`for_models` is what ``adaptspec demo``, ``adaptspec serve`` and ``adaptspec profile-latency`` call at
start; :func:`for_speculator` is the same for a speculator :func:`~adaptspec.models.load_speculator`
made, which ``AdaptiveController(speculator)`` calls for its default policy
(:func:`~adaptspec.control.policy_build.default_on_host`).

Its cost, once per host (the record is cached under ``<cache>/host/``, keyed by
:func:`~adaptspec.host.identity.host_key`): about 20 CPU seconds to time the three dtypes (9 cells of 4
passes each; 10-40 s of wall time on a shared 2-core host), plus loading the models once in
each dtype; later calls read the record (milliseconds).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .choice import HostChoice, choose, server_rows
from .costs import HostCosts, host_costs
from .identity import host_key

__all__ = [
    "HostChoice",
    "HostCosts",
    "choose",
    "for_models",
    "for_speculator",
    "host_costs",
    "host_key",
    "measure_and_choose",
    "models_key",
    "server_rows",
]


def measure_and_choose(
    load: Callable[[str], Any],
    models: str,
    threads: int,
    dtype: str | None = None,
    remeasure: bool = False,
    chosen_by: str = "--dtype",
    rows: Sequence[int] = (1,),
) -> HostChoice:
    """This host's costs for ``models`` at ``threads`` torch threads (cached, or timed on
    ``load(dtype)`` for each dtype), and the choice on them (``dtype``: given, by ``chosen_by``;
    ``rows``: the engine's loads, :func:`~adaptspec.host.choice.choose`)."""
    return choose(
        host_costs(load, host_key(models, threads), remeasure=remeasure),
        dtype,
        chosen_by=chosen_by,
        rows=rows,
    )


def models_key(target: str | None, drafter: str | None, verification: str) -> str:
    """The ``models`` part of a host key: the target's and drafter's absolute paths ('bundled' for
    the bundled ones) and the verification mode.

    >>> models_key(None, None, "fast")
    'target=bundled drafter=bundled verification=fast'
    """
    import os

    return (
        " ".join(
            f"{k}={os.path.abspath(v) if v else 'bundled'}"
            for k, v in (("target", target), ("drafter", drafter))
        )
        + f" verification={verification}"
    )


def for_models(
    target: str | None,
    drafter: str | None,
    verification: str,
    threads: int,
    dtype: str | None = None,
    remeasure: bool = False,
    chosen_by: str = "--dtype",
    rows: Sequence[int] = (1,),
) -> HostChoice:
    """:func:`measure_and_choose` for the models :func:`~adaptspec.models.load_speculator` loads from
    ``target`` and ``drafter`` (None: the bundled ones) in ``verification``, on the CPU; ``rows``:
    the engine's loads (a server's: :func:`~adaptspec.host.choice.server_rows`)."""
    from ..models import load_speculator

    return measure_and_choose(
        lambda d: load_speculator(target, drafter, dtype=d, verification=verification),
        models_key(target, drafter, verification),
        threads,
        dtype,
        remeasure,
        chosen_by,
        rows,
    )


def for_speculator(speculator: Any, threads: int | None = None) -> HostChoice | None:
    """:func:`for_models` for a speculator :func:`~adaptspec.models.load_speculator` made on the CPU
    in a timed dtype, priced in the dtype it was loaded in (``threads``: torch's now, by default);
    None for any other speculator (one of one's own, or on an accelerator: nothing here times it).
    Costs what :func:`for_models` costs (the module docstring): once per host, then cached."""
    import torch

    from ..models.bundled import loaded_from
    from .costs import TIMED_DTYPES

    how = loaded_from(speculator)
    if how is None or how.device != "cpu" or how.dtype not in TIMED_DTYPES:
        return None
    return for_models(
        how.target,
        how.drafter,
        how.verification,
        threads or torch.get_num_threads(),
        how.dtype,
        chosen_by="as loaded",
    )
