"""``adaptspec serve``: HTTP server with A/B testing, decision logs, checkpoints and metrics.

Examples::

    adaptspec serve                                            # bundled models, default policy, port 8000
    adaptspec serve --variant A=neural-linear:head=runs/head --variant B=fixed:16 --split 50,50 \\
        --log-dir runs/serve/log --checkpoint-dir runs/serve/ckpt --port 8000
    adaptspec serve --tiny --variant A=linucb --variant B=fixed:4 --log-dir /tmp/log --port 8001   # for development
    adaptspec serve --speculator mymodule:make --variant A=neural-linear:head=runs/head --variant B=fixed:4 \\
        --log-dir runs/serve/log          # your own speculator (docs/bring-your-own.md), one request at a time
                                          # (on the engine if the factory returns a SpeculativeDecoder)

    curl -s localhost:8000/v1/completions -d '{"prompt": "Write a haiku", "max_tokens": 32, "user": "u1"}'
    curl -s localhost:8000/ab; curl -s localhost:8000/metrics; curl -s localhost:8000/health

Stop it with Ctrl-C or SIGTERM: new requests get 503, the requests in flight have
``--shutdown-grace`` seconds (default 15) to finish, every one left is then answered 503
(whatever its decode is doing: one that never returns holds nothing), every variant's queued
updates are applied, a final checkpoint is written and the log journal becomes a Parquet part;
the process is gone within 30 s of the signal, what orchestrators allow before they kill
(:mod:`adaptspec.serving.shutdown`). After a crash, restarting with the same directories resumes
every variant's policy (see docs/serving.md).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, NamedTuple

from .._util.guarded import STALL_S
from .._util.optional import require
from ..errors import AdaptspecError
from ..load_rules import SPECULATION_MARGIN
from ..reward.attribution import ATTRIBUTIONS
from ..reward.functions import DEFAULT_REWARD, REWARDS
from ..speculator import arm_label, check_block_sizes
from ._types import (
    MAX_BLOCK_SIZE,
    arms as arm_list,
    device,
    float_range,
    input_dir,
    int_range,
    log_dir,
    port,
    seed,
    state_dir,
    threads,
)
from .user_speculator import SPECULATOR_HELP, load_speculator_factory, model_flags_given, speculator_path

#: seconds between SIGTERM and SIGKILL that orchestrators allow (Kubernetes' default grace period)
KILL_AFTER_S = 30.0
#: seconds the shutdown may need after the grace: the cut requests' answers sent (at most
#: adaptspec.serving.shutdown.ANSWER_S, 2), the decoding thread's round left (at most
#: adaptspec.serving.service.DRAINED_WAIT_S, 1), the controllers closed (updates, checkpoints, log roll)
AFTER_GRACE_S = 10.0
#: ``--shutdown-grace``: the default, and the most that keeps the whole shutdown within KILL_AFTER_S
SHUTDOWN_GRACE_S, MAX_SHUTDOWN_GRACE_S = 15.0, KILL_AFTER_S - AFTER_GRACE_S


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``adaptspec serve``'s options, group by group as ``--help`` lists them."""
    _start_options(p.add_argument_group("start here: the options most servers set"))
    _ab_options(p.add_argument_group("A/B design (see docs/serving.md)"))
    _model_options(p.add_argument_group("models (default: the bundled SmolLM2 target and its drafter)"))
    controller = p.add_argument_group("controller")
    _decision_options(controller)
    _saving_options(controller)
    _fleet_options(p.add_argument_group("fleet (replicas learning together; see docs/serving.md#fleet)"))
    _engine_options(
        p.add_argument_group(
            "batched engine: every request is a row of one continuous-batching engine "
            "(see docs/serving.md#batched-serving); with --speculator only when its factory "
            "returns a SpeculativeDecoder"
        )
    )
    _limit_options(p.add_argument_group("server and limits"))


