"""benchmarks/bench_vllm.py and bench_vllm_steps.py without vLLM: the servers' command lines of the
plug-in's floor and plugin-kK configurations, the summary's ratios and the steps' floor by repeat
against hand computations."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from _scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_vllm")


def _args(**kw):
    base = dict(
        vllm_python="py",
        target="T",
        drafter="D",
        levels=[1, 8],
        adaptive_max_k=8,
        plugin_entry="{}",
        plugin_entries="{}",
        idle_drafter_skip=True,
        warm_spec=None,
        table="1-2:3",
        kv_cache_gib=1,
        ld_preload="",
        server_args="{}",
    )
    return SimpleNamespace(**(base | kw))


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_the_floor_runs_every_request_at_b1_with_and_without_the_idle_drafter_skip(bench, tmp_path):
    cmd, env = bench.server_command("floor", _args(), 8000, tmp_path)
    assert json.loads(_flag(cmd, "--additional-config"))["adaptspec"]["variants"] == {"F": "fixed:1"}
    assert json.loads(_flag(cmd, "--speculative-config"))["num_speculative_tokens"] == 8
    assert _flag(cmd, "--worker-extension-cls") == "adaptspec.vllm.IdleDrafterSkip"
    assert (tmp_path / "prometheus-8000").is_dir() and env["PROMETHEUS_MULTIPROC_DIR"] == str(
        tmp_path / "prometheus-8000"
    )
    cmd, _ = bench.server_command("floor-noskip", _args(), 8001, tmp_path)
    assert "--worker-extension-cls" not in cmd
    assert json.loads(_flag(cmd, "--additional-config"))["adaptspec"]["variants"] == {"F": "fixed:1"}


def test_plugin_k_is_vllms_k_through_the_plugin_and_named_entries_reach_their_server(bench, tmp_path):
    cmd, _ = bench.server_command("plugin-k3", _args(), 8000, tmp_path)
    assert json.loads(_flag(cmd, "--speculative-config"))["num_speculative_tokens"] == 3
    entry = json.loads(_flag(cmd, "--additional-config"))["adaptspec"]
    assert (
        entry["variants"] == {"P": "fixed:4"} and entry["load_rule"] == "none"
    )  # every step verifies K, as vLLM's k3
    cmd, _ = bench.server_command(
        "adaptive-l",
        _args(plugin_entries='{"adaptive-l": {"load_rule": "learned"}}', idle_drafter_skip=False),
        8001,
        tmp_path,
    )
    assert json.loads(_flag(cmd, "--additional-config"))["adaptspec"]["load_rule"] == "learned"
    assert "--worker-extension-cls" not in cmd


def test_a_tagged_configuration_is_its_kind_with_the_flags_given_it(bench, tmp_path):
    args = _args(server_args='{"floor@nostats": ["--disable-log-stats"]}')
    tagged, _ = bench.server_command("floor@nostats", args, 8000, tmp_path)
    untagged, _ = bench.server_command("floor", args, 8001, tmp_path)
    assert "--disable-log-stats" in tagged and "--disable-log-stats" not in untagged
    assert json.loads(_flag(tagged, "--additional-config"))["adaptspec"]["variants"] == {"F": "fixed:1"}
    plain, _ = bench.server_command(
        "plain@x", _args(server_args='{"plain@x": ["--max-num-batched-tokens", "512"]}'), 8002, tmp_path
    )
    assert "--speculative-config" not in plain and _flag(plain, "--max-num-batched-tokens") == "512"


def _run(tps, group, repeat, cpu_s, tokens=100, **extra):
    return {"tokens_per_s": tps, "tokens": tokens, "cpu_s": cpu_s, "group": group, "repeat": repeat} | extra


def test_the_summary_pairs_each_run_with_its_groups_plain(bench):
    runs = {
        "plain": {"1": [_run(10.0, 0, 0, 20.0), _run(20.0, 0, 1, 10.0)]},
        "k3": {"1": [_run(15.0, 0, 0, 10.0), _run(20.0, 0, 1, 10.0)]},
        "plugin-k3": {
            "1": [
                _run(12.0, 0, 0, 10.0, plugin={"share": 0.01}),
                _run(22.0, 0, 1, 10.0, plugin={"share": 0.02}),
            ]
        },
    }
    s = bench.summarize(runs)
    # the plug-in at K = 3 against vLLM at K = 3, each over plain first: (12/10)/(15/10) and (22/20)/(20/20)
    assert s["plugin-k3"]["1"]["vs_vllm_same_k"]["geomean"] == pytest.approx(math.sqrt(0.8 * 1.1))
    assert s["plugin-k3"]["1"]["vs_plain"]["geomean"] == pytest.approx(math.sqrt(1.2 * 1.1))
    # tokens per CPU second: 100 / 10 against plain's 100 / 20 and 100 / 10
    assert s["k3"]["1"]["vs_plain_cpu"]["geomean"] == pytest.approx(math.sqrt(2.0 * 1.0))
    assert s["plugin-k3"]["1"]["plugin_share"] == [0.01, 0.02]


def test_the_steps_floor_by_repeat_is_each_repeats_floor_mean_over_its_plain_mean():
    steps = load_script("bench_vllm_steps")

    def step(t, k=0, verified=0, prefill=0, rows=1):
        return {"rows": rows, "step_s": t, "k": k, "verified": verified, "prefill_tokens": prefill}

    plain = [step(0.10), step(0.10), step(0.20), step(0.20)]  # repeat 0: 0.10, repeat 1: 0.20
    other = [
        step(0.11),
        step(0.5, k=3),
        step(0.9, prefill=5),  # repeat 0: floor 0.11 (the rest is no floor)
        step(0.24),
        step(0.20),
        step(0.3, verified=1),
    ]  # repeat 1: floor (0.24 + 0.20) / 2
    marks_p = [
        {"repeat": 0, "rows": 1, "first_step": 0, "last_step": 2},
        {"repeat": 1, "rows": 1, "first_step": 2, "last_step": 4},
    ]
    marks_o = [
        {"repeat": 0, "rows": 1, "first_step": 0, "last_step": 3},
        {"repeat": 1, "rows": 1, "first_step": 3, "last_step": 6},
    ]
    r = steps.floor_by_repeat(plain, other, marks_p, marks_o, rows=1)
    assert r["repeats"] == 2 and r["geomean"] == pytest.approx(math.sqrt(1.1 * 1.1))
    assert r["ci95"][0] == pytest.approx(1.1) and r["ci95"][1] == pytest.approx(
        1.1
    )  # both repeats 1.1: no spread


def test_every_plugin_configuration_is_compared_with_the_table(bench):
    runs = {
        "plain": {"1": [_run(10.0, 0, 0, 1.0), _run(10.0, 0, 1, 1.0)]},
        "table": {"1": [_run(20.0, 0, 0, 1.0), _run(10.0, 0, 1, 1.0)]},
        "adaptive-l": {"1": [_run(10.0, 0, 0, 1.0), _run(20.0, 0, 1, 1.0)]},
        "k1": {"1": [_run(10.0, 0, 0, 1.0), _run(10.0, 0, 1, 1.0)]},
    }
    s = bench.summarize(runs)
    assert s["adaptive-l"]["1"]["vs_table"]["geomean"] == pytest.approx(math.sqrt(0.5 * 2.0))


def test_the_paired_summary_by_pair_and_by_instance_against_hand_computations():
    paired = load_script("bench_vllm_paired")
    runs = {
        "a": [
            {"tokens_per_s": 10.0, "instance": 0},
            {"tokens_per_s": 10.0, "instance": 1},
            {"tokens_per_s": 20.0, "instance": 0},
            {"tokens_per_s": 20.0, "instance": 1},
        ],
        "b": [
            {"tokens_per_s": 12.0, "instance": 0},
            {"tokens_per_s": 9.0, "instance": 1},
            {"tokens_per_s": 30.0, "instance": 0},
            {"tokens_per_s": 18.0, "instance": 1},
        ],
    }
    s = paired.summarize(runs, ["a", "b"], instances=2)["b"]
    assert s["per_repeat"] == pytest.approx([1.2, 0.9, 1.5, 0.9])
    assert s["geomean"] == pytest.approx((1.2 * 0.9 * 1.5 * 0.9) ** 0.25)
    # instance 0 ran pairs 0 and 2, instance 1 pairs 1 and 3: their geometric means, then a t-interval over the two
    per = [math.sqrt(1.2 * 1.5), 0.9]
    assert s["by_instance"]["per_repeat"] == pytest.approx(per)
    half = 12.706204736174707 * abs(math.log(per[0]) - math.log(per[1])) / math.sqrt(2) / math.sqrt(2)
    centre = math.sqrt(per[0] * per[1])
    assert s["by_instance"]["ci95"] == pytest.approx([centre * math.exp(-half), centre * math.exp(half)])
    assert "by_instance" not in paired.summarize(runs, ["a", "b"], instances=1)["b"]


def test_restarting_every_repeat_starts_servers_afresh_and_keeps_each_runs_prompts(
    bench, tmp_path, monkeypatch
):
    started, seen = [], {}

    class FakeServer:
        def __init__(self, name, args, root):
            self.name, self.url = name, f"http://{name}"
            started.append(name)

        def wait_ready(self, timeout):
            pass

        def stop(self):
            pass

    def fake_measure(server, chunk, lv, args):
        seen.setdefault(args.restart_every_repeat, []).append((server.name, lv, chunk[0]))
        return {"tokens_per_s": 1.0}

    monkeypatch.setattr(bench, "Server", FakeServer)
    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(bench, "one_request", lambda *a, **k: None)
    prompts = [f"p{i}" for i in range(50)]
    for restart in (False, True):
        started.clear()
        args = SimpleNamespace(
            levels=[1, 2, 4],
            repeats=3,
            requests_per_client=2,
            deadline_min=60,
            start_timeout=1,
            restart_every_repeat=restart,
            out=tmp_path / "out.json",
        )
        results = {"runs": {"plain": {}, "k2": {}}, "not_run": []}
        bench.run_group(["plain", "k2"], 0, prompts, args, results, bench.time.time(), tmp_path)
        assert len(started) == (3 if restart else 1) * 2  # each server started once a repeat, or once
        assert all(len(results["runs"][n][str(lv)]) == 3 for n in ("plain", "k2") for lv in (1, 2, 4))
    # the same (configuration, level, first prompt) runs either way: only their order and the servers' lives differ
    assert sorted(seen[True]) == sorted(seen[False]) and len(seen[False]) == 2 * 3 * 3
    # without restarts level-major, as before: level 1's repeats on prompts 0, 2, 4, then level 2's from 6
    assert [c for n, lv, c in seen[False] if n == "plain"][:4] == ["p0", "p2", "p4", "p6"]
