"""The simulate / ope / synth / import-blockpilot / traces commands, in-process and as subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from adaptspec.cli import main


def write_bp(folder: Path, n: int = 6) -> dict:
    """A small BlockPilot result folder: tau per block size, the selector's choice, tau at the choice."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    data = {b: {str(i): float(rng.uniform(2, 9)) for i in range(n)} for b in (14, 15, 16, 17, 18)}
    for b, d in data.items():
        (folder / f"{b}.json").write_text(json.dumps(d))
    choice = {str(i): max(data, key=lambda b: data[b][str(i)]) for i in range(n)}
    (folder / "1.json").write_text(json.dumps(choice))
    (folder / "mapped_from_1.json").write_text(json.dumps({k: data[b][k] for k, b in choice.items()}))
    return {"data": data, "choice": choice}


KEYS = {
    "policy",
    "mean_reward",
    "mean_tau",
    "throughput",
    "pct_oracle",
    "pct_best_fixed",
    "cumulative_regret",
}


def run_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_bundled_table_and_plot(tmp_path, capsys):
    png = tmp_path / "x.png"
    assert (
        main(
            [
                "simulate",
                "--policy",
                "fixed:4",
                "--policy",
                "random",
                "--seeds",
                "2",
                "--order",
                "shuffled",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "fixed:4" in out
        and "random" in out
        and "(best fixed)" in out
        and "oracle" in out
        and "% oracle" in out
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_simulate_json_shape(capsys):
    d = run_json(
        capsys, ["simulate", "--policy", "fixed:8", "--policy", "random", "--json", "--seeds", "0,5"]
    )
    assert [p["policy"] for p in d["policies"]] == ["fixed:8", "random"]
    for p in [*d["policies"], d["oracle"], d["best_fixed"]]:
        assert KEYS <= set(p)
    assert isinstance(d["best_fixed"]["block_size"], int) and d["reward"] == "token_latency"
    assert d["oracle"]["pct_oracle"] == 100.0 and d["seeds"] == [0, 5]
    assert d["policies"][0]["pct_oracle"] < 100.0


def test_import_blockpilot_then_simulate_reports_the_fixed_mean(tmp_path, capsys):
    src = write_bp(tmp_path / "gsm8k_0T0.0", n=6)
    out = tmp_path / "bp"
    assert main(["import-blockpilot", str(tmp_path / "gsm8k_0T0.0"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "BlockPilot's choice" in text
    d = run_json(capsys, ["simulate", str(out), "--policy", "fixed:16", "--reward", "tau", "--json"])
    assert d["policies"][0]["mean_tau"] == pytest.approx(np.mean(list(src["data"][16].values())), abs=1e-6)
    assert d["oracle"]["mean_tau"] == pytest.approx(
        np.mean([max(src["data"][b][str(i)] for b in src["data"]) for i in range(6)]), abs=1e-6
    )
    d = run_json(
        capsys,
        [
            "simulate",
            str(out),
            "--policy",
            "fixed:16",
            "--reward",
            "modelled",
            "--latency",
            "h100-qwen3-8b",
            "--json",
        ],
    )
    assert d["latency"] == "h100-qwen3-8b" and d["policies"][0]["throughput"] > 0
    info = run_json(capsys, ["traces", "info", str(out), "--json"])
    assert info["requests"] == 6 and info["features"] is None


def test_synth_traces_info_and_ope_end_to_end(tmp_path, capsys):
    ts = tmp_path / "syn"
    assert (
        main(["synth", "--out", str(ts), "--scenario", "dflash-gpu", "--requests", "80", "--summary-only"])
        == 0
    )
    capsys.readouterr()
    info = run_json(capsys, ["traces", "info", str(ts), "--json"])
    assert info["requests"] == 80 and info["scenario"] == "dflash-gpu" and not info["per_round"]
    assert main(["traces", "validate", str(ts)]) == 0
    assert "ok: traceset" in capsys.readouterr().out
    log = tmp_path / "log"
    assert (
        main(
            [
                "simulate",
                str(ts),
                "--policy",
                "random",
                "--steps",
                "800",
                "--order",
                "shuffled",
                "--log",
                str(log),
            ]
        )
        == 0
    )
    capsys.readouterr()
    d = run_json(
        capsys,
        ["ope", str(log), "--policy", "fixed:16", "--policy", "fixed:1", "--bootstrap", "50", "--json"],
    )
    assert d["decisions"] == 800 and set(d["logged_policies"]) == {"random"}
    v16 = d["policies"][0]["estimates"]["dr"]["value"]
    v1 = d["policies"][1]["estimates"]["dr"]["value"]
    assert v16 > 2 * v1  # DFlash-like: B=16 far better than no speculation
    assert main(["ope", str(log), "--policy", "fixed:16", "--estimator", "ips", "--bootstrap", "50"]) == 0
    assert "ips" in capsys.readouterr().out
    linfo = run_json(capsys, ["traces", "info", str(log), "--json"])
    assert linfo["kind"] == "decision_log" and linfo["decisions"] == 800


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["simulate", "/no/such/dir"], "/no/such/dir: no such trace set directory"),
        (
            ["simulate", "--policy", "fixed:5"],
            "fixed:5: block size 5 is not one of the arms",
        ),  # default set: 1-4,6,8,12,16
        (
            ["simulate", "adaptspec/data/traces/default"],
            "default: no such trace set directory (the bundled template set "
            "moved to adaptspec/data/traces/templates; the default is now "
            "adaptspec/data/traces/benchmarks)",
        ),
        (["simulate", "--seeds", "x"], "--seeds: expected a count"),
        (["simulate", "--steps", "0"], "--steps: expected an integer in 1..10000000, got '0'"),
        (["simulate", "--latency", "tpu"], "unknown latency profile 'tpu'"),
        (["simulate", "--plot", "x.jpg"], "--plot: expected a .png file name"),
        (["ope", "/no/log", "--policy", "random"], "/no/log: no such decision log"),
        (["synth", "--out", "OUT", "--arms", "1,x"], "--arms: expected block sizes"),
        (["import-blockpilot", "/no/bp", "--out", "OUT"], "/no/bp: no such directory"),
        (["traces", "info", "/no/where"], "/no/where: no such file or directory"),
        (["traces", "info", "adaptspec/data/traces/default"], "moved to adaptspec/data/traces/templates"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, msg):
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err and err.startswith(f"adaptspec {argv[0]}: error:")
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_force(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["synth", "--out", str(out), "--requests", "5", "--summary-only"]) == 0
    assert main(["synth", "--out", str(out), "--requests", "5"]) == 2
    assert "already exists (pass --force" in capsys.readouterr().err
    assert main(["synth", "--out", str(out), "--requests", "7", "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["requests"] == 7


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "adaptspec", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent,
    )


def test_subprocess_json_and_error():
    ok = _run("simulate", "--policy", "fixed:4", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["policies"][0]["policy"] == "fixed:4"
    bad = _run("simulate", "--reward", "modelled", "--policy", "random")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == "adaptspec simulate: error: --reward modelled needs --latency PROFILE"


def test_each_bundled_trace_set_is_replayed_with_the_head_trained_on_it(capsys):
    # neural-linear without head= and the automatic featurizer: BUNDLED_HEAD on the default (benchmark)
    # set, TEMPLATES_HEAD on the template set (the head config's fingerprints, read as JSON)
    from adaptspec.models.bundled import TEMPLATES_HEAD
    from adaptspec.paths import BUNDLED_HEAD
    from adaptspec.policies.featurizer import featurizer_for
    from adaptspec.traces import TEMPLATE_TRACES

    for head in (BUNDLED_HEAD, TEMPLATES_HEAD):
        want = json.loads((head / "config.json").read_text())["info"]["featurizer"]
        assert featurizer_for(["linucb"], 1153, "auto", default_head=head).fingerprint == want
    assert (
        featurizer_for(["linucb"], 1153).fingerprint
        == json.loads((BUNDLED_HEAD / "config.json").read_text())["info"]["featurizer"]
    )
    d = run_json(
        capsys, ["simulate", "--policy", "neural-linear", "--steps", "50", "--json", "--no-progress"]
    )
    assert d["policies"][0]["policy"] == "neural-linear"
    assert d["arms"] == json.loads((BUNDLED_HEAD / "config.json").read_text())["arms"]
    d = run_json(
        capsys,
        [
            "simulate",
            str(TEMPLATE_TRACES),
            "--policy",
            "neural-linear",
            "--steps",
            "50",
            "--json",
            "--no-progress",
        ],
    )
    assert d["policies"][0]["policy"] == f"neural-linear:head={TEMPLATES_HEAD}"
    assert d["arms"] == json.loads((TEMPLATES_HEAD / "config.json").read_text())["arms"]
