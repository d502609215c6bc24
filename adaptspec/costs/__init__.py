"""What a round or a pass costs: the models the controller's pricing, the load rules and the
simulators read.

- :mod:`~adaptspec.costs.pass_costs`: :class:`~adaptspec.costs.pass_costs.PassCosts`, what a pass of
  R rows x B tokens costs: the one interface every cost model answers (a latency profile, the
  vLLM plug-in's measured steps) and a batched round's price and the load rules read;
- :mod:`~adaptspec.costs.latency`: the latency profiles, seconds of a draft and a verify pass by
  block size, context and batch, their curves and their fits (the simulators' clock);
- :mod:`~adaptspec.costs.measured`: the curves learnt from the rounds a decoder reports;
- :mod:`~adaptspec.costs.machine_speed`: how fast this machine is against a latency profile,
  learnt online, so measured rewards stay in a head's units;
- :mod:`~adaptspec.costs.rows_pass`: the decoding rows' share of a pass that also carried prompt
  chunks.

What runs the engine to measure these (the host's timing, the engine's cost surface) stays
beside the engine: :mod:`adaptspec.host`, :mod:`adaptspec.batching.cost_surface`.
"""
