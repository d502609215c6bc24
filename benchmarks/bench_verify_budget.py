"""Verify budget: "draft D, verify a prefix of B" against "draft B alone" (issue 40, item 1).

Two questions, per drafter:

1. **Acceptance.** At T = 0, for every fixed block size ``B`` in ``1..D`` and ``D`` in {8, 16},
   the tokens per round (``tau``, bonus included) of a request decoded with each round's ``B - 1``
   drafts drafted alone, against the first ``B - 1`` of a block of ``D`` drafted every round. The
   bundled drafter's figures come from the dense traces of the benchmark prompts
   (``datasets/dense/benchmarks-fast``, 336 prompts): ``accept[p, b - 2]`` holds what a block of
   ``b`` drafted alone accepts at every position ``p`` of the target's greedy text, so a prefix of
   ``B`` of a block of ``D`` accepts ``min(accept[p, D - 2], B - 1)``; each request is replayed round
   by round, blocks cut near the end as the decoder cuts them. No model runs. The DFlash-layout
   drafter's come from the same table computed here (``adaptspec.decoding.acceptance``) for the
   distilled DFlash fixture (``tests/data/dflash-trained-tiny``, a tiny random target, random
   prompts): the only DFlash-layout drafter here whose drafts are ever accepted. The random-weight
   reference fixture (``tests/data/dflash-reference-tiny``) accepts by chance only: cost, not
   acceptance.
2. **Cost.** The drafter pass of ``D`` against ``B`` (one row, ``draft_logits``; and the engine's
   batched pass over 4 and 8 rows, ``draft_logits_rows``), and the target's verify pass of ``B``,
   all interleaved in every repeat on this CPU; medians with bootstrap 95% intervals (paired by
   repeat for differences). Times are the process's CPU milliseconds of each call on one torch
   thread (the machine is shared: wall times, kept as ``wall:``, include waits for a core). A
   round's modelled time is ``draft(d) + verify(B)``; tokens per second is ``tau / round``.

    nice -n 5 python benchmarks/bench_verify_budget.py --out benchmarks/results/verify-budget.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from adaptspec.traces.dense import DenseTraceSet

ROOT = Path(__file__).resolve().parent.parent
DRAFT_LENGTHS = (8, 16)
COST_BLOCKS = (2, 3, 4, 5, 6, 8, 12, 16)


# ------------------------------------------------------------------ acceptance
def replay(
    accept: np.ndarray, n_tokens: int, block: int, draft_length: int | None, max_new: int = 128
) -> tuple[int, int]:
    """(rounds, tokens committed) of fixed ``block`` on one request's acceptance table: drafting
    each round's block alone (``draft_length`` None) or ``draft_length`` and verifying a prefix.
    A block is cut to the tokens left before ``max_new`` (the decoder's rule); a block of 1
    drafts nothing; a round commits nothing past the request's last token (its EOS)."""
    rounds, made, p = 0, 1, 0
    while made < n_tokens:
        v = min(block, max_new - made)
        if v == 1:
            a = 0
        elif draft_length is None:
            a = int(accept[p, v - 2])
        else:
            a = min(int(accept[p, draft_length - 2]), v - 1)
        a = min(a, n_tokens - made - 1)
        rounds += 1
        made += a + 1
        p += a + 1
    return rounds, made - 1


def acceptance(tables: list[tuple[np.ndarray, int, int]], seed: int = 0, boots: int = 1000) -> dict:
    """Mean tau (tokens / rounds over all requests) of every (D, B), alone and prefix, the ratio
    prefix / alone with a bootstrap 95% interval over requests, and the share of positions where
    the prefix accepts a different number of drafts."""
    rng = np.random.default_rng(seed)
    out = {}
    for d in DRAFT_LENGTHS:
        rows = []
        for b in range(1, d + 1):
            alone = np.array([replay(a, n, b, None, m) for a, n, m in tables], dtype=float)
            pre = np.array([replay(a, n, b, d, m) for a, n, m in tables], dtype=float)
            t_alone, t_pre = alone[:, 1].sum() / alone[:, 0].sum(), pre[:, 1].sum() / pre[:, 0].sum()
            idx = rng.integers(0, len(tables), size=(boots, len(tables)))
            ratio = (pre[idx, 1].sum(1) / pre[idx, 0].sum(1)) / (alone[idx, 1].sum(1) / alone[idx, 0].sum(1))
            pos = np.concatenate([a for a, _, _ in tables])
            differ = 0.0 if b < 2 else float((np.minimum(pos[:, d - 2], b - 1) != pos[:, b - 2]).mean())
            rows.append(
                {
                    "B": b,
                    "tau_alone": float(t_alone),
                    "tau_prefix": float(t_pre),
                    "ratio": float(t_pre / t_alone),
                    "ratio_ci95": [float(np.quantile(ratio, 0.025)), float(np.quantile(ratio, 0.975))],
                    "positions_differ": differ,
                }
            )
        out[str(d)] = rows
    return out


def dense_tables(path: Path) -> list[tuple[np.ndarray, int, int]]:
    ds = DenseTraceSet.open(path)
    m = int(ds.meta["max_new_tokens"])
    return [(r.accept, len(r.tokens), m) for _, _, r in ds.requests()]


def fixture_tables(prompts: int, max_new: int) -> list[tuple[np.ndarray, int, int]]:
    """The acceptance table of the distilled DFlash fixture on random prompts (the dense traces' way)."""
    from adaptspec.decoding.acceptance import draft_acceptance
    from adaptspec.models import load_speculator

    spec = load_speculator(
        str(ROOT / "tests/data/dflash-reference-tiny/target"),
        str(ROOT / "tests/data/dflash-trained-tiny/drafter"),
        dtype="float32",
    )
    g = torch.Generator().manual_seed(999)
    out = []
    for _ in range(prompts):
        ids = torch.randint(0, spec.target.vocab_size - 1, (12,), generator=g).tolist()
        pre = spec.prefill(ids)
        tokens = spec.decode(pre, 1, max_new).tokens
        context = spec.teacher_forced_context(pre, tokens[:-1])
        seq = torch.tensor(ids + tokens)
        acc, _, _ = draft_acceptance(spec.drafter, context, seq, len(ids), range(2, 17))
        out.append((acc, len(tokens), max_new))
    return out


def decoder_check(spec, prompts: list[list[int]], block: int, draft_length: int, max_new: int) -> dict:
    """The real decoder at ``block``, each block drafted alone against ``draft_length`` drafted
    and a prefix verified (``SpeculativeDecoder(draft_length=...)``), greedy: tau of each, and
    whether the outputs are equal (they are the target's either way, up to fast verification's
    near-ties)."""
    from adaptspec.decoding import SpeculativeDecoder

    prefix = SpeculativeDecoder(spec.target, spec.drafter, draft_length=draft_length)
    out = {"alone": [0, 0], "prefix": [0, 0], "same_tokens": 0, "prompts": len(prompts)}
    for ids in prompts:
        pre = spec.prefill(ids)
        a = spec.decode(pre, block, max_new)
        b = prefix.decode(pre, block, max_new)
        for key, o in (("alone", a), ("prefix", b)):
            out[key][0] += len(o.rounds)
            out[key][1] += sum(r.tau for r in o.rounds)
        out["same_tokens"] += a.tokens == b.tokens
    out["tau_alone"] = out["alone"][1] / out["alone"][0]
    out["tau_prefix"] = out["prefix"][1] / out["prefix"][0]
    out["block"], out["draft_length"], out["max_new_tokens"] = block, draft_length, max_new
    return out


# ------------------------------------------------------------------ cost
def _ci(xs: list[float], seed: int = 0, boots: int = 1000) -> list[float]:
    a = np.asarray(xs)
    rng = np.random.default_rng(seed)
    med = np.median(a[rng.integers(0, len(a), size=(boots, len(a)))], axis=1)
    return [float(np.quantile(med, 0.025)), float(np.quantile(med, 0.975))]


@torch.inference_mode()
def cost(spec, context_tokens: int, repeats: int, rows: tuple[int, ...], verify: bool) -> dict:
    """Draft pass ms by block (1 row and batched rows) and verify pass ms by block, interleaved."""
    from adaptspec.batching.draft_pass import draft_logits_rows

    drafter, target = spec.drafter, spec.target
    top = drafter.config.max_block_size
    blocks = [b for b in COST_BLOCKS if b <= top]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(10, target.vocab_size - 1, (context_tokens,), generator=g).tolist()
    pre = spec.prefill(ids)
    ctx = pre.state.context_hidden
    state = drafter.new_state(ctx)
    states = {r: [drafter.new_state(ctx) for _ in range(r)] for r in rows if r > 1}
    cache = pre.state.cache
    last = pre.first_token
    times: dict[str, list[float]] = {}

    def clock(key, fn):  # CPU time of the process (robust to waiting for a shared core), and wall time
        t, c = time.perf_counter(), time.process_time()
        fn()
        times.setdefault(key, []).append(1000 * (time.process_time() - c))
        times.setdefault("wall:" + key, []).append(1000 * (time.perf_counter() - t))

    for warm in range(2 + repeats):
        for b in blocks:
            clock(f"draft/1/{b}", lambda: drafter.draft_logits(state, last, b))
            for r, ss in states.items():
                clock(f"draft/{r}/{b}", lambda: draft_logits_rows(drafter, ss, [last] * r, [b] * r))
            if verify:

                def ver():
                    target.verify(torch.tensor([last] * b), cache, context=True)
                    target.crop(cache, context_tokens)

                clock(f"verify/{b}", ver)
        if warm < 2:
            times.clear()
    return {k: {"median_ms": statistics.median(v), "ci95": _ci(v), "samples": v} for k, v in times.items()}


def paired_diff(times: dict, a: str, b: str) -> dict:
    d = [x - y for x, y in zip(times[a]["samples"], times[b]["samples"])]
    return {"median_ms": statistics.median(d), "ci95": _ci(d)}


def speeds(acc: dict, times: dict) -> dict:
    """Modelled tokens/s at every block of the cost table: drafting B alone, or D and verifying B."""
    out = {}
    for d in DRAFT_LENGTHS:
        if f"draft/1/{d}" not in times:
            continue
        rows = []
        for r in acc[str(d)]:
            b = r["B"]
            if b not in COST_BLOCKS or f"verify/{b}" not in times:
                continue
            v = times[f"verify/{b}"]["median_ms"]
            alone = r["tau_alone"] / (times[f"draft/1/{b}"]["median_ms"] + v) * 1000
            pre = r["tau_prefix"] / (times[f"draft/1/{d}"]["median_ms"] + v) * 1000
            rows.append({"B": b, "tok_s_alone": alone, "tok_s_prefix": pre, "ratio": pre / alone})
        out[str(d)] = rows
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dense", default=str(ROOT / "datasets/dense/benchmarks-fast"))
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--fixture-prompts", type=int, default=16)
    ap.add_argument(
        "--check-prompts", type=int, default=8, help="public benchmark prompts decoded for real (bundled)"
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/verify-budget.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from adaptspec.models import load_speculator

    t0 = time.time()
    result = {
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": args.threads,
            "cpu_load_1min_at_start": __import__("os").getloadavg()[0],
        },
        "command": "python benchmarks/bench_verify_budget.py "
        + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("dense", "out")
        ),
    }
    tables = dense_tables(Path(args.dense))
    bundled_acc = acceptance(tables)
    print("bundled acceptance", f"{time.time() - t0:.0f}s", flush=True)
    bundled = load_speculator()
    bundled_cost = cost(bundled, args.context, args.repeats, rows=(1, 4, 8), verify=True)
    print("bundled cost", f"{time.time() - t0:.0f}s", flush=True)
    from adaptspec.models.prompts import benchmark_prompts

    pool = benchmark_prompts()
    picked = [pool[i * len(pool) // args.check_prompts] for i in range(args.check_prompts)]
    check = decoder_check(bundled, [bundled.target.encode_chat(p.prompt) for p in picked], 4, 16, 128)
    print("bundled decoder check", f"{time.time() - t0:.0f}s", flush=True)
    result["bundled"] = {
        "acceptance_source": f"dense traces {args.dense} ({len(tables)} requests, "
        f"{sum(len(a) for a, _, _ in tables)} positions, T = 0, fast verification)",
        "acceptance": bundled_acc,
        "cost_ms": {k: {kk: vv for kk, vv in v.items() if kk != "samples"} for k, v in bundled_cost.items()},
        "draft_extra_ms": {
            f"{r}rows/D{d}-B{b}": paired_diff(bundled_cost, f"draft/{r}/{d}", f"draft/{r}/{b}")
            for r in (1, 4, 8)
            for d in DRAFT_LENGTHS
            for b in (2, 3, 4, 6, 8)
            if b < d
        },
        "speed": speeds(bundled_acc, bundled_cost),
        "context_tokens": args.context,
        "decoder_check": check,
    }
    fx_tables = fixture_tables(args.fixture_prompts, 96)
    fx_acc = acceptance(fx_tables)
    fx = load_speculator(
        str(ROOT / "tests/data/dflash-reference-tiny/target"),
        str(ROOT / "tests/data/dflash-trained-tiny/drafter"),
        dtype="float32",
    )
    fx_cost = cost(fx, 64, args.repeats, rows=(1, 8), verify=True)
    g = torch.Generator().manual_seed(999)  # the acceptance table's prompts
    fx_prompts = [
        torch.randint(0, fx.target.vocab_size - 1, (12,), generator=g).tolist()
        for _ in range(args.fixture_prompts)
    ]
    fx_check = {b: decoder_check(fx, fx_prompts, b, 16, 96) for b in (4, 8)}
    ref = load_speculator(
        str(ROOT / "tests/data/dflash-reference-tiny/target"),
        str(ROOT / "tests/data/dflash-reference-tiny/drafter"),
        dtype="float32",
    )
    ref_cost = cost(ref, 64, args.repeats, rows=(1, 8), verify=False)
    result["dflash_trained_tiny"] = {
        "acceptance_source": f"the distilled DFlash fixture on its tiny random target, {len(fx_tables)} random "
        f"12-token prompts, 96 greedy tokens each, float32",
        "acceptance": fx_acc,
        "cost_ms": {k: {kk: vv for kk, vv in v.items() if kk != "samples"} for k, v in fx_cost.items()},
        "draft_extra_ms": {
            f"{r}rows/D{d}-B{b}": paired_diff(fx_cost, f"draft/{r}/{d}", f"draft/{r}/{b}")
            for r in (1, 8)
            for d in DRAFT_LENGTHS
            for b in (2, 4, 8)
            if b < d
        },
        "speed": speeds(fx_acc, fx_cost),
        "decoder_check": fx_check,
    }
    result["dflash_reference_tiny"] = {
        "note": "random weights: accepts by chance only, so cost and not acceptance",
        "cost_ms": {k: {kk: vv for kk, vv in v.items() if kk != "samples"} for k, v in ref_cost.items()},
        "draft_extra_ms": {
            f"{r}rows/D{d}-B{b}": paired_diff(ref_cost, f"draft/{r}/{d}", f"draft/{r}/{b}")
            for r in (1, 8)
            for d in DRAFT_LENGTHS
            for b in (2, 4, 8)
            if b < d
        },
    }
    result["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} ({result['wall_s']:.0f}s)")


if __name__ == "__main__":
    main()
