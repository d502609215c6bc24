"""vLLM's scheduler in this process, without a model or an engine: the harness of the invariant tests.

A scheduler (vLLM's own ``Scheduler`` or ``AsyncScheduler``, or adaptspec's subclass of either) is
built from an engine config of the tiny local model (no weights loaded) and a synthetic KV cache
config of ``num_blocks`` blocks; :class:`Drive` then plays vLLM's engine loop against it step by
step with a fake model whose answers depend only on the request and the position:

- the text: request ``r``'s token at position ``p`` is :func:`true_token` (r, p), whatever ran before;
- the drafter: after a step, a request whose text has ``L`` tokens gets ``n`` drafts (``n``: the
  step's ``num_spec_tokens_to_schedule``), the first :func:`draft_depth` (r, L) of them right
  (``true_token`` (r, L), ...) and the rest wrong;
- the verifier: a step that scheduled drafts for a request samples the longest right prefix of
  them plus the next true token (vLLM's rejection sampler at temperature 0); a prefill chunk that
  does not end the prompt samples nothing.

So two schedulers fed the same requests see the same answers for the same schedule, and any
difference between them is the scheduler's. With synchronous scheduling the drafts reach the
scheduler through ``update_draft_token_ids`` (the engine's ``step``); with asynchronous scheduling
the scheduler reserves placeholder slots one step ahead and the fake worker fills them with its own
drafts, one step in flight (the engine's ``step_with_batch_queue`` with a queue of two).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import deque
from pathlib import Path
from typing import Any

from _tiny import VOCAB, tiny_qwen3

#: The engine's block size (tokens a KV block holds) in these tests.
BLOCK_SIZE = 4
#: A token no true text holds: a wrong draft.
WRONG = VOCAB - 2


def _draw(*key: Any) -> int:
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


def true_token(rid: str, position: int) -> int:
    """Request ``rid``'s token at ``position`` of its text (prompt positions included)."""
    return 1 + _draw("text", rid, position) % (VOCAB - 4)


def draft_depth(rid: str, length: int, k: int) -> int:
    """How many of the drafts proposed for ``rid`` at text length ``length`` are right (0..k)."""
    return _draw("depth", rid, length) % (k + 1)


def prompt_of(rid: str, n: int) -> list[int]:
    return [true_token(rid, p) for p in range(n)]


def model_path(root: Path) -> Path:
    """The tiny local model whose config the engine config reads (its weights are never loaded)."""
    return tiny_qwen3(root / "scheduler-model")


def engine_config(
    model: Path,
    k: int,
    adaptspec: dict | None,
    *,
    async_scheduling: bool = False,
    prefix_caching: bool = False,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 48,
    max_model_len: int = 256,
) -> Any:
    """vLLM's config of an n-gram speculative engine with ``k`` drafts a step (the drafter's kind
    does not reach the scheduler), adaptspec's entry ``adaptspec`` (None: none)."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(model),
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=prefix_caching,
        enable_chunked_prefill=True,
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 2,
        },
        additional_config={} if adaptspec is None else {"adaptspec": adaptspec},
    )
    config = args.create_engine_config()
    # vLLM's CPU platform turns asynchronous scheduling off; the scheduler's own logic runs either way
    config.scheduler_config.async_scheduling = async_scheduling
    return config


def kv_cache_config(num_blocks: int) -> Any:
    """A KV cache of ``num_blocks`` blocks for one full-attention layer (no tensor behind it)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32)
    return KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)]
    )


def build(cls: type, config: Any, num_blocks: int) -> Any:
    """A scheduler of class ``cls`` over a fresh KV cache of ``num_blocks`` blocks."""
    from vllm.v1.structured_output import StructuredOutputManager

    config.cache_config.num_gpu_blocks = num_blocks  # what the engine sets from its workers' memory
    return cls(
        vllm_config=config,
        kv_cache_config=kv_cache_config(num_blocks),
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK_SIZE,
        log_stats=True,
    )


@dataclasses.dataclass(frozen=True)
class Spec:
    """One request of a mix: its prompt length, its output length, its variant (None: the router's),
    the step after which it is aborted (None: never)."""

    rid: str
    prompt: int
    max_tokens: int
    variant: str | None = None
    abort_at: int | None = None