def _start_options(group: argparse._ArgumentGroup) -> None:
    """The options most servers set: variants, log and checkpoint directories, port, rows."""
    group.add_argument(
        "--variant",
        action="append",
        metavar="NAME=SPEC",
        help="an A/B variant and its policy spec, repeatable (default: one variant 'default' with the "
        "default policy: neural-linear over the bundled head when it fits the model, else fi-ucb, "
        "UCB learning every block size a request's rounds reveal; the server says which at start)",
    )
    group.add_argument(
        "--log-dir",
        type=log_dir,
        default=None,
        metavar="DIR",
        help="decision log directory (needed for /ab): new, or a decision log this server can append to "
        "(every part readable, contexts of this server's width); anything else is refused at start",
    )
    group.add_argument(
        "--checkpoint-dir",
        type=state_dir,
        default=None,
        metavar="DIR",
        help="policy checkpoints, one subdirectory per variant; resumed from at start (refused at start "
        "unless it is a writable directory)",
    )
    group.add_argument("--port", type=port, default=8000, help="port (default: 8000)")
    group.add_argument(
        "--max-rows",
        type=int_range(1, 256),
        default=None,
        metavar="N",
        help="requests decoding at once (default 8; 1: one at a time, through the same engine)",
    )


def _ab_options(group: argparse._ArgumentGroup) -> None:
    """How traffic is split among the variants: by request or by switchback slices."""
    group.add_argument(
        "--split", default=None, metavar="W1,W2,...", help="traffic weights of the variants (default: equal)"
    )
    group.add_argument(
        "--ab-design",
        choices=("requests", "switchback"),
        default=None,
        help="requests: each request is routed to a variant on its own (the default); switchback: "
        "rounds are cut into slices, each slice runs one variant (balanced random order from "
        "--seed) and every request joining in it is that variant; slices are recorded in --log-dir "
        "for ab-report; needs --log-dir and 2+ variants, not --split",
    )
    group.add_argument(
        "--slice-rounds",
        type=int_range(1),
        default=None,
        metavar="N",
        help="rounds per switchback slice (default 32; needs --ab-design switchback)",
    )


def _model_options(group: argparse._ArgumentGroup) -> None:
    """The target and drafter served: bundled, tiny, local paths or your own speculator."""
    group.add_argument(
        "--speculator",
        type=speculator_path,
        default=None,
        metavar="MODULE:FACTORY",
        help=SPECULATOR_HELP + "; not with the model flags below. What the factory returns decides "
        "how it is served: adaptspec's SpeculativeDecoder runs on the batched engine (the engine "
        "options apply); any other speculator one request at a time (the engine options are "
        "refused)",
    )
    group.add_argument(
        "--tiny",
        action="store_true",
        help="a tiny random model with a character tokenizer, for development and tests",
    )
    group.add_argument("--tiny-seed", type=seed, default=0, help="seed of the --tiny model")
    group.add_argument(
        "--target", default=None, metavar="PATH", help="local Hugging Face target model directory"
    )
    group.add_argument(
        "--drafter",
        default=None,
        metavar="PATH",
        help="drafter directory: adaptspec's save_pretrained or a published DFlash v1 one",
    )
    group.add_argument(
        "--verification",
        choices=["fast", "exact"],
        default="fast",
        help="fast: the model's own kernels, plain speed at B=1 (default); exact: bit-identical to one-token greedy, slower",
    )
    group.add_argument(
        "--dtype",
        default=None,
        help="dtype of the real models (default on a CPU: the one measured fastest on this host, "
        "see --remeasure; elsewhere bfloat16)",
    )
    group.add_argument(
        "--remeasure",
        action="store_true",
        help="time this host's round costs again instead of reading them from the cache (a CPU only)",
    )
    group.add_argument(
        "--device", type=device, default="cpu", help="device of the real models (default: cpu)"
    )
    group.add_argument("--threads", type=threads, default=None, metavar="N", help="torch CPU threads")
    group.add_argument("--chat", action="store_true", help="wrap text prompts in the model's chat template")


