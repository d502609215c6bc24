"""The bundled trace sets are real, and the default is the public benchmark prompts' set.

- ``adaptspec/data/traces/benchmarks`` (:data:`DEFAULT_TRACES`, what ``load_traces()`` reads):
  the bundled speculator on GSM8K, MT-Bench and HumanEval prompts, derived from dense traces;
- ``adaptspec/data/traces/templates`` (:data:`TEMPLATE_TRACES`): collected with ``adaptspec
  collect`` on held-out template prompts, the drafter's training distribution (in-distribution).

Expected figures come from the files themselves (meta.json, the Parquet tables read with
pyarrow), not from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from adaptspec.errors import AdaptspecError
from adaptspec.models.bundled import TEMPLATES_HEAD
from adaptspec.models.prompts import HELDOUT_PATH, benchmark_prompts, demo_prompts
from adaptspec.paths import BUNDLED_HEAD
from adaptspec.traces import DEFAULT_TRACES, TEMPLATE_TRACES, TraceSet, load_traces, path_label

DATA = Path(__file__).resolve().parents[1] / "adaptspec" / "data" / "traces"


def raw(folder: Path) -> tuple[dict, list[dict], list[int]]:
    """meta.json, the requests' (id, domain) rows in stored order, and the block sizes in outcomes.parquet."""
    meta = json.loads((folder / "meta.json").read_text())
    req = pq.read_table(folder / "requests.parquet", columns=["request_id", "domain"]).to_pylist()
    arms = sorted(
        set(pq.read_table(folder / "outcomes.parquet", columns=["block_size"])["block_size"].to_pylist())
    )
    return meta, req, arms


def test_load_traces_without_a_path_reads_the_public_benchmark_set():
    assert DEFAULT_TRACES == DATA / "benchmarks" and TEMPLATE_TRACES == DATA / "templates"
    ts = load_traces()
    meta, req, arms = raw(DATA / "benchmarks")
    assert meta["source"] == "adaptspec dense traces" and meta["dense"].endswith("benchmarks-fast")
    assert ts.path == DEFAULT_TRACES and ts.meta["source"] == meta["source"]
    assert ts.request_ids.tolist() == [r["request_id"] for r in req] and len(ts) == len(req)
    # derived from every request of the dense set it names (its Parquet parts, read with pyarrow)
    dense = Path(__file__).resolve().parents[1] / meta["dense"]
    dense_ids = [
        r
        for part in sorted(dense.glob("part-*.parquet"))
        for r in pq.read_table(part, columns=["request_id"])["request_id"].to_pylist()
    ]
    assert sorted(r["request_id"] for r in req) == sorted(dense_ids) and len(req) >= 300
    assert ts.domains.tolist() == [r["domain"] for r in req]
    assert list(ts.arms) == arms == meta["arms"] == [1, 2, 3, 4, 6, 8, 12, 16]
    # the prompts are the public benchmarks' (GSM8K, MT-Bench, HumanEval), all three of them
    assert {r["domain"].split("/")[0] for r in req} == {"gsm8k", "mt-bench", "humaneval"}
    text = {f"{p.domain}-{i:04d}": p.domain for i, p in enumerate(benchmark_prompts())}
    assert all(text.get(r["request_id"]) == r["domain"] for r in req)
    assert ts.has_timings and ts.features.shape == (len(ts), 1153) and np.isfinite(ts.features).all()
    tau = ts.tau_matrix()
    assert (tau[:, ts.arms.index(1)] == 1.0).all()  # block size 1 is the target alone
    assert (tau >= 1.0).all()
    assert sum(p.stat().st_size for p in DEFAULT_TRACES.iterdir()) < 4_000_000


def test_template_trace_set_is_a_real_collection():
    ts = load_traces(TEMPLATE_TRACES)
    meta, req, arms = raw(DATA / "templates")
    assert meta["source"] == "adaptspec collect" and meta["temperature"] == 0.0
    assert ts.path == TEMPLATE_TRACES and len(ts) == len(req) == 200
    assert ts.request_ids.tolist() == [r["request_id"] for r in req]
    assert len({r["domain"] for r in req}) >= 4
    assert list(ts.arms) == arms == meta["arms"] == [1, 2, 4, 6, 8, 10, 12, 16, 20, 24]
    assert ts.has_timings and ts.features.shape == (len(ts), 1153) and np.isfinite(ts.features).all()
    tau = ts.tau_matrix()
    assert (tau[:, ts.arms.index(1)] == 1.0).all()  # block size 1 is the target alone
    assert (tau[:, 1:] >= 1.0).all() and tau[:, 1:].max() > 3.0
    assert sum(p.stat().st_size for p in TEMPLATE_TRACES.iterdir()) < 4_000_000


def test_template_trace_set_prompts_are_held_out_and_not_the_demos():
    ts = load_traces(TEMPLATE_TRACES)
    rows = [json.loads(line) for line in HELDOUT_PATH.read_text().splitlines() if line.strip()]
    demo = {p.prompt for p in demo_prompts()}
    for rid, domain in zip(ts.request_ids.tolist(), ts.domains.tolist()):
        d, i = rid.rsplit("-", 1)  # collect names requests {domain}-{index in the held-out file}
        assert d == domain == rows[int(i)]["domain"] and rows[int(i)]["prompt"] not in demo


def test_each_shipped_head_has_the_block_sizes_of_its_trace_set():
    # BUNDLED_HEAD (the default policy's) is trained on the default set, TEMPLATES_HEAD on the template set
    for head, folder in ((BUNDLED_HEAD, "benchmarks"), (TEMPLATES_HEAD, "templates")):
        config = json.loads((head / "config.json").read_text())
        assert config["arms"] == raw(DATA / folder)[2], head.name


def test_path_labels_of_the_bundled_sets():
    assert path_label(DEFAULT_TRACES) == "adaptspec/data/traces/benchmarks"
    assert path_label(TEMPLATE_TRACES) == "adaptspec/data/traces/templates"
    assert path_label("runs/traces") == "runs/traces" and path_label(None) is None


def test_the_old_default_path_is_gone_with_a_clear_message():
    old = DATA / "default"
    assert not old.exists()
    with pytest.raises(AdaptspecError, match="no such trace set directory") as e:
        TraceSet.read(old)
    msg = str(e.value)
    assert (
        "\n" not in msg
        and "adaptspec/data/traces/templates" in msg
        and "adaptspec/data/traces/benchmarks" in msg
    )
