"""``GET /ab`` never answers 5xx, and ``ab-report --checkpoint-dir`` reads a server's own checkpoints (issue 30.5).

Hypothesis draws the variants (1-3 policies, learning or not, contextual or not), the number of
requests (UCB's warm-up gave NaN target probabilities after a few requests) and whether the
server checkpoints; the server is the FastAPI application in process (no port) over the tiny
model. The off-policy estimates' target probabilities are checked where they are computed
(``evaluate`` refuses any that do not sum to 1), so a 200 here means they were valid.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

POOL = [
    "ucb",
    "ucb-throughput",
    "eps-greedy",
    "ts",
    "exp3",
    "linucb",
    "lints",
    "linucb:standardize=false",
    "fixed:4",
    "random",
]


@pytest.fixture(scope="module")
def speculator():
    from adaptspec.serving.tiny import tiny_speculator

    return tiny_speculator(0)[0]


@pytest.mark.slow
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(specs=["ucb", "fixed:4"], n=12, checkpoints=True)  # the case: UCB still in warm-up
@given(
    specs=st.lists(st.sampled_from(POOL), min_size=1, max_size=3, unique=True),
    n=st.integers(1, 20),
    checkpoints=st.booleans(),
)
def test_ab_never_5xx_with_or_without_checkpoints(speculator, specs, n, checkpoints):
    from fastapi.testclient import TestClient

    from adaptspec.cli import main
    from adaptspec.serving.app import create_app
    from adaptspec.serving.service import CompletionService

    variants = {chr(ord("A") + i): s for i, s in enumerate(specs)}
    with tempfile.TemporaryDirectory() as tmp:
        log, ck = Path(tmp) / "log", Path(tmp) / "ck"
        service = CompletionService.build(
            speculator,
            variants,
            log_dir=log,
            checkpoint_dir=ck if checkpoints else None,
            checkpoint_every=2,
            log_fsync=False,
            seed=1,
        )
        with TestClient(create_app(service)) as client:
            for i in range(n):
                r = client.post(
                    "/v1/completions", json={"prompt": [5, 6, 7 + i % 50], "max_tokens": 3, "user": f"u{i}"}
                )
                assert r.status_code == 200, r.text
                if i % 7 == 6 or i == n - 1:  # the report during the run, as a dashboard polls it
                    for q in ("/ab", "/ab?ope=0"):
                        ab = client.get(q)
                        assert ab.status_code == 200, (q, ab.text)
                        assert sum(v["decisions"] for v in ab.json()["variants"].values()) == i + 1
        if checkpoints:  # the service is closed: every variant wrote its final checkpoint
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = main(["ab-report", str(log), "--checkpoint-dir", str(ck), "--json", "--bootstrap", "20"])
            assert rc == 0, err.getvalue()
