"""The scripts in examples/ run as a user would run them and print what they promise.

Each runs as a subprocess with small arguments. Where a printed figure has a closed form on
the bundled default trace set (the public benchmark prompts': the oracle's gain over the best
fixed block size, the true value of a fixed block size), it is recomputed here from the trace
set's raw Parquet columns, read with pyarrow (not through adaptspec).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from adaptspec.models.prompts import benchmark_prompts

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "adaptspec" / "data" / "traces" / "benchmarks"  # the bundled default trace set


def run_example(name: str, *args: str, timeout: float = 900) -> str:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    p = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
    assert p.returncode == 0, f"{name} exited with {p.returncode}:\n{p.stdout}\n{p.stderr[-3000:]}"
    return p.stdout


def raw_arms() -> list[int]:
    """The bundled default set's block sizes, ascending, from outcomes.parquet."""
    return sorted(
        set(pq.read_table(DEFAULT / "outcomes.parquet", columns=["block_size"])["block_size"].to_pylist())
    )


def n_requests() -> int:
    return pq.read_table(DEFAULT / "requests.parquet", columns=["request_id"]).num_rows


def token_latency() -> np.ndarray:
    """Minus milliseconds per new token of every (request, block size) of the bundled default set,
    ``(requests, arms)`` with arms ascending, from the raw decode_ms and new_tokens columns."""
    rows = pq.read_table(
        DEFAULT / "outcomes.parquet", columns=["request_id", "block_size", "new_tokens", "decode_ms"]
    ).to_pylist()
    arms = raw_arms()
    ids = sorted({r["request_id"] for r in rows})
    out = np.full((len(ids), len(arms)), np.nan)
    for r in rows:
        out[ids.index(r["request_id"]), arms.index(r["block_size"])] = -r["decode_ms"] / r["new_tokens"]
    assert not np.isnan(out).any()
    return out