def _decision_options(group: argparse._ArgumentGroup) -> None:
    """What the policies learn from and decide among, and their time budgets."""
    group.add_argument(
        "--reward",
        default=DEFAULT_REWARD,
        choices=REWARDS,
        help=f"reward the policies learn from (default: {DEFAULT_REWARD}, minus measured ms per token)",
    )
    group.add_argument(
        "--latency", default=None, metavar="PROFILE", help="latency profile for --reward modelled"
    )
    group.add_argument(
        "--arms",
        type=arm_list,
        default=None,
        metavar="B1,B2,...",
        help="block sizes for policies built from a spec, at most the speculator's max_block_size "
        "(default: 1,2,4,6,8,10,12,16,20,24 up to it; a head-based policy uses its head's), and "
        "draft trees tree:N (the arm -N: the best tree of N nodes, fixed:-N plays it) where the "
        "decoder runs trees",
    )
    group.add_argument(
        "--featurizer",
        type=input_dir,
        default=None,
        metavar="DIR",
        help="saved featurizer, for every variant (default: the one saved next to the variants' "
        "heads, if any; heads that bring different ones need this flag)",
    )
    group.add_argument("--seed", type=seed, default=0, help="seed of the policies")
    group.add_argument(
        "--fallback-block-size",
        type=int_range(1, MAX_BLOCK_SIZE),
        default=None,
        metavar="B",
        help="block size used when a policy fails or is late (default: the arm closest to 8)",
    )
    group.add_argument(
        "--decide-timeout",
        type=float_range(0, lo_open=True),
        default=0.1,
        metavar="S",
        help="time budget of a decision (default 0.1): one request at a time, a later one gets the "
        "fallback block size; on the engine, whose thread decides, it is counted late",
    )
    group.add_argument(
        "--feedback-timeout",
        type=float_range(0, lo_open=True),
        default=300.0,
        metavar="S",
        help="drop a decision without feedback after this long",
    )
    group.add_argument(
        "--redecide-every",
        type=int_range(1),
        default=None,
        metavar="K",
        help="decide again every K rounds inside a request (off by default; only with a --speculator "
        "served one request at a time: the batched engine decides once per request, at join)",
    )


def _saving_options(group: argparse._ArgumentGroup) -> None:
    """When the policies are checkpointed and the decision log written."""
    group.add_argument(
        "--checkpoint-every", type=int_range(1), default=100, metavar="N", help="checkpoint after N updates"
    )
    group.add_argument(
        "--checkpoint-interval",
        type=float_range(0, lo_open=True),
        default=60.0,
        metavar="S",
        help="... or S seconds after the last checkpoint",
    )
    group.add_argument(
        "--roll-rows", type=int_range(1), default=1000, metavar="N", help="log rows per Parquet part"
    )
    group.add_argument(
        "--no-fsync",
        action="store_true",
        help="do not fsync each logged decision: acknowledged decisions then survive a crash of the "
        "server but not of the machine (saves a few ms per request)",
    )


def _fleet_options(group: argparse._ArgumentGroup) -> None:
    """Replicas sharing their policies' statistics through Redis."""
    group.add_argument(
        "--shared",
        type=_shared_url,
        default=None,
        metavar="redis://HOST:PORT/NAME",
        help="share every variant's policy statistics with the other replicas of fleet NAME through "
        "Redis (needs the fleet extra); off by default: this server learns alone",
    )
    group.add_argument(
        "--replica-id",
        default=None,
        metavar="ID",
        help="this replica's id in the fleet, stable across restarts (default: HOSTNAME:PORT)",
    )
    group.add_argument(
        "--sync-every",
        type=int_range(1),
        default=32,
        metavar="N",
        help="publish and merge after N own updates (default 32) ...",
    )
    group.add_argument(
        "--sync-interval",
        type=float_range(0, lo_open=True),
        default=1.0,
        metavar="S",
        help="... or every S seconds (default 1)",
    )
    group.add_argument(
        "--lease-ttl",
        type=float_range(0, lo_open=True),
        default=15.0,
        metavar="S",
        help="a replica id is held by one live process: a second one claiming it is refused; a "
        "crashed replica's id is free after S seconds (default 15, at least 3 sync intervals)",
    )


