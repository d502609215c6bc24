"""The load at decision time: the record, the policy's load features, the decision log's load and
attribution columns (old logs without them still read), and batched serving filling them in.

Expected values come from hand computation (log2 of small powers of two), the char codec's
one-id-per-character rule, and the engine's own round history.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _threads import torch_threads
from adaptspec.cli import main
from adaptspec.control.context import LOAD_FEATURES, Contexts, load_vector
from adaptspec.control.controller import AdaptiveController
from adaptspec.errors import AdaptspecError
from adaptspec.policies.featurizer import Featurizer
from adaptspec.speculator import Decision, LoadState, Outcome, Prefill, Round, SharedRounds
from adaptspec.traces import DecisionLog, decision_row
from adaptspec.traces.log_writer import log_rows

LOAD = LoadState(rows=3, queue=1, context_tokens=16, temperature=0.7, max_tokens=64)
LOAD_BY_HAND = [2.0, 1.0, 4.0, 1.0, 6.0]  # log2(1+3), log2(1+1), log2(16), 0.7 > 0, log2(64)


# ============================================================================ the record
@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"rows": 0}, "rows must be an integer >= 1, got 0"),
        ({"queue": -1}, "queue must be an integer >= 0, got -1"),
        ({"context_tokens": 0}, "context_tokens must be an integer >= 1, got 0"),
        ({"max_tokens": 2.5}, "max_tokens must be an integer >= 1, got 2.5"),
        ({"rows": True}, "rows must be an integer >= 1, got True"),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0, got nan"),
        ({"temperature": -0.1}, "temperature must be a finite number >= 0, got -0.1"),
    ],
)
def test_a_load_state_refuses_bad_values_in_one_line(kw, msg):
    args = dict(rows=1, queue=0, context_tokens=5, temperature=0.0, max_tokens=8) | kw
    with pytest.raises(AdaptspecError) as e:
        LoadState(**args)
    assert str(e.value) == msg


def test_a_load_state_keeps_plain_python_values_and_shared_rounds_give_the_mean_rows():
    s = LoadState(
        rows=np.int64(2), queue=np.int32(0), context_tokens=7, temperature=np.float32(0.5), max_tokens=9
    )
    assert (type(s.rows), type(s.queue), type(s.temperature)) == (int, int, float)
    assert SharedRounds(
        attributed_s=0.01, wall_decode_s=0.02, rounds=3, row_rounds=7
    ).mean_rows == pytest.approx(7 / 3)
    assert SharedRounds(attributed_s=0.0, wall_decode_s=0.0, rounds=0, row_rounds=0).mean_rows is None
    with pytest.raises(AdaptspecError, match="row_rounds must be an integer >= 3, got 2"):
        SharedRounds(
            attributed_s=0.01, wall_decode_s=0.02, rounds=3, row_rounds=2
        )  # a round holds at least its row


# ============================================================================ the policy's context
def test_the_load_features_are_the_log2_counts_and_whether_it_samples():
    assert LOAD_FEATURES == (
        "log2_1p_rows",
        "log2_1p_queue",
        "log2_context_tokens",
        "sampled",
        "log2_max_tokens",
    )
    assert load_vector(LOAD).tolist() == LOAD_BY_HAND
    greedy = LoadState(rows=1, queue=0, context_tokens=1, temperature=0.0, max_tokens=1)
    assert load_vector(greedy).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_the_context_is_the_prefill_features_then_the_load_features():
    raw = Contexts(None, contextual=True, policy_label="linucb", raw_width=3, load_features=True)
    assert raw([1.5, -2.0, 0.25], LOAD).tolist() == [1.5, -2.0, 0.25, *LOAD_BY_HAND]
    assert raw.width == 3 + 5
    # with a featurizer, the featurizer's output comes first: (x - mean) / scale
    f = Featurizer("standardize", np.array([1.0, 1.0, 1.0]), np.array([1.0, 3.0, 5.0]))
    mapped = Contexts(f, contextual=True, policy_label="linucb", load_features=True)
    assert mapped([2.0, 4.0, 6.0], LOAD).tolist() == [1.0, 1.0, 1.0, *LOAD_BY_HAND]
    assert mapped.width == 8
    # off (the default): the load is ignored and the width is the features'
    off = Contexts(f, contextual=True, policy_label="linucb")
    assert off([2.0, 4.0, 6.0], LOAD).tolist() == [1.0, 1.0, 1.0] and off.width == 3
    with pytest.raises(
        AdaptspecError,
        match=r"made with load_features: each decision needs load=LoadState\(...\), got NoneType",
    ):
        mapped([2.0, 4.0, 6.0])


class Toy:
    """A speculator with fixed 3 prefill features and a fixed outcome."""

    max_block_size = 8

    def prefill(self, prompt_ids, temperature=0.0, seed=None):
        return Prefill(
            first_token=1, prompt_tokens=len(prompt_ids), features=np.array([1.0, 2.0, 4.0], np.float32)
        )

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        return Outcome(
            [1] * 2, [Round(int(block_size), 1, 0.001, 0.004)], decode_s=0.005
        )  # first token + tau


def test_a_controller_with_load_features_decides_and_logs_on_the_longer_context(tmp_path):
    log = tmp_path / "log"
    with AdaptiveController(Toy(), "linucb", arms=[1, 4], log_dir=log, load_features=True, reward="tau") as c:
        d = c.decide([1.0, 2.0, 4.0], load=LOAD)
        assert (
            c.feedback(
                d.decision_id,
                Outcome([1] * 2, [Round(d.block_size, 1, 0.001, 0.004)], decode_s=0.005),
                shared=SharedRounds(attributed_s=0.005, wall_decode_s=0.009, rounds=1, row_rounds=3),
            )
            == "applied"
        )
        g = c.generate([5, 6, 7, 8, 9, 10], max_new_tokens=12, temperature=0.0)  # alone: one row, no queue
        with pytest.raises(AdaptspecError, match="each decision needs load=LoadState"):
            c.decide([1.0, 2.0, 4.0])
        with pytest.raises(AdaptspecError, match="load must be an adaptspec LoadState, got dict"):
            c.decide([1.0, 2.0, 4.0], load={"rows": 1})
    rows = {r["decision_id"]: r for r in log_rows(log)}
    split, alone = rows[d.decision_id], rows[g.decision.decision_id]
    assert split["features"] == pytest.approx([1.0, 2.0, 4.0, *LOAD_BY_HAND])
    assert (
        split["rows_in_flight"],
        split["queue_length"],
        split["context_tokens"],
        split["temperature"],
        split["max_tokens"],
    ) == (3, 1, 16, 0.7, 64)
    assert (
        split["attributed_ms"],
        split["wall_decode_ms"],
        split["row_rounds"],
        split["mean_rows"],
    ) == pytest.approx((5.0, 9.0, 3, 3.0))
    assert alone["features"] == pytest.approx([1.0, 2.0, 4.0, 1.0, 0.0, np.log2(6), 0.0, np.log2(12)])
    assert (alone["rows_in_flight"], alone["queue_length"], alone["context_tokens"], alone["max_tokens"]) == (
        1,
        0,
        6,
        12,
    )
    assert alone["attributed_ms"] is None  # not batched: no attribution


def test_without_load_features_the_load_is_logged_but_not_in_the_context(tmp_path):
    with AdaptiveController(Toy(), "linucb", arms=[1, 4], log_dir=tmp_path / "log", reward="tau") as c:
        d = c.decide([1.0, 2.0, 4.0], load=LOAD)
        c.feedback(d.decision_id, Outcome([1] * 2, [Round(d.block_size, 1, 0.001, 0.004)], decode_s=0.005))
        g = c.generate([5, 6, 7], max_new_tokens=4)
    rows = {r["decision_id"]: r for r in log_rows(tmp_path / "log")}
    assert rows[d.decision_id]["features"] == pytest.approx([1.0, 2.0, 4.0])
    assert rows[d.decision_id]["queue_length"] == 1 and rows[d.decision_id].get("wall_decode_ms") is None
    assert rows[g.decision.decision_id].get("rows_in_flight") is None  # unbatched callers give no load


def test_load_features_are_chosen_with_the_policy_a_head_sized_for_the_features_alone_is_refused(tmp_path):
    from adaptspec.policies import LinUCB

    f = Featurizer("standardize", np.zeros(3), np.ones(3))
    with pytest.raises(
        AdaptspecError, match=r"the featurizer gives 3 values \+ 5 load features, policy .* expects 3"
    ):
        AdaptiveController(Toy(), LinUCB((1, 4), dim=3), featurizer=f, load_features=True)
    AdaptiveController(Toy(), LinUCB((1, 4), dim=8), featurizer=f, load_features=True).close()
    with pytest.raises(AdaptspecError, match="load_features must be True or False, got 1"):
        AdaptiveController(Toy(), "linucb", arms=[1, 4], load_features=1)


def test_a_checkpoint_keeps_the_load_features_choice_and_a_controller_without_it_is_refused(tmp_path):
    kw = dict(arms=[1, 4], log_dir=tmp_path / "log", checkpoint_dir=tmp_path / "ck", reward="tau")
    with AdaptiveController(Toy(), "linucb", load_features=True, **kw) as c:
        d = c.decide([1.0, 2.0, 4.0], load=LOAD)
        c.feedback(d.decision_id, Outcome([1] * 2, [Round(d.block_size, 1, 0.001, 0.004)], decode_s=0.005))
        c.checkpoint()
    with pytest.raises(
        AdaptspecError,
        match="checkpoint was written with load_features=True, this controller has load_features=False",
    ):
        AdaptiveController(
            Toy(), "linucb", log_dir=tmp_path / "other", **{k: v for k, v in kw.items() if k != "log_dir"}
        )
    with AdaptiveController(Toy(), "linucb", load_features=True, **kw) as c:
        assert c.resumed is not None and c.stats()["updates"] == 1


# ============================================================================ the decision log
OLD_COLUMNS = [
    "decision_id",
    "time",
    "request_id",
    "policy",
    "version",
    "variant",
    "features",
    "block_size",
    "propensity",
    "probs",
    "arms",
    "reward",
    "new_tokens",
    "decode_ms",
    "mean_tau",
    "rounds",
]


def _old_part(path, n=40, seed=0):
    """A part as a logger before the load columns wrote it (only the columns it knew)."""
    rng = np.random.default_rng(seed)
    arms = [1, 4]
    rows = {k: [] for k in OLD_COLUMNS}
    for i in range(n):
        b = int(rng.choice(arms))
        rows["decision_id"].append(f"old{i}")
        rows["time"].append(datetime.fromtimestamp(1.7e9 + i, tz=timezone.utc))
        rows["request_id"].append(f"r{i}")
        rows["policy"].append("fixed:4" if i % 2 else "ucb")
        rows["version"].append(0)
        rows["variant"].append("B" if i % 2 else "A")
        rows["features"].append(rng.normal(size=4).astype(np.float32).tolist())
        rows["block_size"].append(b)
        rows["propensity"].append(0.5)
        rows["probs"].append([0.5, 0.5])
        rows["arms"].append(arms)
        rows["reward"].append(float(rng.normal(-20 + b, 1)))
        rows["new_tokens"].append(16)
        rows["decode_ms"].append(float(rng.uniform(50, 80)))
        rows["mean_tau"].append(1.0)
        rows["rounds"].append(16)
    schema = pa.schema(
        [
            ("decision_id", pa.string()),
            ("time", pa.timestamp("us", tz="UTC")),
            ("request_id", pa.string()),
            ("policy", pa.string()),
            ("version", pa.int64()),
            ("variant", pa.string()),
            ("features", pa.list_(pa.float32())),
            ("block_size", pa.int64()),
            ("propensity", pa.float64()),
            ("probs", pa.list_(pa.float64())),
            ("arms", pa.list_(pa.int64())),
            ("reward", pa.float64()),
            ("new_tokens", pa.int64()),
            ("decode_ms", pa.float64()),
            ("mean_tau", pa.float64()),
            ("rounds", pa.int64()),
        ],
        metadata={b"adaptspec.schema_version": b"1"},
    )
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows, schema=schema), path / "part-00000000000000000001-1-000000.parquet")


def _new_rows(n=40, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        b = int(rng.choice([1, 4]))
        d = Decision(
            b, 0.5, np.array([0.5, 0.5]), (1, 4), "fixed:4" if i % 2 else "ucb", decision_id=f"new{i}"
        )
        rounds = [Round(b, 1, 0.001, 0.004)] * 4
        load = LoadState(rows=1 + i % 4, queue=i % 3, context_tokens=10 + i, temperature=0.0, max_tokens=4)
        shared = SharedRounds(attributed_s=0.01, wall_decode_s=0.03, rounds=4, row_rounds=4 + i % 5)
        out.append(
            decision_row(
                d,
                features=rng.normal(size=4),
                outcome=Outcome([1] * 4, rounds, decode_s=0.01),
                reward=float(rng.normal(-20 + b, 1)),
                request_id=f"q{i}",
                variant="B" if i % 2 else "A",
                load=load,
                shared=shared,
            )
        )
    return out


def test_an_old_log_without_the_load_columns_still_reads_and_takes_new_rows(tmp_path):
    log = tmp_path / "log"
    _old_part(log)
    old = DecisionLog.read(log)
    assert len(old) == 40 and "rows_in_flight" not in old.table.column_names
    DecisionLog(log).append(_new_rows())
    both = DecisionLog.read(log)
    assert len(both) == 80 and both.contexts.shape == (80, 4)
    rows = {r["decision_id"]: r for r in log_rows(log)}
    assert rows["old3"]["rows_in_flight"] is None and rows["old3"]["attributed_ms"] is None
    assert (rows["new5"]["rows_in_flight"], rows["new5"]["queue_length"], rows["new5"]["context_tokens"]) == (
        2,
        2,
        15,
    )
    assert (rows["new5"]["row_rounds"], rows["new5"]["mean_rows"], rows["new6"]["mean_rows"]) == (
        4,
        1.0,
        1.25,
    )  # 4 + i % 5 over 4 rounds
    assert rows["new5"]["attributed_ms"] == pytest.approx(10.0) and rows["new5"][
        "wall_decode_ms"
    ] == pytest.approx(30.0)


@pytest.mark.parametrize(
    "column,value,msg",
    [
        ("queue_length", -1, "column 'queue_length', row 0: -1 is negative"),
        ("attributed_ms", float("nan"), "column 'attributed_ms', row 0: nan"),
    ],
)
def test_bad_load_columns_are_refused_where_they_enter(tmp_path, column, value, msg):
    row = _new_rows(1)[0] | {column: value}
    with pytest.raises(AdaptspecError, match=msg):
        DecisionLog(tmp_path / "log").append([row])


@pytest.mark.parametrize("with_new", [False, True])
def test_ope_and_ab_report_read_logs_with_and_without_the_load_columns(tmp_path, capsys, with_new):
    from adaptspec.analysis.ope import evaluate_log

    log = tmp_path / "log"
    _old_part(log)
    if with_new:
        DecisionLog(log).append(_new_rows())
    est = evaluate_log(DecisionLog.read(log), "fixed:4", n_boot=20)
    # fixed:4 on a log that chose 1 or 4 at 1/2 each: its value is the mean reward of the rows that chose 4
    d = DecisionLog.read(log)
    truth = d.rewards[d.block_sizes == 4].mean()
    assert est["ips"].value == pytest.approx(2 * d.rewards[d.block_sizes == 4].sum() / len(d))
    assert est["snips"].value == pytest.approx(truth)
    capsys.readouterr()
    assert main(["ab-report", str(log), "--json", "--bootstrap", "20"]) == 0
    report = json.loads(capsys.readouterr().out)
    n = 80 if with_new else 40
    assert report["decisions"] == n and {k: v["decisions"] for k, v in report["variants"].items()} == {
        "A": n // 2,
        "B": n // 2,
    }
    variant = np.array(d.table.column("variant").to_pylist())
    assert report["variants"]["A"]["reward"]["mean"] == pytest.approx(
        d.rewards[variant == "A"].mean(), abs=1e-5
    )


# ============================================================================ batched serving fills them in
@pytest.fixture
def one_thread():
    with torch_threads(1):  # the machine's cores are shared
        yield


PROMPTS = ["Hello there", "def f(x):", "Once upon a time", "The quick brown fox", "Q: why?", "Dear Sir,"]


def test_batched_decisions_log_their_load_and_attribution_and_decide_on_the_load(tmp_path, one_thread):
    from fastapi.testclient import TestClient

    from adaptspec.serving import CompletionService, ServerLimits
    from adaptspec.serving.app import create_app
    from adaptspec.serving.codec import CharCodec
    from adaptspec.serving.engine.batched import EngineSettings
    from adaptspec.serving.tiny import tiny_speculator

    codec = CharCodec()
    spec, _ = tiny_speculator(0, verification="exact")
    svc = CompletionService.build(
        spec,
        {"A": "linucb", "B": "fixed:4"},
        codec=codec,
        log_dir=tmp_path / "log",
        limits=ServerLimits(max_context=512, vocab_size=128, max_tokens=400),
        arms=[1, 2, 4, 8],
        load_features=True,
        engine=EngineSettings(max_rows=3, max_queue=8),
    )
    max_rows = 3
    bodies = [
        {
            "prompt": p,
            "max_tokens": 8 + 2 * i,
            "user": f"u{i}",
            "temperature": 0.0 if i % 2 else 0.8,
            "seed": i,
        }
        for i, p in enumerate(PROMPTS)
    ]
    with TestClient(create_app(svc)) as client:
        loop = svc.runner.loop
        hold = (
            threading.Event()
        )  # hold the engine's thread until every request is queued, so they share rounds
        blocker = loop.submit(codec.encode("wait"), max_new_tokens=2, on_tokens=lambda ids: hold.wait(60))
        with ThreadPoolExecutor(len(bodies)) as pool:
            futures = [pool.submit(client.post, "/v1/completions", json=b) for b in bodies]
            deadline = time.time() + 60
            while loop.queue_length < len(bodies) and time.time() < deadline:
                time.sleep(0.005)
            hold.set()
            answers = [f.result() for f in futures]
        blocker.wait(60)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    rows = {r["decision_id"]: r for r in log_rows(tmp_path / "log")}
    got = [rows[a.json()["adaptspec"]["decision_id"]] for a in answers]
    history = list(loop.engine.history)
    for body, row in zip(bodies, got):
        assert row["context_tokens"] == len(body["prompt"])  # the char codec: one id per character
        assert (row["temperature"], row["max_tokens"]) == (body["temperature"], body["max_tokens"])
        assert 1 <= row["rows_in_flight"] <= max_rows and row["rows_in_flight"] + row["queue_length"] <= len(
            bodies
        )
        assert row["attributed_ms"] == pytest.approx(
            row["decode_ms"]
        )  # the reward's time is the attributed one
        if row["rounds"]:
            assert 1 <= row["mean_rows"] <= max_rows and row["row_rounds"] == pytest.approx(
                row["mean_rows"] * row["rounds"]
            )
            assert (
                row["attributed_ms"] <= row["wall_decode_ms"] + 1e-6
            )  # a share of rounds inside its own decode
        # the policy's context is the prefill features then the load features of the logged load
        load = LoadState(
            rows=row["rows_in_flight"],
            queue=row["queue_length"],
            context_tokens=row["context_tokens"],
            temperature=row["temperature"],
            max_tokens=row["max_tokens"],
        )
        assert row["features"][-5:] == pytest.approx(load_vector(load).tolist(), abs=1e-6)
        assert len(row["features"]) == spec.target.feature_dim + 5
    # every request was queued before the first joined, and they joined one by one from a FIFO queue:
    # the queue each saw at its decision is 5, 4, ..., 0; the first to join decoded alone
    by_queue = sorted(got, key=lambda r: -r["queue_length"])
    assert [r["queue_length"] for r in by_queue] == list(range(len(bodies) - 1, -1, -1))
    assert by_queue[0]["rows_in_flight"] == 1
    # the rows of each request's rounds, summed over the requests, count each round's rows once per row
    assert sum(r["row_rounds"] for r in got) + blocker.row_rounds == sum(rec.rows**2 for rec in history)
    assert max(r["mean_rows"] for r in got if r["rounds"]) > 1  # they really shared rounds
    # attribution conserves time: the requests' attributed times add up to the rounds' decode time
    total = sum(rec.round_s - rec.join_s for rec in history)
    assert sum(r["attributed_ms"] for r in got) + 1000 * blocker.attributed_s == pytest.approx(
        1000 * total, rel=1e-6
    )
