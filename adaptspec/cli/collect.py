"""``adaptspec collect``: run the real decoder at every candidate block size to build a trace set
(or, with ``--dense``, a dense trace set from one greedy pass per prompt).

``--speculator MODULE:FACTORY`` runs your own speculator instead of adaptspec's models
(:mod:`adaptspec.cli.user_speculator`): its codec encodes the prompts. The default block sizes
are those of ``--arms``'s default up to the speculator's (or the drafter's) ``max_block_size``
(with ``--ray``, whose driver loads no model, the default itself: each task checks it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._util.ray import ADDRESS_HELP, parse_address
from ..errors import AdaptspecError
from ._types import block_sizes, float_range, input_file, int_range, seed
from .user_speculator import (
    add_model_options,
    load_speculator_factory,
    model_flags_given,
    speculator_from_flags,
)

#: the block sizes collected by default (those up to the speculator's max_block_size)
DEFAULT_ARMS = [1, 2, 4, 6, 8, 12, 16]


def _part(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N, e.g. 0/2, got {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"I/N needs 0 <= I < N, got {text!r}")
    return i, n


def _prompt_source(text: str) -> Path | str:
    return "benchmarks" if text == "benchmarks" else input_file(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    _add_collection_options(p)
    add_model_options(p, not_with=", --dense or --ray")
    _add_output_options(p)
    _add_parallel_options(p)


def _add_collection_options(p: argparse.ArgumentParser) -> None:
    """What is collected: the prompts, the block sizes, the decoding settings and where the trace set goes."""
    p.add_argument(
        "--prompts",
        type=_prompt_source,
        default=None,
        help="JSONL with 'prompt' (text) or 'prompt_ids' (the target's token ids, a list of integers: "
        "for a target without a tokenizer) and optional 'domain', or 'benchmarks' for the public "
        "benchmark prompts (GSM8K, MT-Bench, HumanEval in turn; default: the held-out template "
        "prompts minus the demo's)",
    )
    p.add_argument(
        "--arms",
        type=block_sizes,
        default=None,
        help="comma-separated block sizes, at most the speculator's max_block_size (default: "
        f"{','.join(map(str, DEFAULT_ARMS))} up to it)",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="trace set directory to write (new, empty, or a trace set to replace with --force)",
    )
    p.add_argument("--max-new-tokens", type=int_range(1), default=96)
    p.add_argument("--temperature", type=float_range(0), default=0.0)
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument(
        "--limit", type=int_range(1), default=None, help="only N prompts, taking the domains in turn"
    )


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """Replacing a trace set, and dense traces (every block size at every position)."""
    p.add_argument("--force", action="store_true", help="replace the trace set at OUT (only a trace set)")
    p.add_argument(
        "--dense",
        action="store_true",
        help="T=0 only: one greedy pass per prompt, then the drafts accepted at every position for every "
        "block size up to max(--arms) (a dense trace set; derive per-request traces with "
        "'adaptspec traces derive'); resumes an interrupted run in OUT",
    )
    p.add_argument(
        "--greedy-from",
        type=Path,
        default=None,
        metavar="DENSE",
        help="with --dense: reuse the greedy outputs of this dense set (same target and settings, any "
        "drafter) instead of decoding; a new drafter's dense traces then cost a teacher-forced "
        "pass and drafter passes per prompt",
    )


def _add_parallel_options(p: argparse.ArgumentParser) -> None:
    """Collecting in parts: one part per process, or parts run as Ray tasks."""
    p.add_argument(
        "--part",
        type=_part,
        default=None,
        metavar="I/N",
        help="collect only prompts I, I+N, ... (run N processes, then once without --part to write OUT)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        type=parse_address,
        help="split the prompts into parts run as Ray tasks, each loading the speculator with one thread "
        "(pip install 'adaptspec[ray]'); resumable like --part. " + ADDRESS_HELP[len("run as Ray tasks: ") :],
    )
    p.add_argument(
        "--ray-tasks",
        type=int_range(1),
        default=None,
        metavar="N",
        help="with --ray: this many parts (default: one per CPU of the Ray cluster, one per GPU with "
        "--device cuda)",
    )


def _check_dense_out(args: argparse.Namespace) -> None:
    """``--dense`` writes a new dense set at OUT or resumes the one there, made with the same
    settings: anything else is one line now, before the model loads."""
    from ..traces.dense import DenseTraceSet

    out = args.out
    if args.arms is not None and max(args.arms) < 2:  # default arms: checked again once the drafter is loaded
        raise AdaptspecError(
            f"--dense needs a block size >= 2 in --arms (it records every size up to max(--arms)), "
            f"got {','.join(map(str, args.arms))}"
        )
    if out.is_dir() and (out / "meta.json").exists():
        if not (out / "meta.json").is_file():
            raise AdaptspecError(f"{out / 'meta.json'}: not a regular file")
        old = DenseTraceSet.open(out).meta
        planned = {
            "max_new_tokens": args.max_new_tokens,
            "verification": args.verification,
            "target": args.target or "smollm2-135m-instruct",
            "drafter": args.drafter or "bundled",
            "dtype": args.dtype,
            "device": args.device,
        }
        if args.arms is not None:
            planned["max_block_size"] = max(args.arms)
        if args.greedy_from is not None or "greedy_from" in old:
            planned["greedy_from"] = None if args.greedy_from is None else str(args.greedy_from)
        diff = [f"{k} {old.get(k)!r}, now {v!r}" for k, v in planned.items() if old.get(k) != v]
        if diff:
            raise AdaptspecError(
                f"{out}: a dense trace set made with other settings ({'; '.join(diff)}); "
                "use another directory"
            )
    elif out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise AdaptspecError(f"{out}: exists and is not a dense trace set; refusing to write into it")


def run(args: argparse.Namespace) -> int:
    """Collect every block size's outcome on every prompt: with adaptspec's own models here
    (traces, or dense traces with ``--dense``), with ``--speculator``'s, or as Ray tasks."""
    _check_flags(args)
    _check_out(args)
    numbered = _numbered_prompts(args)
    if args.speculator is not None:
        return _run_user_speculator(args, numbered)
    if args.ray:
        return _run_ray(args, numbered)
    return _run_own_models(args, numbered)


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse flags that do not go together, before anything loads (``--ray`` takes the default
    arms now: its driver loads no model)."""
    model_flags_given(
        args,
        {
            "--target": None,
            "--drafter": None,
            "--verification": "fast",
            "--dtype": "bfloat16",
            "--device": "cpu",
        },
    )
    if args.speculator is not None and (args.dense or args.ray):
        raise AdaptspecError(
            f"{'--dense' if args.dense else '--ray'} runs adaptspec's own models; with --speculator, "
            "collect every block size in this process (--part I/N shares the prompts among processes)"
        )
    if args.ray:
        args.arms = (
            args.arms or DEFAULT_ARMS
        )  # the driver loads no model: each task checks them against its own
    if args.ray_tasks and not args.ray:
        raise AdaptspecError("--ray-tasks needs --ray")
    if args.ray and args.part:
        raise AdaptspecError("--ray makes its own parts: drop --part")
    if args.greedy_from is not None:
        if not args.dense or args.ray:
            raise AdaptspecError("--greedy-from is for --dense in one process: add --dense, drop --ray")
        from ..traces.dense import DenseTraceSet

        DenseTraceSet.open(args.greedy_from)  # not a dense set: one line, before the model loads


def _check_out(args: argparse.Namespace) -> None:
    """Refuse an output the collection cannot write (a dense set resumes its own), before the
    model is loaded and any prompt decoded."""
    from .._util.outputs import check_output

    if args.dense:
        if args.temperature != 0 or args.part or args.force:
            raise AdaptspecError(
                "--dense is for T=0 in one process and resumes OUT: drop --temperature/--part/--force"
            )
        _check_dense_out(args)
    else:
        check_output(
            args.out,
            "traceset",
            args.force,  # before the model is loaded and any prompt decoded
            reads=[p for p in (args.prompts,) if isinstance(p, Path)],
        )


def _numbered_prompts(args: argparse.Namespace) -> list:
    """``(number, prompt)`` of the prompts collected: the default set, the benchmarks' or a file's;
    ``--limit N`` takes N of them in turn by domain."""
    from ..models.prompts import benchmark_prompts, read_prompts, trace_prompts

    if args.prompts is None:
        numbered = trace_prompts()
    elif args.prompts == "benchmarks":
        numbered = list(enumerate(benchmark_prompts()))
    else:
        numbered = list(enumerate(read_prompts(args.prompts)))
    if args.limit:
        by: dict[str, list] = {}
        for item in numbered:
            by.setdefault(item[1].domain, []).append(item)
        turns = [by[d][i] for i in range(max(map(len, by.values()))) for d in sorted(by) if i < len(by[d])]
        numbered = sorted(turns[: args.limit])
    return numbered


def _run_own_models(args: argparse.Namespace, numbered: list) -> int:
    """``collect`` with adaptspec's own target and drafter, in this process: every block size on
    every prompt, or the dense traces with ``--dense``."""
    import torch

    from ..collect.every_arm import collect_traces
    from ..models.prompts import check_prompt_ids

    spec = speculator_from_flags(args)
    check_prompt_ids(
        [p for _, p in numbered],
        spec.target.vocab_size,
        getattr(spec.target.model.config, "max_position_embeddings", None),
        args.max_new_tokens,
        "the target's",
    )
    defaulted = args.arms is None
    args.arms = _arms(args.arms, spec.max_block_size, "the drafter's")
    if args.dense and defaulted:
        _check_dense_out(args)  # the default arms, now known: the same checks as a given --arms had before
    triples = [(f"{p.domain}-{i:04d}", p.domain, _encode(spec.target, p, args.target)) for i, p in numbered]
    if args.dense:
        return _collect_dense(args, spec, triples)
    traces = collect_traces(
        spec,
        triples,
        args.arms,
        args.out,
        args.max_new_tokens,
        args.temperature,
        args.seed,
        overwrite=args.force,
        part=args.part,
        progress=sys.stderr.isatty(),
        meta={**_model_meta(args, spec), "threads": torch.get_num_threads()},
    )
    if traces is None:
        print(f"part {args.part[0]}/{args.part[1]} done; run again without --part to write {args.out}")
    else:
        print(f"wrote {args.out}: {len(traces)} requests x {len(args.arms)} block sizes")
    return 0


def _collect_dense(args: argparse.Namespace, spec, triples: list) -> int:
    """``collect --dense``: the dense traces of the prompts, resumed where ``--out`` stopped."""
    from ..collect.dense import collect_dense

    ds = collect_dense(
        spec,
        triples,
        args.out,
        args.max_new_tokens,
        max(args.arms),
        meta=_model_meta(args, spec),
        greedy_from=args.greedy_from,
    )
    print(f"{args.out}: dense traces of {len(ds.request_ids())} requests, block sizes 2..{ds.max_block_size}")
    return 0


def _model_meta(args: argparse.Namespace, spec) -> dict:
    """What the traces' meta.json says of adaptspec's own models."""
    return {
        "target": args.target or "smollm2-135m-instruct",
        "drafter": args.drafter or "bundled",
        "dtype": args.dtype,
        "device": args.device,
        "features": spec.target.feature_spec,
    }


def _arms(arms: list[int] | None, max_block_size: int, whose: str = "the speculator's") -> list[int]:
    """``--arms``, checked against the speculator (or drafter) loaded; by default
    :data:`DEFAULT_ARMS` up to its largest block."""
    from ..speculator import check_block_sizes

    if arms is None:
        return [b for b in DEFAULT_ARMS if b <= max_block_size]
    return list(
        check_block_sizes(arms, max_block_size, name=f"--arms {','.join(map(str, arms))}", whose=whose)
    )


def _encode(target, prompt, target_dir: str | None) -> list[int]:
    """A prompt's token ids: its ``prompt_ids`` as given, or its text in the target's chat template;
    text for a target without a tokenizer is one line saying what works instead."""
    from ..models.prompts import IDS_INSTEAD

    if prompt.prompt_ids is not None:
        return list(prompt.prompt_ids)
    if target.tokenizer is None:
        raise AdaptspecError(
            f"--target {target_dir}: this target has no tokenizer, so collect cannot encode its text "
            f"prompts ({prompt.where or 'the default prompts'}): add the tokenizer's files to the "
            f"target directory, or {IDS_INSTEAD}, or collect token ids from Python "
            "(adaptspec.collect.collect_traces(spec, [(request_id, domain, token_ids), ...], arms, "
            "out))"
        )
    return target.encode_chat(prompt.prompt)


def _run_user_speculator(args: argparse.Namespace, numbered: list) -> int:
    """``collect --speculator``: every block size on every prompt, with the user's speculator and its codec."""
    import torch

    from ..collect.every_arm import collect_traces

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from ..models.prompts import check_prompt_ids

    user = load_speculator_factory(args.speculator)
    arms = _arms(args.arms, user.speculator.max_block_size)
    check_prompt_ids(
        [p for _, p in numbered],
        user.vocab_size,
        user.max_context,
        args.max_new_tokens,
        f"--speculator {user.path}'s",
    )
    triples = [
        (
            f"{p.domain}-{i:04d}",
            p.domain,
            user.codec.encode(p.prompt) if p.prompt_ids is None else list(p.prompt_ids),
        )
        for i, p in numbered
    ]
    traces = collect_traces(
        user.speculator,
        triples,
        arms,
        args.out,
        args.max_new_tokens,
        args.temperature,
        args.seed,
        overwrite=args.force,
        part=args.part,
        progress=sys.stderr.isatty(),
        meta={"speculator": user.path, "threads": torch.get_num_threads()},
    )
    if traces is None:
        print(f"part {args.part[0]}/{args.part[1]} done; run again without --part to write {args.out}")
    else:
        print(f"wrote {args.out}: {len(traces)} requests x {len(arms)} block sizes")
    return 0


