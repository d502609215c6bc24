"""The bundled default trace set is real: collected with `adaptspec collect` from the bundled
speculator on held-out prompts, every block size on every request."""

from __future__ import annotations

import json

import numpy as np

from adaptspec.models.prompts import HELDOUT_PATH, demo_prompts
from adaptspec.traces import DEFAULT_TRACES, load_traces


def test_default_trace_set_is_a_real_collection():
    ts = load_traces()
    meta = json.loads((DEFAULT_TRACES / "meta.json").read_text())
    assert meta["source"] == "adaptspec collect" and meta["temperature"] == 0.0
    assert ts.path == DEFAULT_TRACES and len(ts) >= 200
    assert len(set(ts.domains.tolist())) >= 4
    assert {2, 4, 6, 8, 10, 12, 16, 20, 24} <= set(ts.arms) and 1 in ts.arms
    assert ts.has_timings and ts.features.shape == (len(ts), 1153) and np.isfinite(ts.features).all()
    tau = ts.tau_matrix()
    assert (tau[:, ts.arms.index(1)] == 1.0).all()  # block size 1 is the target alone
    assert (tau[:, 1:] >= 1.0).all() and tau[:, 1:].max() > 3.0
    assert sum(p.stat().st_size for p in DEFAULT_TRACES.iterdir()) < 4_000_000


def test_default_trace_set_prompts_are_held_out_and_not_the_demos():
    ts = load_traces()
    rows = [json.loads(line) for line in HELDOUT_PATH.read_text().splitlines() if line.strip()]
    demo = {p.prompt for p in demo_prompts()}
    for rid, domain in zip(ts.request_ids.tolist(), ts.domains.tolist()):
        d, i = rid.rsplit("-", 1)  # collect names requests {domain}-{index in the held-out file}
        assert d == domain == rows[int(i)]["domain"] and rows[int(i)]["prompt"] not in demo
