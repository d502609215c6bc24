"""Section 6: end to end on the real decoder (no replay).

The same held-out prompts, in the same process, three ways: plain greedy decoding of the
target alone (transformers' own kernels and KV cache, :func:`~adaptspec.decoding.greedy.plain_greedy`;
for a speculator that is not a transformers model, block size 1 through its own loop), the
best fixed block size, and :class:`~adaptspec.AdaptiveController` with the default policy
learning online. The order of the three rotates from prompt to prompt so
that slow changes in the machine's speed favour none of them. Reported: tokens per second of
decoding (prefill excluded, as everywhere), mean tau, whether the outputs are identical (they
must be at temperature 0), and the controller's own time per request (featurize, decide,
reward, log, enqueue the update) against the decode time.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from ..costs.machine_speed import MEASURED_REWARDS
from ..errors import AdaptspecError
from ..reward.functions import DEFAULT_REWARD, trace_rewards
from .core import ProgressBar, Settings, make_contexts, provenance, split_requests
from .replay_sections import default_reward

METHODS = ("plain", "fixed", "controller")


def run_e2e(
    speculator: Any,
    prompts: Sequence[tuple[str, str, Sequence[int]]],
    fixed_block: int,
    policy: Any,
    *,
    featurizer: Any = None,
    max_new_tokens: int = 64,
    warmup: bool = True,
    progress: bool = True,
    speed_reference: Any = "auto",
) -> dict[str, Any]:
    """Decode every prompt plainly, at ``fixed_block`` and through a controller over ``policy``.

    ``prompts`` are ``(request_id, domain, token_ids)``. The controller learns online (the
    default reward, minus measured ms per token) from the first prompt on, calibrated to
    ``speed_reference`` (the controller's argument: the profile that timed the head's rewards).
    """
    from ..control.controller import AdaptiveController

    if not prompts:
        raise AdaptspecError("the end-to-end section needs at least one prompt")
    if not 1 <= fixed_block <= speculator.max_block_size:
        raise AdaptspecError(f"fixed block size {fixed_block} outside 1..{speculator.max_block_size}")
    plain = _Plain(speculator)
    if warmup:  # first calls pay for lazy initialisation; keep them out of the timings
        pre = speculator.prefill(list(prompts[0][2]))
        for b in sorted({1, fixed_block}):
            speculator.decode(pre, b, min(8, max_new_tokens))
        plain(list(prompts[0][2]), min(8, max_new_tokens))
    ctrl = AdaptiveController(
        speculator,
        policy,
        featurizer=featurizer,
        reward=DEFAULT_REWARD,
        seed=0,
        speed_reference=speed_reference,
        feedback_timeout_s=None,
        checkpoint_interval_s=None,
        roll_interval_s=None,
    )
    rows = []
    bar = ProgressBar("6 end to end", progress, unit="prompt")
    bar.plan(len(prompts))
    try:
        for i, (rid, domain, ids) in enumerate(prompts):
            rows.append(
                _three_ways(i, rid, domain, list(ids), speculator, plain, ctrl, fixed_block, max_new_tokens)
            )
            bar.update(1)
        ctrl.sync()
        stats = ctrl.stats()
    finally:
        bar.close()
        ctrl.close()
    summary = summarize_e2e(rows, stats, fixed_block, ctrl.policy_label)
    summary["plain"] = plain.description
    return summary


def _three_ways(
    i: int,
    rid: str,
    domain: str,
    ids: list[int],
    speculator: Any,
    plain: _Plain,
    ctrl: Any,
    fixed_block: int,
    max_new_tokens: int,
) -> dict[str, Any]:
    """Prompt i decoded plainly, at the fixed block size and through the controller (the method that
    goes first turns with i); each one's speed and tau, and whether the outputs are identical."""
    pre = None
    rec: dict[str, Any] = {"request_id": rid, "domain": domain, "prompt_tokens": len(ids)}
    toks = {}
    for m in METHODS[i % 3 :] + METHODS[: i % 3]:
        if m == "controller":
            g = ctrl.generate(ids, max_new_tokens=max_new_tokens, request_id=rid)
            out = g.outcome
            rec[m] = {
                "block_size": int(g.decision.block_size),
                "overhead_s": float(g.overhead_s),
                "fallback": g.fallback,
                "reward": g.reward,
            }
        elif m == "plain":
            out = plain(ids, max_new_tokens)
            rec[m] = {"block_size": 1}
        else:
            if pre is None:
                pre = speculator.prefill(ids)
            out = speculator.decode(pre, fixed_block, max_new_tokens)
            rec[m] = {"block_size": int(fixed_block)}
        rec[m].update(
            new_tokens=int(out.new_tokens),
            decode_s=float(out.decode_s),
            mean_tau=float(out.mean_tau) if out.rounds else None,
        )
        toks[m] = list(out.tokens)
    verdict = plain.verdict(toks["fixed"], toks["plain"], ids, max_new_tokens)
    rec["identical"] = toks["fixed"] == toks["controller"] and verdict != "NO"
    if verdict == "yes*":  # standard bf16 kernels drifted; equal to the exact-kernel greedy output
        rec["plain_kernels_differ"] = True
    return rec


