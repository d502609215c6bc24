"""A policy whose misbehaviour a test switches while vLLM runs.

The plug-in builds a variant's policy from its spec, so this module puts :class:`Misbehaving` in
adaptspec's policy registry as ``misbehaving`` when it is imported, and re-exports the plug-in's
own scheduler class: an engine given ``scheduler_cls=SCHEDULER`` imports this module where vLLM
imports its scheduler class (after its worker is up: importing adaptspec's policies loads numba,
after which vLLM 0.32 cannot start a worker, ``conftest.make_llm``), runs
:class:`~adaptspec.vllm.AdaptiveScheduler` unchanged, and ``{"variants": {"S": "misbehaving"}}``
makes its controller decide with :class:`Misbehaving` (the engine runs in the test's process). It
chooses block size 2 unless :attr:`Misbehaving.mode` says otherwise:

- ``sleep``: each decision takes :attr:`Misbehaving.sleep_s` seconds first;
- ``never``: a decision waits until :attr:`Misbehaving.release` is set (a policy that never returns);
- ``raise``: a decision raises;
- ``invalid``: a decision names block size 99, an arm it does not have;
- ``update``: decisions are right, every update raises.
"""

from __future__ import annotations

import threading
import time

from adaptspec.policies.baselines import Fixed
from adaptspec.policies.spec import REGISTRY
from adaptspec.speculator import Decision
from adaptspec.vllm.scheduler import AdaptiveScheduler

__all__ = ["AdaptiveScheduler", "Misbehaving", "SCHEDULER", "SPEC"]

#: the engine's ``scheduler_cls``: the plug-in's class, named through this module
SCHEDULER = "_misbehaving.AdaptiveScheduler"
#: the policy spec of a variant deciding with :class:`Misbehaving`
SPEC = "misbehaving"


class Misbehaving(Fixed):
    """Block size 2, or the misbehaviour :attr:`mode` names (see the module docstring)."""

    name = SPEC
    mode = "fast"
    sleep_s = 8.0
    release = threading.Event()

    def __init__(self, arms, seed=None) -> None:
        super().__init__(2, arms=arms, seed=seed)

    def decide(self, context=None) -> Decision:
        mode = Misbehaving.mode
        if mode == "sleep":
            time.sleep(Misbehaving.sleep_s)
        elif mode == "never":
            Misbehaving.release.wait()
        elif mode == "raise":
            raise RuntimeError("the policy is down")
        d = super().decide(context)
        if mode == "invalid":
            return Decision(99, d.propensity, d.probs, d.arms, d.policy, d.version)
        return d

    def _update(self, context, arm, reward) -> None:
        if Misbehaving.mode == "update":
            raise RuntimeError("the policy's update is down")


REGISTRY[SPEC] = Misbehaving
