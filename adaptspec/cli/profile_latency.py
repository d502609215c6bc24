"""``adaptspec profile-latency``: measure draft and verify times on this machine and fit a profile.

Runs the real decoder on a few held-out prompts at several block sizes, records every
round's draft and verify seconds with its context length, fits the monotone latency model
of :mod:`adaptspec.costs.latency` and writes it as JSON (usable anywhere a profile name is:
``adaptspec simulate --latency FILE``). ``--speculator MODULE:FACTORY`` times your own
speculator instead (:mod:`adaptspec.cli.user_speculator`; its codec encodes the prompts).

On a CPU with adaptspec's own models it first says what the host measurement
(:mod:`adaptspec.host`, as ``adaptspec demo`` and ``adaptspec serve`` run it: cached per host, or
timed, about 20 CPU seconds) measured and chose: each dtype's plain round, the dtype that
decodes fastest here, the 4-token verify's cost over a 1-token one, and whether speculating
pays at the prior's acceptance (the block size the default starts from); ``--json`` carries it
as ``host`` (what ``/health`` reports).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple

from ..collect.checked import checked_decode, checked_prefill
from ._types import block_sizes, input_file, int_range
from .user_speculator import (
    add_model_options,
    load_speculator_factory,
    model_flags_given,
    speculator_from_flags,
)

#: the block sizes timed by default (those up to the speculator's max_block_size)
DEFAULT_ARMS = [1, 2, 4, 8, 12, 16, 24, 32]


def add_arguments(p: argparse.ArgumentParser) -> None:
    _add_profile_options(p)
    add_model_options(p, not_with=" or the --batch-* timings")
    _add_output_options(p)
    _add_batch_options(p)


def _add_profile_options(p: argparse.ArgumentParser) -> None:
    """What is profiled: the prompts, the block sizes and where the profile goes."""
    p.add_argument(
        "--prompts",
        type=_prompts,
        default=6,
        metavar="N|FILE",
        help="N held-out prompts to decode (spread over domains; default 6), or a JSONL file of them, "
        "each row 'prompt' (text) or 'prompt_ids' (the target's token ids, a list of integers: for "
        "a target without a tokenizer)",
    )
    p.add_argument(
        "--arms",
        type=block_sizes,
        default=None,
        help=f"block sizes to time (default: {','.join(map(str, DEFAULT_ARMS))} up to the speculator's "
        "max_block_size)",
    )
    p.add_argument("--max-new-tokens", type=int_range(1), default=64)
    p.add_argument("--name", default="cpu-measured")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="profile JSON (default: <cache>/latency/NAME.json); replaces only a latency profile",
    )


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """Whether the host's round costs are timed again, and the output as JSON."""
    p.add_argument(
        "--remeasure",
        action="store_true",
        help="time this host's round costs again (adaptspec.host) instead of reading the cached record",
    )
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")


def _add_batch_options(p: argparse.ArgumentParser) -> None:
    """Timing batched rounds: the rows, tokens and contexts, the repeats and the engine."""
    p.add_argument(
        "--batch-rows",
        type=_positive_ints,
        default=None,
        help="also time batched rounds (adaptspec.batching) at these row counts, e.g. 1,2,4,8,16: the profile's batch axis",
    )
    p.add_argument(
        "--batch-tokens",
        type=_positive_ints,
        default=[1, 2, 4, 8, 16],
        help="tokens per row of the batched rounds",
    )
    p.add_argument(
        "--batch-contexts",
        type=_positive_ints,
        default=[64, 256],
        help="context tokens per row of the batched rounds",
    )
    p.add_argument(
        "--batch-repeats",
        type=int_range(1),
        default=3,
        help="passes per batched measurement (the fastest is kept)",
    )
    p.add_argument(
        "--batch-only", action="store_true", help="time only the batched rounds (no prompts decoded)"
    )
    p.add_argument(
        "--batch-engine",
        action="store_true",
        help="time the engine's whole rounds on held-out prompt text cut to --batch-contexts tokens "
        "(passes, acceptance, commit: what a served round costs; --batch-repeats rounds kept per "
        "cell) instead of its two passes on synthetic rows",
    )
    p.add_argument(
        "--batch-cpu-time",
        action="store_true",
        help="time batched rounds in process CPU seconds (CPU, one thread: robust to other load on a shared machine)",
    )


