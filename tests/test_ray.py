"""Ray runs give the single-process results (issue 17): simulate sweeps, every-arm and dense
collection as Ray tasks on a real local Ray with 2 CPUs. Ray comes with the dev extra: these
tests run in CI, they do not skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import ray
import torch

import adaptspec
from adaptspec.cli import main
from adaptspec.collect.dense import collect_dense
from adaptspec.collect.every_arm import collect_traces
from adaptspec.collect.ray_tasks import collect_dense_ray, collect_traces_ray
from adaptspec.errors import AdaptspecError
from adaptspec.simulators.replay import replay
from adaptspec.traces import load_traces
from adaptspec.traces.dense import DenseTraceSet
from adaptspec.traces.traceset import DEFAULT_TRACES
from decoding_helpers import make_decoder, tiny_target

BENCHMARKS = DEFAULT_TRACES  # the bundled default: the public benchmark prompts' trace set
PROMPTS = [(f"r{i}", "ab"[i % 2], [6 + i, 7 + i % 3, 8, 9, 10]) for i in range(6)]


@pytest.fixture(scope="module", autouse=True)
def threads_restored():
    """The modules after this one get back the thread count they set (a test here sets two)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # the workers import this module (tiny_speculator) and this checkout's adaptspec: they inherit
    # the environment of the processes ray.init starts
    here = Path(__file__).resolve().parent
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(here), str(Path(adaptspec.__file__).resolve().parents[1]), *([old] if old else [])]
    )
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    yield
    ray.shutdown()


def tiny_speculator():
    """The speculator every task builds for itself (and the single-process run once)."""
    return make_decoder(tiny_target("llama"), max_block_size=8)


# ---------------------------------------------------------------------- simulate
def test_replay_sweep_via_ray_is_the_single_process_report():
    traces = load_traces(BENCHMARKS)
    kw = dict(reward="tau", seeds=[0, 1], order="shuffled", progress=False)
    one = replay(traces, ["ucb", "ts"], **kw)
    par = replay(traces, ["ucb", "ts"], ray=True, **kw)
    assert one.table() == par.table()
    assert json.dumps(one.to_json()) == json.dumps(par.to_json())
    for a, b in zip([*one.policies, one.oracle, one.best_fixed], [*par.policies, par.oracle, par.best_fixed]):
        assert a.name == b.name
        assert all(np.array_equal(a.values[m], b.values[m]) for m in a.values)  # bit for bit
        assert np.array_equal(a.curve, b.curve) and np.array_equal(a.chosen, b.chosen)


def test_simulate_cli_with_ray_prints_the_same_table(capsys):
    argv = [
        "simulate",
        str(BENCHMARKS),
        "--policy",
        "ucb",
        "--policy",
        "linucb",
        "--seeds",
        "2",
        "--order",
        "shuffled",
        "--no-progress",
    ]
    assert main(argv) == 0
    single = capsys.readouterr().out
    assert main([*argv, "--ray"]) == 0  # joins the module's Ray (and leaves it running)
    assert capsys.readouterr().out == single
    assert ray.is_initialized()


# ---------------------------------------------------------------------- collect
def _without_timings(ts):
    keep = ["request_id", "block_size", "new_tokens", "rounds", "mean_tau", "tau"]
    return ts.requests, ts.outcomes.select(keep)


def test_collect_every_arm_via_ray_is_the_single_process_trace_set(tmp_path):
    torch.set_num_threads(2)
    one = collect_traces(
        tiny_speculator(), PROMPTS, [1, 2, 4], tmp_path / "one", max_new_tokens=12, progress=False
    )
    par = collect_traces_ray(
        tiny_speculator, PROMPTS, [1, 2, 4], tmp_path / "ray", max_new_tokens=12, progress=False, tasks=2
    )
    for a, b in zip(_without_timings(one), _without_timings(par)):
        assert a.equals(b)
    assert par.meta["processes"] == 2 and par.meta["threads"] == 1
    assert not list(tmp_path.glob("ray.partial*"))  # merged and removed
    # a part collected by hand (collect --part 0/3) is resumed, not redone
    collect_traces(
        tiny_speculator(),
        PROMPTS,
        [1, 2, 4],
        tmp_path / "mixed",
        max_new_tokens=12,
        progress=False,
        part=(0, 3),
    )
    mixed = collect_traces_ray(
        tiny_speculator, PROMPTS, [1, 2, 4], tmp_path / "mixed", max_new_tokens=12, progress=False, tasks=2
    )
    for a, b in zip(_without_timings(one), _without_timings(mixed)):
        assert a.equals(b)