def _engine_options(group: argparse._ArgumentGroup) -> None:
    """The batched engine's queue, reward attribution and per-round load rule."""
    group.add_argument(
        "--batched",
        action="store_true",
        help="no effect, accepted for old scripts: the batched engine is the default (--max-rows 1 "
        "decodes one request at a time)",
    )
    group.add_argument(
        "--max-queue",
        type=int_range(0),
        default=None,
        metavar="Q",
        help="requests waiting for a row; past it a request gets 429 with Retry-After (default 64)",
    )
    group.add_argument(
        "--attribution",
        choices=ATTRIBUTIONS,
        default=None,
        help="how a round's time is split among its rows for their rewards: marginal (each row's "
        "marginal cost on the --latency profile, default cpu-smollm2-batched on a CPU; the default) "
        "or tokens (by block size; also used on other devices without --latency)",
    )
    group.add_argument(
        "--load-rule",
        type=_load_rule_name,
        default=None,
        metavar="RULE",
        help="the per-round block-size rule under load: learned (the default: one block "
        "size a round for every row, learned from measured rounds, warm-started from the cost "
        "model; none where every variant decodes plainly, as the default does where speculation cannot "
        "pay), goodput, fixed:B, or none (each request keeps its controller's block size); each "
        "round every row verifies min(the rule's choice, its request's own)",
    )
    group.add_argument(
        "--load-features",
        action="store_true",
        help="each variant's policy decides on the load at join too (rows in flight, queue, context "
        "tokens, temperature, max_tokens: 5 more context columns; a policy that fits them, such "
        "as linucb or lints, not the bundled head; every variant of a log directory alike)",
    )
    group.add_argument(
        "--load-prior",
        type=float_range(0, 1, hi_open=True),
        default=0.4,
        metavar="A",
        help="prior per-draft acceptance of the goodput and learned rules (default 0.4)",
    )
    group.add_argument(
        "--load-margin",
        type=float_range(0, 1, hi_open=True),
        default=SPECULATION_MARGIN,
        metavar="M",
        help="the learned rule's margin over plain decoding: a speculating block size is preferred "
        f"only where its rounds beat plain's by M (default {SPECULATION_MARGIN}; 0: the rounds alone)",
    )


def _limit_options(group: argparse._ArgumentGroup) -> None:
    """The listening address, request limits, stall and shutdown timeouts, log level."""
    group.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    group.add_argument("--max-prompt-tokens", type=int_range(1), default=2048, metavar="N")
    group.add_argument(
        "--max-tokens", type=int_range(1), default=1024, metavar="N", help="largest max_tokens accepted"
    )
    group.add_argument("--default-max-tokens", type=int_range(1), default=16, metavar="N")
    group.add_argument(
        "--stall-timeout",
        type=float_range(0, lo_open=True),
        default=STALL_S,
        metavar="S",
        help=f"seconds the decoding thread (the engine, or your speculator) may stay busy without "
        f"progress (a round; a decode that reports no rounds: the whole decode) before it is "
        f"declared stalled: the requests waiting on it get 503, new ones too, /health says stalled "
        f"(HTTP 503) and SIGTERM exits without it (default {STALL_S:g})",
    )
    group.add_argument(
        "--shutdown-grace",
        type=float_range(0, MAX_SHUTDOWN_GRACE_S),
        default=SHUTDOWN_GRACE_S,
        metavar="S",
        help=f"on SIGTERM or SIGINT, new requests get 503 and those in flight have S seconds to finish; "
        f"every one left then gets 503 (the server is shutting down), whatever its decode is doing, "
        f"and the server exits (default {SHUTDOWN_GRACE_S:g}; at most {MAX_SHUTDOWN_GRACE_S:g}, so "
        f"that it is gone within {KILL_AFTER_S:g} s of the signal)",
    )
    group.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
    )


