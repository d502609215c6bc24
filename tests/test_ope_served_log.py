"""ope on a running server's log and what it says about its weights (issue 46, items 16 and 19):
it reads the log as ab-report does (parts and journal rows, one reader), and a weighted estimate
outside the logged rewards comes with its reason (support, effective sample size, mean weight)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adaptspec.analysis.ope import evaluate, weight_diagnostics
from adaptspec.cli import main
from adaptspec.control import AdaptiveController
from adaptspec.speculator import Outcome, Round
from adaptspec.traces.log_writer import journal_rows


def serve_some(c: AdaptiveController, n: int) -> list[float]:
    """``n`` requests through the split form, each accepting 2 drafts of its block: the rewards."""
    out = []
    for i in range(n):
        d = c.decide([float(i % 3), 1.0])
        tau = min(d.block_size, 3)
        fb = c.feedback(
            d.decision_id, Outcome([7] * (1 + tau), [Round(d.block_size, tau, 0.0, 0.01)], 0.01 + i * 1e-4)
        )
        out.append(fb.reward)
    return out


@pytest.mark.slow  # two CLI commands over a live log (about 2 s)
def test_ope_reads_a_running_servers_log_as_ab_report_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    with AdaptiveController.for_engine(
        [1, 2, 4, 8],
        feature_dim=2,
        policy="random",
        reward="tau",
        log_dir=log,
        roll_rows=10_000,
        roll_interval_s=None,
        log_fsync=False,
    ) as c:
        rewards = serve_some(c, 12)
        c.sync()
        assert not list(log.glob("part-*.parquet")) and len(journal_rows(log)) == 12  # all still in journals
        assert main(["ope", str(log), "--policy", "fixed:4", "--bootstrap", "20", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert main(["ab-report", str(log), "--json"]) == 0
        ab = json.loads(capsys.readouterr().out)
    assert out["decisions"] == out["with_reward"] == 12
    assert out["logged_policies"]["random"] == pytest.approx(np.mean(rewards))
    assert ab["decisions"] == 12


def test_an_ips_outside_the_logged_rewards_says_why() -> None:
    """Logged by a policy that plays arms 0 and 1 only; the target plays arm 2 half the time. IPS
    shrinks toward 0 (the rounds the target would play arm 2 on have no logged reward)."""
    rng = np.random.default_rng(3)
    n = 400
    a = rng.integers(0, 2, n)
    r = np.where(a == 0, -6.0, -3.8) + rng.normal(0, 0.1, n)
    p = np.full(n, 0.5)
    target = np.tile([0.0, 0.5, 0.5], (n, 1))
    logging = np.tile([0.5, 0.5, 0.0], (n, 1))
    est = evaluate(
        r,
        a,
        p,
        target,
        estimators=("ips", "snips", "dm"),
        reward_model="mean",
        n_boot=50,
        logging_probs=logging,
    )
    ips = est["ips"]
    # by hand: weight 1 on the rounds that played arm 1 (0.5 / 0.5), 0 elsewhere
    assert ips.value == pytest.approx(np.mean(np.where(a == 1, r, 0.0)))
    assert ips.value > r.max()  # outside every logged reward
    assert ips.diagnostics.support == pytest.approx(0.5)
    assert ips.diagnostics.mean_weight == pytest.approx(np.mean(a == 1))
    assert (
        "outside the logged rewards" in ips.note
        and "no support" in ips.note
        and "mean importance weight" in ips.note
    )
    assert est["dm"].diagnostics is None and est["dm"].note is None
    w = np.where(a == 1, 1.0, 0.0)
    assert weight_diagnostics(a, p, target).ess == pytest.approx(w.sum() ** 2 / (w**2).sum())


def test_a_well_supported_ips_has_no_note() -> None:
    rng = np.random.default_rng(4)
    n = 2000
    a = rng.integers(0, 3, n)
    r = np.array([1.0, 2.0, 3.0])[a] + rng.normal(0, 0.1, n)
    est = evaluate(
        r,
        a,
        np.full(n, 1 / 3),
        np.tile([0.2, 0.3, 0.5], (n, 1)),
        estimators=("ips",),
        n_boot=20,
        logging_probs=np.full((n, 3), 1 / 3),
    )
    assert est["ips"].note is None and est["ips"].diagnostics.support == pytest.approx(1.0)


def test_ope_prints_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log"
    with AdaptiveController.for_engine(
        [1, 2, 4, 8], feature_dim=2, policy="fixed:2", reward="tau", log_dir=log
    ) as c:
        serve_some(c, 20)
    assert main(["ope", str(log), "--policy", "fixed:8", "--estimator", "ips", "--bootstrap", "20"]) == 0
    text = capsys.readouterr().out
    assert "read with care" in text and "fixed:8, ips:" in text and "no support" in text


def test_rows_read_as_a_log_are_validated_and_not_appended_to(tmp_path: Path) -> None:
    from adaptspec.errors import AdaptspecError
    from adaptspec.traces import DecisionLog

    row = {
        "decision_id": "d1",
        "time": 0.0,
        "policy": "fixed:4",
        "block_size": 4,
        "propensity": 1.0,
        "probs": [0.0, 1.0],
        "arms": [1, 4],
        "reward": 2.5,
    }
    log = DecisionLog.of_rows(tmp_path, [row])
    assert log.arms == (1, 4) and log.rewards.tolist() == [2.5]
    with pytest.raises(AdaptspecError, match="cannot append"):
        log.append([{**row, "decision_id": "d2"}])
    assert not list(tmp_path.iterdir())
    with pytest.raises(AdaptspecError, match="propensity"):
        DecisionLog.of_rows(tmp_path, [{**row, "propensity": 0.0}])