def test_collect_dense_via_ray_is_the_single_process_dense_set(tmp_path):
    # the tasks run one torch thread each: bit for bit, the single process at one thread
    torch.set_num_threads(1)
    one = collect_dense(
        tiny_speculator(),
        PROMPTS,
        tmp_path / "one",
        max_new_tokens=12,
        max_block_size=8,
        rows_per_part=2,
        progress=False,
    )
    torch.set_num_threads(2)  # another thread count sums the drafter's softmax in another order:
    two = collect_dense(
        tiny_speculator(),
        PROMPTS,
        tmp_path / "two",
        max_new_tokens=12,
        max_block_size=8,
        rows_per_part=2,
        progress=False,
    ).table()
    for col in ("request_id", "tokens", "accept", "features"):  # the same acceptance and tokens,
        assert two[col].equals(one.table()[col])
    for col in ("top1", "entropy"):  # the same confidences to float rounding
        a, b = (np.concatenate(t[col].to_numpy(zero_copy_only=False)) for t in (one.table(), two))
        assert np.allclose(a, b, rtol=1e-5, atol=1e-6)
    par = collect_dense_ray(
        tiny_speculator,
        PROMPTS,
        tmp_path / "ray",
        max_new_tokens=12,
        max_block_size=8,
        rows_per_part=2,
        progress=False,
        tasks=2,
    )
    assert one.meta == par.meta
    assert [p.name for p in one.parts()] == [p.name for p in par.parts()]
    assert one.table().equals(par.table())  # accept, top1, entropy, tokens, features: all of it
    # resumed: a Ray run over the first three prompts, then one over all of them
    kw = dict(max_new_tokens=12, max_block_size=8, rows_per_part=2, progress=False, tasks=2)
    collect_dense_ray(tiny_speculator, PROMPTS[:3], tmp_path / "resumed", **kw)
    resumed = collect_dense_ray(tiny_speculator, PROMPTS, tmp_path / "resumed", **kw)
    assert one.table().equals(resumed.table())
    assert DenseTraceSet.open(tmp_path / "resumed").request_ids() == {p[0] for p in PROMPTS}


# ---------------------------------------------------------------------- bad input
def test_bad_ray_input_is_one_line_and_exit_2(capsys, monkeypatch, tmp_path):
    assert main(["simulate", str(BENCHMARKS), "--ray", "no/such/address"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ray" in err and "Traceback" not in err
    assert main(["collect", "--out", str(tmp_path / "t"), "--ray", "x", "--limit", "1"]) == 2
    assert "--ray" in capsys.readouterr().err
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(AdaptspecError, match="not a dense trace set"):  # refused before a task starts
        collect_dense_ray(tiny_speculator, PROMPTS, tmp_path / "foreign", max_block_size=8, progress=False)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert main(["simulate", str(BENCHMARKS), "--policy", "ucb", "--ray", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'adaptspec[ray]'" in err


def test_unreachable_cluster_is_one_line_and_exit_2():
    # a fresh process (this module's Ray is running in this one), and a port nothing listens on
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "adaptspec",
            "simulate",
            str(BENCHMARKS),
            "--policy",
            "ucb",
            "--no-progress",
            "--ray",
            "127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(
        "adaptspec simulate: error: cannot start or join Ray at 127.0.0.1:9: nothing answers"
    )
