"""OpenMP's spin on a machine whose cores are already busy: short, so that waiting wastes little.

torch's CPU kernels run on OpenMP (libgomp in the pip wheels for Linux). Between two parallel
regions libgomp's idle team members spin before they sleep: 300,000 turns of a busy-wait loop
by default, about 3 ms here. With the cores to itself a process gains from that (the next
region starts at once); when other work wants the same cores, a team member waiting for a
descheduled one burns its whole spin at every region, the process loses its share and its
neighbours theirs: 2-thread decoding on 2 shared cores ran an order of magnitude slower or worse
(BENCHMARKS.md, "Shared cores"). 10,000 turns (about 0.1 ms here) made it many times faster there,
but cost a few percent with the cores to itself; so
the short spin is set only when
the machine is already busy as the command starts (1-minute load average of at least
:data:`BUSY_LOAD`). Processes started together on idle cores are not seen this way: for them
set ``GOMP_SPINCOUNT=10000`` (or ``OMP_WAIT_POLICY=PASSIVE``, or use one thread) yourself.

The spin decides only how long threads wait, never what they compute: results are the same
whatever it is. libgomp reads the variable once, when torch is loaded, so :func:`apply` acts
on this process only before the first ``import torch`` (the CLI's ``main`` calls it first
thing); child processes inherit it. A value the user set wins, and so does
``OMP_WAIT_POLICY`` (an explicit ``GOMP_SPINCOUNT`` would override the policy's own spin).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

#: Busy-wait turns before an idle OpenMP thread sleeps, on a busy machine (libgomp's default: 300,000).
SPIN_COUNT = "10000"
#: The 1-minute load average from which the machine counts as busy (half a core's work).
BUSY_LOAD = 0.5


def spin_count(environ: Mapping[str, str], load: float) -> str | None:
    """The ``GOMP_SPINCOUNT`` to set given the environment and the machine's load, or None.

    >>> spin_count({}, 1.8), spin_count({}, 0.1)
    ('10000', None)
    >>> spin_count({"GOMP_SPINCOUNT": "300000"}, 1.8), spin_count({"OMP_WAIT_POLICY": "ACTIVE"}, 1.8)
    (None, None)
    """
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return None
    return SPIN_COUNT if load >= BUSY_LOAD else None


def apply(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Set ``GOMP_SPINCOUNT`` in ``environ`` when :func:`spin_count` says so; the value set, or None."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this system: leave OpenMP as it is
        return None
    value = spin_count(environ, load)
    if value is not None:
        environ["GOMP_SPINCOUNT"] = value
    return value
