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
from ..paths import (
    BUNDLED_HEAD,  # the head trained on the bundled default (benchmark) traces, with its featurizer
)
from ..policies.featurizer import Featurizer
from .context import LOAD_FEATURES

#: Block sizes a policy built from a spec chooses among (those up to the drafter's maximum, and
#: the maximum itself: :func:`default_arms`); the same as the template trace set's
#: (``adaptspec/data/traces/templates``). A head-based spec, the bundled default included, uses
#: its head's arms instead (the bundled head's: 1, 2, 3, 4, 6, 8, 12, 16).
DEFAULT_ARMS = (1, 2, 4, 6, 8, 10, 12, 16, 20, 24)

#: the default where speculating cannot pay on the host (:func:`default_on_host`): plain decoding
PLAIN_SPEC = "fixed:1"

log = logging.getLogger("adaptspec.control.controller")


def default_arms(max_block_size: int) -> tuple[int, ...]:
    """The block sizes a policy built from a spec chooses among on a drafter of ``max_block_size``:
    :data:`DEFAULT_ARMS` up to it, and the maximum itself.

    >>> default_arms(8), default_arms(5), default_arms(16)
    ((1, 2, 4, 6, 8), (1, 2, 4, 5), (1, 2, 4, 6, 8, 10, 12, 16))
    """
    return tuple(sorted({a for a in DEFAULT_ARMS if a <= max_block_size} | {int(max_block_size)}))


def cold_policy_spec(arms: Sequence[int], full_information: bool = True) -> str:
    """The policy a decoder starts with when no trained head fits it: the one that learns best
    from nothing over ``arms``. ``full_information``: the controller feeds every block size's
    counterfactual reward (:mod:`adaptspec.control.full_feedback`; not with a custom reward
    function). A fleet shares them too (:class:`adaptspec.fleet.stats.FullInfo`).

    With full information, ``fi-ucb``: UCB learning every block size a request's rounds reveal.
    Replayed cold on prompts the project never saw (336 dense benchmark prompts, arms 1-16,
    ``cpu-smollm2-fast``, 20 orders; docs/evaluation.md section 9) it earns 98.7% of the best
    fixed block size in its first 48 requests and 99.7% by 240 (98.75% / 99.75% over the default
    arms up to 16), where ``ucb`` earns 92.7% / 97.5% and LinUCB and SquareCB 87-88%; fed the arm
    that ran alone it would earn 91.0% / 94.1%, so without full information, ``ucb``. The one
    place this choice is made: switch it here when a better cold learner lands.

    >>> cold_policy_spec((1, 2, 4, 8)), cold_policy_spec((1, 2, 4, 8), full_information=False)
    ('fi-ucb', 'ucb')
    """
    return "fi-ucb" if full_information else "ucb"


@dataclass(frozen=True)
class PolicyChoice:
    """Which policy a controller runs and why, in words (logged once, in ``stats()``); ``arms``,
    when the choice names its own (a default that added tree arms: :func:`tree_default`)."""

    spec: str | None
    reason: str
    arms: tuple[int, ...] | None = None

    def __str__(self) -> str:
        return f"{self.spec or 'a policy object'}: {self.reason}"


def choose_default_policy(
    max_block_size: int,
    feature_dim: int | None,
    arms: Sequence[int] | None = None,
    head: str | Path | None = None,
    full_information: bool = True,
) -> PolicyChoice:
    """The product default for a decoder of ``max_block_size`` whose prefill features have
    ``feature_dim`` values (None: not declared), decoding only ``arms`` when given: NeuralLinear
    over ``head`` (default: the bundled head) where it fits (:func:`head_misfit`), else
    :func:`cold_policy_spec` over ``arms`` (default: :func:`default_arms`), with
    ``full_information`` when the controller will have it.

    >>> choose_default_policy(8, 40).reason
    'no head fits: the bundled head has arms up to 16, beyond max_block_size 8; cold start over arms [1, 2, 4, 6, 8]'
    """
    h = Path(head) if head is not None else BUNDLED_HEAD
    which = "the bundled head" if head is None else f"head {h}"
    why = (
        f"{which} is not installed"
        if not (h / "config.json").is_file()
        else head_misfit(h, max_block_size, feature_dim, arms)
    )
    if why is None:
        return PolicyChoice(
            f"neural-linear:head={h}",
            f"{which} fits: its block sizes are within max_block_size "
            f"{max_block_size} and it reads the decoder's {feature_dim} "
            "feature values",
        )
    cold = tuple(sorted(int(a) for a in arms)) if arms is not None else default_arms(max_block_size)
    return PolicyChoice(
        cold_policy_spec(cold, full_information), f"no head fits: {why}; cold start over arms {list(cold)}"
    )


