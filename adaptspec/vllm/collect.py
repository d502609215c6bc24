"""Trace collection through vLLM: every block size run for real on every prompt, through the plug-in.

One vLLM engine at K = max(arms) - 1 speculative tokens runs :class:`AdaptiveScheduler` with one
variant per block size, ``fixed:B`` (named ``bB``: ``b1``, ``b4``, ...). Each prompt is sent once
per block size, with ``adaptspec_variant`` naming that variant, so vLLM's own drafter proposes its
K drafts every step and the plug-in cuts them to B - 1 before vLLM verifies them: every block
size's tokens, rounds (vLLM's drafts verified and tokens committed, step by step) and time are
what vLLM itself ran at that length, not a counterfactual. (The plug-in's full-information prefix
outcomes are exact for one round, but after a shorter round the request would stand elsewhere
in its text: a whole request's outcome at another length is known only by running it.) The
plug-in hands each finished request's :class:`~adaptspec.speculator.Outcome` to
:attr:`AdaptspecPlugin.on_outcome`, so the engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``).

The rows are the embedded collection's (:mod:`adaptspec.collect.every_arm`): the same partial
file (``OUT.partial.jsonl``, one line a prompt, so an interrupted run resumes), the same block
sizes' order rotated from prompt to prompt (slow drift favours none), the same trace set
(``simulate``, ``train-head``, ``evaluate`` read it). What differs, and is said in its
``meta.json``:

- ``features``: the plug-in's own context of the prompt (:mod:`adaptspec.vllm.features`), so a
  head trained on the set reads what the plug-in gives it (``neural-linear:head=DIR`` as a
  variant's spec);
- times: a round's ``verify_ms`` is its share of vLLM's step (the target's pass and the
  drafter's, which vLLM runs in one step; ``draft_ms`` is 0), attributed as the plug-in
  attributes it; ``decode_ms`` their sum (prefill excluded). ``concurrency`` requests run at once
  (1: each step carries one request, as the embedded collection times them);
- B = 1 is the plug-in's B = 1: no draft verified, timed as the plug-in runs it whenever it
  chooses B = 1 (vLLM without any speculative method can be faster still).

A prompt whose request ends at its first token (no step after its prefill: nothing to record)
is left out, and named on stderr and in ``meta.json`` (``dropped``).

Nothing here loads numba before the engine has started: vLLM 0.32's engine start scans the
loaded modules and fails once numba is loaded (``'_lib_fn_wrapper' object has no attribute
'get'``), and :mod:`adaptspec.collect.every_arm` loads it (through the policies) at import, so it
is imported only once the engine runs, or when no prompt is left to run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .._util.jsonlines import read_jsonl
from .._util.outputs import check_output
from ..errors import AdaptspecError
from ..speculator import Outcome, outcome_fault
from ..traces import TraceSet
from .config import MAX_DECIDE_TIMEOUT
from .features import FEATURE_NAMES, prompt_features

__all__ = ["collect_vllm", "variant_name"]


def variant_name(block_size: int) -> str:
    """The plug-in's variant that runs ``block_size`` (``fixed:B``)."""
    return f"b{block_size}"


