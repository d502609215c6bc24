"""Collection: what a speculator does on real prompts, recorded as traces.

- :mod:`~adaptspec.collect.every_arm`: every candidate block size on every prompt (a
  full-information trace set); :func:`collect_traces` runs any
  :class:`~adaptspec.speculator.BlockSpeculator`, yours included (docs/bring-your-own.md);
- :mod:`~adaptspec.collect.dense`: at T = 0, how many drafts the target accepts at every
  position and block size, from one greedy pass;
- :mod:`~adaptspec.collect.ray_tasks`: the same collections, and replay sweeps, as Ray tasks.
"""

__all__ = ["collect_traces"]


def __getattr__(name: str):
    # lazy, as in adaptspec/__init__.py: importing the package loads no trace-set code
    if name == "collect_traces":
        from .every_arm import collect_traces

        return collect_traces
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