#: The bundled drafter's tokens a round with the best tree of N nodes (``FixedTree(N)``: fast
#: verification, T = 0, bfloat16, 128 tokens; 12 public gsm8k prompts, offset 346): the prior a
#: host's curve prices tree arms with, as the bundled trace set's acceptance prices block sizes
#: (:func:`adaptspec.host.pricing.prior_tokens_per_round`). Measured by
#: ``benchmarks/bench_trees.py`` (BENCHMARKS.md, "Draft trees"; the chains on those prompts
#: committed 1.50-1.53 tokens a round at B = 3-6, under the bundled set's 1.54-1.60, so the
#: prior favours trees less than chains, if anything).
TREE_PRIOR_TAU = {4: 1.69, 8: 1.91, 16: 1.99, 32: 2.15, 64: 2.28}
#: The trees a default adds where draft trees pay on the host (:func:`tree_default`): the best
#: trees of these many nodes, those the prior was measured at.
DEFAULT_TREE_NODES = tuple(sorted(TREE_PRIOR_TAU))
#: Where a 4-token verify costs more than this many times a 1-token one, the default never plays a
#: draft tree (issue 47): a wide pass is not cheap there.
TREE_VERIFY_RATIO = 1.5
#: The best tree must beat the best chain at the prior's acceptance by this share for the default to
#: add trees: the bar issue 47 sets for trees (1.10x the best chain's tok/s). The prior is one
#: drafter's mean, and the tree arms' exploration costs, so a tree that only ties is not added
#: (what trees measured, and why the default keeps chains there: BENCHMARKS.md, "Draft trees").
TREE_MARGIN = 0.10


def tree_default(
    profile: Any,
    chain_speeds: dict[int, float],
    chain_arms: Sequence[int],
    prior: dict[int, float] | None = None,
) -> tuple[PolicyChoice, int] | None:
    """Where draft trees pay on ``profile`` (a host's curve): ``fi-ucb`` over ``chain_arms`` and the
    tree arms of the prior (:data:`DEFAULT_TREE_NODES` by default), with the best tree at the
    prior's acceptance as the fallback; None (no tree) where a 4-token verify costs more than
    :data:`TREE_VERIFY_RATIO` times a 1-token one, or where the best tree at ``prior`` (default
    :data:`TREE_PRIOR_TAU`) is not :data:`TREE_MARGIN` faster than the best of ``chain_speeds``
    (tokens a second by block size). A host's curve is timed at up to 8 positions
    (:data:`adaptspec.host.timing.GRID`): a larger tree's verify is priced by its last slope.
    The learner starts from the largest tree, which shows every smaller tree and most chains
    (full information, :func:`adaptspec.decoding.tree_outcomes.round_outcomes`)."""
    from ..host.pricing import expected_speeds
    from ..speculator import arm_label, tree_arm

    ratio = float(profile.verify_s(4)) / float(profile.verify_s(1))
    if ratio > TREE_VERIFY_RATIO:
        return None
    prior = TREE_PRIOR_TAU if prior is None else prior
    trees = expected_speeds(profile, {tree_arm(n): t for n, t in prior.items()})
    best_tree = max(trees, key=lambda a: trees[a])
    best_chain = max(chain_speeds.values())
    if trees[best_tree] < best_chain * (1 + TREE_MARGIN):
        return None
    arms = tuple(sorted({int(a) for a in chain_arms} | set(trees)))
    why = (
        f"draft trees pay on this host: a 4-token verify costs {ratio:.2f}x a 1-token one (at most "
        f"{TREE_VERIFY_RATIO}), and the best tree at the prior's acceptance ({arm_label(best_tree)}) decodes "
        f"{trees[best_tree] / best_chain:.2f}x the best chain; full-information UCB over chains and trees, "
        f"the largest tree first"
    )
    return PolicyChoice("fi-ucb", why, arms), best_tree


