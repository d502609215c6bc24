"""``adaptspec profile-latency``: measure draft and verify times on this machine and fit a profile.

Runs the real decoder on a few held-out prompts at several block sizes, records every
round's draft and verify seconds with its context length, fits the monotone latency model
of :mod:`adaptspec.reward.latency` and writes it as JSON (usable anywhere a profile name is:
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

from ..collect.checked import checked_decode, checked_prefill
from ._types import block_sizes, device, input_file, int_range, threads
from .user_speculator import SPECULATOR_HELP, load_speculator_factory, model_flags_given, speculator_path

#: the block sizes timed by default (those up to the speculator's max_block_size)
DEFAULT_ARMS = [1, 2, 4, 8, 12, 16, 24, 32]


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--speculator",
        type=speculator_path,
        default=None,
        metavar="MODULE:FACTORY",
        help=SPECULATOR_HELP + " (not with --target, --drafter, --verification, --dtype, --device or "
        "the --batch-* timings)",
    )
    p.add_argument("--target", default=None, help="target model directory (default: bundled SmolLM2)")
    p.add_argument(
        "--drafter", default=None, help="drafter directory: adaptspec's own or a published DFlash v1 one"
    )
    p.add_argument(
        "--verification",
        choices=["fast", "exact"],
        default="fast",
        help="fast: the model's own kernels, plain speed at B=1 (default); exact: bit-identical to one-token greedy, slower",
    )
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--device",
        type=device,
        default="cpu",
        help="cpu, cuda, cuda:N or mps (checked before the model loads)",
    )
    p.add_argument("--threads", type=threads, default=None)
    p.add_argument(
        "--remeasure",
        action="store_true",
        help="time this host's round costs again (adaptspec.host) instead of reading the cached record",
    )
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")
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
    import torch
    from tqdm import tqdm

    from .._util.outputs import check_output, write_file
    from ..decoding.loading import cache_dir
    from ..errors import AdaptspecError
    from ..models import load_speculator
    from ..models.prompts import IDS_INSTEAD, check_prompt_ids, heldout_prompts, read_prompts
    from ..reward.latency import fit_profile

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
    out = args.out or cache_dir() / "latency" / f"{args.name}.json"
    check_output(out, "latency-profile", replace=True)
    pool = heldout_prompts()
    domains = sorted({p.domain for p in pool})
    most = len(domains) * min(sum(p.domain == d for p in pool) for d in domains)
    if isinstance(args.prompts, int) and args.prompts > most:
        raise AdaptspecError(
            f"--prompts {args.prompts}: there are {most} held-out prompts to take in turn by domain"
        )
    if isinstance(args.prompts, int):
        picked = [
            [p for p in pool if p.domain == domains[i % len(domains)]][i // len(domains)]
            for i in range(args.prompts)
        ]
    else:
        picked = read_prompts(args.prompts)  # one line naming the file and the row, before any model loads
    host = None
    if args.speculator is None:
        spec = load_speculator(
            args.target,
            args.drafter,
            dtype=args.dtype,
            device=args.device,
            threads=args.threads,
            verification=args.verification,
        )
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
        encode, where, who = spec.target.encode_chat, f"{args.device}, {args.dtype}", "the decoder"
        if (
            args.device == "cpu"
        ):  # what demo and serve measure and choose on this host, said before the timings
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
    else:
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        user = load_speculator_factory(args.speculator)
        spec, encode, where = user.speculator, user.codec.encode, f"--speculator {user.path}"
        who = where
        check_prompt_ids(picked, user.vocab_size, user.max_context, args.max_new_tokens, f"{where}'s")
    if args.arms is None:
        args.arms = [b for b in DEFAULT_ARMS if b <= spec.max_block_size]
    bad = [a for a in args.arms if not 1 <= a <= spec.max_block_size]
    if bad:
        raise AdaptspecError(f"--arms {bad} outside 1..{spec.max_block_size}")
    decoded = []  # (prompt tokens, block size, outcome)
    for i, p in enumerate(
        tqdm(
            [] if args.batch_only else picked, desc="profile", unit="prompt", disable=not sys.stderr.isatty()
        )
    ):
        ids = encode(p.prompt) if p.prompt_ids is None else list(p.prompt_ids)
        at = f"{who}, held-out prompt {i}" if isinstance(args.prompts, int) else f"{who}, {p.where}"
        pre = checked_prefill(spec, ids, 0.0, 0, at)
        decoded += [(len(ids), b, checked_decode(spec, pre, b, args.max_new_tokens, at)) for b in args.arms]
    rounds, whole = timed_rounds(decoded, who)
    if args.batch_rows:
        from ..batching.cost_surface import measure_rounds, measure_surface, round_table, surface_table

        if args.batch_engine:
            bad = [b for b in args.batch_tokens if b > spec.max_block_size]
            if bad:
                raise AdaptspecError(
                    f"--batch-tokens {bad}: the drafter's largest block is {spec.max_block_size}"
                )
            text = [
                t for p in pool for t in spec.target.encode_chat(p.prompt)
            ]  # held-out prompts, end to end
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
        rounds += surface
        if not args.json:
            tables = (
                [round_table(surface)]
                if args.batch_engine
                else [surface_table(surface, f) for f in ("verify_s", "draft_s")]
            )
            print(*tables, sep="\n")
    machine = f"{platform.machine()}, {where}, {torch.get_num_threads()} threads"
    source = f"adaptspec profile-latency: {len(rounds)} rounds on {machine}"
    if whole:
        source += (
            " (timed from whole-request decode_s: its rounds carry no times; round time on the verify curve)"
        )
    if args.batch_engine and args.batch_only:
        from ..reward.latency import fit_round_totals

        profile = fit_round_totals(rounds, args.name, source=source + " (whole engine rounds)")
    else:
        profile = fit_profile(rounds, args.name, source=source)
    write_file(out, "latency-profile", True, profile.save)
    if args.batch_rows and not args.json:
        from ..batching.cost_surface import fit_errors

        errs = fit_errors(profile, surface, totals=args.batch_engine)
        print("fit on the batched rounds: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in errs.items()))
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
                    "rounds": len(rounds),
                    "times": timing,
                    "fit": rows,
                    "host": None if host is None else host.to_dict(),
                }
            )
        )
    else:
        if whole:
            print(
                "the speculator's rounds carry no times (draft_s and verify_s 0): fitted to each request's decode_s "
                "shared among its rounds, the whole round on the verify curve"
            )
        print(f"fitted to {len(rounds)} rounds at a median context of {ctx} tokens; wrote {out}")
        print(f"{'B':>4} {'draft ms':>9} {'verify ms':>10}")
        for r in rows:
            print(f"{r['block_size']:>4} {r['draft_ms']:>9.1f} {r['verify_ms']:>10.1f}")
    return 0