def timed_rounds(decoded: list, where: str) -> tuple[list[dict], bool]:
    """The rounds to fit, from ``(prompt_tokens, block_size, outcome)`` triples, each with its
    context, and whether they were timed from whole requests.

    Rounds that carry their times (every ``verify_s`` > 0) are fitted as they are. A loop that
    does not time its rounds reports them 0: then each request's ``decode_s`` (the loop's wall
    time) is shared equally among its rounds, all of it on the verify curve (the draft curve 0:
    the two passes cannot be told apart). Neither: one line.

    >>> from adaptspec.speculator import Outcome, Round
    >>> o = Outcome([1] * 5, [Round(4, 2, 0.0, 0.0), Round(4, 2, 0.0, 0.0)], decode_s=0.5)
    >>> timed_rounds([(10, 4, o)], "mine")
    ([{'block_size': 4, 'draft_s': 0.0, 'verify_s': 0.25, 'context_tokens': 11}, {'block_size': 4, 'draft_s': 0.0, 'verify_s': 0.25, 'context_tokens': 13}], True)
    """
    from ..errors import AdaptspecError

    every = [r for _, _, o in decoded for r in o.rounds]
    whole = any(r.verify_s <= 0 for r in every)
    if whole and any(o.rounds and not o.decode_s > 0 for _, _, o in decoded):
        raise AdaptspecError(
            f"{where} reports no times: its rounds' verify_s and its outcomes' decode_s are 0; time "
            "its rounds (Round.draft_s and verify_s, seconds) or at least its loop (Outcome.decode_s)"
        )
    rows = []
    for prompt_tokens, _, o in decoded:
        ctx = prompt_tokens + 1
        for r in o.rounds:
            draft, verify = (0.0, o.decode_s / len(o.rounds)) if whole else (r.draft_s, r.verify_s)
            rows.append(
                {"block_size": r.block_size, "draft_s": draft, "verify_s": verify, "context_tokens": ctx}
            )
            ctx += r.tau
    return rows, whole


def _prompts(text: str) -> int | Path:
    """``--prompts``: a count of held-out prompts, or a prompt file (read once the flags are checked)."""
    return int_range(1)(text) if text.lstrip("+-").isdigit() else input_file(text)


