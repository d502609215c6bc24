"""Which policy a controller runs: the product default, a policy built from a spec (a head's
arms win over the default arms), the featurizer saved next to a policy's head, and the latency
profile its head's rewards were timed with (the controller's machine-speed reference).
:func:`setup_policy` resolves all of it for one controller (:class:`PolicySetup`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import AdaptspecError
from .context import LOAD_FEATURES
from ..policies.featurizer import Featurizer
from ..models.bundled import BUNDLED_HEAD  # the head trained on the bundled default (benchmark) traces, with its featurizer

#: Block sizes a policy built from a spec chooses among (those up to the drafter's maximum);
#: the same as the template trace set's (``adaptspec/data/traces/templates``). A head-based
#: spec, the default policy included, uses its head's arms instead (the bundled head's: 1, 2, 3, 4, 6, 8, 12, 16).
DEFAULT_ARMS = (1, 2, 4, 6, 8, 10, 12, 16, 20, 24)

log = logging.getLogger("adaptspec.control.controller")


def default_policy_spec(head: str | Path | None = None, speculator: Any = None) -> str:
    """The product default: NeuralLinear over ``head`` (default: the bundled head) if it exists, else UCB.

    UCB is the context-free fallback while no trained head is available, or, given
    ``speculator``, when the head does not fit it: a head trained for block sizes beyond the
    speculator's ``max_block_size``, or for prefill features of another width (another model).
    """
    h = Path(head) if head is not None else BUNDLED_HEAD
    if not (h / "config.json").is_file():
        return "ucb"
    if speculator is not None and not head_fits(h, speculator):
        return "ucb"
    return f"neural-linear:head={h}"


def head_fits(head: Path, speculator: Any) -> bool:
    """Whether ``head`` can run on ``speculator``: its arms up to the speculator's
    ``max_block_size``, its input as wide as the speculator's prefill features (when known)."""
    from ..policies.offline_head import HeadModel

    model = HeadModel.load(head)
    if max(model.arms) > int(getattr(speculator, "max_block_size", 0) or 0):
        return False
    width = getattr(getattr(speculator, "target", None), "feature_dim", None)
    if width is None:
        return True
    want = Featurizer.load(head).in_dim if Featurizer.exists(head) else model.in_dim
    return int(width) == int(want)


def make_learner(policy: Any, arms: Sequence[int] | None, max_block_size: int, seed: int | None) -> tuple[str | None, Any]:
    """``(spec, policy)`` for :class:`~adaptspec.control.controller.AdaptiveController`'s ``policy`` argument.

    None means :func:`default_policy_spec`; a spec string is built over ``arms`` (default:
    :data:`DEFAULT_ARMS` up to ``max_block_size``; a head-based spec uses its head's arms); a
    policy object is checked to be one (``spec`` is then None) and must have ``arms`` if given.
    """
    if policy is None:
        policy = default_policy_spec()
    if isinstance(policy, str):
        from ..policies.spec import make_policy

        cand = tuple(arms) if arms is not None else tuple(a for a in DEFAULT_ARMS if a <= max_block_size)
        return policy, build_policy(make_policy, policy, cand, seed)
    learner = policy
    for name in ("decide", "update", "arms"):
        if not hasattr(learner, name):
            raise AdaptspecError(f"policy {type(learner).__name__} has no {name}: not a block-size policy")
    if arms is not None and tuple(sorted(arms)) != tuple(learner.arms):
        raise AdaptspecError(f"arms {list(arms)} differ from the policy's {list(learner.arms)}")
    return None, learner


def spec_head(policy_spec: str | None) -> Path | None:
    """The head directory a policy spec names; None for a spec without a head.

    ``neural-linear`` takes its head as ``head=`` or its first value and defaults to the bundled
    one; ``head`` takes ``path=`` or its first value; ``squarecb`` only ``head=`` (its first value
    is ``gamma``).
    """
    if policy_spec is None:
        return None
    from ..policies.spec import parse_spec

    name, args, opts = parse_spec(policy_spec)
    if name == "neural-linear":
        h = opts.get("head") or (args[0] if args else None) or BUNDLED_HEAD
    elif name == "head":
        h = opts.get("path") or (args[0] if args else None)
    elif name == "squarecb":
        h = opts.get("head")
    else:
        h = None
    return None if h is None else Path(h).expanduser()


