"""simulate says when a head is scored on the requests it was trained on (issue 46, item 19):
from the ids train-head records, from what is known of the shipped heads, and, for a head that
records neither, that it cannot tell."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adaptspec.cli import main
from adaptspec.paths import BUNDLED_HEAD
from adaptspec.policies.neural_linear import NeuralLinear
from adaptspec.policies.offline_head import HeadModel, OfflineHead
from adaptspec.simulators.in_sample import in_sample_warnings
from adaptspec.simulators.synthetic import generate
from adaptspec.traces import DEFAULT_TRACES, load_traces


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A synthetic trace set, a head trained on its first 60 requests by train-head, and its other 40."""
    root = tmp_path_factory.mktemp("insample")
    ts = generate("cpu-small", n_requests=100, seed=5, per_round=False)
    ts.subset(np.arange(60)).write(root / "train")
    ts.subset(np.arange(60, 100)).write(root / "unseen")
    assert (
        main(
            [
                "train-head",
                str(root / "train"),
                "--out",
                str(root / "head"),
                "--hidden",
                "8",
                "--epochs",
                "5",
                "--reward",
                "tau",
                "--json",
            ]
        )
        == 0
    )
    return root / "train", root / "unseen", root / "head"


@pytest.mark.slow  # trains a head through the CLI (about 10 s)
def test_a_head_scored_on_its_training_requests_is_named(
    two_sets, capsys: pytest.CaptureFixture[str]
) -> None:
    train, unseen, head = two_sets
    capsys.readouterr()
    ids = HeadModel.load(head).info["request_ids"]
    assert sorted(ids) == sorted(load_traces(train).request_ids.tolist())  # what it was trained on, recorded
    spec = f"head:path={head}"
    assert main(["simulate", str(train), "--policy", spec, "--reward", "tau", "--no-progress", "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert len(warnings) == 1 and "trained on 60 of these 60 requests" in warnings[0]
    assert main(["simulate", str(unseen), "--policy", spec, "--reward", "tau", "--no-progress"]) == 0
    assert "warning:" not in capsys.readouterr().out  # none of these requests trained it


@pytest.mark.slow  # reads the bundled benchmark set (about 1.5 s)
def test_the_shipped_head_on_its_own_trace_set_and_a_head_that_records_nothing() -> None:
    ts = load_traces(DEFAULT_TRACES)
    nl = NeuralLinear(BUNDLED_HEAD)
    (line,) = in_sample_warnings([nl], ts)
    assert "the shipped head was trained on requests of this trace set" in line
    assert (
        in_sample_warnings([nl], ts.subset(np.arange(10))) == []
    )  # not the bundled set's path: nothing known
    bare = HeadModel.load(BUNDLED_HEAD)
    bare.layers = [(W + 1e-3, b) for W, b in bare.layers]  # another head (other weights), no ids recorded
    (line,) = in_sample_warnings([NeuralLinear(bare)], ts)
    assert "records no training request ids" in line


def test_the_overlap_is_counted_from_the_recorded_ids() -> None:
    from adaptspec.traces import TraceSet

    head = HeadModel.load(BUNDLED_HEAD)
    head.info = {**head.info, "request_ids": ["a", "c", "z"]}
    ts = TraceSet.from_arrays(list("abcd"), ["x"] * 4, list(head.arms), np.ones((4, len(head.arms))))
    (line,) = in_sample_warnings([OfflineHead(head), OfflineHead(head)], ts)  # one line per head
    assert "trained on 2 of these 4 requests" in line
    head.info = {**head.info, "request_ids": ["z"]}
    assert in_sample_warnings([OfflineHead(head)], ts) == []