def _load_rule_name(text: str) -> str:
    """``--load-rule``'s value as given: an empty one is refused, not taken for the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "an empty rule: give learned, goodput, fixed:B or none (or drop the flag "
            "for the default, learned)"
        )
    return text


def _shared_url(text: str) -> str:
    from ..fleet.redis_backend import parse_url

    try:
        parse_url(text)
    except AdaptspecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _shared(args: argparse.Namespace, variants: list[str]) -> dict | None:
    """One SharedState per variant over one Redis connection, each holding its replica id (None without --shared).

    Redis is pinged and the replica id claimed now, before any model is loaded: unreachable, or an
    id a live replica holds, is one line."""
    if not getattr(args, "shared", None):
        return None
    import socket

    from ..fleet import claimed_states

    return claimed_states(
        args.shared,
        args.replica_id or f"{socket.gethostname()}:{args.port}",
        variants,
        sync_every=args.sync_every,
        sync_interval_s=args.sync_interval,
        lease_ttl_s=args.lease_ttl,
    )


def build(args: argparse.Namespace):
    """The :class:`~adaptspec.serving.CompletionService` the arguments describe.

    Everything that can be checked without the model is checked before it is loaded.
    """
    from ..ab.variants import named_specs
    from ..reward.functions import reward_function

    if args.default_max_tokens > args.max_tokens:
        raise AdaptspecError(
            f"--default-max-tokens {args.default_max_tokens} exceeds --max-tokens {args.max_tokens}"
        )
    if args.tiny and (args.target or args.drafter):
        raise AdaptspecError("--tiny builds its own model: drop --target/--drafter")
    model_flags_given(
        args,
        {
            "--tiny": False,
            "--tiny-seed": 0,
            "--target": None,
            "--drafter": None,
            "--verification": "fast",
            "--dtype": None,
            "--device": "cpu",
            "--chat": False,
            "--remeasure": False,
        },
    )
    if (
        args.fallback_block_size is not None
        and args.arms is not None
        and args.fallback_block_size not in args.arms
    ):
        raise AdaptspecError(
            f"--fallback-block-size {args.fallback_block_size} is not one of --arms {args.arms}"
        )
    reward_function(args.reward, args.latency)  # an unknown latency profile fails here, not after loading
    _check_engine(args)
    _check_ab_design(args)
    specs = named_specs(args.variant or [], "--variant", "A=fixed:16")
    args.featurizer = _one_featurizer(args.featurizer, specs)
    from ..ab.router import ABRouter

    ABRouter.parse([f"{n}={s}" for n, s in (specs or {"default": "ucb"}).items()], args.split)  # --split
    shared = _shared(args, list(specs) or ["default"])
    try:
        return _build(args, specs, shared)
    except BaseException:
        for s in (shared or {}).values():
            s.close()  # frees the replica ids (an attached one was closed by its controller already)
        raise


def _build(args: argparse.Namespace, specs: dict[str, str], shared: dict | None):
    """The model and the service (the part of :func:`build` that may take minutes)."""
    if args.tiny:
        from ..serving.tiny import TINY_MAX_BLOCK_SIZE

        # a drafter, sdpa or exact kernels
        _check_arms(args.arms, TINY_MAX_BLOCK_SIZE, "the --tiny model's", trees=True)
    engine_threads = _set_threads(args)
    if args.speculator is not None:
        model = _user_model(args)
    elif args.tiny:
        model = _tiny_model(args)
    else:
        model = _own_model(args, engine_threads)
    specs = specs or _default_specs(args, model.speculator)
    return _service(args, model, specs, shared, engine_threads)


class _Model(NamedTuple):
    """The speculator served, its codec, the model name answers carry, its context and vocabulary
    (None: unknown) and the device the engine runs on."""

    speculator: Any
    codec: Any
    name: str
    max_context: int | None
    vocab: int | None
    device: str


def _set_threads(args: argparse.Namespace) -> int:
    """The engine's torch threads (``--threads``, else torch's default), this thread's set first."""
    import torch

    engine_threads = args.threads or torch.get_num_threads()
    if args.speculator is None:  # the batched engine decodes
        # this thread at one intra-op thread before any torch work (model loading included): a second
        # OpenMP team here would make the engine thread's rounds slower (EngineLoop docstring)
        torch.set_num_threads(1)
    elif args.threads is not None:
        torch.set_num_threads(args.threads)
    return engine_threads


def _user_model(args: argparse.Namespace) -> _Model:
    """The speculator ``--speculator``'s factory makes, checked against the arms and engine options."""
    import torch

    from ..serving.service import runs_on_engine

    user = load_speculator_factory(args.speculator)
    speculator = user.speculator
    _check_arms(
        args.arms,
        speculator.max_block_size,
        "the speculator's",
        bool(getattr(speculator, "draft_trees", False)),
    )
    _check_user_engine(args, speculator)
    device = args.device
    if runs_on_engine(speculator):  # the factory's target and drafter run on the engine, as the bundled ones
        torch.set_num_threads(1)
        device = speculator.target.device.type
    return _Model(speculator, user.codec, user.path, user.max_context, user.vocab_size, device)


def _tiny_model(args: argparse.Namespace) -> _Model:
    """The tiny random model ``--tiny`` asks for."""
    from ..serving.tiny import TINY_MAX_POSITIONS, tiny_speculator

    speculator, codec = tiny_speculator(args.tiny_seed, verification=args.verification)
    name = f"adaptspec-tiny-{args.tiny_seed}"
    return _Model(speculator, codec, name, TINY_MAX_POSITIONS, speculator.target.vocab_size, args.device)