def make_request(spec: Spec, config: Any) -> Any:
    """vLLM's ``Request`` for ``spec`` (its prompt: the true text's first tokens), with block hashes
    when prefix caching is on."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(
        max_tokens=spec.max_tokens,
        temperature=0.0,
        ignore_eos=True,
        extra_args=None if spec.variant is None else {"adaptspec_variant": spec.variant},
    )
    hasher = None
    if config.cache_config.enable_prefix_caching:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        init_none_hash(fn)
        hasher = get_request_block_hasher(BLOCK_SIZE, fn)
    return Request(
        request_id=spec.rid,
        prompt_token_ids=prompt_of(spec.rid.split("#")[0], spec.prompt),
        sampling_params=params,
        pooling_params=None,
        block_hasher=hasher,
    )


@dataclasses.dataclass
class Step:
    """What one ``schedule()`` scheduled, as plain values (comparable between schedulers)."""

    tokens: dict[str, int]
    spec: dict[str, tuple[int, ...]]
    spec_to_schedule: int
    new: tuple[tuple[str, tuple], ...]
    cached: tuple[tuple[str, Any], ...]
    preempted: frozenset[str]
    finished: frozenset[str]
    total: int

    @classmethod
    def of(cls, out: Any) -> Step:
        c = out.scheduled_cached_reqs
        cached = tuple(
            (rid, None if blocks is None else tuple(map(tuple, blocks)))
            for rid, blocks in zip(c.req_ids, c.new_block_ids)
        )
        return cls(
            tokens=dict(out.num_scheduled_tokens),
            spec={rid: tuple(t) for rid, t in out.scheduled_spec_decode_tokens.items()},
            spec_to_schedule=int(out.num_spec_tokens_to_schedule),
            new=tuple((r.req_id, tuple(map(tuple, r.block_ids))) for r in out.scheduled_new_reqs),
            cached=cached,
            preempted=frozenset(out.preempted_req_ids or ()),
            finished=frozenset(out.finished_req_ids),
            total=int(out.total_num_scheduled_tokens),
        )


@dataclasses.dataclass
class Drive:
    """vLLM's engine loop over ``scheduler`` with the fake model of the module docstring.

    ``steps``: every step scheduled; ``drafts``: for every step, each request's drafts as the fake
    drafter proposed them after it (before any cut); ``outputs``: each finished request's tokens;
    ``preempted``: the requests preempted at least once."""

    scheduler: Any
    k: int
    async_scheduling: bool = False
    steps: list[Step] = dataclasses.field(default_factory=list)
    proposed: list[dict[str, list[int]]] = dataclasses.field(default_factory=list)
    outputs: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    preempted: set[str] = dataclasses.field(default_factory=set)
    aborted: set[str] = dataclasses.field(default_factory=set)
    _worker_drafts: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    _in_flight: deque = dataclasses.field(default_factory=deque)

    def run(self, specs: list[Spec], config: Any, max_steps: int = 2000) -> Drive:
        """Add every request of ``specs`` at once, then step until the scheduler holds none, aborting
        each at its step; returns self."""
        for s in specs:
            self.scheduler.add_request(make_request(s, config))
        aborts = {s.rid: s.abort_at for s in specs if s.abort_at is not None}
        for n in range(max_steps):
            for rid, at in list(aborts.items()):
                if at <= n:
                    self.abort(rid)
                    del aborts[rid]
            if not self.scheduler.has_requests() and not self._in_flight:
                return self
            self.step()
        raise AssertionError(f"the scheduler still holds requests after {max_steps} steps")

    def abort(self, rid: str) -> None:
        from vllm.v1.request import RequestStatus

        if rid in self.scheduler.requests:
            self.aborted.add(rid)
            self.scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)

    def step(self) -> None:
        """One step of the engine: schedule; with synchronous scheduling run it at once and hand the
        drafts back; with asynchronous scheduling keep one step in flight."""
        if self.scheduler.has_requests():
            out = self.scheduler.schedule()
            self.steps.append(Step.of(out))
            # the requests whose step ends short of their prompt (vLLM has counted the step's tokens)
            out.harness_chunks = {
                rid for rid in out.num_scheduled_tokens if self.scheduler.requests[rid].is_prefill_chunk
            }
            self.preempted |= set(out.preempted_req_ids or ())
            if not self.async_scheduling:
                self._finish_step(out)
                return
            self._in_flight.append(out)
            if len(self._in_flight) < 2 and out.total_num_scheduled_tokens > 0:
                return
        if self._in_flight:
            self._finish_step(self._in_flight.popleft())

    # ------------------------------------------------------------------ the fake model
    def _finish_step(self, out: Any) -> None:
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

        sched = self.scheduler
        rids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in rids:
            request = sched.requests.get(rid)
            sampled.append([] if request is None else self._sample(out, request, out.harness_chunks))
        lengths = {rid: self._length(rid) for rid in rids}
        result = ModelRunnerOutput(
            req_ids=rids, req_id_to_index={r: i for i, r in enumerate(rids)}, sampled_token_ids=sampled
        )
        for rid, toks in zip(rids, sampled):
            if rid in lengths and lengths[rid] is not None:
                lengths[rid] += len(toks)
        engine_out = sched.update_from_output(out, result)
        for outputs in engine_out.values():
            for o in outputs.outputs:
                self.outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
        drafts = {}
        for rid, toks in zip(rids, sampled):
            if toks and lengths[rid] is not None:  # a step that sampled: the drafter proposes after it
                n = out.num_spec_tokens_to_schedule
                depth = draft_depth(rid, lengths[rid], self.k)
                drafts[rid] = [true_token(rid, lengths[rid] + i) if i < depth else WRONG for i in range(n)]
        self.proposed.append({r: list(d) for r, d in drafts.items()})
        if self.async_scheduling:
            self._worker_drafts.update(drafts)
        elif drafts:
            ids = [r for r in rids if r in drafts]
            sched.update_draft_token_ids(DraftTokenIds(ids, [drafts[r] for r in ids]))

    def _length(self, rid: str) -> int | None:
        """The request's text length (prompt and tokens out) before this step's output."""
        request = self.scheduler.requests.get(rid)
        return None if request is None else request.num_tokens

    def _sample(self, out: Any, request: Any, chunks: set[str]) -> list[int]:
        rid = request.request_id
        spec = list(out.scheduled_spec_decode_tokens.get(rid, ()))
        if self.async_scheduling and spec:  # placeholders: the worker's own drafts fill them
            spec = (self._worker_drafts.get(rid, []) + [WRONG] * len(spec))[: len(spec)]
        if rid in chunks:  # a chunk that ends short of the prompt samples nothing
            return []
        base = request.num_tokens  # the text before this step's tokens
        accepted = 0
        for i, t in enumerate(spec):
            if t != true_token(rid, base + i):
                break
            accepted += 1
        return [true_token(rid, base + i) for i in range(accepted + 1)]