def resolve_featurizer(featurizer: Any, policy_spec: str | None) -> Featurizer | None:
    """A :class:`~adaptspec.policies.featurizer.Featurizer`, the one saved in directory ``featurizer``, or
    (None) the one saved next to the head of ``policy_spec`` if there is one."""
    if isinstance(featurizer, Featurizer):
        return featurizer
    if featurizer is not None:
        return Featurizer.load(featurizer)
    h = spec_head(policy_spec)
    if h is not None and Featurizer.exists(h):
        return Featurizer.load(h)
    return None


def resolve_machine_speed(speed_reference: Any, learner: Any, reward: Any) -> Any:
    """The controller's :class:`~adaptspec.reward.machine_speed.MachineSpeed`, or None (no calibration).

    ``"auto"``: the latency profile the policy's head was trained on (the ``info["timings"]`` of
    its ``head``, which the head-based policies, NeuralLinear, OfflineHead and SquareCB, carry),
    when the reward is measured on this machine; ``None``: none; a profile (name, path or
    object): that one.
    """
    from ..reward.machine_speed import MEASURED_REWARDS, MachineSpeed
    from ..policies.offline_head import HeadModel

    if speed_reference is None:
        return None
    measured = isinstance(reward, str) and reward in MEASURED_REWARDS
    if isinstance(speed_reference, str) and speed_reference == "auto":
        head = getattr(learner, "head", None)
        timings = head.info.get("timings") if isinstance(head, HeadModel) else None
        if not measured or not timings:
            return None
        try:
            return MachineSpeed(timings)
        except AdaptspecError as e:  # e.g. a profile file that stayed on the machine the head was trained on
            log.warning("the policy's head was timed with latency profile %r, which is not available here (%s): "
                        "learning from uncalibrated rewards; pass speed_reference=PROFILE to calibrate", timings, e)
            return None
    if not measured:
        raise AdaptspecError(f"speed_reference calibrates measured rewards ({', '.join(MEASURED_REWARDS)}); "
                             f"the reward is {reward if isinstance(reward, str) else 'a custom function'}")
    return MachineSpeed(speed_reference)


def build_policy(make_policy: Callable[..., Any], spec: str, arms: tuple[int, ...], seed: int | None) -> Any:
    """The policy of ``spec`` over ``arms``, or over its head's arms when it names a head."""
    h = spec_head(spec)
    if h is not None and (h / "config.json").is_file():  # a head decides the arms
        from ..policies.offline_head import HeadModel

        arms = HeadModel.load(h).arms
    return make_policy(spec, arms, seed=seed)  # a missing head is the policy's own error


@dataclass
class PolicySetup:
    """What a controller runs, resolved against its speculator: the policy (``learner``, from
    ``spec`` when it came from one), its checked ``arms``, ``label``, whether it is ``contextual``,
    the ``featurizer``, the checked ``fallback_block_size``, the reward function and the
    machine-speed calibration (or None)."""

    spec: str | None
    learner: Any
    arms: tuple[int, ...]
    label: str
    contextual: bool
    featurizer: Featurizer | None
    fallback_block_size: int
    reward_fn: Callable[[Any], float]
    machine_speed: Any


def setup_policy(policy: Any, config: Any, max_block_size: int) -> PolicySetup:
    """Build and check the policy side of a controller from its ``policy`` argument and its
    :class:`~adaptspec.control.config.ControllerConfig`, for a speculator's ``max_block_size``."""
    from ..reward.functions import reward_function
    from .block_sizes import check_arms, choose_fallback

    spec, learner = make_learner(policy, config.arms, max_block_size, config.seed)
    arms = check_arms(learner, config.arms, max_block_size)
    label = str(getattr(learner, "label", type(learner).__name__))
    contextual = bool(getattr(learner, "contextual", True))
    featurizer = resolve_featurizer(config.featurizer, spec)
    dim = getattr(learner, "dim", None)
    if featurizer is not None and dim is not None and contextual:
        extra = len(LOAD_FEATURES) if config.load_features else 0
        if dim != featurizer.out_dim + extra:
            with_load = f" + {extra} load features" if extra else ""
            raise AdaptspecError(f"the featurizer gives {featurizer.out_dim} values{with_load}, policy {label} expects {dim}"
                                 f"{' (load_features is chosen when the policy is created)' if extra else ''}")
    fallback = choose_fallback(config.fallback_block_size, arms)
    reward_fn = config.reward if callable(config.reward) else reward_function(config.reward, config.latency)
    machine_speed = resolve_machine_speed(config.speed_reference, learner, config.reward)
    return PolicySetup(spec, learner, arms, label, contextual, featurizer, fallback, reward_fn, machine_speed)