def _own_model(args: argparse.Namespace, engine_threads: int) -> _Model:
    """adaptspec's own target and drafter (the bundled ones, or ``--target``/``--drafter``), in the
    dtype measured fastest on this host where it is a CPU and ``--dtype`` leaves the choice."""
    from ..host.costs import TIMED_DTYPES
    from ..models import load_speculator
    from ..serving.codec import HFCodec

    dtype = args.dtype or "bfloat16"
    if args.device == "cpu" and args.dtype in (None, *TIMED_DTYPES):
        dtype = _host_dtype(args, engine_threads)
    speculator = load_speculator(
        args.target, args.drafter, dtype=dtype, device=args.device, verification=args.verification
    )
    tok = speculator.target.tokenizer
    if tok is None and args.chat:  # else the server starts, then answers every chat request 400
        raise AdaptspecError(
            f"--chat wraps prompts in the target's chat template, but --target {args.target} has no "
            "tokenizer (its prompts are token ids): drop --chat, or add the tokenizer's files"
        )
    codec = None if tok is None else HFCodec(tok, chat=args.chat)
    name = str(args.target or "smollm2-135m-instruct")
    max_context = getattr(speculator.target.model.config, "max_position_embeddings", None)
    _check_arms(
        args.arms,
        speculator.max_block_size,
        "the speculator's",
        bool(getattr(speculator, "draft_trees", False)),
    )
    return _Model(speculator, codec, name, max_context, speculator.target.vocab_size, args.device)


def _host_dtype(args: argparse.Namespace, engine_threads: int) -> str:
    """The dtype this host's costs choose (:mod:`adaptspec.host`: the dtype run, the head's prior
    and every price), kept as ``args.host_choice``; its profile is the ``--latency`` default."""
    from ..host import for_models, server_rows

    # the dtype at every load the engine runs: bfloat16 without native kernels is cheap at one row, dear at 8
    args.host_choice = for_models(
        args.target,
        args.drafter,
        args.verification,
        engine_threads,
        args.dtype,
        args.remeasure,
        rows=server_rows(args.max_rows or 8),
    )
    args.latency = args.latency or str(args.host_choice.profile_path)
    return args.host_choice.dtype


def _default_specs(args: argparse.Namespace, speculator) -> dict[str, str]:
    """One variant, ``default``, with the library's default policy for this speculator and host;
    the choice is kept as ``args.default_choice`` (said once the server is up), and its fallback
    is the ``--fallback-block-size`` default."""
    from ..control.policy_build import default_on_host
    from ..control.protocol import speculator_shape

    shape = speculator_shape(speculator)
    host = getattr(args, "host_choice", None)
    choice, fallback = default_on_host(
        shape.max_block_size,
        shape.feature_dim,
        args.arms,  # a fleet shares fi-ucb too
        None if host is None else lambda: host,
    )  # the library's default, the same code
    args.default_choice = choice  # said once the server is up (run), not before a refusal
    if args.fallback_block_size is None:
        args.fallback_block_size = (
            fallback  # a late decision plays what pays here (1 where nothing else does)
        )
    return {"default": choice.spec}


def _service(
    args: argparse.Namespace, model: _Model, specs: dict[str, str], shared: dict | None, engine_threads: int
):
    """The :class:`~adaptspec.serving.CompletionService` serving ``model`` with the variants ``specs``."""
    from ..serving.service import CompletionService, ServerLimits, runs_on_engine

    limits = ServerLimits(
        max_prompt_tokens=args.max_prompt_tokens,
        max_tokens=args.max_tokens,
        default_max_tokens=args.default_max_tokens,
        max_context=model.max_context,
        vocab_size=model.vocab,
    )
    engine = runs_on_engine(model.speculator)
    return CompletionService.build(
        model.speculator,
        specs,
        args.split,
        codec=model.codec,
        log_dir=args.log_dir,
        checkpoint_dir=args.checkpoint_dir,
        limits=limits,
        model_name=model.name,
        arms=args.arms,
        featurizer=args.featurizer,
        reward=args.reward,
        latency=args.latency,
        seed=args.seed,
        fallback_block_size=args.fallback_block_size,
        decide_timeout_s=args.decide_timeout,
        feedback_timeout_s=args.feedback_timeout,
        redecide_every=args.redecide_every,
        checkpoint_every=args.checkpoint_every,
        checkpoint_interval_s=args.checkpoint_interval,
        roll_rows=args.roll_rows,
        log_fsync=not args.no_fsync,
        stall_s=args.stall_timeout,
        host=None if getattr(args, "host_choice", None) is None else args.host_choice.to_dict(),
        **({"load_features": True} if getattr(args, "load_features", False) else {}),
        **({} if shared is None else {"shared": shared.__getitem__}),
        **({"engine": _engine_settings(args, engine_threads, model.device, specs)} if engine else {}),
    )