def default_on_host(
    max_block_size: int,
    feature_dim: int | None,
    arms: Sequence[int] | None = None,
    host: Callable[[], Any] | None = None,
    full_information: bool = True,
    trees: bool = False,
) -> tuple[PolicyChoice, int | None]:
    """The product default priced by this host's curve, and the block size its late decisions play.

    :func:`choose_default_policy`; where that is the bundled head and ``host`` gives this host's
    :class:`~adaptspec.host.HostChoice` (``host()``, called only then: :func:`adaptspec.host.for_speculator`
    or :func:`adaptspec.host.for_models`, which time the host once, about 15 CPU seconds, and then
    read the cached record; None where nothing times the decoder), NeuralLinear over the head
    re-priced by the host's curve instead, with the host's best block size as the fallback.
    Where no block size beyond 1 pays on the host's curve at the prior's acceptance, by
    :data:`~adaptspec.host.pricing.PAYS_MARGIN` (``speculation_pays`` false: the AVX2 kind of
    CPU, BENCHMARKS.md), the default is plain
    decoding, ``fixed:1``, from the first request to the last: a request the head would have
    speculated on costs more than it can win there, and the drafter's pass is never run. The
    fallback is None (the controller's own default) otherwise. Where the decoder verifies draft trees
    (``trees``: it declares ``draft_trees``), no arms were given and trees pay on the host's curve,
    :func:`tree_default` instead. ``AdaptiveController(speculator)`` and ``adaptspec serve`` both
    choose their default here."""
    choice = choose_default_policy(max_block_size, feature_dim, arms, full_information=full_information)
    if host is None or choice.spec != f"neural-linear:head={BUNDLED_HEAD}":
        return choice, None
    priced = host()
    if priced is None or priced.head is None:
        return choice, None
    if not priced.speculation_pays:
        return PolicyChoice(
            PLAIN_SPEC,
            f"speculation cannot pay on this host's curve ({priced.dtype}: no block "
            "size beyond 1 beats plain decoding by the margin at the prior's acceptance, "
            "adaptspec.host.pricing.PAYS_MARGIN): plain decoding; give a policy to "
            "speculate anyway",
        ), 1
    here = choose_default_policy(
        max_block_size, feature_dim, arms, head=priced.head, full_information=full_information
    )
    if here.spec != f"neural-linear:head={priced.head}":
        return choice, None
    if trees and arms is None and full_information:
        from ..policies.offline_head import HeadModel

        with_trees = tree_default(priced.profile, priced.speeds, HeadModel.load(priced.head).arms)
        if with_trees is not None:
            return with_trees
    why = (
        f"the bundled head fits (its block sizes within max_block_size {max_block_size}, the decoder's "
        f"{feature_dim} feature values), re-priced by this host's curve ({priced.dtype}; best block size at the "
        f"prior's acceptance {priced.best_block_size}, the fallback)"
    )
    return PolicyChoice(here.spec, why), int(priced.best_block_size)


def default_policy_spec(head: str | Path | None = None, speculator: Any = None) -> str:
    """The product default's spec: NeuralLinear over ``head`` (default: the bundled head) if it
    exists, else :func:`cold_policy_spec`.

    Given ``speculator``, the head must fit it, read through the protocol only
    (:class:`~adaptspec.speculator.BlockSpeculator`: ``max_block_size`` and the declared
    ``feature_dim``): see :func:`choose_default_policy`, the rule the controller applies.
    """
    if speculator is None:
        h = Path(head) if head is not None else BUNDLED_HEAD
        return f"neural-linear:head={h}" if (h / "config.json").is_file() else cold_policy_spec(DEFAULT_ARMS)
    from .protocol import speculator_shape

    shape = speculator_shape(speculator)
    return choose_default_policy(shape.max_block_size, shape.feature_dim, head=head).spec or ""


def head_misfit(
    head: Path, max_block_size: int, feature_dim: int | None, arms: Sequence[int] | None = None
) -> str | None:
    """Why ``head`` cannot run on a decoder of ``max_block_size`` with ``feature_dim`` feature
    values (decoding only ``arms`` when given), in words; None when it fits. A decoder that
    declares no width does not fit: the head's would be a guess."""
    from ..policies.offline_head import HeadModel

    model = HeadModel.load(head)
    name = "the bundled head" if Path(head) == BUNDLED_HEAD else f"head {head}"
    if arms is not None and not set(model.arms) <= {
        int(a) for a in arms
    }:  # the arms given, in the caller's words
        return f"{name} has arms {list(model.arms)}, not all among the arms {sorted(int(a) for a in arms)}"
    if max(model.arms) > max_block_size:
        return f"{name} has arms up to {max(model.arms)}, beyond max_block_size {max_block_size}"
    want = Featurizer.load(head).in_dim if Featurizer.exists(head) else model.in_dim
    if feature_dim is None:
        return f"{name} reads {want} feature values and the decoder declares no feature_dim"
    if int(feature_dim) != int(want):
        return f"{name} reads {want} feature values, the decoder's features have {feature_dim}"
    return None


