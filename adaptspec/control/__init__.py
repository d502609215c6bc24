"""The controller and its parts: each part an object the controller owns and calls, each in its
own module, each given what it needs when it is built (none of them sees the controller).

- :mod:`~adaptspec.control.controller`: :class:`AdaptiveController`, the request loop
  (prefill, decide, decode, feedback) and the public API; it builds the parts below;
- :mod:`~adaptspec.control.generation`: what ``generate`` returns
  (:class:`~adaptspec.control.generation.Generation`), :class:`~adaptspec.control.generation.PrefillError`,
  the split of one outcome among re-decisions;
- :mod:`~adaptspec.control.protocol`: the speculator checked against the protocol (methods,
  signatures, ``max_block_size``, the optional ``feature_dim`` and ``per_round``), or an
  engine's arms: the :class:`~adaptspec.control.protocol.DecoderShape` the rest is decided from;
- :mod:`~adaptspec.control.config`: :class:`~adaptspec.control.config.ControllerConfig`, the
  constructor's settings as given, each checked once;
- :mod:`~adaptspec.control.policy_build`: which policy a controller runs (the default chosen
  from the decoder, a policy built from a spec, the featurizer and machine-speed reference that
  go with it), resolved against the decoder in :func:`~adaptspec.control.policy_build.setup_policy`;
- :mod:`~adaptspec.control.context`: :class:`~adaptspec.control.context.Contexts`, the one
  place a request's context is made (today the prefill features, featurized);
- :mod:`~adaptspec.control.decider`: :class:`~adaptspec.control.decider.Decider`, deciding on
  a snapshot of the policy on the decision thread, with the fallback;
- :mod:`~adaptspec.control.block_sizes`: where block sizes enter and are checked, once: the
  arms, the fallback block size, each decision a policy returns (``check_decision``), the
  block sizes of a reported outcome;
- :mod:`~adaptspec.control.book`: :class:`~adaptspec.control.book.DecisionBook`, the pending
  decisions and what each feedback does (applied, duplicate, late, expired, dropped), writing
  rows to the decision log and queueing their updates in one order, the counters;
- :mod:`~adaptspec.control.updates`: the learning policy
  (:class:`~adaptspec.control.updates.Learner`), the update queue and the update thread
  (:class:`~adaptspec.control.updates.UpdateWorker`: applying in log order, publishing
  snapshots, housekeeping);
- :mod:`~adaptspec.control.checkpointer`: :class:`~adaptspec.control.checkpointer.Checkpointer`,
  writing checkpoints, resuming from the newest and replaying the decision log after it;
- :mod:`~adaptspec.control.policy_checkpoint`: the checkpoint format.
"""


def __getattr__(name: str):
    # lazy, as in adaptspec/__init__.py: importing one part (block_sizes, say) loads no policy or torch
    if name == "AdaptiveController":
        from .controller import AdaptiveController

        return AdaptiveController
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
