"""Bad input on the command line never costs data and never shows a traceback (issue 18).

Every case runs ``python -m adaptspec ...`` as a user would, in a directory of its own that
holds a trace set, decision logs, a head, a user's notes and a regular file, and expects:
exit status 2, exactly one line on stderr (``adaptspec CMD: error: ...``, naming the
problem), no traceback, and the directory exactly as it was (nothing created, nothing
deleted, nothing changed). Case ids ``dN-...`` are the numbered defects of the issue; the
others are the same classes with other values. Commands that would load a model (collect,
demo, serve) must fail before loading it, which keeps every case about a second.

The cases run concurrently (two at a time) in a module fixture; each test checks one result.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adaptspec.traces import DecisionLog, TraceSet

ROOT = Path(__file__).resolve().parents[1]

# (id, argv, the text stderr must contain)
CASES: list[tuple[str, list[str], str]] = [
    # 1: writers replace only their own kind of artefact
    (
        "d1-train-head-overwrite-foreign-dir",
        ["train-head", "ts", "--out", "notes", "--overwrite"],
        "notes exists and is not an adaptspec offline head: refusing to replace it",
    ),
    (
        "d1-train-head-overwrite-regular-file",
        ["train-head", "ts", "--out", "afile", "--overwrite"],
        "afile exists and is not an adaptspec offline head",
    ),
    (
        "d1-train-head-overwrite-trace-set",
        ["train-head", "ts", "--out", "ts", "--overwrite"],
        "ts: the output overlaps this command's own input ts",
    ),
    (
        "d1-train-head-existing-head-needs-overwrite",
        ["train-head", "ts", "--out", "head"],
        "head already exists (pass --overwrite to replace the offline head)",
    ),
    (
        "d1-train-head-out-under-a-file",
        ["train-head", "ts", "--out", "afile/head"],
        "afile is not a directory",
    ),
    (
        "d1-synth-force-foreign-dir",
        ["synth", "--out", "notes", "--force"],
        "notes exists and is not an adaptspec trace set",
    ),
    (
        "d1-synth-force-decision-log",
        ["synth", "--out", "log", "--force"],
        "log exists and is not an adaptspec trace set",
    ),
    (
        "d1-import-blockpilot-force-regular-file",
        ["import-blockpilot", "notes", "--out", "afile", "--force"],
        "afile exists and is not an adaptspec trace set",
    ),
    # 2: simulate --log writes a new log (or, with --force, replaces a log): never duplicate ids
    (
        "d2-simulate-log-twice",
        ["simulate", "ts", "--policy", "random", "--log", "log", "--no-progress"],
        "log already exists (pass --force to replace the decision log)",
    ),
    (
        "d2-simulate-log-force-foreign-dir",
        ["simulate", "ts", "--policy", "random", "--log", "notes", "--force"],
        "notes exists and is not an adaptspec decision log",
    ),
    # 3: ab-report validates the log as every reader does
    ("d3-ab-report-duplicate-ids", ["ab-report", "dup"], "duplicate decision_id 'd0'"),
    ("d3-ab-report-nan-reward", ["ab-report", "nan"], "column 'reward', row 3: nan"),
    (
        "d3-ab-report-negative-block-size",
        ["ab-report", "neg"],
        "column 'block_size', row 4: -4 is not one of the row's arms",
    ),
    ("d3-ab-report-no-propensity", ["ab-report", "noprop"], "missing column 'propensity'"),
    # 6 (command line half; the server half is in test_bad_input_server.py)
    (
        "d6-serve-checkpoint-dir-regular-file",
        ["serve", "--tiny", "--checkpoint-dir", "afile"],
        "argument --checkpoint-dir: afile exists and is not a directory",
    ),
    (
        "d6-serve-log-dir-regular-file",
        ["serve", "--tiny", "--log-dir", "afile"],
        "argument --log-dir: afile exists and is not a directory",
    ),
    # 7: arms beyond the speculator's max_block_size: one line, before the model is built
    (
        "d7-serve-tiny-arms-beyond-max-block-size",
        ["serve", "--tiny", "--arms", "1,2,4,8,32"],
        "--arms 1,2,4,8,32: the --tiny model's max_block_size is 16, so block sizes [32] cannot be drafted",
    ),
    # 8: tracebacks on user errors
    (
        "d8-serve-port-overflow",
        ["serve", "--port", "99999"],
        "argument --port: expected an integer in 0..65535, got '99999'",
    ),
    (
        "d8-serve-threads-zero",
        ["serve", "--threads", "0"],
        "argument --threads: expected an integer in 1..4096",
    ),
    ("d8-collect-threads-negative", ["collect", "--out", "new", "--threads", "-2"], "argument --threads"),
    ("d8-demo-threads-zero", ["demo", "--threads", "0"], "argument --threads"),
    (
        "d8-collect-prompts-directory",
        ["collect", "--out", "new", "--prompts", "notes"],
        "notes: not a regular file",
    ),
    ("d8-ope-zero-row-part", ["ope", "empty", "--policy", "fixed:4"], "part has no rows"),
    ("d8-traces-validate-zero-row-part", ["traces", "validate", "empty"], "part has no rows"),
    ("d8-traces-info-zero-row-file", ["traces", "info", "empty.parquet"], "empty.parquet: part has no rows"),
    # 9: counts out of range
    (
        "d9-collect-limit-zero",
        ["collect", "--out", "new", "--limit", "0"],
        "argument --limit: expected an integer >= 1, got '0'",
    ),
    ("d9-collect-limit-negative", ["collect", "--out", "new", "--limit", "-1"], "argument --limit"),
    (
        "d9-demo-prompts-beyond-the-benchmark-set",
        ["demo", "--prompts", "999"],
        "argument --prompts: expected an integer in 1..722",
    ),
    # 10: collect fails before loading the model, leaving no OUT.partial.jsonl
    (
        "d10-collect-force-foreign-dir",
        ["collect", "--out", "notes", "--force", "--limit", "1"],
        "notes exists and is not an adaptspec trace set",
    ),
    (
        "d10-collect-existing-trace-set-needs-force",
        ["collect", "--out", "ts", "--limit", "1"],
        "ts already exists (pass --force to replace the trace set)",
    ),
    (
        "d10-collect-temperature-negative",
        ["collect", "--out", "new", "--temperature", "-1"],
        "argument --temperature: expected a number >= 0, got '-1'",
    ),
    # 11: minor ones
    (
        "d11-ope-string-reward",
        ["ope", "strrew", "--policy", "fixed:4"],
        "column 'reward' has type string, expected double",
    ),
    (
        "d11-ope-switch-tau-negative",
        ["ope", "log", "--policy", "fixed:4", "--switch-tau", "-1"],
        "argument --switch-tau",
    ),
    (
        "d11-ab-report-min-n-negative",
        ["ab-report", "log", "--min-n", "-1"],
        "argument --min-n: expected an integer >= 2",
    ),
    (
        "d11-ab-report-checkpoint-dir-foreign",
        ["ab-report", "log", "--checkpoint-dir", "notes"],
        "notes: no checkpoints",
    ),
    (
        "d11-simulate-plot-missing-dir",
        ["simulate", "ts", "--plot", "nodir/deeper/x.png"],
        "directory nodir/deeper does not exist",
    ),
    (
        "d11-synth-arms-overflow",
        ["synth", "--out", "new", "--arms", "4,100000"],
        "block sizes must be in 1..64",
    ),
    # the same classes with other values
    ("serve-port-negative", ["serve", "--port", "-1"], "argument --port"),
    (
        "serve-port-not-a-number",
        ["serve", "--port", "http"],
        "argument --port: expected an integer in 0..65535, got 'http'",
    ),
    (
        "serve-decide-timeout-nan",
        ["serve", "--decide-timeout", "nan"],
        "argument --decide-timeout: expected a number > 0",
    ),
    (
        "serve-fallback-block-size-zero",
        ["serve", "--fallback-block-size", "0"],
        "argument --fallback-block-size",
    ),
    (
        "serve-split-weights-mismatch",
        ["serve", "--tiny", "--split", "1,2"],
        "--split has 2 weights for 1 variants",
    ),
    ("synth-requests-zero", ["synth", "--out", "new", "--requests", "0"], "argument --requests"),
    (
        "synth-seed-negative",
        ["synth", "--out", "new", "--seed", "-3"],
        "argument --seed: expected an integer in 0..",
    ),
    ("synth-existing-trace-set-needs-force", ["synth", "--out", "ts"], "ts already exists (pass --force"),
    ("simulate-seeds-zero", ["simulate", "ts", "--seeds", "0"], "argument --seeds"),
    (
        "simulate-plot-over-a-text-file",
        ["simulate", "ts", "--plot", "notes/plot.png"],
        "plot.png exists and is not an adaptspec plot (PNG file)",
    ),
    ("train-head-epochs-zero", ["train-head", "ts", "--out", "new", "--epochs", "0"], "argument --epochs"),
    (
        "train-head-hidden-negative",
        ["train-head", "ts", "--out", "new", "--hidden", "64,-1"],
        "argument --hidden",
    ),
    (
        "collect-arms-zero",
        ["collect", "--out", "new", "--arms", "0,4"],
        "argument --arms: block sizes must be in 1..64",
    ),
    (
        "collect-part-out-of-range",
        ["collect", "--out", "new", "--part", "2/2"],
        "argument --part: I/N needs 0 <= I < N",
    ),
    (
        "collect-prompts-missing",
        ["collect", "--out", "new", "--prompts", "nope.jsonl"],
        "nope.jsonl: no such file",
    ),
    (
        "ope-bootstrap-too-few",
        ["ope", "log", "--policy", "fixed:4", "--bootstrap", "3"],
        "argument --bootstrap",
    ),
    ("ope-trace-set-is-not-a-log", ["ope", "ts", "--policy", "fixed:4"], "this is a trace set"),
    ("ab-report-trace-set-is-not-a-log", ["ab-report", "ts"], "this is a trace set"),
    # issue 38: latency profiles (item 2: all-zero curves divided by zero later; item 6: decode errors)
    (
        "i38-simulate-latency-all-zero",
        ["simulate", "ts", "--reward", "modelled", "--latency", "zero.json", "--no-progress"],
        "zero.json: verify times must be > 0 s",
    ),
    (
        "i38-simulate-latency-not-utf8",
        ["simulate", "ts", "--reward", "modelled", "--latency", "xff.json", "--no-progress"],
        "xff.json: not valid JSON (a JSON latency profile expected; not UTF-8 text: byte 0xff",
    ),
    (
        "i38-simulate-latency-deeply-nested",
        ["simulate", "ts", "--reward", "modelled", "--latency", "deep.json", "--no-progress"],
        "deep.json: not readable JSON (a JSON latency profile expected; nested too deeply)",
    ),
    (
        "i38-simulate-latency-a-directory",
        ["simulate", "ts", "--reward", "modelled", "--latency", "notes", "--no-progress"],
        "notes: not a regular file (a JSON latency profile expected, found a directory)",
    ),
    # issue 38, item 15: counts cross-checked where a trace set is read
    (
        "i38-traces-validate-new-tokens-2-62",
        ["traces", "validate", "bigtok"],
        "column 'new_tokens', row 0: 4.61169e+18",
    ),
    ("i38-simulate-new-tokens-2-62", ["simulate", "bigtok", "--no-progress"], "column 'new_tokens', row 0"),
    (
        "i38-traces-validate-new-tokens-beyond-its-rounds",
        ["traces", "validate", "moretok"],
        "column 'new_tokens', row 7: 5000 tokens, but its rounds produced",
    ),
    # issue 38, item 6: a trace set's meta.json that is not UTF-8
    ("i38-traces-validate-meta-not-utf8", ["traces", "validate", "metaxff"], "meta.json: not valid JSON"),
    # issue 38, item 5: a decision-log part that is not Parquet
    ("i38-ab-report-part-not-parquet", ["ab-report", "badpart"], "not a readable Parquet file"),
    ("i38-ope-part-not-parquet", ["ope", "badpart", "--policy", "fixed:4"], "not a readable Parquet file"),
]


# ============================================================================ the world each case runs in
def _rows(n: int = 60) -> list[dict]:
    return [
        {
            "decision_id": f"d{i}",
            "time": 1.7e9 + i,
            "policy": "fixed:4",
            "variant": "AB"[i % 2],
            "block_size": 4,
            "propensity": 1.0,
            "probs": [0.0, 1.0],
            "arms": [1, 4],
            "reward": float(i % 7),
        }
        for i in range(n)
    ]


def _make_world(root: Path) -> None:
    """A trace set, decision logs good and bad, a head, a user's notes and a regular file."""
    from adaptspec.simulators.synthetic import generate

    generate("cpu-small", 60, seed=0, per_round=False).write(root / "ts")
    part = DecisionLog(root / "log").append(_rows())
    good = pq.read_table(part)
    for name, table in (
        ("dup", good),
        ("nan", good),
        ("neg", good),
        ("noprop", good.drop(["propensity"])),
        (
            "strrew",
            good.set_column(
                good.column_names.index("reward"),
                "reward",
                pa.array([str(v) for v in good.column("reward").to_pylist()]),
            ),
        ),
        ("empty", good.slice(0, 0)),
    ):
        (root / name).mkdir()
        if name in ("nan", "neg"):
            rows = good.to_pylist()
            if name == "nan":
                rows[3]["reward"] = float("nan")
            else:
                rows[4]["block_size"] = -4
            table = pa.Table.from_pylist(rows, schema=good.schema)
        pq.write_table(table, root / name / "part-00000000000000000001-1-000000.parquet")
        if name == "dup":  # the same rows again in a second part: 120 rows, 60 decisions
            pq.write_table(table, root / name / "part-00000000000000000002-1-000000.parquet")
    pq.write_table(good.slice(0, 0), root / "empty.parquet")
    (root / "head").mkdir()
    (root / "head" / "config.json").write_text(json.dumps({"kind": "adaptspec-offline-head", "format": 1}))
    (root / "notes").mkdir()
    (root / "notes" / "notes.txt").write_text("a user's notes: nothing may delete them\n")
    (root / "notes" / "plot.png").write_text("not a PNG, but named like one\n")
    (root / "afile").write_text("a regular file\n")
    from adaptspec.costs.latency import get_profile

    profile = get_profile("cpu-smollm2-bf16").to_dict()
    for curve in ("draft", "verify"):
        profile[curve]["values_s"] = [0.0] * len(profile[curve]["knots"])
    (root / "zero.json").write_text(json.dumps(profile))
    (root / "xff.json").write_bytes(b'{"name": "caf\xff"}')
    (root / "deep.json").write_text("[" * 100000)
    for name, row, value in (("bigtok", 0, 2**62), ("moretok", 7, 5000)):
        shutil.copytree(root / "ts", root / name)
        t = pq.read_table(root / name / "outcomes.parquet")
        cells = t.column("new_tokens").to_pylist()
        cells[row] = value
        t = t.set_column(t.column_names.index("new_tokens"), "new_tokens", pa.array(cells, pa.int64()))
        pq.write_table(t, root / name / "outcomes.parquet")
    shutil.copytree(root / "ts", root / "metaxff")
    (root / "metaxff" / "meta.json").write_bytes(b'{"schema_version": 1, "note": "\xff"}')
    (root / "badpart").mkdir()
    (root / "badpart" / "part-00000000000000000001-1-000000.parquet").write_bytes(
        b"PAR1 not Parquet\x00\xff" * 8
    )


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with a hash of its contents (directories as 'dir')."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _run(case: tuple[str, list[str], str], template: Path, base: Path) -> dict:
    cid, argv, _ = case
    cwd = base / cid
    shutil.copytree(template, cwd)
    before = _snapshot(cwd)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "adaptspec", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return {
        "rc": p.returncode,
        "stderr": p.stderr,
        "stdout": p.stdout,
        "before": before,
        "after": _snapshot(cwd),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    template = tmp_path_factory.mktemp("world")
    _make_world(template)
    base = tmp_path_factory.mktemp("cases")
    with ThreadPoolExecutor(2) as pool:
        futures = {c[0]: pool.submit(_run, c, template, base) for c in CASES}
        return {cid: f.result() for cid, f in futures.items()}


def test_the_case_ids_are_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(results, case):
    cid, argv, needle = case
    r = results[cid]
    err = r["stderr"]
    assert "Traceback" not in err, err
    assert r["rc"] == 2, (r["rc"], err, r["stdout"])
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(f"adaptspec {argv[0]}"), err
    assert needle in err, err
    assert r["after"] == r["before"], {
        k: (r["before"].get(k), r["after"].get(k))
        for k in set(r["before"]) ^ set(r["after"]) or r["after"]
        if r["before"].get(k) != r["after"].get(k)
    }


def test_the_world_is_what_the_cases_assume(tmp_path):
    """The fixtures are what the case table says: a valid trace set and log, bad logs that the
    library's own reader refuses (so a case passing means the command validated)."""
    _make_world(tmp_path)
    assert len(TraceSet.read(tmp_path / "ts")) == 60 and len(DecisionLog.read(tmp_path / "log")) == 60
    assert pq.read_table(tmp_path / "dup").num_rows == 120
    assert np.isnan(pq.read_table(tmp_path / "nan").column("reward").to_pylist()[3])
    assert "propensity" not in pq.read_schema(next((tmp_path / "noprop").glob("*.parquet"))).names


@pytest.mark.parametrize("content", [b"\xff\xfe", b"[" * 100_000, b'{"layers": "all"}', b"[1, 2]"])
def test_train_drafter_work_dir_with_a_bad_data_json_is_one_line(tmp_path, content):
    """A train-drafter work directory whose data.json is not UTF-8, nested too deep, or holds no
    list of layers: exit 2 with one line naming the file, before any model loads."""

    work = tmp_path / "work"
    work.mkdir()
    (work / "data.json").write_bytes(content)
    p = subprocess.run(
        [sys.executable, "-m", "adaptspec", "train-drafter", "--work", str(work), "--stage", "train"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "data.json" in lines[0] and "Traceback" not in p.stderr, p.stderr


# ============================================================================ issue 46: a user's speculator in collect and profile-latency
#: a speculator of one's own in plain Python (no model to load: each case stays about a second), and
#: factories whose decode, prefill or declarations go wrong in the ways issue 46 met
USERSPEC = """
import math

import numpy as np

from adaptspec import Outcome, Prefill, Round

V, EOS = 41, 0


def nxt(seq):
    return (seq[-1] * 7 + len(seq) * 3 + (seq[-2] if len(seq) > 1 else 5)) % V


class Codec:
    def encode(self, text):
        return [ord(c) % (V - 1) + 1 for c in text] or [1]

    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)


class Loop:
    def __init__(self, change=None, feature_dim=3, max_block_size=8, buffer=8, features=None, prefill_error=None):
        self.change, self.feature_dim, self.max_block_size = change, feature_dim, max_block_size
        self.buffer, self.features, self.prefill_error, self.codec = buffer, features, prefill_error, Codec()

    def prefill(self, prompt_ids, temperature=0.0, seed=None):
        if self.prefill_error is not None:
            raise self.prefill_error
        ids = list(prompt_ids)
        x = [math.log1p(len(ids)), sum(ids) / len(ids) / V, 1.0] if self.features is None else self.features
        return Prefill(nxt(ids), len(ids), np.asarray(x, np.float32), state=ids)

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        block = [0] * self.buffer  # the loop's block buffer, sized once
        seq, n0, rounds = list(prefill.state) + [prefill.first_token], len(prefill.state), []
        while len(seq) - n0 < max_new_tokens and seq[-1] != EOS:
            block[block_size - 1] = 1  # an IndexError past its buffer
            tau = min(block_size, 1 + len(seq) % 3, max_new_tokens - (len(seq) - n0))
            for i in range(tau):
                seq.append(nxt(seq))
                if seq[-1] == EOS:
                    tau = i + 1
                    break
            rounds.append(Round(block_size, tau, 0.001, 0.002))
        out = Outcome(seq[n0:], rounds, 0.003 * len(rounds) + 0.001)
        return out if self.change is None else self.change(out)


def make():
    return Loop()

def raising():
    def boom(out):
        raise RuntimeError("decode boom")
    return Loop(boom)

def claims_1000():
    return Loop(max_block_size=1000)

def too_many():
    return Loop(lambda o: Outcome(o.tokens + [5] * 3, o.rounds, o.decode_s))

def bigger_rounds():
    return Loop(lambda o: Outcome(o.tokens, [Round(2 * r.block_size, r.tau, r.draft_s, r.verify_s) for r in o.rounds],
                                  o.decode_s))

def round_past_the_end():
    return Loop(lambda o: Outcome(o.tokens, o.rounds + [Round(o.rounds[-1].block_size, 1, 0.001, 0.002)] * 2,
                                  o.decode_s + 0.006))

def wrong_width():
    return Loop(feature_dim=40)

def nan_features():
    return Loop(features=[0.0, float("nan"), 1.0])

def negative_draft_s():
    return Loop(lambda o: Outcome(o.tokens, [Round(r.block_size, r.tau, -5.0, r.verify_s) for r in o.rounds],
                                  o.decode_s))

def nan_decode_s():
    return Loop(lambda o: Outcome(o.tokens, o.rounds, float("nan")))

def decode_s_far_below():
    return Loop(lambda o: Outcome(o.tokens, [Round(r.block_size, r.tau, 1.0, 1.0) for r in o.rounds], o.decode_s))

def no_times():
    return Loop(lambda o: Outcome(o.tokens, [Round(r.block_size, r.tau, 0.0, 0.0) for r in o.rounds], 0.0))

def prefill_raises():
    return Loop(prefill_error=ValueError("prefill boom"))
"""

_COLLECT = ["collect", "--out", "runs/t", "--limit", "1", "--max-new-tokens", "4", "--speculator"]
_PROFILE = ["profile-latency", "--out", "p.json", "--prompts", "1", "--max-new-tokens", "4", "--speculator"]

CASES_46: list[tuple[str, list[str], str]] = [
    # 4: the user's decode raises, or claims a max_block_size its loop cannot draft
    (
        "i46-collect-decode-raises",
        _COLLECT + ["userspec:raising"],
        "decode at block size 1 raised RuntimeError: decode boom",
    ),
    (
        "i46-collect-claims-1000-drafts-8",
        _COLLECT + ["userspec:claims_1000"],
        "decode at block size 12 raised IndexError: list assignment index out of range",
    ),
    (
        "i46-collect-prefill-raises",
        _COLLECT + ["userspec:prefill_raises"],
        "prefill raised ValueError: prefill boom",
    ),
    (
        "i46-profile-latency-decode-raises",
        _PROFILE + ["userspec:raising"],
        "--speculator userspec:raising, held-out prompt 0: decode at block size 1 raised RuntimeError: decode boom",
    ),
    (
        "i46-profile-latency-claims-1000-drafts-8",
        _PROFILE + ["userspec:claims_1000"],
        "decode at block size 12 raised IndexError",
    ),
    # 7: outcomes checked as the controller checks them
    (
        "i46-collect-too-many-tokens",
        _COLLECT + ["userspec:too_many"],
        "is refused: it has 7 tokens, more than max_new_tokens=4",
    ),
    (
        "i46-collect-rounds-larger-than-the-arm",
        _COLLECT + ["userspec:bigger_rounds"],
        "is refused: round 0 ran block size 2, larger than the 1 decided",
    ),
    (
        "i46-collect-rounds-past-the-end",
        _COLLECT + ["userspec:round_past_the_end"],
        "ran after the output had ended",
    ),
    ("i46-profile-latency-too-many-tokens", _PROFILE + ["userspec:too_many"], "more than max_new_tokens=4"),
    # 6: outcome times
    (
        "i46-collect-negative-draft-s",
        _COLLECT + ["userspec:negative_draft_s"],
        "round 0 draft_s is -5.0: seconds must be finite and >= 0",
    ),
    (
        "i46-collect-nan-decode-s",
        _COLLECT + ["userspec:nan_decode_s"],
        "decode_s is nan: seconds must be finite and >= 0",
    ),
    (
        "i46-collect-decode-s-far-below-its-rounds",
        _COLLECT + ["userspec:decode_s_far_below"],
        "under half of its rounds'",
    ),
    # 0: a speculator whose rounds and requests carry no times
    (
        "i46-profile-latency-no-times",
        _PROFILE + ["userspec:no_times"],
        "--speculator userspec:no_times reports no times",
    ),
    # 18: features of another width than declared, and their neighbour
    (
        "i46-collect-feature-dim-40-gives-3",
        _COLLECT + ["userspec:wrong_width"],
        "features have 3 values, speculator Loop declares feature_dim 40",
    ),
    (
        "i46-collect-nan-features",
        _COLLECT + ["userspec:nan_features"],
        "features have NaN or infinite values",
    ),
]


def _run_46(case: tuple[str, list[str], str], base: Path) -> dict:
    cid, argv, _ = case
    cwd = base / cid
    cwd.mkdir()
    (cwd / "userspec.py").write_text(USERSPEC)
    before = _snapshot(cwd)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "adaptspec", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return {
        "rc": p.returncode,
        "stderr": p.stderr,
        "stdout": p.stdout,
        "before": before,
        "after": _snapshot(cwd),
    }


@pytest.fixture(scope="module")
def results_46(tmp_path_factory):
    base = tmp_path_factory.mktemp("cases46")
    with ThreadPoolExecutor(2) as pool:
        futures = {c[0]: pool.submit(_run_46, c, base) for c in CASES_46}
        return {cid: f.result() for cid, f in futures.items()}


@pytest.mark.slow  # a subprocess each, torch imported (by the prompt reader): about 2 s of CPU a case
@pytest.mark.parametrize("case", CASES_46, ids=[c[0] for c in CASES_46])
def test_a_users_speculator_that_goes_wrong_is_one_line_exit_2_and_changes_nothing(results_46, case):
    cid, argv, needle = case
    r = results_46[cid]
    err = r["stderr"]
    assert "Traceback" not in err, err
    assert r["rc"] == 2, (r["rc"], err, r["stdout"])
    assert err.count("\n") == 1 and err.endswith("\n") and err.startswith(f"adaptspec {argv[0]}: error: "), (
        err
    )
    assert needle in err, err
    assert r["after"] == r["before"]


@pytest.mark.slow
def test_the_users_speculator_of_the_issue_46_cases_works_when_nothing_is_changed(tmp_path):
    """The cases' speculator is honest as written: collect and profile-latency run it (exit 0)."""
    (tmp_path / "userspec.py").write_text(USERSPEC)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    for argv in (_COLLECT + ["userspec:make"], _PROFILE + ["userspec:make"]):
        p = subprocess.run(
            [sys.executable, "-m", "adaptspec", *argv],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert p.returncode == 0, p.stderr
    assert TraceSet.read(tmp_path / "runs/t").arms == (1, 2, 4, 6, 8)


# ============================================================================ issue 46, item 17: --prompts of token ids
#: the published-format tiny pair: a target without a tokenizer (vocabulary 256, 1024 positions), a drafter of 8
_PAIR = ROOT / "tests" / "data" / "dflash-reference-tiny-b8"
_IDS_MODEL = ["--target", str(_PAIR / "target"), "--drafter", str(_PAIR / "drafter"), "--threads", "1"]
_GOOD_ROW = '{"prompt_ids": [5, 17, 33], "domain": "a"}\n'

# (id, the prompt file's text, the text stderr must contain): each row after a good one, so the line is 2
CASES_IDS: list[tuple[str, str, str]] = [
    (
        "ids-not-a-list",
        '{"prompt_ids": "5 17 33"}',
        'ids.jsonl:2: prompt_ids must be a non-empty list of token ids, got "5 17 33"',
    ),
    (
        "ids-empty",
        '{"prompt_ids": []}',
        "ids.jsonl:2: prompt_ids must be a non-empty list of token ids, got []",
    ),
    (
        "ids-null",
        '{"prompt_ids": null}',
        "ids.jsonl:2: prompt_ids must be a non-empty list of token ids, got null",
    ),
    (
        "ids-negative",
        '{"prompt_ids": [5, -1]}',
        "ids.jsonl:2: prompt_ids[1] is -1: token ids are integers >= 0",
    ),
    (
        "ids-float",
        '{"prompt_ids": [5, 2.5]}',
        "ids.jsonl:2: prompt_ids[1] is 2.5: token ids are integers >= 0",
    ),
    (
        "ids-integral-float",
        '{"prompt_ids": [5.0]}',
        "ids.jsonl:2: prompt_ids[0] is 5.0: token ids are integers",
    ),
    ("ids-bool", '{"prompt_ids": [true]}', "ids.jsonl:2: prompt_ids[0] is true: token ids are integers >= 0"),
    (
        "ids-string",
        '{"prompt_ids": [5, "17"]}',
        'ids.jsonl:2: prompt_ids[1] is "17": token ids are integers >= 0',
    ),
    (
        "ids-nested",
        '{"prompt_ids": [[5, 17]]}',
        "ids.jsonl:2: prompt_ids[0] is [5, 17]: token ids are integers >= 0",
    ),
    ("ids-nan", '{"prompt_ids": [NaN]}', "ids.jsonl:2: prompt_ids[0] is NaN: token ids are integers >= 0"),
    (
        "ids-too-many",
        json.dumps({"prompt_ids": [1] * 131_073}),
        "ids.jsonl:2: prompt_ids has 131073 token ids, more than the 131072 a prompt may hold",
    ),
    (
        "ids-and-text-both",
        '{"prompt_ids": [5], "prompt": "hi"}',
        "ids.jsonl:2: needs a non-empty string field 'prompt' or a list of token ids 'prompt_ids' (one of them)",
    ),
    (
        "ids-neither",
        '{"domain": "a"}',
        "ids.jsonl:2: needs a non-empty string field 'prompt' or a list of token ids",
    ),
    # checked against the target once it is loaded (the vocabulary is 0..255, 1024 positions)
    (
        "ids-past-the-vocabulary",
        '{"prompt_ids": [5, 256]}',
        "ids.jsonl:2: prompt_ids[1] is 256, outside the target's vocabulary 0..255",
    ),
    (
        "ids-far-past-the-vocabulary",
        '{"prompt_ids": [1000000000000000000000000000000]}',
        "ids.jsonl:2: prompt_ids[0] is 1000000000000000000000000000000, outside the target's vocabulary 0..255",
    ),
    (
        "ids-past-the-context",
        json.dumps({"prompt_ids": [7] * 1021}),
        "ids.jsonl:2: 1021 prompt ids and --max-new-tokens 4 exceed the target's context of 1024 tokens",
    ),
    # a text row on a target without a tokenizer: what works instead
    (
        "ids-text-row-without-a-tokenizer",
        '{"prompt": "hello"}',
        "ids.jsonl:2): add the tokenizer's files to the target directory, or pass token ids instead: --prompts "
        'FILE.jsonl whose rows are {"prompt_ids": [12, 345, ...], "domain": "..."}',
    ),
]
_IDS_COMMANDS = {
    "collect": ["collect", "--out", "runs/t", "--max-new-tokens", "4"],
    "profile-latency": ["profile-latency", "--out", "p.json", "--max-new-tokens", "4"],
}
#: Both commands read the file with one reader (models.prompts.read_prompts): every case runs through collect,
#: and through profile-latency the cases checked once the model is loaded plus one the reader refuses (a
#: subprocess a run, about 3 s of CPU each: the suite's time)
_CHECKED_AT_LOAD = {
    "ids-past-the-vocabulary",
    "ids-far-past-the-vocabulary",
    "ids-past-the-context",
    "ids-text-row-without-a-tokenizer",
}
_IDS_RUNS = [("collect", case) for case in CASES_IDS] + [
    ("profile-latency", case) for case in CASES_IDS if case[0] in _CHECKED_AT_LOAD | {"ids-not-a-list"}
]


def _run_ids(command: str, case: tuple[str, str, str], base: Path) -> dict:
    cid, row, _ = case
    cwd = base / f"{command}-{cid}"
    cwd.mkdir()
    (cwd / "ids.jsonl").write_text(_GOOD_ROW + row + "\n")
    before = _snapshot(cwd)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }  # transformers' weight-loading bar is not adaptspec's stderr
    argv = [*_IDS_COMMANDS[command], *_IDS_MODEL, "--prompts", "ids.jsonl"]
    p = subprocess.run(
        [sys.executable, "-m", "adaptspec", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    return {
        "rc": p.returncode,
        "stderr": p.stderr,
        "stdout": p.stdout,
        "before": before,
        "after": _snapshot(cwd),
    }


@pytest.fixture(scope="module")
def results_ids(tmp_path_factory):
    base = tmp_path_factory.mktemp("cases-ids")
    with ThreadPoolExecutor(2) as pool:
        futures = {(command, c[0]): pool.submit(_run_ids, command, c, base) for command, c in _IDS_RUNS}
        return {key: f.result() for key, f in futures.items()}


@pytest.mark.slow  # a subprocess each, torch imported, some load the tiny pair: about 3 s of CPU a case
@pytest.mark.parametrize("command, case", _IDS_RUNS, ids=[f"{command}-{c[0]}" for command, c in _IDS_RUNS])
def test_a_bad_token_id_prompt_file_is_one_line_naming_file_and_row_exit_2_and_changes_nothing(
    results_ids, command, case
):
    r = results_ids[(command, case[0])]
    err = r["stderr"]
    assert "Traceback" not in err, err
    assert r["rc"] == 2, (r["rc"], err, r["stdout"])
    assert err.count("\n") == 1 and err.startswith(f"adaptspec {command}: error: "), err
    assert case[2] in err, err
    assert r["after"] == r["before"]


@pytest.mark.slow
def test_the_good_row_of_the_token_id_cases_collects_alone(tmp_path):
    """The cases' first row is good: alone, the same command line collects it (exit 0)."""
    (tmp_path / "ids.jsonl").write_text(_GOOD_ROW)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "adaptspec", *_IDS_COMMANDS["collect"], *_IDS_MODEL, "--prompts", "ids.jsonl"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert TraceSet.read(tmp_path / "runs/t").n_requests == 1