def _one_featurizer(featurizer, specs: dict[str, str]):
    """``--featurizer``, else the featurizer saved next to the variants' heads, for every variant:
    one decision log holds contexts of one width, so a variant without a head (``fixed:4``)
    featurizes as the head's variant does. Variants whose heads bring different featurizers are one
    line (give ``--featurizer``)."""
    if featurizer is not None:
        return featurizer
    from ..control.policy_build import spec_head
    from ..policies.featurizer import Featurizer

    found = {
        n: h
        for n, h in ((n, spec_head(s)) for n, s in specs.items())
        if h is not None and Featurizer.exists(h)
    }
    if not found:
        return None
    loaded = {n: Featurizer.load(h) for n, h in found.items()}
    first = next(iter(found))
    other = next((n for n in loaded if loaded[n] != loaded[first]), None)
    if other is not None:
        raise AdaptspecError(
            f"variants {first} and {other} bring different featurizers with their heads "
            f"({found[first]}, {found[other]}); every variant of a server featurizes alike (one "
            "decision log, one context width): give --featurizer DIR"
        )
    return found[first]


def _check_engine(args: argparse.Namespace) -> None:
    """The batched engine's options that can be checked before any model is loaded. With a
    --speculator, whether they apply is known once its factory has run (:func:`_check_user_engine`)."""
    if args.speculator is None and args.redecide_every is not None:
        raise AdaptspecError(
            "--redecide-every needs --speculator: the batched engine decides once per request, at join"
        )
    if args.speculator is None or args.load_rule is not None:
        _load_rule(args, args.device)  # a bad rule is one line before any model is loaded


def _check_user_engine(args: argparse.Namespace, speculator: object) -> None:
    """--speculator's engine options, decided by what its factory returned, as
    :meth:`~adaptspec.serving.CompletionService.build` decides (:func:`~adaptspec.serving.runs_on_engine`):
    a SpeculativeDecoder runs on the batched engine, which decides once per request (no
    --redecide-every); any other speculator is served one request at a time (no engine option)."""
    from ..serving.service import runs_on_engine

    returned = f"--speculator {args.speculator} returned a {type(speculator).__name__}"
    if runs_on_engine(speculator):
        if args.redecide_every is not None:
            raise AdaptspecError(
                f"--redecide-every: {returned}, which runs on the batched engine: it decides once "
                "per request, at join"
            )
        return
    given = [
        f
        for f, v in (
            ("--batched", getattr(args, "batched", False) or None),
            ("--max-rows", args.max_rows),
            ("--max-queue", args.max_queue),
            ("--attribution", args.attribution),
            ("--load-rule", args.load_rule),
            ("--load-features", args.load_features or None),
            ("--ab-design", getattr(args, "ab_design", None)),
            ("--slice-rounds", getattr(args, "slice_rounds", None)),
        )
        if v is not None
    ]
    if given:
        raise AdaptspecError(
            f"{given[0]} applies to the batched engine; {returned}, not adaptspec's "
            "SpeculativeDecoder, so it is served one request at a time: drop it"
        )


def _engine_settings(args: argparse.Namespace, threads: int, device: str, specs: dict[str, str]):
    """The batched engine's :class:`~adaptspec.serving.engine.batched.EngineSettings` the arguments
    describe, for models on ``device``, serving the variants ``specs``."""
    from ..serving.engine.batched import EngineSettings

    return EngineSettings(
        max_rows=args.max_rows or 8,
        max_queue=64 if args.max_queue is None else args.max_queue,
        attribution=args.attribution or "marginal",
        profile=_cost_model(args, device),
        rule=None if _plain_only(args, specs) else _load_rule(args, device),
        design=getattr(args, "ab_design", None) or "requests",
        slice_rounds=getattr(args, "slice_rounds", None),
        seed=args.seed,
        threads=threads,
    )


def _check_ab_design(args: argparse.Namespace) -> None:
    """--ab-design and --slice-rounds: one line before any model is loaded."""
    design = getattr(args, "ab_design", None)
    if design is None and getattr(args, "slice_rounds", None) is None:
        return
    if design != "switchback":
        if args.slice_rounds is not None:
            raise AdaptspecError("--slice-rounds needs --ab-design switchback")
        return
    if args.log_dir is None:
        raise AdaptspecError(
            "--ab-design switchback needs --log-dir (its slices are recorded next to the decision log)"
        )
    from ..ab.variants import named_specs

    if len(named_specs(args.variant or [], "--variant", "A=fixed:16")) < 2:
        raise AdaptspecError("--ab-design switchback needs at least 2 --variant")
    if args.split is not None:
        raise AdaptspecError(
            "--split does not apply to --ab-design switchback (every variant gets the same number of slices)"
        )


