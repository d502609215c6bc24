"""Trace sets, decision logs and the BlockPilot importer: round trips, validation, atomic writes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

import adaptspec.traces as traces_mod
import adaptspec.traces.traceset as traceset_mod
from adaptspec.errors import AdaptspecError
from adaptspec.speculator import Decision, Outcome, Round
from adaptspec.traces import DecisionLog, TraceSet, decision_row, import_blockpilot, open_any


def small_traces(
    n: int = 3, arms=(1, 2, 4), dim: int | None = 3, per_round: bool = True, seed: int = 0
) -> TraceSet:
    rng = np.random.default_rng(seed)
    k = len(arms)
    taus, dms, vms = [], [], []
    mean = np.empty((n, k))
    rounds = np.empty((n, k), dtype=np.int64)
    new = np.empty((n, k), dtype=np.int64)
    for i in range(n):
        for j, b in enumerate(arms):
            r = int(rng.integers(1, 5))
            t = rng.integers(1, b + 1, r)
            taus.append(t)
            dms.append(rng.uniform(0, 5, r))
            vms.append(rng.uniform(1, 9, r))
            mean[i, j] = t.mean()
            rounds[i, j] = r
            new[i, j] = t.sum() + 1  # the rounds' tokens and the prefill's
    return TraceSet.from_arrays(
        [f"r{i}" for i in range(n)],
        ["math" if i % 2 else "chat" for i in range(n)],
        arms,
        mean,
        prompt_tokens=rng.integers(1, 100, n),
        features=None if dim is None else rng.normal(size=(n, dim)),
        new_tokens=new,
        rounds=rounds,
        tau=taus if per_round else None,
        draft_ms=dms if per_round else None,
        verify_ms=vms if per_round else None,
        meta={"target": "t"},
    )


def rewrite(path: Path, name: str, fn) -> None:
    """Apply ``fn`` to one table of a written trace set and write it back."""
    t = pq.read_table(path / name)
    pq.write_table(fn(t), path / name)


def _tau_with(t: pa.Table, row: int, value: int) -> list:
    lists = t.column("tau").to_pylist()
    lists[row][0] = value
    return lists


def set_col(t: pa.Table, name: str, values) -> pa.Table:
    return t.set_column(t.column_names.index(name), name, pa.array(values, t.schema.field(name).type))


# ============================================================================ trace sets
@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 6),
    arms=st.lists(st.integers(1, 24), min_size=1, max_size=5, unique=True),
    dim=st.one_of(st.none(), st.integers(1, 5)),
    per_round=st.booleans(),
    seed=st.integers(0, 10),
)
def test_round_trip(tmp_path_factory, n, arms, dim, per_round, seed):
    ts = small_traces(n, sorted(arms), dim, per_round, seed)
    path = tmp_path_factory.mktemp("ts") / "set"
    ts.write(path)
    back = TraceSet.read(path)
    assert back.arms == tuple(sorted(arms))
    np.testing.assert_array_equal(back.tau_matrix(), ts.tau_matrix())
    np.testing.assert_array_equal(back.rounds_matrix(), ts.rounds_matrix())
    np.testing.assert_array_equal(back.request_ids, ts.request_ids)
    if dim is None:
        assert back.features is None
    else:
        np.testing.assert_array_equal(back.features, ts.features)
        assert back.features.dtype == np.float32
    if per_round:
        np.testing.assert_allclose(back.decode_s_matrix(), ts.decode_s_matrix(), rtol=1e-6)
    else:
        assert back.decode_s_matrix() is None and not back.has_timings
    meta = json.loads((path / "meta.json").read_text())
    assert meta["schema_version"] == traces_mod.SCHEMA_VERSION and meta["target"] == "t"
    assert meta["arms"] == sorted(arms)


def test_matrices_follow_request_and_arm_order_whatever_the_row_order(tmp_path):
    ts = small_traces(4, (1, 2, 4))
    path = ts.write(tmp_path / "s")
    perm = np.random.default_rng(0).permutation(12)
    rewrite(path, "outcomes.parquet", lambda t: t.take(pa.array(perm)))
    back = TraceSet.read(path)
    np.testing.assert_array_equal(back.tau_matrix(), ts.tau_matrix())
    np.testing.assert_allclose(back.decode_s_matrix(), ts.decode_s_matrix())


def test_decode_ms_takes_precedence_over_round_sums():
    ts = small_traces(2, (1, 2), per_round=True)
    t2 = TraceSet(
        ts.requests, ts.outcomes.append_column("decode_ms", pa.array([100.0, 200.0, 300.0, 400.0])), ts.meta
    )
    np.testing.assert_allclose(t2.decode_s_matrix(), [[0.1, 0.2], [0.3, 0.4]])


def test_subset_keeps_rows_and_order():
    ts = small_traces(5, (1, 2, 4))
    sub = ts.subset([4, 1])
    assert sub.request_ids.tolist() == ["r4", "r1"]
    np.testing.assert_array_equal(sub.tau_matrix(), ts.tau_matrix()[[4, 1]])
    np.testing.assert_array_equal(sub.features, ts.features[[4, 1]])
    with pytest.raises(AdaptspecError, match="subset indices"):
        ts.subset([7])


@pytest.mark.parametrize(
    "file,mutate,expected",
    [
        ("outcomes.parquet", lambda t: t.drop(["mean_tau"]), "outcomes.parquet: missing column 'mean_tau'"),
        ("requests.parquet", lambda t: t.drop(["domain"]), "requests.parquet: missing column 'domain'"),
        (
            "outcomes.parquet",
            lambda t: set_col(t, "mean_tau", [1.0, 1.5, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
            "outcomes.parquet: column 'mean_tau', row 2: 9.0 outside 1..4",
        ),
        (
            "outcomes.parquet",
            lambda t: set_col(t, "mean_tau", [1.0, np.nan] + [1.0] * 7),
            "column 'mean_tau', row 1: nan outside",
        ),
        (
            "outcomes.parquet",
            lambda t: set_col(t, "block_size", [1, 2, 2, 1, 2, 4, 1, 2, 4]),
            "outcomes.parquet: rows 1 and 2 repeat (request 'r0', block_size 2)",
        ),
        (
            "outcomes.parquet",
            lambda t: t.slice(0, 8),
            "request 'r2' has block sizes [1, 2], others have [1, 2, 4]",
        ),
        (
            "outcomes.parquet",
            lambda t: set_col(t, "request_id", ["zz"] + ["r0", "r0"] + ["r1"] * 3 + ["r2"] * 3),
            "column 'request_id', row 0: request 'zz' is not in requests.parquet",
        ),
        (
            "outcomes.parquet",
            lambda t: set_col(t, "tau", _tau_with(t, 4, 3)),
            "column 'tau', row 4: tau 3 outside 1..2",
        ),
        (
            "outcomes.parquet",
            lambda t: t.set_column(1, "block_size", pa.array(["x"] * 9)),
            "column 'block_size' has type string, expected int64",
        ),
        (
            "requests.parquet",
            lambda t: set_col(t, "features", [[1.0, 2.0, 3.0], [1.0, 2.0], [1.0, 2.0, 3.0]]),
            "requests.parquet: column 'features', row 1: 2 values, row 0 has 3",
        ),
        (
            "requests.parquet",
            lambda t: set_col(t, "features", [[1.0, 2.0, 3.0], [1.0, np.nan, 2.0], [1.0, 2.0, 3.0]]),
            "column 'features', row 1: NaN or infinite value",
        ),
        (
            "requests.parquet",
            lambda t: set_col(t, "request_id", ["r0", "r0", "r2"]),
            "column 'request_id', row 0: duplicate request_id 'r0'",
        ),
        (
            "requests.parquet",
            lambda t: set_col(t, "domain", ["a", None, "b"]),
            "column 'domain', row 1: missing value",
        ),
    ],
)
def test_validation_names_file_column_and_row(tmp_path, file, mutate, expected):
    ts = small_traces(3, (1, 2, 4), dim=3)
    path = ts.write(tmp_path / "s")
    rewrite(path, file, mutate)
    with pytest.raises(AdaptspecError) as e:
        TraceSet.read(path)
    assert expected in str(e.value)
    assert str(path) in str(e.value)


def test_per_round_lists_must_match_rounds_and_be_times(tmp_path):
    ts = small_traces(2, (2, 4))
    path = ts.write(tmp_path / "s")
    rounds = ts.rounds_matrix().ravel().astype(int)
    rewrite(
        path, "outcomes.parquet", lambda t: set_col(t, "rounds", (rounds + np.array([0, 0, 1, 0])).tolist())
    )
    with pytest.raises(AdaptspecError, match=r"column 'tau', row 2: \d+ rounds listed, column 'rounds' says"):
        TraceSet.read(path)
    path2 = ts.write(tmp_path / "s2")
    dm = [list(map(float, x)) for x in ts.outcomes.column("draft_ms").to_pylist()]
    dm[3][0] = -1.0
    rewrite(path2, "outcomes.parquet", lambda t: set_col(t, "draft_ms", dm))
    with pytest.raises(AdaptspecError, match="column 'draft_ms', row 3: -1.0 is not a time"):
        TraceSet.read(path2)


def test_meta_problems(tmp_path):
    path = small_traces().write(tmp_path / "s")
    (path / "meta.json").write_text("{not json")
    with pytest.raises(AdaptspecError, match="meta.json: not valid JSON"):
        TraceSet.read(path)
    (path / "meta.json").write_text(json.dumps({"arms": [1, 2, 4]}))
    with pytest.raises(AdaptspecError, match="meta.json: no schema_version"):
        TraceSet.read(path)
    (path / "meta.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(AdaptspecError, match="schema_version 99 is newer"):
        TraceSet.read(path)
    (path / "meta.json").write_text(json.dumps({"schema_version": 1, "arms": [1, 2]}))
    with pytest.raises(
        AdaptspecError, match=r"meta.json: arms \[1, 2\] but outcomes.parquet has block sizes \[1, 2, 4\]"
    ):
        TraceSet.read(path)
    (path / "requests.parquet").write_bytes(b"garbage")
    (path / "meta.json").write_text(json.dumps({"schema_version": 1}))
    with pytest.raises(AdaptspecError, match="requests.parquet: not a readable Parquet file"):
        TraceSet.read(path)
    with pytest.raises(AdaptspecError, match="no such trace set directory"):
        TraceSet.read(tmp_path / "nope")


def test_writes_are_atomic(tmp_path, monkeypatch):
    ts = small_traces()
    path = ts.write(tmp_path / "s")
    with pytest.raises(AdaptspecError, match="already exists"):
        ts.write(path)
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    calls = []

    def failing(table, p, metadata=None):
        calls.append(p)
        if len(calls) == 2:
            raise OSError("disk full")
        pq.write_table(table, p)

    monkeypatch.setattr(traceset_mod, "_write_parquet", failing)
    with pytest.raises(AdaptspecError, match="cannot write \\(disk full\\); nothing was changed"):
        small_traces(seed=5).write(path, overwrite=True)
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before  # old set intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no temporary left
    monkeypatch.undo()
    small_traces(seed=5).write(path, overwrite=True)
    np.testing.assert_array_equal(TraceSet.read(path).tau_matrix(), small_traces(seed=5).tau_matrix())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_refuses_to_replace_a_directory_that_is_not_a_trace_set(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("precious")
    with pytest.raises(AdaptspecError, match="refusing to replace"):
        small_traces().write(tmp_path / "home", overwrite=True)
    assert (tmp_path / "home" / "notes.txt").read_text() == "precious"


def test_info_and_columns():
    ts = small_traces(4)
    info = ts.info()
    assert info["requests"] == 4 and info["arms"] == [1, 2, 4] and info["features"] == 3
    assert info["domains"] == {"chat": 2, "math": 2} and info["per_round"] and info["timings"]
    with pytest.raises(AdaptspecError, match="no column 'nope'"):
        ts.column("nope")


# ============================================================================ decision logs
def row(i: int, **kw):
    d = {
        "decision_id": f"d{i}",
        "time": 1.7e9 + i,
        "policy": "random",
        "block_size": 4,
        "propensity": 0.5,
        "probs": [0.5, 0.5],
        "arms": [1, 4],
        "reward": 1.0 + i,
        "features": [0.1 * i, 1.0],
    }
    d.update(kw)
    return d


def test_decision_log_parts_round_trip(tmp_path):
    log = DecisionLog(tmp_path / "log")
    p1 = log.append([row(0), row(1, block_size=1, reward=None)])
    p2 = log.append([row(2)])
    assert p1.name.startswith("part-") and p1 != p2
    assert not [p for p in (tmp_path / "log").iterdir() if p.name.startswith(".")]
    r = DecisionLog.read(tmp_path / "log")
    assert len(r) == 3 and r.arms == (1, 4)
    assert r.actions.tolist() == [1, 0, 1]
    np.testing.assert_array_equal(r.rewards, [1.0, np.nan, 3.0])
    np.testing.assert_allclose(r.contexts, [[0, 1], [0.1, 1], [0.2, 1]], rtol=1e-6)
    assert r.probs.shape == (3, 2) and r.propensities.tolist() == [0.5, 0.5, 0.5]
    assert r.table.column("time").type == pa.timestamp("us", tz="UTC")
    info = r.info()
    assert info["decisions"] == 3 and info["with_reward"] == 2 and info["parts"] == 2
    assert isinstance(open_any(tmp_path / "log"), DecisionLog)


@pytest.mark.parametrize(
    "bad,msg",
    [
        ({"propensity": 0.7}, "column 'propensity', row 0: 0.7 but probs gives 0.5"),
        ({"probs": [0.5, 0.6]}, "column 'probs', row 0: probabilities sum to 1.1"),
        ({"block_size": 8}, "column 'block_size', row 0: 8 is not one of the row's arms [1, 4]"),
        ({"reward": float("nan")}, "column 'reward', row 0: nan (use null for a missing value)"),
        ({"probs": [1.0]}, "column 'probs', row 0: 1 probabilities for 2 arms"),
        ({"propensity": 0.0}, "column 'propensity', row 0: 0.0 outside (0, 1]"),
        ({"colour": "red"}, "unknown decision-log column 'colour'"),
        ({"time": "noon"}, "column 'time', row 0: 'noon' is not a time"),
    ],
)
def test_decision_log_rejects_bad_rows_and_writes_nothing(tmp_path, bad, msg):
    log = DecisionLog(tmp_path / "log")
    with pytest.raises(AdaptspecError) as e:
        log.append([row(0, **bad)])
    assert msg in str(e.value)
    assert not (tmp_path / "log").exists() or not list((tmp_path / "log").iterdir())


def test_decision_log_checks_across_parts(tmp_path):
    log = DecisionLog(tmp_path / "log")
    log.append([row(0)])
    with pytest.raises(
        AdaptspecError, match="2 values, earlier parts of this log have 2|3 values, earlier parts"
    ):
        log.append([row(1, features=[1.0, 2.0, 3.0])])
    # a second writer (fresh object) is checked against the stored parts too
    with pytest.raises(AdaptspecError, match="earlier parts of this log have 2"):
        DecisionLog(tmp_path / "log").append([row(1, features=[1.0])])
    for writer in (log, DecisionLog(tmp_path / "log")):  # the same decision id again: refused on write
        with pytest.raises(
            AdaptspecError, match="decision_id 'd0' is already in this log; nothing was written"
        ):
            writer.append([row(0, time=5.0)])
    assert len(DecisionLog(tmp_path / "log").parts()) == 1
    first = DecisionLog(tmp_path / "log").parts()[0]  # ... and on read, for a part written by other means
    shutil.copy(first, first.with_name("part-99999999999999999999-0-000000.parquet"))
    with pytest.raises(AdaptspecError, match="duplicate decision_id 'd0'"):
        DecisionLog.read(tmp_path / "log")


def test_decision_log_arms_must_agree_and_schema_version_is_checked(tmp_path):
    log = DecisionLog(tmp_path / "a")
    log.append([row(0), row(1, arms=[1, 4, 8], probs=[0.25, 0.5, 0.25])])
    with pytest.raises(
        AdaptspecError, match=r"column 'arms', row 1: arms \[1, 4, 8\] differ from row 0's \[1, 4\]"
    ):
        DecisionLog.read(tmp_path / "a").arms
    t = pq.read_table(DecisionLog(tmp_path / "a").parts()[0])
    pq.write_table(t.replace_schema_metadata({"adaptspec.schema_version": "7"}), tmp_path / "one.parquet")
    with pytest.raises(AdaptspecError, match="schema_version 7 is newer"):
        DecisionLog.read(tmp_path / "one.parquet")
    with pytest.raises(AdaptspecError, match="no such decision log"):
        DecisionLog.read(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdaptspecError, match="no part-"):
        DecisionLog.read(tmp_path / "empty")


def test_decision_row_from_records(tmp_path):
    d = Decision(
        block_size=4,
        propensity=0.75,
        probs=np.array([0.25, 0.75]),
        arms=(1, 4),
        policy="linucb",
        version=3,
        decision_id="abc",
    )
    out = Outcome(tokens=[1] * 9, rounds=[Round(4, 3, 0.01, 0.04), Round(4, 4, 0.01, 0.04)], decode_s=0.1)
    r = decision_row(
        d, features=[1.0, 2.0], outcome=out, reward=90.0, request_id="q1", variant="B", time=1.7e9
    )
    DecisionLog(tmp_path / "log").append([r, decision_row(d.with_id("xyz"), features=[0.0, 1.0])])
    log = DecisionLog.read(tmp_path / "log")
    t = log.table.to_pylist()
    assert t[0]["new_tokens"] == 9 and t[0]["rounds"] == 2 and t[0]["mean_tau"] == 3.5
    assert t[0]["decode_ms"] == pytest.approx(100.0) and t[0]["version"] == 3 and t[0]["variant"] == "B"
    assert t[1]["reward"] is None and t[1]["new_tokens"] is None


# ============================================================================ BlockPilot importer
def write_bp(
    folder: Path,
    sizes=(14, 15, 16, 17, 18),
    n: int = 4,
    choice: bool = True,
    mapped: bool = True,
    seed: int = 0,
) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    data = {b: {str(i): float(rng.uniform(1, min(b, 9))) for i in range(n)} for b in sizes}
    for b, d in data.items():
        (folder / f"{b}.json").write_text(json.dumps(d))
    ch = {str(i): int(max(sizes, key=lambda b: data[b][str(i)])) for i in range(n)}
    if choice:
        (folder / "1.json").write_text(json.dumps(ch, indent=4))
    if mapped:
        (folder / "mapped_from_1.json").write_text(json.dumps({k: data[b][k] for k, b in ch.items()}))
    return {"data": data, "choice": ch}


def test_import_blockpilot_detects_the_choice_file(tmp_path):
    src = write_bp(tmp_path / "gsm8k_0T0.0")
    ts = import_blockpilot(tmp_path / "gsm8k_0T0.0")
    assert ts.arms == (14, 15, 16, 17, 18) and ts.features is None and not ts.has_timings
    assert ts.request_ids.tolist() == [f"gsm8k_0T0.0/{i}" for i in range(4)]
    assert set(ts.domains) == {"gsm8k"} and ts.meta["temperature"] == 0.0
    np.testing.assert_allclose(ts.tau_matrix()[:, 2], [src["data"][16][str(i)] for i in range(4)])
    assert ts.column("blockpilot_choice").tolist() == [src["choice"][str(i)] for i in range(4)]
    assert ts.meta["source"]["kind"] == "blockpilot"
    path = ts.write(tmp_path / "out")
    assert TraceSet.read(path).column("blockpilot_choice").tolist() == ts.column("blockpilot_choice").tolist()


def test_import_blockpilot_true_block_size_one_and_parent_folders(tmp_path):
    write_bp(tmp_path / "p" / "gsm8k_0T0.0", sizes=(4, 8), choice=False, mapped=False)
    f = tmp_path / "p" / "math_0T0.0"
    write_bp(f, sizes=(4, 8), choice=False, mapped=False, seed=1)
    (f / "1.json").write_text(json.dumps({str(i): 1.0 for i in range(4)}))
    (tmp_path / "p" / "gsm8k_0T0.0" / "1.json").write_text(json.dumps({str(i): 1.0 for i in range(4)}))
    ts = import_blockpilot(tmp_path / "p")
    assert ts.arms == (1, 4, 8) and len(ts) == 8
    assert sorted(set(ts.domains)) == ["gsm8k", "math"]
    assert np.all(ts.tau_matrix()[:, 0] == 1.0)
    assert np.all(np.isnan(ts.column("blockpilot_choice")))


@pytest.mark.parametrize(
    "break_it,msg",
    [
        (
            lambda f: (f / "mapped_from_1.json").write_text(json.dumps({str(i): 1.5 for i in range(4)})),
            "mapped_from_1.json: prompt 0: tau 1.5 but",
        ),
        (
            lambda f: (f / "1.json").write_text(json.dumps({str(i): 40 for i in range(4)})),
            "1.json: mapped_from_1.json is present, so 1.json should hold the selector's block size",
        ),
        (
            lambda f: (f / "16.json").write_text(json.dumps({str(i): 2.0 for i in range(3)})),
            "16.json: prompt 3 missing",
        ),
        (
            lambda f: (f / "14.json").write_text(json.dumps({str(i): 15.0 for i in range(4)})),
            "14.json: prompt 0: tau 15.0 outside 1..14",
        ),
        (lambda f: (f / "15.json").write_text("[1, 2"), "15.json: not valid JSON"),
        (
            lambda f: (f / "15.json").write_text(json.dumps({"a": 1.0})),
            "15.json: key 'a' is not a prompt index",
        ),
        (
            lambda f: (f / "15.json").write_text(json.dumps({str(i): "x" for i in range(4)})),
            "15.json: prompt 0: 'x' is not",
        ),
    ],
)
def test_import_blockpilot_errors(tmp_path, break_it, msg):
    f = tmp_path / "gsm8k_0T0.0"
    write_bp(f)
    break_it(f)
    with pytest.raises(AdaptspecError) as e:
        import_blockpilot(f)
    assert msg in str(e.value)


def test_import_blockpilot_folders_must_share_block_sizes(tmp_path):
    write_bp(tmp_path / "a_0T0.0", sizes=(4, 8), choice=False, mapped=False)
    write_bp(tmp_path / "b_0T0.0", sizes=(4, 16), choice=False, mapped=False)
    with pytest.raises(
        AdaptspecError, match=r"b_0T0.0: block sizes \[4, 16\] differ from a_0T0.0's \[4, 8\]"
    ):
        import_blockpilot(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdaptspecError, match="no BlockPilot result folder"):
        import_blockpilot(tmp_path / "empty")


def test_read_only_source_is_never_written(tmp_path):
    f = tmp_path / "gsm8k_0T0.0"
    write_bp(f)
    before = {p.name: p.read_bytes() for p in f.iterdir()}
    os.chmod(f, 0o555)
    try:
        import_blockpilot(f).write(tmp_path / "out")
    finally:
        os.chmod(f, 0o755)
    assert {p.name: p.read_bytes() for p in f.iterdir()} == before
