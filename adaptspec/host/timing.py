"""A short timing of the engine's passes on this host, by rows and verified tokens per row.

:func:`time_rounds` runs :func:`~adaptspec.batching.cost_surface.measure_surface` (the engine's own
drafter pass and :func:`~adaptspec.batching.target_pass.verify_rows` pass, on rows of
:data:`CONTEXT` tokens) on the grid :data:`GRID`, each figure the fastest of :data:`REPEATS`
passes after a warm-up, counted in the process's CPU seconds on one torch thread: the passes' own
work, which the waits for a core on a shared host (other programs, other agents) do not inflate
as they inflate wall time. What a round costs in wall time at the engine's threads differs from
this by a factor common to the block sizes, to first order, which the controller's machine-speed
calibration learns (:mod:`adaptspec.costs.machine_speed`); what decides between block sizes and
dtypes is the curve's shape, which this measures. :func:`fit_host_profile` fits a
:class:`~adaptspec.costs.latency.LatencyProfile` to the records
(:func:`~adaptspec.costs.latency.fit_profile`; past the sizes timed, the last slopes).

Its cost: 9 cells of ``REPEATS + 1`` passes a dtype; BENCHMARKS.md ("The host measurement") gives
the seconds measured.
"""

from __future__ import annotations

from typing import Any, Sequence

#: (rows, block sizes) timed: one row at the sizes a request chooses among, four rows at a few
#: (the batch axis of the curve; more rows are priced by the fit's slopes).
GRID: tuple[tuple[int, tuple[int, ...]], ...] = ((1, (1, 2, 3, 4, 6, 8)), (4, (1, 2, 4)))
REPEATS = 3
#: context tokens of each row
CONTEXT = 128


def time_rounds(
    speculator: Any,
    grid: Sequence[tuple[int, Sequence[int]]] = GRID,
    context: int = CONTEXT,
    repeats: int = REPEATS,
) -> list[dict]:
    """Draft and verify CPU seconds of every (rows, block size) of ``grid`` on ``speculator`` (a
    :class:`~adaptspec.decoding.SpeculativeDecoder`), on one torch thread (restored after); block
    sizes past its drafter's largest are left out. Records as
    :func:`~adaptspec.costs.latency.fit_profile` reads them."""
    import torch

    from ..batching.cost_surface import measure_surface

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out: list[dict] = []
        for rows, sizes in grid:
            sizes = [b for b in sizes if b <= speculator.max_block_size]
            out += measure_surface(
                speculator.target,
                speculator.drafter,
                rows=[rows],
                tokens=sizes,
                contexts=[context],
                repeats=repeats,
                cpu_time=True,
            )
        return out
    finally:
        torch.set_num_threads(threads)


def fit_host_profile(records: list[dict], name: str, source: str) -> Any:
    """The latency profile of ``records``, named ``name`` (at their one context: no context terms)."""
    from ..costs.latency import fit_profile

    return fit_profile(records, name, source=source)
