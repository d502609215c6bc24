"""A/B across a fleet: ``ab-report`` reads every replica's decision log and gives one verdict.

The expected verdict comes from the sequential test run directly on the rewards in the order
the driver fed them (one stream, as one process would have seen it), not from the log readers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from _controller_helpers import SplitFormOnly as _Toy
from adaptspec import AdaptiveController
from adaptspec.analysis.statistics import sequential_test
from adaptspec.cli import main


def write_fleet(root, n=300, replicas=3, seed=0):
    """Replicas r0..r2, each serving variants A and B; B earns 0.6 more on average. Returns the
    (variant, reward) stream in the order it was fed."""
    rng = np.random.default_rng(seed)
    ctls = {
        (i, v): AdaptiveController(
            _Toy(),
            "fixed:2",
            arms=[1, 2, 4],
            variant=v,
            log_dir=root / f"r{i}",
            log_fsync=False,
            roll_rows=37,
        )
        for i in range(replicas)
        for v in "AB"
    }
    fed = []
    for t in range(n):
        v = "AB"[int(rng.integers(2))]
        c = ctls[(t % replicas, v)]
        r = float(rng.normal(1.0 + (0.6 if v == "B" else 0.0), 1.0))
        d = c.decide(None)
        assert c.feedback(d.decision_id, reward=r) == "applied"
        fed.append((v, r))
    for c in ctls.values():
        c.close()
    return fed


def expected(fed):
    g = np.array([v == "B" for v, _ in fed], dtype=np.int64)
    return sequential_test(g, np.array([r for _, r in fed]))


def report(capsys, *argv):
    assert main(["ab-report", *argv, "--json", "--bootstrap", "20"]) == 0
    return json.loads(capsys.readouterr().out)


def test_one_verdict_over_every_replica_log(tmp_path, capsys):
    fed = write_fleet(tmp_path / "fleet")
    want = expected(fed)
    assert want.stopped_at is not None and want.winner == 1  # the whole fleet's stream decides
    dirs = [str(tmp_path / "fleet" / f"r{i}") for i in range(3)]
    for argv in (dirs, [str(tmp_path / "fleet")]):  # several directories, or their parent
        rep = report(capsys, *argv)
        (t,) = rep["sequential"]["tests"]
        assert rep["decisions"] == len(fed) and len(rep["logs"]) == 3
        assert t["n"] == {"A": want.n[0], "B": want.n[1]}
        assert t["stopped_at"] == want.stopped_at and t["winner"] == "B"
        assert t["p_value"] == pytest.approx(want.p_value, rel=1e-5, abs=1e-6)
    # one replica alone saw a third of the stream: its own report is about that third only
    alone = report(capsys, dirs[0])
    assert alone["decisions"] == sum(1 for i in range(len(fed)) if i % 3 == 0)


def test_a_log_given_twice_is_one_line(tmp_path, capsys):
    write_fleet(tmp_path / "fleet", n=30)
    r0 = str(tmp_path / "fleet" / "r0")
    assert main(["ab-report", r0, r0]) == 2
    assert "given twice" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["ab-report", str(tmp_path / "empty")]) == 2
    assert "neither a decision log nor a directory of replicas' decision logs" in capsys.readouterr().err
