"""vLLM's scheduler invariants with adaptspec's scheduler in its place, in process (no model, no engine).

vLLM's own ``Scheduler`` / ``AsyncScheduler`` and adaptspec's ``AdaptiveScheduler`` /
``AdaptiveAsyncScheduler`` are built from one engine config and a synthetic KV cache and fed the same
fake model step by step (:mod:`_scheduler_harness`). Each request's length is fixed by its variant
(``fixed:B`` policies: B - 1 drafts a step), so every expected value comes from the test's own map
of variants, the fake model's closed form or vLLM's class, never from the plug-in:

- at one length equal to vLLM's (B = K + 1 for every request) the plug-in schedules exactly what
  vLLM's class schedules, step by step (requests, token counts, drafts, KV blocks, preemptions);
- at per-request lengths no request is scheduled more drafts than its length allows, and as many as
  it allows when nothing else limits them (synchronous scheduling); every request ends with the
  tokens of its true text (lossless), every finished or aborted request is freed (vLLM's and the
  plug-in's records) and the KV pool is whole again; preempted requests resume at their length;
  prefix caching with drafts keeps all of it.

No model runner is built in process, so the schedulers are built past the runner check
(:class:`InProcess`); the check itself is tested on its own below.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from _scheduler_harness import Drive, Spec, build, engine_config, model_path, true_token

K = 4  #: vLLM's num_speculative_tokens in these tests
LENGTHS = {f"b{b}": b for b in range(1, K + 2)}  #: variant -> block size B (1 + drafts)
BUDGET = 48  #: max_num_batched_tokens
#: the smallest KV pool: vLLM admits a request only when its whole sequence fits (prompt <= 40, 24 tokens
#: out, K drafts: 17 blocks of 4 tokens) besides its null block; more requests than that force preemption
POOL = 18
ENTRY = {
    "variants": {v: f"fixed:{b}" for v, b in LENGTHS.items()},
    "load_rule": "none",
    "decide_timeout": 1.0,
}
FULL = {"variants": {"full": f"fixed:{K + 1}"}, "load_rule": "none", "decide_timeout": 1.0}


def _classes():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from adaptspec.vllm.scheduler import AdaptiveAsyncScheduler, AdaptiveScheduler

    class InProcess(AdaptiveScheduler):
        def check_runner(self, vllm_config):  # no model runner in this process (see the module docstring)
            return None

    class InProcessAsync(AdaptiveAsyncScheduler):
        def check_runner(self, vllm_config):
            return None

    return {False: (Scheduler, InProcess), True: (AsyncScheduler, InProcessAsync)}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_path(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def configs(model):
    """One engine config per (entry, asynchronous, prefix caching), built once."""
    made = {}

    def get(entry: dict, async_scheduling: bool, prefix_caching: bool = False):
        key = (repr(entry), async_scheduling, prefix_caching)
        if key not in made:
            made[key] = engine_config(
                model,
                K,
                entry,
                async_scheduling=async_scheduling,
                prefix_caching=prefix_caching,
                max_num_batched_tokens=BUDGET,
            )
        return made[key]

    return get


def _drive(cls, config, specs, num_blocks, async_scheduling):
    sched = build(cls, config, num_blocks)
    try:
        return Drive(sched, K, async_scheduling=async_scheduling).run(specs, config), sched
    finally:
        sched.shutdown()


def _mix(variants: bool, prefixes: bool = False):
    """A mix of 1-6 requests (of the test's own names): prompt 1-40 tokens, 1-24 tokens out, a variant, maybe aborted."""
    one = st.tuples(
        st.integers(1, 40),
        st.integers(1, 24),
        st.sampled_from(sorted(LENGTHS)) if variants else st.just("full"),
        st.one_of(st.none(), st.integers(0, 30)),
        st.integers(0, 2) if prefixes else st.just(None),
    )
    return st.lists(one, min_size=1, max_size=6).map(
        lambda rows: [
            Spec(
                f"r{i}" if group is None else f"g{group}#{i}",
                prompt=p,
                max_tokens=m,
                variant=v,
                abort_at=a,
            )
            for i, (p, m, v, a, group) in enumerate(rows)
        ]
    )


SETTINGS = settings(
    max_examples=int(os.environ.get("ADAPTSPEC_SCHEDULER_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# ---------------------------------------------------------------------------------------- one length
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@SETTINGS
@given(specs=_mix(variants=False), num_blocks=st.integers(POOL, 60))
def test_at_vllms_length_the_plugin_schedules_what_vllm_schedules(
    configs, async_scheduling, specs, num_blocks
):
    vllm_cls, ours = _classes()[async_scheduling]
    config = configs(FULL, async_scheduling)
    theirs, _ = _drive(vllm_cls, config, specs, num_blocks, async_scheduling)
    mine, _ = _drive(ours, config, specs, num_blocks, async_scheduling)
    assert len(mine.steps) == len(theirs.steps)
    for n, (a, b) in enumerate(zip(mine.steps, theirs.steps)):
        # the drafter is asked for no draft a request drops (a prefill chunk's, one that ends at its first token)
        assert a.spec_to_schedule <= b.spec_to_schedule, f"step {n}"
        assert dataclasses.replace(a, spec_to_schedule=0) == dataclasses.replace(b, spec_to_schedule=0), (
            f"step {n}"
        )
    assert mine.outputs == theirs.outputs


# ---------------------------------------------------------------------------------------- per-request lengths
def _check_invariants(drive, sched, specs, num_blocks, async_scheduling):
    by_id = {s.rid: s for s in specs}
    length = {s.rid: LENGTHS[s.variant] for s in specs}
    # drafts scheduled never exceed the request's length (a request asking for one token is never decided:
    # it ends at its prefill's token, and vLLM's slots for it are its own). vLLM pads a request it takes from
    # the waiting queue needing one token (its prompt cached, or resumed) to K placeholder drafts (-1) for its
    # CUDA graphs: no draft, in its first step (new or resumed), of any length.
    seen, resuming = set(), set()
    for n, step in enumerate(drive.steps):
        for rid, spec in step.spec.items():
            fresh = rid not in seen or rid in resuming
            padding = fresh and spec == (-1,) * K
            assert by_id[rid].max_tokens <= 1 or padding or len(spec) <= length[rid] - 1, (n, rid, spec)
        seen |= set(step.tokens)
        resuming = (resuming - set(step.tokens)) | set(step.preempted)
    if not async_scheduling:  # ... and are as many as it allows when nothing else limits them
        for n in range(1, len(drive.steps)):
            step, before = drive.steps[n], drive.steps[n - 1]
            if step.total >= BUDGET or step.preempted or before.preempted:
                continue
            for rid, proposed in drive.proposed[n - 1].items():
                if rid in step.tokens and rid in before.tokens and by_id[rid].max_tokens > 1:
                    assert len(step.spec.get(rid, ())) == min(length[rid] - 1, len(proposed)), (n, rid)
    # every request that was not aborted ends with its true text, at its length
    for rid, s in by_id.items():
        if rid in drive.aborted:
            continue
        prompt = s.prompt
        assert drive.outputs.get(rid) == [true_token(rid, prompt + i) for i in range(s.max_tokens)], rid
    # every request freed, in vLLM and in the plug-in; the KV pool whole again
    assert not sched.requests and not sched.running and not len(sched.waiting)
    assert sched.adaptspec.records == {}
    assert (
        sched.kv_cache_manager.block_pool.get_num_free_blocks() == num_blocks - 1
    )  # block 0: vLLM's null block


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@SETTINGS
@given(specs=_mix(variants=True), num_blocks=st.integers(POOL, 60))
def test_per_request_lengths_keep_vllms_invariants(configs, async_scheduling, specs, num_blocks):
    _, ours = _classes()[async_scheduling]
    config = configs(ENTRY, async_scheduling)
    drive, sched = _drive(ours, config, specs, num_blocks, async_scheduling)
    _check_invariants(drive, sched, specs, num_blocks, async_scheduling)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@SETTINGS
@given(specs=_mix(variants=True, prefixes=True), num_blocks=st.integers(POOL, 60))
def test_prefix_caching_with_drafts_keeps_the_invariants(configs, async_scheduling, specs, num_blocks):
    _, ours = _classes()[async_scheduling]
    config = configs(ENTRY, async_scheduling, prefix_caching=True)
    drive, sched = _drive(ours, config, specs, num_blocks, async_scheduling)
    _check_invariants(drive, sched, specs, num_blocks, async_scheduling)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_preempted_requests_resume_at_their_length(configs, async_scheduling):
    """Four long requests in a pool too small for them all: vLLM preempts, and each preempted
    request is scheduled its own number of drafts again once it runs."""
    _, ours = _classes()[async_scheduling]
    config = configs(ENTRY, async_scheduling)
    specs = [
        Spec(f"r{i}", prompt=20, max_tokens=40, variant=v) for i, v in enumerate(["b2", "b3", "b4", "b5"])
    ]
    num_blocks = 24
    drive, sched = _drive(ours, config, specs, num_blocks, async_scheduling)
    assert drive.preempted, "the pool was meant to force a preemption"
    for rid in drive.preempted:
        b = LENGTHS[next(s.variant for s in specs if s.rid == rid)]
        resumed = [n for n, st_ in enumerate(drive.steps) if rid in st_.preempted]
        after = [len(st_.spec.get(rid, ())) for st_ in drive.steps[resumed[-1] :]]
        assert max(after) == b - 1, (rid, after)
    _check_invariants(drive, sched, specs, num_blocks, async_scheduling)


def test_prefix_caching_reuses_blocks_with_drafts(configs):
    """Two requests with one prompt: the second's prompt blocks come from the cache."""
    _, ours = _classes()[False]
    config = configs(ENTRY, False, prefix_caching=True)
    specs = [Spec("g#0", prompt=33, max_tokens=12, variant="b5")]
    sched = build(ours, config, 40)
    try:
        drive = Drive(sched, K).run(specs, config)
        from _scheduler_harness import make_request

        request = make_request(Spec("g#1", prompt=33, max_tokens=12, variant="b3"), config)
        sched.add_request(request)
        while sched.has_requests():
            drive.step()
        blocks = {rid: ids[0] for step in drive.steps for rid, ids in step.new}
        assert (
            blocks["g#1"][:8] == blocks["g#0"][:8]
        )  # every full block of the prompt (4 tokens a block), cached
        _check_invariants(drive, sched, specs + [Spec("g#1", 33, 12, "b3")], 40, False)
    finally:
        sched.shutdown()


# ---------------------------------------------------------------------------------------- the runner check
def test_asynchronous_scheduling_builds_the_async_form(configs, monkeypatch):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from adaptspec.errors import AdaptspecError
    from adaptspec.vllm.scheduler import RELEASE, AdaptiveAsyncScheduler, AdaptiveScheduler

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    config = configs(ENTRY, True)
    if not RELEASE.has_v1_runner:
        with pytest.raises(AdaptspecError, match="install 'vllm>=0.32,<0.34'"):
            build(AdaptiveScheduler, config, 20)
        return
    sched = build(AdaptiveScheduler, config, 20)
    try:
        assert isinstance(sched, AdaptiveAsyncScheduler) and isinstance(sched, AsyncScheduler)
    finally:
        sched.shutdown()


def test_model_runner_v2_is_refused_in_one_line_naming_the_setting(configs, monkeypatch):
    from adaptspec.errors import AdaptspecError
    from adaptspec.vllm.idle_drafter import install
    from adaptspec.vllm.scheduler import RELEASE, AdaptiveScheduler

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    config = configs(ENTRY, False)
    setting = "VLLM_USE_V2_MODEL_RUNNER=0"
    with pytest.raises(AdaptspecError) as refused:
        build(AdaptiveScheduler, config, 20)
    line = str(refused.value)
    assert "\n" not in line and setting in line and "vllm#51510" in line
    if not RELEASE.has_v1_runner:
        assert "install 'vllm>=0.32,<0.34'" in line
    with pytest.raises(AdaptspecError) as refused:
        install()
    assert "\n" not in str(refused.value) and "IdleDrafterSkip" in str(refused.value)