def collect_vllm(
    target: str,
    speculative_config: Mapping[str, Any],
    prompts: Sequence[tuple[str, str, Sequence[int]]],
    arms: Sequence[int],
    out: str | os.PathLike,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    seed: int = 0,
    concurrency: int = 1,
    engine_args: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> TraceSet:
    """Run every block size of ``arms`` on every prompt in one vLLM engine on ``target`` and write
    the trace set at ``out`` (see the module docstring).

    ``speculative_config``: vLLM's (``method``, ``model``, ...); its ``num_speculative_tokens`` is
    set to max(arms) - 1. ``prompts``: ``(request_id, domain, token_ids)``. ``engine_args``: more
    keyword arguments of ``vllm.LLM`` (``dtype``, ``max_model_len``, ...). Returns the trace set."""
    arms, out = _checked_args(arms, concurrency, out, overwrite, temperature, max_new_tokens)
    rows = _done_rows(out, arms)
    todo = [p for p in prompts if p[0] not in rows]
    if todo:
        _run(
            target,
            dict(speculative_config),
            todo,
            arms,
            out,
            rows,
            max_new_tokens,
            temperature,
            seed,
            concurrency,
            dict(engine_args or {}),
            progress,
        )
    from ..collect.every_arm import finish

    dropped = {rid: r["dropped"] for rid, r in rows.items() if "dropped" in r}
    kept = [p for p in prompts if p[0] not in dropped]
    if not kept:
        raise AdaptspecError(
            f"every request ended at its first token ({len(dropped)}): nothing to write at {out}"
        )
    info = _info(target, speculative_config, arms, concurrency, meta, dropped)
    return finish(
        out,
        kept,
        arms,
        {r: v for r, v in rows.items() if r not in dropped},
        max_new_tokens,
        temperature,
        info,
        overwrite,
    )


def _checked_args(
    arms: Sequence[int],
    concurrency: int,
    out: str | os.PathLike,
    overwrite: bool,
    temperature: float,
    max_new_tokens: int,
) -> tuple[list[int], Path]:
    """:func:`collect_vllm`'s arguments checked, before the engine starts: its block sizes sorted,
    without repeats, and ``out`` as a path."""
    arms = sorted({int(b) for b in arms})
    if not arms or arms[0] < 1:
        raise AdaptspecError(f"block sizes must be integers >= 1, got {list(arms)}")
    if arms[-1] < 2:
        raise AdaptspecError(
            "collect-vllm needs a block size >= 2 (B = 1 + the drafts verified): with B = 1 alone "
            "vLLM verifies nothing it drafts"
        )
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise AdaptspecError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    out = Path(out)
    check_output(out, "traceset", overwrite)  # the embedded collection's checks, before the engine starts
    if not (isinstance(temperature, (int, float)) and np.isfinite(temperature) and temperature >= 0):
        raise AdaptspecError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise AdaptspecError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    return arms, out


def _info(
    target: str,
    speculative_config: Mapping[str, Any],
    arms: list[int],
    concurrency: int,
    meta: Mapping[str, Any] | None,
    dropped: dict[str, str],
) -> dict:
    """The trace set's ``meta.json`` entries that say how vLLM collected it (``meta`` added, then
    ``dropped``)."""
    return {
        "source": "adaptspec collect-vllm",
        "engine": f"vLLM {_vllm_version()}",
        "target": str(target),
        "drafter": speculative_config.get("model"),
        "method": speculative_config.get("method"),
        "num_speculative_tokens": arms[-1] - 1,
        "concurrency": concurrency,
        "features": "vllm-prompt-tokens",
        "feature_names": list(FEATURE_NAMES),
        "times": "verify_ms: each round's attributed share of vLLM's step (target and drafter passes); "
        "draft_ms: 0",
        **dict(meta or {}),
        "dropped": dropped,
    }


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def _done_rows(out: Path, arms: list[int]) -> dict[str, dict]:
    """The rows of ``OUT.partial.jsonl`` (an interrupted collection's), by request id; rows made
    with other block sizes are refused. (The embedded collection's ``read_partials``, read here
    without importing it: see the module docstring.)"""
    path = out.with_name(out.name + ".partial.jsonl")
    rows = read_jsonl(
        path, "a collection's partial file", missing_ok=True
    ).records  # a torn last line: a crash
    for r in rows:
        if r.get("arms") != arms:
            raise AdaptspecError(
                f"{path}: collected with arms {r.get('arms')}, now asked for {arms}; remove it to restart"
            )
    return {r["request_id"]: r for r in rows}


def _run(
    target: str,
    spec: dict,
    todo: list,
    arms: list[int],
    out: Path,
    rows: dict,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    concurrency: int,
    engine_args: dict,
    progress: bool,
) -> None:
    """Start the engine, run ``todo`` chunk by chunk (every block size a chunk), append each prompt's row."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = (
        "0"  # the engine in this process: its plug-in hands us outcomes
    )
    from tqdm import tqdm
    from vllm import LLM  # loads vllm.SamplingParams and vllm.inputs too (_run_chunk's)

    llm = LLM(model=str(target), **_engine_kwargs(spec, arms, seed, concurrency, engine_args))
    try:
        from ..collect.every_arm import open_partial  # now: it loads numba (the module docstring)

        finished = _listen(llm)
        chunks = [todo[i : i + concurrency] for i in range(0, len(todo), concurrency)]
        offset, f = len(rows), None
        try:
            for c, chunk in enumerate(tqdm(chunks, desc="collect-vllm", unit="chunk", disable=not progress)):
                k = (offset + c) % len(arms)
                per_prompt = _run_chunk(
                    llm, chunk, arms[k:] + arms[:k], finished, max_new_tokens, temperature, seed
                )
                if f is None:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    f = open_partial(out.with_name(out.name + ".partial.jsonl"))
                _append_rows(f, chunk, arms, per_prompt, rows)
        finally:
            if f is not None:
                f.close()
    finally:
        llm.llm_engine.engine_core.shutdown()


def _engine_kwargs(spec: dict, arms: list[int], seed: int, concurrency: int, engine_args: dict) -> dict:
    """``vllm.LLM``'s keyword arguments: the plug-in's scheduler, one ``fixed:B`` variant per block
    size, ``spec`` (set here to draft max(arms) - 1 tokens) as vLLM's speculative config."""
    spec["num_speculative_tokens"] = arms[-1] - 1
    # a fixed policy decides in microseconds: the longest budget, so that a busy host's slow hand-off to the
    # decision thread never gives a request the fallback length in place of its variant's
    settings = {
        "variants": {variant_name(b): f"fixed:{b}" for b in arms},
        "arms": arms,
        "load_rule": "none",
        "decide_timeout": MAX_DECIDE_TIMEOUT,
    }
    return {
        "seed": seed,
        **engine_args,
        "max_num_seqs": concurrency,
        "speculative_config": spec,
        "scheduler_cls": "adaptspec.vllm.AdaptiveScheduler",
        "additional_config": {"adaptspec": settings},
    }


def _listen(llm: Any) -> dict[str, tuple[str, Outcome]]:
    """The dict the engine's plug-in fills from now on with each finished request's variant and
    outcome, by vLLM's request id (its ``on_outcome``)."""
    try:
        plugin = llm.llm_engine.engine_core.engine_core.scheduler.adaptspec
    except AttributeError:
        raise AdaptspecError(
            "collect-vllm reads the plug-in in its own process: vLLM's engine ran in another one "
            "(VLLM_ENABLE_V1_MULTIPROCESSING must be 0)"
        ) from None
    finished: dict[str, tuple[str, Outcome]] = {}
    plugin.on_outcome = lambda rid, variant, outcome: finished.__setitem__(rid, (variant, outcome))
    return finished


def _run_chunk(
    llm: Any,
    chunk: list,
    order: list[int],
    finished: dict[str, tuple[str, Outcome]],
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> dict[str, dict]:
    """Every prompt of ``chunk`` run at once at each block size of ``order`` in turn: each prompt's
    records (:func:`_arm_result`), by request id, then by block size in ``order``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    per_prompt: dict[str, dict] = {p[0]: {} for p in chunk}
    for b in order:
        params = [
            SamplingParams(
                temperature=temperature,
                max_tokens=max_new_tokens,
                seed=seed,
                extra_args={"adaptspec_variant": variant_name(b)},
            )
            for _ in chunk
        ]
        finished.clear()
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=list(p[2])) for p in chunk], params, use_tqdm=False
        )
        for p, o in zip(chunk, outs):
            per_prompt[p[0]][b] = _arm_result(p[0], b, o, finished, max_new_tokens)
    return per_prompt


def _append_rows(f: Any, chunk: list, arms: list[int], per_prompt: dict[str, dict], rows: dict) -> None:
    """Each prompt of ``chunk``'s row appended to the partial file ``f`` and kept in ``rows``; a
    prompt left out is named on stderr."""
    from ..collect.every_arm import append_row  # loaded already (by _run)

    for rid, domain, ids in chunk:
        row = _row(rid, domain, ids, arms, per_prompt[rid])
        if "dropped" in row:
            print(f"collect-vllm: request {rid} left out: {row['dropped']}", file=sys.stderr)
        append_row(f, row)
        rows[rid] = row


def _arm_result(
    rid: str, b: int, output: Any, finished: dict[str, tuple[str, Outcome]], max_new_tokens: int
) -> dict | str:
    """Block size ``b``'s record of request ``rid`` from vLLM's output and the plug-in's outcome
    (or why there is none: a request that ended at its first token)."""
    tokens = list(output.outputs[0].token_ids)
    mine = [k for k in finished if k.startswith(f"{output.request_id}-") or k == output.request_id]
    if len(mine) != 1:
        if len(tokens) <= 1:
            return "it ended at its first token (no step after its prefill)"
        raise AdaptspecError(
            f"request {rid} at block size {b}: the plug-in reported {len(mine)} outcomes for vLLM's "
            f"request {output.request_id} (a plug-in fault: see the adaptspec.vllm log)"
        )
    variant, o = finished[mine[0]]
    where = f"request {rid} at block size {b}"
    if variant != variant_name(b):
        raise AdaptspecError(f"{where}: the plug-in ran it as variant {variant}, not {variant_name(b)}")
    if list(o.tokens) != tokens:
        raise AdaptspecError(
            f"{where}: the plug-in's outcome holds {len(o.tokens)} tokens, vLLM returned {len(tokens)}"
        )
    fault = outcome_fault(o, b, max_new_tokens)
    if fault is not None or not o.rounds:
        raise AdaptspecError(f"{where}: the plug-in's outcome is refused: {fault or 'no rounds'}")
    return {
        "new_tokens": len(o.tokens),
        "tau": [r.tau for r in o.rounds],
        "draft_ms": [0.0] * len(o.rounds),
        "verify_ms": [r.verify_s * 1e3 for r in o.rounds],
        "decode_ms": o.decode_s * 1e3,
    }


def _row(rid: str, domain: str, ids: Sequence[int], arms: list[int], per_arm: dict[int, dict | str]) -> dict:
    """The partial file's row of one prompt (:mod:`adaptspec.collect.every_arm`'s form), or a
    ``dropped`` row saying why it is left out."""
    why = next((v for v in per_arm.values() if isinstance(v, str)), None)
    if why is not None:
        return {"request_id": rid, "domain": domain, "arms": arms, "dropped": why}
    return {
        "request_id": rid,
        "domain": domain,
        "prompt_tokens": len(ids),
        "features": prompt_features(ids).tolist(),
        "arms": arms,
        "outcomes": {str(b): per_arm[b] for b in arms},
    }
