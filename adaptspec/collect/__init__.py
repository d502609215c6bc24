"""Collection: what a speculator does on real prompts, recorded as traces.

- :mod:`~adaptspec.collect.every_arm`: every candidate block size on every prompt (a
  full-information trace set);
- :mod:`~adaptspec.collect.dense`: at T = 0, how many drafts the target accepts at every
  position and block size, from one greedy pass;
- :mod:`~adaptspec.collect.ray_tasks`: the same collections, and replay sweeps, as Ray tasks.
"""