def _cost_model(args: argparse.Namespace, device: str) -> str | None:
    """The batched engine's cost model: --latency, else on a CPU the bundled pair's measured batched
    surface (``cpu-smollm2-batched``); None elsewhere (rounds are split by tokens)."""
    return args.latency or ("cpu-smollm2-batched" if device == "cpu" else None)


def _plain_only(args: argparse.Namespace, specs: dict[str, str]) -> bool:
    """Whether every variant decodes plainly (``fixed:1``: the default where speculation cannot pay on
    this host) and no ``--load-rule`` was given: then the engine runs no per-round rule, which could
    only cut a block that plain decoding does not draft, and would cost each round its bookkeeping."""
    from ..control.policy_build import PLAIN_SPEC

    return args.load_rule is None and all(spec == PLAIN_SPEC for spec in specs.values())


def _load_rule(args: argparse.Namespace, device: str) -> object | None:
    """The per-round rule ``--load-rule`` names (default ``learned``; ``none``: no rule)."""
    from ..load_rules.round_rule import make_load_rule

    spec = args.load_rule or "learned"
    if spec == "none":
        return None
    chains = [
        a for a in args.arms or [] if a > 0
    ]  # the rule sets chains' block sizes; a tree row keeps its tree
    arms = chains or [b for b in (1, 2, 3, 4, 6, 8) if b <= MAX_BLOCK_SIZE]
    return make_load_rule(
        spec,
        arms,
        _cost_model(args, device) or "cpu-smollm2-batched",
        prior=args.load_prior,
        seed=args.seed,
        margin=args.load_margin,
    )


def _check_arms(arms: list[int] | None, max_block_size: int, whose: str, trees: bool) -> None:
    """--arms against the decoder: block sizes it can draft, trees only where it runs them (``trees``)."""
    if arms is not None:
        check_block_sizes(
            arms, max_block_size, name=f"--arms {','.join(map(arm_label, arms))}", whose=whose, trees=trees
        )


def _check_port(host: str, port: int) -> None:
    """One line when ``host:port`` cannot be listened on (another server has it), before any work."""
    import socket

    if port == 0:
        return
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as e:
        raise AdaptspecError(f"--host {host}: cannot resolve it ({e.strerror or e})") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as uvicorn does: a port in TIME_WAIT is free
        try:
            s.bind(addr)
        except OSError as e:
            raise AdaptspecError(
                f"--port {port}: cannot listen on {host}:{port} ({e.strerror or e})"
            ) from None


def run(args: argparse.Namespace) -> int:
    for package in ("fastapi", "uvicorn"):
        require(package, extra="serve", needed_by="serving")
    from ..serving.app import create_app
    from ..serving.shutdown import GracefulServer  # uvicorn's, its shutdown bounded whatever the requests do

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(levelname)s %(name)s: %(message)s"
    )
    _check_port(args.host, args.port)  # before anything is loaded or created
    service = build(args)
    try:
        app = create_app(service)
        if getattr(args, "host_choice", None) is not None:
            print(f"adaptspec serve: {args.host_choice.summary()}", file=sys.stderr, flush=True)
        if getattr(args, "default_choice", None) is not None:
            print(f"adaptspec serve: default policy {args.default_choice}", file=sys.stderr, flush=True)
        for name, c in service.controllers.items():
            r = c.resumed or {}
            print(
                f"adaptspec serve: variant {name}: {c.policy_label} (arms {list(c.arms)}), weight "
                f"{service.router.weights[service.router.variants.index(name)]:.2f}"
                + (
                    f", resumed at {r['updates_at_checkpoint']} updates + {r['replayed']} replayed"
                    if r.get("checkpoint") or r.get("replayed")
                    else ""
                ),
                file=sys.stderr,
                flush=True,
            )
        print(f"adaptspec serve: {service.runner.describe()}", file=sys.stderr, flush=True)
        GracefulServer(
            app, service, args.shutdown_grace, host=args.host, port=args.port, log_level=args.log_level
        ).run()
    finally:
        service.close()  # done already by the app's lifespan, unless a second Ctrl-C skipped it
    return 0