class _Plain:
    """Plain decoding for section 6: transformers' greedy loop on the target alone
    (:class:`~adaptspec.decoding.greedy.PlainGreedy`) when the speculator holds a transformers
    model, else block size 1 through the speculator's own loop."""

    def __init__(self, speculator: Any) -> None:
        from ..decoding.greedy import PlainGreedy

        target = getattr(speculator, "target", None)
        self.speculator = speculator
        self.greedy = PlainGreedy(target) if hasattr(getattr(target, "model", None), "config") else None
        self.description = (
            "transformers' greedy loop on the target alone: standard kernels, KV cache"
            if self.greedy
            else "block size 1 through the speculator's own loop"
        )

    def __call__(self, ids: list[int], max_new: int) -> Any:
        from ..speculator import Outcome

        if self.greedy is None:
            return self.speculator.decode(self.speculator.prefill(ids), 1, max_new)
        tokens, seconds = self.greedy(ids, max_new)
        finish = "eos" if tokens[-1] in self.greedy.eos else "length"
        return Outcome(tokens=tokens, rounds=[], decode_s=seconds, finish_reason=finish)

    def verdict(self, tokens: list[int], plain_tokens: list[int], ids: list[int], max_new: int) -> str:
        if self.greedy is None:
            return "yes" if tokens == plain_tokens else "NO"
        return self.greedy.verdict(tokens, plain_tokens, ids, max_new)


def summarize_e2e(
    rows: list[dict[str, Any]], stats: dict[str, Any], fixed_block: int, policy: str
) -> dict[str, Any]:
    """Totals per method (tokens/s = all new tokens / all decode seconds), speedups over plain
    decoding, and the controller's overhead."""
    out: dict[str, Any] = {
        "prompts": len(rows),
        "fixed_block": int(fixed_block),
        "policy": policy,
        "methods": {},
        "rows": rows,
    }
    plain_tps = None
    for m in METHODS:
        tok = sum(r[m]["new_tokens"] for r in rows)
        sec = sum(r[m]["decode_s"] for r in rows)
        taus = [r[m]["mean_tau"] for r in rows if r[m]["mean_tau"] is not None]
        tps = tok / sec if sec > 0 else float("nan")
        if m == "plain":
            plain_tps = tps
        out["methods"][m] = {
            "new_tokens": tok,
            "decode_s": round(sec, 4),
            "tokens_per_s": round(tps, 3),
            "mean_tau": round(float(np.mean(taus)), 4) if taus else None,
            "speedup": round(tps / plain_tps, 4) if plain_tps else None,
        }
    ov = [r["controller"]["overhead_s"] for r in rows]
    dec = sum(r["controller"]["decode_s"] for r in rows)
    tok = out["methods"]["controller"]["new_tokens"]
    out["controller"] = {
        "overhead_ms_mean": round(1000 * float(np.mean(ov)), 4),
        "overhead_ms_max": round(1000 * float(np.max(ov)), 4),
        "overhead_pct_of_decode": round(100.0 * sum(ov) / dec, 4) if dec > 0 else None,
        "tokens_per_s_with_overhead": round(tok / (dec + sum(ov)), 3) if dec + sum(ov) > 0 else None,
        "block_sizes": [r["controller"]["block_size"] for r in rows],
        "fallbacks": int(sum(1 for r in rows if r["controller"]["fallback"])),
        "update_mean_ms": round(1000 * float(stats.get("update_mean_s", 0.0)), 4),
        "updates": int(stats.get("updates", 0)),
        "machine_speed": stats.get("machine_speed"),
    }
    out["identical_outputs"] = int(sum(1 for r in rows if r["identical"]))
    return out


def pick_prompts(traces: Any, n: int, train_fraction: float) -> tuple[list[tuple[str, str, str]], str]:
    """``n`` prompts the head never trained on, from the pool the trace set was collected from:
    the public benchmark prompts when its request ids are theirs (the bundled default), else the
    held-out template prompts. Prompts the trace set holds are used only from its evaluation
    split. Benchmarks (or domains) are taken in turn."""
    from ..models.prompts import benchmark_prompts, heldout_prompts

    known = {str(r): j for j, r in enumerate(traces.request_ids)}
    pool, source = benchmark_prompts(), "public benchmark prompts"
    ids = [f"{p.domain}-{i:04d}" for i, p in enumerate(pool)]
    if not any(i in known for i in ids):
        pool, source = (
            heldout_prompts(),
            "held-out template prompts (in distribution for the drafter's templates)",
        )
        ids = [f"{p.domain}-{i:04d}" for i, p in enumerate(pool)]
    allowed = set(range(len(pool)))
    how = f"{source}; the trace set was not collected from them"
    if any(i in known for i in ids):
        _, ev = split_requests(traces.domains, train_fraction, 0)
        ev_ids = {str(traces.request_ids[j]) for j in ev}
        allowed = {k for k, i in enumerate(ids) if i in ev_ids or i not in known}
        how = f"{source}: the trace set's evaluation split and prompts it does not hold (the head never trained on them)"
    by_group: dict[str, list[int]] = {}
    for k in sorted(allowed):  # MT-Bench's categories count as one benchmark
        by_group.setdefault(pool[k].domain.split("/")[0], []).append(k)
    groups = sorted(by_group)
    chosen: list[int] = []
    while len(chosen) < n and any(by_group.values()):
        for g in groups:
            if by_group[g] and len(chosen) < n:
                chosen.append(by_group[g].pop(0))
    return [(ids[k], pool[k].domain, pool[k].prompt) for k in chosen], how