def make_learner(
    policy: Any, arms: Sequence[int] | None, max_block_size: int, seed: int | None
) -> tuple[str | None, Any]:
    """``(spec, policy)`` for :class:`~adaptspec.control.controller.AdaptiveController`'s ``policy`` argument.

    A spec string is built over ``arms`` (default: :func:`default_arms` of ``max_block_size``; a
    head-based spec uses its head's arms); a policy object is checked to be one (``spec`` is
    then None) and must have ``arms`` if given.
    """
    if isinstance(policy, str):
        from ..policies.spec import make_policy

        cand = tuple(arms) if arms is not None else default_arms(max_block_size)
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
    """The controller's :class:`~adaptspec.costs.machine_speed.MachineSpeed`, or None (no calibration).

    ``"auto"``: the latency profile the policy's head was trained on (the ``info["timings"]`` of
    its ``head``, which the head-based policies, NeuralLinear, OfflineHead and SquareCB, carry),
    when the reward is measured on this machine; ``None``: none; a profile (name, path or
    object): that one.
    """
    from ..costs.machine_speed import MEASURED_REWARDS, MachineSpeed
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
            log.warning(
                "the policy's head was timed with latency profile %r, which is not available here (%s): "
                "learning from uncalibrated rewards; pass speed_reference=PROFILE to calibrate",
                timings,
                e,
            )
            return None
    if not measured:
        raise AdaptspecError(
            f"speed_reference calibrates measured rewards ({', '.join(MEASURED_REWARDS)}); "
            f"the reward is {reward if isinstance(reward, str) else 'a custom function'}"
        )
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
    """What a controller runs, resolved against its decoder: the policy (``learner``, from
    ``spec`` when it came from one), its checked ``arms``, ``label``, whether it is ``contextual``,
    the ``featurizer``, the checked ``fallback_block_size``, the reward function, the
    machine-speed calibration (or None), which policy was chosen and why (``choice``), and the
    width of the prefill features the policy reads (``reads``: its featurizer's input, or its own
    dimension; None when it does not say). Whether that fits the decoder is
    :func:`~adaptspec.control.context_width.settle_width`'s to say."""

    spec: str | None
    learner: Any
    arms: tuple[int, ...]
    label: str
    contextual: bool
    featurizer: Featurizer | None
    fallback_block_size: int
    reward_fn: Callable[[Any], float]
    machine_speed: Any
    choice: PolicyChoice
    reads: int | None = None


def setup_policy(policy: Any, config: Any, shape: Any, host: Callable[[], Any] | None = None) -> PolicySetup:
    """Build and check the policy side of a controller from its ``policy`` argument and its
    :class:`~adaptspec.control.config.ControllerConfig`, for a decoder of
    :class:`~adaptspec.control.protocol.DecoderShape` ``shape``. ``policy=None`` is the default
    (:func:`default_on_host`, priced by ``host()`` when given)."""
    from ..reward.functions import reward_function
    from .block_sizes import check_arms, choose_fallback

    allowed = config.arms if config.arms is not None else shape.arms
    host_fallback = None
    if policy is None:
        full = isinstance(config.reward, str)  # counterfactuals priced and learnt (a fleet shares them)
        choice, host_fallback = default_on_host(
            shape.max_block_size, shape.feature_dim, allowed, host, full, trees=shape.draft_trees
        )
        policy = choice.spec
        allowed = choice.arms if choice.arms is not None else allowed
    else:
        choice = PolicyChoice(policy if isinstance(policy, str) else None, "given by the caller")
    spec, learner = make_learner(
        policy, allowed if isinstance(policy, str) else config.arms, shape.max_block_size, config.seed
    )
    arms = check_arms(learner, config.arms, shape.max_block_size, trees=shape.draft_trees)
    if shape.arms is not None and not set(arms) <= set(shape.arms):
        raise AdaptspecError(
            f"arms {list(arms)} of policy {getattr(learner, 'label', spec)}: the engine decodes only "
            f"{list(shape.arms)}"
        )
    label = str(getattr(learner, "label", type(learner).__name__))
    contextual = bool(getattr(learner, "contextual", True))
    featurizer = resolve_featurizer(config.featurizer, spec)
    dim = getattr(learner, "dim", None)
    extra = len(LOAD_FEATURES) if config.load_features else 0
    if featurizer is not None and dim is not None and contextual:
        if dim != featurizer.out_dim + extra:
            with_load = f" + {extra} load features" if extra else ""
            raise AdaptspecError(
                f"the featurizer gives {featurizer.out_dim} values{with_load}, policy {label} expects {dim}"
                f"{' (load_features is chosen when the policy is created)' if extra else ''}"
            )
    reads = (
        featurizer.in_dim
        if featurizer is not None
        else (dim - extra if contextual and dim is not None else None)
    )
    fallback = choose_fallback(
        config.fallback_block_size if config.fallback_block_size is not None else host_fallback, arms
    )
    reward_fn = config.reward if callable(config.reward) else reward_function(config.reward, config.latency)
    machine_speed = resolve_machine_speed(config.speed_reference, learner, config.reward)
    return PolicySetup(
        spec,
        learner,
        arms,
        label,
        contextual,
        featurizer,
        fallback,
        reward_fn,
        machine_speed,
        choice,
        None if reads is None else int(reads),
    )
