"""The parts of :class:`adaptspec.control.controller.AdaptiveController`, one concern per module.

- :mod:`~adaptspec.control.policy_build`: which policy a controller runs: the product default
  (:func:`~adaptspec.control.policy_build.default_policy_spec`), a policy built from a spec,
  the featurizer that goes with it;
- :mod:`~adaptspec.control.block_sizes`: where block sizes enter the controller and are
  checked, once: the arms, the fallback block size, each decision a policy returns, the
  block sizes of a reported outcome;
- :mod:`~adaptspec.control.feedback`: decisions waiting for feedback, what each feedback
  does (applied, duplicate, late, expired, dropped), logging it, the counters;
- :mod:`~adaptspec.control.workers`: the decision thread (policy snapshots) and the update
  thread (applying feedback, housekeeping), and the lock around the speculator;
- :mod:`~adaptspec.control.checkpoints`: writing checkpoints, resuming from the newest and
  replaying the decision log after it.

The request loop (prefill, decide, decode, reward) and the public API stay in
:mod:`adaptspec.control.controller`; the classes here are mixins of its one class and share its state.
"""


def __getattr__(name: str):
    # lazy, as in adaptspec/__init__.py: importing one part (block_sizes, say) loads no policy or torch
    if name == "AdaptiveController":
        from .controller import AdaptiveController

        return AdaptiveController
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