def _positive_ints(text: str) -> list[int]:
    try:
        xs = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,2,4, got {text!r}") from None
    if not xs or xs[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,2,4, got {text!r}")
    return xs


def run(args: argparse.Namespace) -> int:
    """Time the speculator's rounds on held-out prompts (and the batched engine's with
    ``--batch-rows``), fit the latency profile to them, write it and say what it holds."""
    from .._util.outputs import check_output, write_file
    from ..decoding.loading import cache_dir
    from ..models.prompts import heldout_prompts

    _check_flags(args)
    out = args.out or cache_dir() / "latency" / f"{args.name}.json"
    check_output(out, "latency-profile", replace=True)
    pool = heldout_prompts()
    picked = _picked_prompts(args, pool)
    timed = _own_models(args, picked) if args.speculator is None else _user_speculator(args, picked)
    _choose_arms(args, timed.spec)
    rounds, whole = timed_rounds(_decoded(args, timed, picked), timed.who)
    if args.batch_rows:
        surface = _batched_rounds(args, timed.spec, pool)
        rounds += surface
    profile = _fitted_profile(args, rounds, whole, timed.where)
    write_file(out, "latency-profile", True, profile.save)
    if args.batch_rows and not args.json:
        from ..batching.cost_surface import fit_errors

        errs = fit_errors(profile, surface, totals=args.batch_engine)
        print("fit on the batched rounds: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in errs.items()))
    _report(args, profile, out, len(rounds), whole, timed.host)
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse flags that do not go together, before anything loads."""
    from ..errors import AdaptspecError

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
    if args.speculator is not None and args.batch_rows:
        raise AdaptspecError(
            "--batch-rows times adaptspec's batched engine on its own models: drop it with --speculator"
        )
    if args.batch_only and not args.batch_rows:
        raise AdaptspecError("--batch-only needs --batch-rows")


def _picked_prompts(args: argparse.Namespace, pool: list) -> list:
    """The prompts timed: ``--prompts N`` held-out ones taken in turn by domain, or a file's."""
    from ..errors import AdaptspecError
    from ..models.prompts import read_prompts

    domains = sorted({p.domain for p in pool})
    most = len(domains) * min(sum(p.domain == d for p in pool) for d in domains)
    if isinstance(args.prompts, int) and args.prompts > most:
        raise AdaptspecError(
            f"--prompts {args.prompts}: there are {most} held-out prompts to take in turn by domain"
        )
    if isinstance(args.prompts, int):
        return [
            [p for p in pool if p.domain == domains[i % len(domains)]][i // len(domains)]
            for i in range(args.prompts)
        ]
    return read_prompts(args.prompts)  # one line naming the file and the row, before any model loads


class _Timed(NamedTuple):
    """The speculator timed, how it encodes a prompt, where it runs (said in the profile's
    source), who decodes (said in errors) and the host measurement (None unless measured)."""

    spec: Any
    encode: Callable[[str], list[int]]
    where: str
    who: str
    host: Any = None


def _own_models(args: argparse.Namespace, picked: list) -> _Timed:
    """adaptspec's own target and drafter, the prompts checked against the target; on a CPU,
    the host measurement too (said before the timings)."""
    import torch

    from ..errors import AdaptspecError
    from ..models.prompts import IDS_INSTEAD, check_prompt_ids

    spec = speculator_from_flags(args)
    text = [p for p in picked if p.prompt_ids is None]
    if spec.target.tokenizer is None and text and not args.batch_only:
        what = text[0].where if isinstance(args.prompts, Path) else "its held-out text prompts"
        raise AdaptspecError(
            f"--target {args.target}: this target has no tokenizer, so profile-latency cannot encode "
            f"text prompts ({what}): add the tokenizer's files to the target directory, or "
            f"{IDS_INSTEAD}"
        )
    check_prompt_ids(
        picked,
        spec.target.vocab_size,
        getattr(spec.target.model.config, "max_position_embeddings", None),
        args.max_new_tokens,
        "the target's",
    )
    host = None
    if args.device == "cpu":  # what demo and serve measure and choose on this host, said before the timings
        from ..host import for_models

        host = for_models(
            args.target,
            args.drafter,
            args.verification,
            torch.get_num_threads(),
            remeasure=args.remeasure,
        )
        if not args.json:
            print(f"host measurement: {host.summary()}", flush=True)
    return _Timed(spec, spec.target.encode_chat, f"{args.device}, {args.dtype}", "the decoder", host)


def _user_speculator(args: argparse.Namespace, picked: list) -> _Timed:
    """The speculator ``--speculator`` makes, the prompts checked against its vocabulary and context."""
    import torch

    from ..models.prompts import check_prompt_ids

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    user = load_speculator_factory(args.speculator)
    where = f"--speculator {user.path}"
    check_prompt_ids(picked, user.vocab_size, user.max_context, args.max_new_tokens, f"{where}'s")
    return _Timed(user.speculator, user.codec.encode, where, where)


def _choose_arms(args: argparse.Namespace, spec) -> None:
    """``--arms`` by default the timed block sizes up to the speculator's largest; refused beyond it."""
    from ..errors import AdaptspecError

    if args.arms is None:
        args.arms = [b for b in DEFAULT_ARMS if b <= spec.max_block_size]
    bad = [a for a in args.arms if not 1 <= a <= spec.max_block_size]
    if bad:
        raise AdaptspecError(f"--arms {bad} outside 1..{spec.max_block_size}")


def _decoded(args: argparse.Namespace, timed: _Timed, picked: list) -> list:
    """``(prompt tokens, block size, outcome)`` of every picked prompt decoded at every block
    size (none with ``--batch-only``)."""
    from tqdm import tqdm

    decoded = []
    for i, p in enumerate(
        tqdm(
            [] if args.batch_only else picked, desc="profile", unit="prompt", disable=not sys.stderr.isatty()
        )
    ):
        ids = timed.encode(p.prompt) if p.prompt_ids is None else list(p.prompt_ids)
        who = timed.who
        at = f"{who}, held-out prompt {i}" if isinstance(args.prompts, int) else f"{who}, {p.where}"
        pre = checked_prefill(timed.spec, ids, 0.0, 0, at)
        decoded += [
            (len(ids), b, checked_decode(timed.spec, pre, b, args.max_new_tokens, at)) for b in args.arms
        ]
    return decoded


def _batched_rounds(args: argparse.Namespace, spec, pool: list) -> list[dict]:
    """The batched rounds ``--batch-rows`` asks for: whole engine rounds on held-out prompts
    (``--batch-engine``) or the target's and drafter's passes alone; printed as tables
    unless ``--json``."""
    from ..batching.cost_surface import measure_rounds, measure_surface, round_table, surface_table
    from ..errors import AdaptspecError

    if args.batch_engine:
        bad = [b for b in args.batch_tokens if b > spec.max_block_size]
        if bad:
            raise AdaptspecError(
                f"--batch-tokens {bad}: the drafter's largest block is {spec.max_block_size}"
            )
        text = [t for p in pool for t in spec.target.encode_chat(p.prompt)]  # held-out prompts, end to end
        surface = []
        for c in args.batch_contexts:  # each row a different stretch of them, c tokens long
            ids = [text[i * 37 % max(1, len(text) - c) :][:c] for i in range(max(args.batch_rows))]
            surface += measure_rounds(
                spec.target,
                spec.drafter,
                ids,
                args.batch_rows,
                args.batch_tokens,
                rounds=args.batch_repeats,
            )
    else:
        surface = measure_surface(
            spec.target,
            spec.drafter,
            args.batch_rows,
            args.batch_tokens,
            args.batch_contexts,
            repeats=args.batch_repeats,
            cpu_time=args.batch_cpu_time,
        )
    if not args.json:
        tables = (
            [round_table(surface)]
            if args.batch_engine
            else [surface_table(surface, f) for f in ("verify_s", "draft_s")]
        )
        print(*tables, sep="\n")
    return surface


def _fitted_profile(args: argparse.Namespace, rounds: list[dict], whole: bool, where: str):
    """The latency profile fitted to the rounds, its source saying what was timed on what machine."""
    import torch

    from ..costs.latency import fit_profile

    machine = f"{platform.machine()}, {where}, {torch.get_num_threads()} threads"
    source = f"adaptspec profile-latency: {len(rounds)} rounds on {machine}"
    if whole:
        source += (
            " (timed from whole-request decode_s: its rounds carry no times; round time on the verify curve)"
        )
    if args.batch_engine and args.batch_only:
        from ..costs.latency import fit_round_totals

        return fit_round_totals(rounds, args.name, source=source + " (whole engine rounds)")
    return fit_profile(rounds, args.name, source=source)


def _report(args: argparse.Namespace, profile, out: Path, n_rounds: int, whole: bool, host) -> None:
    """The profile's draft and verify times at its median context, per block size: a table, or
    one JSON object with ``--json``."""
    ctx = profile.context_tokens
    rows = [
        {
            "block_size": b,
            "draft_ms": float(profile.draft_s(b, ctx)) * 1e3,
            "verify_ms": float(profile.verify_s(b, ctx)) * 1e3,
        }
        for b in args.arms
    ]
    timing = "whole-request" if whole else "per-round"
    if args.json:
        print(
            json.dumps(
                {
                    "profile": str(out),
                    "context_tokens": ctx,
                    "rounds": n_rounds,
                    "times": timing,
                    "fit": rows,
                    "host": None if host is None else host.to_dict(),
                }
            )
        )
        return
    if whole:
        print(
            "the speculator's rounds carry no times (draft_s and verify_s 0): fitted to each request's decode_s "
            "shared among its rounds, the whole round on the verify curve"
        )
    print(f"fitted to {n_rounds} rounds at a median context of {ctx} tokens; wrote {out}")
    print(f"{'B':>4} {'draft ms':>9} {'verify ms':>10}")
    for r in rows:
        print(f"{r['block_size']:>4} {r['draft_ms']:>9.1f} {r['verify_ms']:>10.1f}")