def _run_ray(args: argparse.Namespace, numbered: list) -> int:
    """``collect --ray``: the same collection as Ray tasks; the driver loads no model (the tasks
    encode the prompts)."""
    import functools

    from .._util.optional import require
    from .._util.ray import session
    from ..collect.ray_tasks import collect_dense_ray, collect_traces_ray
    from ..models import load_speculator

    require("ray", extra="ray", needed_by="--ray")  # a missing Ray is one line, before anything else
    if args.dense and (args.out / "meta.json").exists():
        from ..traces.dense import DenseTraceSet

        DenseTraceSet.open(args.out)  # a foreign directory is refused before Ray starts
    make = functools.partial(
        load_speculator,
        args.target,
        args.drafter,
        dtype=args.dtype,
        device=args.device,
        threads=1,
        verification=args.verification,
    )
    triples = [
        (f"{p.domain}-{i:04d}", p.domain, p.prompt if p.prompt_ids is None else list(p.prompt_ids))
        for i, p in numbered
    ]  # ids: their vocabulary checked by each task's target
    meta = {
        "target": args.target or "smollm2-135m-instruct",
        "drafter": args.drafter or "bundled",
        "dtype": args.dtype,
        "device": args.device,
        "features": None,
    }
    gpu = args.device.startswith("cuda")
    with session(args.ray):
        if args.dense:
            ds = collect_dense_ray(
                make,
                triples,
                args.out,
                args.max_new_tokens,
                max(args.arms),
                meta=meta,
                tasks=args.ray_tasks,
                gpu=gpu,
                address=args.ray,
            )
            print(
                f"{args.out}: dense traces of {len(ds.request_ids())} requests, block sizes 2..{ds.max_block_size}"
            )
            return 0
        traces = collect_traces_ray(
            make,
            triples,
            args.arms,
            args.out,
            args.max_new_tokens,
            args.temperature,
            args.seed,
            meta=meta,
            overwrite=args.force,
            tasks=args.ray_tasks,
            gpu=gpu,
            address=args.ray,
        )
    print(f"wrote {args.out}: {len(traces)} requests x {len(args.arms)} block sizes")
    return 0