def test_every_example_has_a_docstring_a_main_and_a_readme_line():
    readme = (ROOT / "examples" / "README.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "examples").glob("*.py"))
    assert scripts == [
        "ab_serving.py",
        "byo_dflash.py",
        "off_policy.py",
        "replay_policies.py",
        "wrap_speculator.py",
    ]
    for name in scripts:
        text = (ROOT / "examples" / name).read_text()
        assert text.startswith('"""') and f"python examples/{name}" in text, name  # says how to run it
        assert "def main()" in text and "argparse" in text, name
        assert f"({name})" in readme, name


def test_wrap_speculator(tmp_path):
    out = run_example("wrap_speculator.py", "--prompts", "2", "--max-new-tokens", "8", "--out", str(tmp_path))
    rows = [line.split() for line in out.splitlines() if re.match(r"^(gsm8k|mt-bench|humaneval)", line)]
    assert [r[0] for r in rows] == [p.domain for p in benchmark_prompts(per_benchmark=1)[:2]]
    for domain, b, tau, tps, reward in rows:
        if int(b) == 1:  # plain decoding commits one token a round
            assert float(tau) == 1.0
        # the reward is minus milliseconds per token, -1000 / (tokens per second), up to the printed rounding
        t, r = float(tps), float(reward)
        assert -1000.0 / (t - 0.05) - 0.005 <= r <= -1000.0 / (t + 0.05) + 0.005
    assert re.search(r"engine-style: decide -> B=\d+ \(propensity [0-9.]+\), feedback -> applied", out)
    assert "updates learnt: 3;" in out  # two generate calls and one feedback
    assert list((tmp_path / "log").glob("part-*.parquet")) and list((tmp_path / "ckpt").iterdir())


def test_replay_policies_held_out():
    out = run_example("replay_policies.py", "--seeds", "2", "--passes", "1")
    m = re.search(r"^head trained on (\d+) requests, policies replayed on the other (\d+)$", out, re.M)
    n, domains = n_requests(), len(set(pq.read_table(DEFAULT / "requests.parquet")["domain"].to_pylist()))
    assert m and int(m[1]) + int(m[2]) == n and abs(int(m[1]) - int(m[2])) <= domains, (
        out
    )  # halves, by domain
    rows = {
        m[1].strip(): m
        for m in re.finditer(
            r"^(.{26}) +([0-9.]+) \[([0-9.]+), ([0-9.]+)\] +([-+][0-9.]+) \[([-+][0-9.]+), ([-+][0-9.]+)\] +([0-9.]+)$",
            out,
            re.M,
        )
    }
    assert len(rows) == 5, out
    for m in rows.values():
        pct, lo, hi = float(m[2]), float(m[3]), float(m[4])
        assert lo <= pct <= hi and pct <= 100.0 + 1e-9
    assert rows["per-request oracle"][2] == "100.0"
    best_fixed = [m for k, m in rows.items() if k.startswith("best fixed (B=")]
    assert len(best_fixed) == 1 and best_fixed[0][5] == "+0.0"


def test_replay_policies_bundled_head_matches_the_trace_set():
    out = run_example("replay_policies.py", "--bundled-head", "--seeds", "2", "--passes", "1")
    assert f"bundled head on all {n_requests()} requests" in out  # BUNDLED_HEAD goes with the default set
    cost = -token_latency()
    best = int(np.argmin(cost.sum(axis=0)))
    gain = (
        100.0 * cost[:, best].sum() / cost.min(axis=1).sum() - 100.0
    )  # oracle's speed over the best fixed block's
    arms = raw_arms()
    m = re.search(rf"^best fixed \(B={arms[best]}\) .*$", out, re.M)
    assert m, out
    oracle = re.search(r"^per-request oracle +100\.0 \[100\.0, 100\.0\] +([-+][0-9.]+)", out, re.M)
    assert oracle and float(oracle[1]) == round(gain, 1)


def test_off_policy_truth_and_estimates():
    n = n_requests()
    out = run_example("off_policy.py", "--steps", str(n))  # one shuffled pass: every request once
    R = token_latency()
    arms = raw_arms()
    for spec in ("fixed:4", "fixed:16"):
        m = re.search(rf"^{spec} +(-[0-9.]+) +ips +(-[0-9.]+) +\[(-[0-9.]+), (-[0-9.]+)\]", out, re.M)
        assert m, out
        assert float(m[1]) == round(R[:, arms.index(int(spec.split(":")[1]))].mean(), 2)
    estimates = re.findall(r"(ips|snips|dr) +(-[0-9.]+) +\[(-[0-9.]+), (-[0-9.]+)\] +(yes|no)$", out, re.M)
    assert len(estimates) == 9
    assert all(float(lo) <= float(v) <= float(hi) for _, v, lo, hi, _ in estimates)
    assert f"decision log of ucb:epsilon=0.3: {n} decisions" in out


def test_ab_serving():
    out = run_example(
        "ab_serving.py",
        "--requests",
        "24",
        "--users",
        "12",
        "--max-tokens",
        "8",
        "--budget-s",
        "80",
        timeout=120,
    )
    served = {v: int(n) for v, n in re.findall(r"^variant (\w+): (\d+) requests", out, re.M)}
    assert set(served) == {"A", "B"} and sum(served.values()) == 24
    assert "B=4: " + str(served["B"]) in out  # fixed:4 always picks 4
    assert re.search(r"^server stopped", out, re.M)
    assert "24 decisions;" in out  # every request is in the decision log after the shutdown
    assert re.search(r"^verdict A vs B: (A is better|B is better|no significant difference yet)", out, re.M)


@pytest.mark.slow
def test_byo_dflash_end_to_end(tmp_path):
    out = run_example(
        "byo_dflash.py",
        "--prompts",
        "6",
        "--requests",
        "8",
        "--max-new-tokens",
        "8",
        "--out",
        str(tmp_path),
        timeout=300,
    )
    m = re.search(
        r"^1\. AdaptiveController\(speculator\): policy (\S+), block sizes \[([0-9, ]+)\]$", out, re.M
    )
    assert m, out
    arms = [int(b) for b in m[2].split(", ")]
    assert max(arms) <= 8  # derived from the speculator's max_block_size, not the bundled head's 1..16
    chosen = [int(b) for b in re.findall(r"^   \w+ +B=(\d+) ", out, re.M)]
    assert len(chosen) == 3 and set(chosen) <= set(arms)
    assert "updates learnt: 3" in out  # three generate calls
    assert re.search(
        r"^2\. for_engine: decide -> B=\d+, decode -> \d+ tokens, feedback -> applied$", out, re.M
    )
    assert re.search(r"^3\. collected 6 requests x block sizes \[1, 2, 4, 8\]", out, re.M)
    served = {v: int(n) for v, n in re.findall(r"^5\. variant (\w): (\d+) requests", out, re.M)}
    assert sum(served.values()) == 8
    assert re.search(r"^8 decisions;", out, re.M)  # every served request is in the decision log
    for v, n in served.items():
        if n:
            assert re.search(rf"^\| {v} \| {n} \|", out, re.M), out
    assert (tmp_path / "head" / "config.json").is_file()
