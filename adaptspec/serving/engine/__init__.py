"""The decoding side of the server: what runs a checked request (a :class:`~adaptspec.serving.runner.Runner`).

- :mod:`~adaptspec.serving.engine.batched`: adaptspec's own target and drafter, every request a
  row of one continuous-batching engine (:class:`BatchedRunner`, :class:`EngineSettings`);
- :mod:`~adaptspec.serving.engine.loop`: the engine's thread, its queue and tickets;
- :mod:`~adaptspec.serving.engine.switchback`: the switchback A/B design over the engine's rounds;
- :mod:`~adaptspec.serving.engine.sequential` and :mod:`~adaptspec.serving.engine.halting`: a
  speculator of one's own, one request at a time through its controller.

Nothing here knows HTTP; the HTTP side (:mod:`adaptspec.serving.app` and its helpers) knows only
the :class:`~adaptspec.serving.runner.Runner` protocol, through the service.
"""