def e2e_policy(traces: Any, feature_dim: int, train_fraction: float) -> tuple[Any, Any, str]:
    """The default policy for the controller: NeuralLinear warm-started from a head trained on the
    trace set's training split when the trace set's features come from this decoder; otherwise
    the product default (the bundled head if there is one, else UCB), with the reason."""
    from ..control.controller import default_policy_spec
    from ..policies.neural_linear import NeuralLinear
    from ..policies.offline_head import train_head

    prov = provenance(traces)
    X = traces.features
    if X is not None and X.shape[1] == feature_dim and not prov["synthetic"]:
        reward, latency = default_reward(traces)
        R = trace_rewards(traces, reward, latency)
        tr, _ = split_requests(traces.domains, train_fraction, 0)
        ctx = make_contexts(traces, tr)
        head = train_head(ctx.X[tr], R[tr], traces.arms, seed=0)
        return (
            NeuralLinear(head, seed=0),
            ctx.featurizer,
            (
                f"neural-linear warm-started from a head trained on the trace set's training split ({len(tr)} requests, "
                f"{ctx.description})"
            ),
        )
    spec = default_policy_spec()
    why = (
        "the trace set has no features"
        if X is None
        else "the trace set is synthetic"
        if prov["synthetic"]
        else f"the trace set's features ({X.shape[1]}) are not this decoder's ({feature_dim})"
    )
    return spec, None, f"`{spec}` (the product default without a matching head: {why})"


def section_e2e(
    traces: Any,
    st: Settings,
    n_prompts: int,
    *,
    max_new_tokens: int = 64,
    drafter: str | None = None,
    target: str | None = None,
    fixed_block: int | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Load the decoder, pick prompts and the policy, and run :func:`run_e2e`."""
    import platform

    import torch

    from ..models import load_speculator

    if n_prompts < 1:
        raise AdaptspecError(f"--e2e needs a number of prompts >= 1, got {n_prompts}")
    if max_new_tokens < 2:
        raise AdaptspecError(f"--e2e-max-new-tokens must be >= 2, got {max_new_tokens}")
    t0 = time.perf_counter()
    spec = load_speculator(target, drafter, threads=threads)
    load_s = time.perf_counter() - t0
    prompts, how = pick_prompts(traces, n_prompts, st.train_fraction)
    encoded = [(rid, dom, spec.target.encode_chat(text)) for rid, dom, text in prompts]
    dim = int(np.asarray(spec.prefill(encoded[0][2]).features).shape[0])
    policy, featurizer, policy_desc = e2e_policy(traces, dim, st.train_fraction)
    reward, latency = default_reward(traces)
    arms = [a for a in traces.arms if a <= spec.max_block_size]
    if fixed_block is None:
        tr, _ = split_requests(traces.domains, st.train_fraction, 0)
        R = trace_rewards(traces, reward, latency)[:, [traces.arms.index(a) for a in arms]]
        fixed_block = int(arms[int(np.argmax(R[tr].mean(axis=0)))])
        fixed_how = "the best fixed block size on the trace set's training split"
    else:
        fixed_how = "given with --e2e-fixed"
    # a head trained here on the trace set learnt rewards timed by the trace set's profile, if any
    profile = traces.meta.get("latency_profile") if reward in MEASURED_REWARDS else None
    speed_reference = "auto" if isinstance(policy, str) else profile
    res = run_e2e(
        spec,
        encoded,
        fixed_block,
        policy,
        featurizer=featurizer,
        max_new_tokens=max_new_tokens,
        progress=st.progress,
        speed_reference=speed_reference,
    )
    res.update(
        prompt_selection=how,
        policy_description=policy_desc,
        fixed_how=fixed_how,
        max_new_tokens=max_new_tokens,
        drafter=str(drafter) if drafter else "bundled",
        target=str(target) if target else "smollm2-135m-instruct (bundled)",
        feature_dim=dim,
        load_s=round(load_s, 2),
        traces=provenance(traces),
        speed_reference=None if speed_reference is None else str(speed_reference),
        machine=f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}",
    )
    return res
