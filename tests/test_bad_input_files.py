"""Every file adaptspec reads is checked where it is read (issue 30, items 6-10).

One table: for each reader (dense trace parts and their meta.json, both drafter layouts, a
policy checkpoint, a distillation corpus, a training state.pt, a trace set's meta.json, an
offline head's config) a good artefact is written by the project's own writer, then broken in
one way of each class (truncated, empty, wrong type, out of range, missing field). The reader
is called directly and must raise AdaptspecError, in one line, naming the file and the field
(or column and row). ``test_every_reader_reads_its_good_artefact`` checks that each unbroken
artefact reads, so a case passing means the reader refused that one fault.

The command-line half (exit 2, one line, no traceback) runs ``adaptspec.cli.main`` in-process
for the flags; a few cases run the real command in a subprocess (marked slow).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from adaptspec.errors import AdaptspecError

ROOT = Path(__file__).resolve().parents[1]
DFLASH_FIXTURE = ROOT / "tests" / "data" / "dflash-reference-tiny" / "drafter"
BUNDLED_HEAD = ROOT / "adaptspec" / "models" / "weights" / "smollm2-135m-head"
B = 4  # the dense fixture's largest block size


# ============================================================================ corrupting files
def truncate(f: Path) -> None:
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])


def empty(f: Path) -> None:
    f.write_bytes(b"")


def garbage(f: Path) -> None:
    f.write_bytes(b"\x00not what it claims to be\xff" * 8)


def not_utf8(f: Path) -> None:
    """A JSON file with one byte that is not UTF-8 (issue 38, item 6: a UnicodeDecodeError escaped)."""
    f.write_bytes(b'{"note": "caf\xff"}')


def deeply_nested(f: Path) -> None:
    """Valid-looking JSON nested past the parser's recursion limit (a RecursionError escaped)."""
    f.write_text("[" * 100000)


def huge_number(f: Path) -> None:
    """A 5,000-digit integer: Python refuses to convert it (a ValueError that is not a JSONDecodeError)."""
    f.write_text('{"n": ' + "9" * 5000 + "}")


def set_json(f: Path, key: str, value: Any) -> None:
    """Set ``key`` (``a.b`` for a nested one; ``value`` None deletes it) in a JSON file."""
    data = json.loads(f.read_text())
    *outer, last = key.split(".")
    d = data
    for k in outer:
        d = d[k]
    if value is None:
        d.pop(last, None)
    else:
        d[last] = value
    f.write_text(json.dumps(data))


def set_cell(f: Path, column: str, row: int, index: int, value, pa_type=None) -> None:
    """Set one entry of a list cell (``index`` None: the whole cell) of a Parquet part."""
    t = pq.read_table(f)
    cells = t.column(column).to_pylist()
    if index is None:
        cells[row] = value
    else:
        cells[row] = list(cells[row])
        cells[row][index] = value
    typ = pa_type or t.schema.field(column).type
    t = t.set_column(t.column_names.index(column), column, pa.array(cells, typ))
    pq.write_table(t, f)


def retype(f: Path, column: str, convert, pa_type) -> None:
    """Store a Parquet part's column as another type, each cell converted."""
    t = pq.read_table(f)
    cells = [convert(c) for c in t.column(column).to_pylist()]
    pq.write_table(t.set_column(t.column_names.index(column), column, pa.array(cells, pa_type)), f)


def drop_column(f: Path, column: str) -> None:
    pq.write_table(pq.read_table(f).drop([column]), f)


# ============================================================================ good artefacts
def make_dense(root: Path) -> Path:
    from adaptspec.traces.dense import DenseRequest, DenseTraceSet

    rng = np.random.default_rng(0)
    ds = DenseTraceSet.create(root / "dense", {"max_new_tokens": 8, "max_block_size": B})
    rows = []
    for i in range(3):
        L = 6
        accept = np.stack([rng.integers(0, b, size=L - 1) for b in range(2, B + 1)], axis=1).astype(np.uint8)
        rows.append(
            (
                f"r{i}",
                "math",
                DenseRequest(
                    tokens=rng.integers(0, 100, size=L),
                    accept=accept,
                    top1=rng.uniform(0, 1, size=(L - 1, B - 1)).astype(np.float32),
                    entropy=rng.uniform(0, 2, size=(L - 1, B - 1)).astype(np.float32),
                    features=rng.normal(size=3).astype(np.float32),
                    prompt_tokens=5,
                    finish_reason="length",
                ),
            )
        )
    ds.write_part(rows)
    return root / "dense"


def read_dense(p: Path):
    from adaptspec.traces.dense import DenseTraceSet

    return list(DenseTraceSet.open(p).requests())


def derive_dense(p: Path):
    from adaptspec.costs.latency import get_profile
    from adaptspec.traces.dense import DenseTraceSet, to_traceset

    return to_traceset(DenseTraceSet.open(p), [1, 2, 4], get_profile("cpu-smollm2-bf16"))


def dense_ids(p: Path):
    from adaptspec.traces.dense import DenseTraceSet

    return DenseTraceSet.open(p).request_ids()


def _tiny_config(**kw):
    from adaptspec.decoding.drafter_config import DrafterConfig

    return DrafterConfig(
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        intermediate_size=32,
        vocab_size=64,
        target_layers=[1, 2],
        max_block_size=8,
        **kw,
    )


def make_adaptspec_drafter(root: Path) -> Path:
    from adaptspec.decoding import BlockDiffusionDrafter

    torch.manual_seed(0)
    BlockDiffusionDrafter(_tiny_config()).save_pretrained(root / "drafter", dtype=torch.float32)
    return root / "drafter"


def make_dflash_drafter(root: Path) -> Path:
    import shutil

    shutil.copytree(DFLASH_FIXTURE, root / "drafter")
    return root / "drafter"


def read_drafter(p: Path):
    from adaptspec.decoding import BlockDiffusionDrafter

    return BlockDiffusionDrafter.from_pretrained(p)


def make_checkpoint(root: Path) -> Path:
    from adaptspec.control.policy_checkpoint import write_checkpoint
    from adaptspec.policies import UCB

    pol = UCB([1, 4, 8], seed=0)
    pol.update(None, 4, 2.0)
    return write_checkpoint(root / "ck", pol, {"updates": 1, "last_decision_id": "d1", "arms": [1, 4, 8]})


def read_checkpoint_policy(p: Path):
    from adaptspec.control.policy_checkpoint import load_policy, read_checkpoint
    from adaptspec.policies import UCB

    read_checkpoint(p)
    load_policy(p, UCB([1, 4, 8], seed=0))


def make_corpus(root: Path) -> Path:
    from adaptspec.models import corpus
    from adaptspec.models.prompts import Prompt

    c = corpus.create(root / "corpus", "tiny", max_new_tokens=8, max_prompt_tokens=16)
    prompts = [Prompt("add two numbers", "math"), Prompt("say hi", "chat")]
    corpus._write_shard(c.path / "shard-00000.npz", prompts, [[1, 2, 3], [4, 5]], [[7, 8, 0], [9]], eos={0})
    return c.path


def read_corpus(p: Path):
    from adaptspec.models.corpus import Corpus

    c = Corpus(p)
    return list(c.sequences()), c.prompts()


def rewrite_shard(f: Path, **changes) -> None:
    """Rewrite a corpus shard with arrays replaced (a value None drops the array)."""
    with np.load(f) as z:
        arrays = {k: z[k] for k in z.files}
    for k, v in changes.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    np.savez(f, **arrays)
    f.with_suffix(".npz.npz").replace(f) if f.with_suffix(".npz.npz").exists() else None


def make_state_pt(root: Path) -> Path:
    (root / "run").mkdir()
    torch.save(
        {
            "cfg": {"num_layers": 1},
            "model": {"w": torch.zeros(3)},
            "draft_vocab": None,
            "step": 5,
            "rng": {"state": 1},
        },
        root / "run" / "state.pt",
    )
    return root / "run"


def read_state_pt(p: Path):
    from adaptspec.models.train_drafter import load_state

    return load_state(p / "state.pt")


def make_traceset(root: Path) -> Path:
    from adaptspec.simulators.synthetic import generate

    generate("cpu-small", 12, seed=0, per_round=False).write(root / "ts")
    return root / "ts"


def read_traceset(p: Path):
    from adaptspec.traces import TraceSet

    return TraceSet.read(p)


def make_head(root: Path) -> Path:
    import shutil

    shutil.copytree(BUNDLED_HEAD, root / "head")
    return root / "head"


def read_head(p: Path):
    from adaptspec.policies.offline_head import HeadModel

    return HeadModel.load(p)


def read_featurizer(p: Path):
    from adaptspec.policies.featurizer import Featurizer

    return Featurizer.load(p)


def make_traceset_per_round(root: Path) -> Path:
    from adaptspec.simulators.synthetic import generate

    generate("cpu-small", 12, seed=0, per_round=True).write(root / "ts")
    return root / "ts"


def make_latency(root: Path) -> Path:
    from adaptspec.costs.latency import get_profile

    (root / "lat").mkdir()
    get_profile("cpu-smollm2-bf16").save(root / "lat" / "profile.json")
    return root / "lat"


def read_latency(p: Path):
    from adaptspec.costs.latency import LatencyProfile

    return LatencyProfile.load(p / "profile.json")


def zero_curves(f: Path) -> None:
    """Issue 38, item 2: every curve all zero passed validation, then divided by zero at serving."""
    d = json.loads(f.read_text())
    for curve in ("draft", "verify"):
        d[curve] = {"knots": d[curve]["knots"], "values_s": [0.0] * len(d[curve]["knots"])}
    f.write_text(json.dumps(d))


def _decision_rows(n: int, start: int = 0) -> list[dict]:
    return [
        {
            "decision_id": f"d{i}",
            "time": 1.7e9 + i,
            "policy": "ucb",
            "variant": "A",
            "block_size": 4,
            "propensity": 1.0,
            "probs": [0.0, 0.0, 1.0],
            "arms": [1, 2, 4],
            "reward": 1.0,
            "new_tokens": 10,
        }
        for i in range(start, start + n)
    ]


def make_decision_log(root: Path) -> Path:
    from adaptspec.traces import DecisionLog

    DecisionLog(root / "log").append(_decision_rows(3))
    return root / "log"


def read_decision_log(p: Path):
    from adaptspec.traces import DecisionLog
    from adaptspec.traces.decision_log import read_part

    DecisionLog.read(p)
    return [read_part(f) for f in sorted(p.glob("part-*.parquet"))]


JOURNAL = ".journal-A-00000001.jsonl"


def make_journal(root: Path) -> Path:
    """A writer that died with four acknowledged rows in its journal (the file as the writer writes it)."""
    d = root / "log"
    d.mkdir()
    lines = [{"__journal__": 1, "writer": "A", "created_ns": 1}] + _decision_rows(4)
    (d / JOURNAL).write_text("".join(json.dumps(r) + "\n" for r in lines))
    return d


def read_journal(p: Path):
    """Start a writer on the directory: it recovers the journal into a part."""
    from adaptspec.traces.log_writer import DecisionLogWriter

    w = DecisionLogWriter(p, name="A")
    w.close()
    return w.recovered


def set_journal_line(line: int, change: Callable[[dict], Any]) -> Callable[[Path], None]:
    """Rewrite line ``line`` (from 1) of the journal: ``change`` edits its object in place."""

    def corrupt(d: Path) -> None:
        rows = [json.loads(x) for x in (d / JOURNAL).read_text().splitlines()]
        change(rows[line - 1])
        (d / JOURNAL).write_text("".join(json.dumps(r) + "\n" for r in rows))

    return corrupt


# ============================================================================ the table
@dataclass(frozen=True)
class Reader:
    make: Callable[[Path], Path]
    read: Callable[[Path], Any]


READERS = {
    "dense": Reader(make_dense, read_dense),
    "dense-derive": Reader(make_dense, derive_dense),
    "dense-resume": Reader(make_dense, dense_ids),
    "drafter-adaptspec": Reader(make_adaptspec_drafter, read_drafter),
    "drafter-dflash": Reader(make_dflash_drafter, read_drafter),
    "checkpoint": Reader(make_checkpoint, read_checkpoint_policy),
    "corpus": Reader(make_corpus, read_corpus),
    "state-pt": Reader(make_state_pt, read_state_pt),
    "traceset": Reader(make_traceset, read_traceset),
    "head": Reader(make_head, read_head),
    "featurizer": Reader(make_head, read_featurizer),
    "traceset-per-round": Reader(make_traceset_per_round, read_traceset),
    "latency": Reader(make_latency, read_latency),
    "decision-log": Reader(make_decision_log, read_decision_log),
    "journal": Reader(make_journal, read_journal),
}

P0 = "part-00000.parquet"
SHARD = "shard-00000.npz"

# (id, reader, class, corruption of the artefact's directory, what the message must name)
CASES: list[tuple[str, str, str, Callable[[Path], None], tuple[str, ...]]] = [
    # ---- item 6: impossible values in a dense set are refused, never clipped
    (
        "dense-accept-200",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "accept", 1, 4, 200),
        (P0, "'accept'", "row 1", "200"),
    ),
    (
        "dense-derive-accept-200",
        "dense-derive",
        "range",
        lambda d: set_cell(d / P0, "accept", 1, 4, 200),
        (P0, "'accept'", "row 1"),
    ),
    (
        "dense-accept-beyond-its-block",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "accept", 2, 0, 2),
        (P0, "'accept'", "row 2", "block size 2"),
    ),
    (
        "dense-accept-negative",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "accept", 0, 3, -1, pa.list_(pa.int64())),
        (P0, "'accept'", "row 0", "-1"),
    ),
    (
        "dense-top1-above-1",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "top1", 2, 0, 1.5),
        (P0, "'top1'", "row 2", "1.5"),
    ),
    (
        "dense-top1-negative",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "top1", 0, 5, -0.25),
        (P0, "'top1'", "row 0"),
    ),
    (
        "dense-top1-nan",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "top1", 1, 1, float("nan")),
        (P0, "'top1'", "row 1", "nan"),
    ),
    (
        "dense-entropy-negative",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "entropy", 1, 1, -3.0),
        (P0, "'entropy'", "row 1"),
    ),
    (
        "dense-features-inf",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "features", 0, 0, float("inf")),
        (P0, "'features'", "row 0"),
    ),
    (
        "dense-token-negative",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "tokens", 2, 1, -7),
        (P0, "'tokens'", "row 2"),
    ),
    (
        "dense-prompt-tokens-negative",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "prompt_tokens", 1, None, -5),
        (P0, "'prompt_tokens'", "row 1"),
    ),
    (
        "dense-more-tokens-than-max-new-tokens",
        "dense",
        "range",
        lambda d: (
            set_cell(d / P0, "tokens", 0, None, list(range(9))),
            set_cell(d / P0, "accept", 0, None, [0] * 24),
            set_cell(d / P0, "top1", 0, None, [0.5] * 24),
            set_cell(d / P0, "entropy", 0, None, [0.5] * 24),
        ),
        (P0, "'tokens'", "row 0", "max_new_tokens"),
    ),
    (
        "dense-short-accept-row",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "accept", 1, None, [0, 1, 2]),
        (P0, "'accept'", "row 1", "3 values"),
    ),
    (
        "dense-short-top1-row",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "top1", 2, None, [0.5] * 14),
        (P0, "'top1'", "row 2"),
    ),
    (
        "dense-features-ragged",
        "dense",
        "range",
        lambda d: set_cell(d / P0, "features", 2, None, [0.1]),
        (P0, "'features'", "row 2"),
    ),
    # ---- item 7: dense parts that are truncated, empty, missing or mistyped columns, null cells
    (
        "dense-part-truncated",
        "dense",
        "truncated",
        lambda d: truncate(d / P0),
        (P0, "truncated or corrupted"),
    ),
    (
        "dense-resume-part-truncated",
        "dense-resume",
        "truncated",
        lambda d: truncate(d / P0),
        (P0, "truncated or corrupted"),
    ),
    ("dense-part-empty", "dense", "empty", lambda d: empty(d / P0), (P0,)),
    (
        "dense-part-no-rows",
        "dense",
        "empty",
        lambda d: pq.write_table(pq.read_table(d / P0).slice(0, 0), d / P0),
        (P0, "no rows"),
    ),
    (
        "dense-missing-column",
        "dense",
        "missing",
        lambda d: drop_column(d / P0, "top1"),
        (P0, "missing column 'top1'"),
    ),
    (
        "dense-resume-missing-request-id",
        "dense-resume",
        "missing",
        lambda d: drop_column(d / P0, "request_id"),
        (P0, "'request_id'"),
    ),
    (
        "dense-accept-as-strings",
        "dense",
        "type",
        lambda d: retype(d / P0, "accept", lambda row: [str(v) for v in row], pa.list_(pa.string())),
        (P0, "'accept'", "string"),
    ),
    (
        "dense-prompt-tokens-as-float",
        "dense",
        "type",
        lambda d: set_cell(d / P0, "prompt_tokens", 0, None, 5.0, pa.float64()),
        (P0, "'prompt_tokens'", "double"),
    ),
    (
        "dense-null-domain",
        "dense",
        "missing",
        lambda d: set_cell(d / P0, "domain", 1, None, None),
        (P0, "'domain'", "row 1", "null"),
    ),
    (
        "dense-meta-no-max-new-tokens",
        "dense",
        "missing",
        lambda d: set_json(d / "meta.json", "max_new_tokens", None),
        ("meta.json", "max_new_tokens"),
    ),
    (
        "dense-meta-block-size-string",
        "dense",
        "type",
        lambda d: set_json(d / "meta.json", "max_block_size", "4"),
        ("meta.json", "max_block_size"),
    ),
    (
        "dense-meta-block-size-huge",
        "dense",
        "range",
        lambda d: set_json(d / "meta.json", "max_block_size", 10**9),
        ("meta.json", "max_block_size"),
    ),
    ("dense-meta-truncated", "dense", "truncated", lambda d: truncate(d / "meta.json"), ("meta.json",)),
    (
        "dense-meta-a-list",
        "dense",
        "type",
        lambda d: (d / "meta.json").write_text("[1, 2]"),
        ("meta.json", "object"),
    ),
    # ---- item 7: drafter weights, both layouts
    (
        "drafter-adaptspec-weights-truncated",
        "drafter-adaptspec",
        "truncated",
        lambda d: truncate(d / "drafter.safetensors"),
        ("drafter.safetensors", "truncated or corrupted"),
    ),
    (
        "drafter-adaptspec-weights-empty",
        "drafter-adaptspec",
        "empty",
        lambda d: empty(d / "drafter.safetensors"),
        ("drafter.safetensors",),
    ),
    (
        "drafter-adaptspec-weights-garbage",
        "drafter-adaptspec",
        "type",
        lambda d: garbage(d / "drafter.safetensors"),
        ("drafter.safetensors",),
    ),
    (
        "drafter-adaptspec-weights-missing",
        "drafter-adaptspec",
        "missing",
        lambda d: (d / "drafter.safetensors").unlink(),
        ("drafter.safetensors",),
    ),
    (
        "drafter-adaptspec-config-truncated",
        "drafter-adaptspec",
        "truncated",
        lambda d: truncate(d / "drafter_config.json"),
        ("drafter_config.json",),
    ),
    (
        "drafter-dflash-weights-truncated",
        "drafter-dflash",
        "truncated",
        lambda d: truncate(d / "model.safetensors"),
        ("model.safetensors", "truncated or corrupted"),
    ),
    (
        "drafter-dflash-weights-empty",
        "drafter-dflash",
        "empty",
        lambda d: empty(d / "model.safetensors"),
        ("model.safetensors",),
    ),
    (
        "drafter-dflash-weights-missing",
        "drafter-dflash",
        "missing",
        lambda d: (d / "model.safetensors").unlink(),
        ("model.safetensors",),
    ),
    (
        "drafter-dflash-no-hidden-size",
        "drafter-dflash",
        "missing",
        lambda d: set_json(d / "config.json", "hidden_size", None),
        ("config.json", "hidden_size"),
    ),
    (
        "drafter-dflash-config-truncated",
        "drafter-dflash",
        "truncated",
        lambda d: truncate(d / "config.json"),
        ("config.json",),
    ),
    # ---- item 8: wrongly typed or impossible scalars in drafter configs
    (
        "drafter-adaptspec-eps-string",
        "drafter-adaptspec",
        "type",
        lambda d: set_json(d / "drafter_config.json", "rms_norm_eps", "1e-6"),
        ("drafter_config.json", "rms_norm_eps"),
    ),
    (
        "drafter-adaptspec-eps-negative",
        "drafter-adaptspec",
        "range",
        lambda d: set_json(d / "drafter_config.json", "rms_norm_eps", -1),
        ("drafter_config.json", "rms_norm_eps"),
    ),
    (
        "drafter-adaptspec-head-dim-string",
        "drafter-adaptspec",
        "type",
        lambda d: set_json(d / "drafter_config.json", "head_dim", "8"),
        ("drafter_config.json", "head_dim"),
    ),
    (
        "drafter-adaptspec-rope-theta-string",
        "drafter-adaptspec",
        "type",
        lambda d: set_json(d / "drafter_config.json", "rope_theta", "10000"),
        ("drafter_config.json", "rope_theta"),
    ),
    (
        "drafter-adaptspec-block-size-1e9",
        "drafter-adaptspec",
        "range",
        lambda d: set_json(d / "drafter_config.json", "max_block_size", 1e9),
        ("drafter_config.json", "max_block_size"),
    ),
    (
        "drafter-adaptspec-missing-hidden-size",
        "drafter-adaptspec",
        "missing",
        lambda d: set_json(d / "drafter_config.json", "hidden_size", None),
        ("drafter_config.json", "hidden_size"),
    ),
    (
        "drafter-adaptspec-unknown-field",
        "drafter-adaptspec",
        "missing",
        lambda d: set_json(d / "drafter_config.json", "hiden_size", 16),
        ("drafter_config.json", "hiden_size"),
    ),
    (
        "drafter-adaptspec-target-layers-object",
        "drafter-adaptspec",
        "type",
        lambda d: set_json(d / "drafter_config.json", "target_layers", {"a": 1}),
        ("drafter_config.json", "target_layers"),
    ),
    (
        "drafter-dflash-eps-string",
        "drafter-dflash",
        "type",
        lambda d: set_json(d / "config.json", "rms_norm_eps", "1e-6"),
        ("config.json", "rms_norm_eps"),
    ),
    (
        "drafter-dflash-eps-negative",
        "drafter-dflash",
        "range",
        lambda d: set_json(d / "config.json", "rms_norm_eps", -1),
        ("config.json", "rms_norm_eps"),
    ),
    (
        "drafter-dflash-head-dim-string",
        "drafter-dflash",
        "type",
        lambda d: set_json(d / "config.json", "head_dim", "16"),
        ("config.json", "head_dim"),
    ),
    (
        "drafter-dflash-rope-theta-string",
        "drafter-dflash",
        "type",
        lambda d: set_json(d / "config.json", "rope_theta", "abc"),
        ("config.json", "rope_theta"),
    ),
    (
        "drafter-dflash-kv-heads-string",
        "drafter-dflash",
        "type",
        lambda d: set_json(d / "config.json", "num_key_value_heads", "2"),
        ("config.json", "num_key_value_heads"),
    ),
    (
        "drafter-dflash-block-size-1e9",
        "drafter-dflash",
        "range",
        lambda d: (
            set_json(d / "config.json", "block_size", None),
            set_json(d / "config.json", "dflash_config.block_size", 10**9),
        ),
        ("config.json", "block_size"),
    ),
    # ---- item 7: server checkpoints (policy.npz, checkpoint.json)
    (
        "checkpoint-policy-truncated",
        "checkpoint",
        "truncated",
        lambda d: truncate(d / "policy.npz"),
        ("policy.npz", "truncated or corrupted"),
    ),
    ("checkpoint-policy-empty", "checkpoint", "empty", lambda d: empty(d / "policy.npz"), ("policy.npz",)),
    ("checkpoint-policy-garbage", "checkpoint", "type", lambda d: garbage(d / "policy.npz"), ("policy.npz",)),
    (
        "checkpoint-policy-no-meta",
        "checkpoint",
        "missing",
        lambda d: np.savez(d / "policy.npz", x=np.zeros(2)),
        ("policy.npz", "'__meta__'"),
    ),
    (
        "checkpoint-policy-meta-not-json",
        "checkpoint",
        "type",
        lambda d: np.savez(d / "policy.npz", __meta__=np.frombuffer(b"{not json", np.uint8)),
        ("policy.npz", "'__meta__'"),
    ),
    (
        "checkpoint-policy-missing-array",
        "checkpoint",
        "missing",
        lambda d: np.savez(
            d / "policy.npz",
            __meta__=np.frombuffer(
                json.dumps(
                    {
                        "name": "ucb",
                        "arms": [1, 4, 8],
                        "rng": {},
                        "version": 1,
                        "state": {"n": {"__array__": "s/state/n"}},
                    }
                ).encode(),
                np.uint8,
            ),
        ),
        ("policy.npz", "s/state/n"),
    ),
    (
        "checkpoint-json-truncated",
        "checkpoint",
        "truncated",
        lambda d: truncate(d / "checkpoint.json"),
        ("checkpoint.json",),
    ),
    (
        "checkpoint-json-format-string",
        "checkpoint",
        "type",
        lambda d: set_json(d / "checkpoint.json", "format", "x"),
        ("checkpoint.json", "format"),
    ),
    (
        "checkpoint-json-updates-string",
        "checkpoint",
        "type",
        lambda d: set_json(d / "checkpoint.json", "updates", "7"),
        ("checkpoint.json", "updates"),
    ),
    (
        "checkpoint-json-no-updates",
        "checkpoint",
        "missing",
        lambda d: set_json(d / "checkpoint.json", "updates", None),
        ("checkpoint.json", "updates"),
    ),
    (
        "checkpoint-json-updates-negative",
        "checkpoint",
        "range",
        lambda d: set_json(d / "checkpoint.json", "updates", -3),
        ("checkpoint.json", "updates"),
    ),
    # ---- item 7: distillation corpus
    ("corpus-json-truncated", "corpus", "truncated", lambda d: truncate(d / "corpus.json"), ("corpus.json",)),
    (
        "corpus-json-a-list",
        "corpus",
        "type",
        lambda d: (d / "corpus.json").write_text("[]"),
        ("corpus.json", "object"),
    ),
    (
        "corpus-json-max-new-tokens-string",
        "corpus",
        "type",
        lambda d: set_json(d / "corpus.json", "max_new_tokens", "8"),
        ("corpus.json", "max_new_tokens"),
    ),
    (
        "corpus-shard-truncated",
        "corpus",
        "truncated",
        lambda d: truncate(d / SHARD),
        (SHARD, "truncated or corrupted"),
    ),
    ("corpus-shard-empty", "corpus", "empty", lambda d: empty(d / SHARD), (SHARD,)),
    (
        "corpus-shard-no-lengths",
        "corpus",
        "missing",
        lambda d: rewrite_shard(d / SHARD, lengths=None),
        (SHARD, "'lengths'"),
    ),
    (
        "corpus-shard-lengths-float",
        "corpus",
        "type",
        lambda d: rewrite_shard(d / SHARD, lengths=np.array([6.0, 3.0])),
        (SHARD, "'lengths'"),
    ),
    (
        "corpus-shard-lengths-do-not-add-up",
        "corpus",
        "range",
        lambda d: rewrite_shard(d / SHARD, lengths=np.array([6, 30], np.int32)),
        (SHARD, "'tokens'", "'lengths'"),
    ),
    (
        "corpus-shard-prompt-longer-than-sequence",
        "corpus",
        "range",
        lambda d: rewrite_shard(d / SHARD, prompt_lens=np.array([3, 9], np.int32)),
        (SHARD, "row 1", "prompt_lens"),
    ),
    (
        "corpus-shard-domains-short",
        "corpus",
        "range",
        lambda d: rewrite_shard(d / SHARD, domains=np.array(["math"])),
        (SHARD, "'domains'"),
    ),
    # ---- item 7: a training state.pt (--init-from / resume)
    ("state-pt-truncated", "state-pt", "truncated", lambda d: truncate(d / "state.pt"), ("state.pt",)),
    ("state-pt-empty", "state-pt", "empty", lambda d: empty(d / "state.pt"), ("state.pt",)),
    ("state-pt-garbage", "state-pt", "type", lambda d: garbage(d / "state.pt"), ("state.pt",)),
    (
        "state-pt-not-a-dict",
        "state-pt",
        "type",
        lambda d: torch.save([1, 2], d / "state.pt"),
        ("state.pt", "list"),
    ),
    # ---- item 8: arms in a trace set's meta.json and a head's config
    (
        "traceset-arms-string",
        "traceset",
        "type",
        lambda d: set_json(d / "meta.json", "arms", "x"),
        ("meta.json", "arms", "'x'"),
    ),
    (
        "traceset-arms-number",
        "traceset",
        "type",
        lambda d: set_json(d / "meta.json", "arms", 5),
        ("meta.json", "arms", "5"),
    ),
    (
        "traceset-arms-object",
        "traceset",
        "type",
        lambda d: set_json(d / "meta.json", "arms", {"a": 1}),
        ("meta.json", "arms"),
    ),
    (
        "traceset-arms-zero",
        "traceset",
        "range",
        lambda d: set_json(d / "meta.json", "arms", [0, 4]),
        ("meta.json", "arms"),
    ),
    (
        "head-arms-string",
        "head",
        "type",
        lambda d: set_json(d / "config.json", "arms", "x"),
        ("config.json", "arms"),
    ),
    (
        "head-arms-number",
        "head",
        "type",
        lambda d: set_json(d / "config.json", "arms", 5),
        ("config.json", "arms"),
    ),
    (
        "head-arms-object",
        "head",
        "type",
        lambda d: set_json(d / "config.json", "arms", {"a": 1}),
        ("config.json", "arms"),
    ),
    (
        "head-n-layers-string",
        "head",
        "type",
        lambda d: set_json(d / "config.json", "n_layers", "3"),
        ("config.json", "n_layers"),
    ),
    (
        "head-reward-scale-zero",
        "head",
        "range",
        lambda d: set_json(d / "config.json", "reward_scale", 0),
        ("config.json", "reward_scale"),
    ),
    (
        "head-no-mode",
        "head",
        "missing",
        lambda d: set_json(d / "config.json", "mode", None),
        ("config.json", "mode"),
    ),
    ("head-config-truncated", "head", "truncated", lambda d: truncate(d / "config.json"), ("config.json",)),
    ("head-weights-empty", "head", "empty", lambda d: empty(d / "model.safetensors"), ("model.safetensors",)),
    (
        "head-weights-truncated",
        "head",
        "truncated",
        lambda d: truncate(d / "model.safetensors"),
        ("model.safetensors",),
    ),
    (
        "head-arms-disagree-with-weights",
        "head",
        "range",
        lambda d: set_json(d / "config.json", "arms", [1, 2]),
        ("head", "outputs"),
    ),
    # ---- issue 38, item 6: every JSON reader catches the whole class of decode errors
    (
        "dense-meta-not-utf8",
        "dense",
        "decode",
        lambda d: not_utf8(d / "meta.json"),
        ("meta.json", "not UTF-8", "0xff"),
    ),
    (
        "dense-meta-deeply-nested",
        "dense",
        "decode",
        lambda d: deeply_nested(d / "meta.json"),
        ("meta.json", "nested too deeply"),
    ),
    (
        "drafter-adaptspec-config-not-utf8",
        "drafter-adaptspec",
        "decode",
        lambda d: not_utf8(d / "drafter_config.json"),
        ("drafter_config.json", "not UTF-8"),
    ),
    (
        "drafter-adaptspec-config-deeply-nested",
        "drafter-adaptspec",
        "decode",
        lambda d: deeply_nested(d / "drafter_config.json"),
        ("drafter_config.json", "nested too deeply"),
    ),
    # (a DFlash directory is known by its config.json: one that cannot be decoded does not name DFlashDraftModel)
    (
        "drafter-dflash-config-not-utf8",
        "drafter-dflash",
        "decode",
        lambda d: not_utf8(d / "config.json"),
        ("config.json naming DFlashDraftModel",),
    ),
    (
        "drafter-dflash-config-deeply-nested",
        "drafter-dflash",
        "decode",
        lambda d: deeply_nested(d / "config.json"),
        ("config.json naming DFlashDraftModel",),
    ),
    (
        "drafter-dflash-config-huge-number",
        "drafter-dflash",
        "decode",
        lambda d: huge_number(d / "config.json"),
        ("config.json naming DFlashDraftModel",),
    ),
    (
        "checkpoint-json-not-utf8",
        "checkpoint",
        "decode",
        lambda d: not_utf8(d / "checkpoint.json"),
        ("checkpoint.json", "not UTF-8"),
    ),
    (
        "checkpoint-json-deeply-nested",
        "checkpoint",
        "decode",
        lambda d: deeply_nested(d / "checkpoint.json"),
        ("checkpoint.json", "nested too deeply"),
    ),
    (
        "checkpoint-policy-meta-not-utf8",
        "checkpoint",
        "decode",
        lambda d: np.savez(d / "policy.npz", __meta__=np.frombuffer(b'{"name": "\xff"}', np.uint8)),
        ("policy.npz", "'__meta__'", "not UTF-8"),
    ),
    (
        "checkpoint-policy-meta-deeply-nested",
        "checkpoint",
        "decode",
        lambda d: np.savez(d / "policy.npz", __meta__=np.frombuffer(b"[" * 100000, np.uint8)),
        ("policy.npz", "'__meta__'", "nested too deeply"),
    ),
    (
        "checkpoint-policy-a-bare-npy",
        "checkpoint",
        "type",
        lambda d: np.save(open(d / "policy.npz", "wb"), np.zeros(3)),
        ("policy.npz", "not an .npz archive"),
    ),
    (
        "corpus-json-not-utf8",
        "corpus",
        "decode",
        lambda d: not_utf8(d / "corpus.json"),
        ("corpus.json", "not UTF-8"),
    ),
    (
        "corpus-json-deeply-nested",
        "corpus",
        "decode",
        lambda d: deeply_nested(d / "corpus.json"),
        ("corpus.json", "nested too deeply"),
    ),
    (
        "head-config-not-utf8",
        "head",
        "decode",
        lambda d: not_utf8(d / "config.json"),
        ("config.json", "not UTF-8"),
    ),
    (
        "head-config-deeply-nested",
        "head",
        "decode",
        lambda d: deeply_nested(d / "config.json"),
        ("config.json", "nested too deeply"),
    ),
    (
        "head-config-huge-number",
        "head",
        "decode",
        lambda d: huge_number(d / "config.json"),
        ("config.json", "not valid JSON"),
    ),
    (
        "featurizer-json-not-utf8",
        "featurizer",
        "decode",
        lambda d: not_utf8(d / "featurizer.json"),
        ("featurizer.json", "not UTF-8"),
    ),
    (
        "featurizer-json-deeply-nested",
        "featurizer",
        "decode",
        lambda d: deeply_nested(d / "featurizer.json"),
        ("featurizer.json", "nested too deeply"),
    ),
    (
        "traceset-meta-not-utf8",
        "traceset",
        "decode",
        lambda d: not_utf8(d / "meta.json"),
        ("meta.json", "not UTF-8"),
    ),
    (
        "traceset-meta-deeply-nested",
        "traceset",
        "decode",
        lambda d: deeply_nested(d / "meta.json"),
        ("meta.json", "nested too deeply"),
    ),
    # ---- issue 38, item 15: counts cross-checked where a trace set is read
    (
        "traceset-new-tokens-2-62",
        "traceset",
        "range",
        lambda d: set_cell(d / "outcomes.parquet", "new_tokens", 0, None, 2**62),
        ("outcomes.parquet", "'new_tokens'", "row 0"),
    ),
    (
        "traceset-new-tokens-beyond-its-rounds",
        "traceset",
        "range",
        lambda d: set_cell(d / "outcomes.parquet", "new_tokens", 2, None, 10**6),
        ("outcomes.parquet", "'new_tokens'", "row 2", "rounds produced"),
    ),
    (
        "traceset-new-tokens-short-of-its-rounds",
        "traceset",
        "range",
        lambda d: set_cell(d / "outcomes.parquet", "new_tokens", 1, None, 0),
        ("outcomes.parquet", "'new_tokens'", "row 1"),
    ),
    (
        "traceset-rounds-2-62",
        "traceset",
        "range",
        lambda d: set_cell(d / "outcomes.parquet", "rounds", 3, None, 2**62),
        ("outcomes.parquet", "'rounds'", "row 3"),
    ),
    (
        "traceset-prompt-tokens-1e12",
        "traceset",
        "range",
        lambda d: set_cell(d / "requests.parquet", "prompt_tokens", 0, None, 10**12),
        ("requests.parquet", "'prompt_tokens'", "row 0"),
    ),
    (
        "traceset-per-round-new-tokens-2-62",
        "traceset-per-round",
        "range",
        lambda d: set_cell(d / "outcomes.parquet", "new_tokens", 0, None, 2**62),
        ("outcomes.parquet", "'new_tokens'", "row 0"),
    ),
    (
        "traceset-per-round-new-tokens-twice-its-taus",
        "traceset-per-round",
        "range",
        lambda d: set_cell(
            d / "outcomes.parquet",
            "new_tokens",
            5,
            None,
            2 * sum(pq.read_table(d / "outcomes.parquet").column("tau")[5].as_py()),
        ),
        ("outcomes.parquet", "'new_tokens'", "row 5", "sum of their tau"),
    ),
    (
        "traceset-per-round-verify-zero",
        "traceset-per-round",
        "range",
        lambda d: set_cell(d / "outcomes.parquet", "verify_ms", 4, 0, 0.0),
        ("outcomes.parquet", "'verify_ms'", "row 4", "a time > 0"),
    ),
    (
        "traceset-per-round-draft-inf",
        "traceset-per-round",
        "range",
        lambda d: set_cell(d / "outcomes.parquet", "draft_ms", 6, 0, float("inf")),
        ("outcomes.parquet", "'draft_ms'", "row 6"),
    ),
    (
        "traceset-per-round-decode-ms-zero",
        "traceset-per-round",
        "range",
        lambda d: set_cell(d / "outcomes.parquet", "decode_ms", 2, None, 0.0),
        ("outcomes.parquet", "'decode_ms'", "row 2"),
    ),
    # ---- issue 38, items 2, 3, 6: latency profiles
    (
        "latency-all-curves-zero",
        "latency",
        "range",
        lambda d: zero_curves(d / "profile.json"),
        ("profile.json", "verify times must be > 0"),
    ),
    (
        "latency-verify-starts-at-zero",
        "latency",
        "range",
        lambda d: set_json(d / "profile.json", "verify.values_s", [0.0, 0.045, 0.052, 0.067]),
        ("profile.json", "verify times"),
    ),
    (
        "latency-values-decrease",
        "latency",
        "range",
        lambda d: set_json(d / "profile.json", "verify.values_s", [0.04, 0.03, 0.052, 0.067]),
        ("profile.json", "never decrease"),
    ),
    (
        "latency-negative-slope",
        "latency",
        "range",
        lambda d: set_json(d / "profile.json", "draft.per_context_s", -1e-6),
        ("profile.json", "per_context_s"),
    ),
    (
        "latency-value-a-string",
        "latency",
        "type",
        lambda d: set_json(d / "profile.json", "verify.values_s", ["0.04", 0.045, 0.052, 0.067]),
        ("profile.json", "'0.04' is not a number"),
    ),
    (
        "latency-value-a-boolean",
        "latency",
        "type",
        lambda d: set_json(d / "profile.json", "verify.tail_slope_s", True),
        ("profile.json", "True is not a number"),
    ),
    (
        "latency-context-tokens-fractional",
        "latency",
        "type",
        lambda d: set_json(d / "profile.json", "context_tokens", 3.7),
        ("profile.json", "context_tokens"),
    ),
    (
        "latency-value-nan",
        "latency",
        "range",
        lambda d: set_json(d / "profile.json", "verify.values_s", [float("nan"), 0.045, 0.052, 0.067]),
        ("profile.json", "finite"),
    ),
    (
        "latency-no-verify",
        "latency",
        "missing",
        lambda d: set_json(d / "profile.json", "verify", None),
        ("profile.json", "'verify'"),
    ),
    (
        "latency-truncated",
        "latency",
        "truncated",
        lambda d: truncate(d / "profile.json"),
        ("profile.json", "not valid JSON"),
    ),
    (
        "latency-empty",
        "latency",
        "empty",
        lambda d: empty(d / "profile.json"),
        ("profile.json", "not valid JSON"),
    ),
    (
        "latency-not-utf8",
        "latency",
        "decode",
        lambda d: not_utf8(d / "profile.json"),
        ("profile.json", "not UTF-8"),
    ),
    (
        "latency-deeply-nested",
        "latency",
        "decode",
        lambda d: deeply_nested(d / "profile.json"),
        ("profile.json", "nested too deeply"),
    ),
    (
        "latency-a-directory",
        "latency",
        "type",
        lambda d: ((d / "profile.json").unlink(), (d / "profile.json").mkdir()),
        ("profile.json", "not a regular file", "a directory"),
    ),
    # ---- issue 38, item 5: a decision-log part that is not Parquet (ArrowInvalid escaped /ab)
    (
        "decision-log-part-garbage",
        "decision-log",
        "type",
        lambda d: garbage(next(d.glob("part-*.parquet"))),
        ("part-", "not a readable Parquet file"),
    ),
    (
        "decision-log-part-truncated",
        "decision-log",
        "truncated",
        lambda d: truncate(next(d.glob("part-*.parquet"))),
        ("part-", "truncated or corrupted"),
    ),
    (
        "decision-log-part-empty",
        "decision-log",
        "empty",
        lambda d: empty(next(d.glob("part-*.parquet"))),
        ("part-",),
    ),
    (
        "decision-log-part-a-directory",
        "decision-log",
        "type",
        lambda d: (d / "part-99999999999999999999-1-000000.parquet").mkdir(),
        ("part-99999999999999999999", "a directory"),
    ),
    (
        "decision-log-new-tokens-2-62",
        "decision-log",
        "range",
        lambda d: set_cell(next(d.glob("part-*.parquet")), "new_tokens", 1, None, 2**62, pa.int64()),
        ("part-", "'new_tokens'", "row 1", "more than 100000000"),
    ),
    (
        "decision-log-part-no-decision-id",
        "decision-log",
        "missing",
        lambda d: drop_column(next(d.glob("part-*.parquet")), "decision_id"),
        ("part-", "'decision_id'"),
    ),
    (
        "decision-log-part-schema-version-garbage",
        "decision-log",
        "type",
        lambda d: (
            lambda f: pq.write_table(
                pq.read_table(f).replace_schema_metadata({"adaptspec.schema_version": "abc"}), f
            )
        )(next(d.glob("part-*.parquet"))),
        ("part-", "schema_version"),
    ),
    # ---- issue 38, item 7: a complete journal line that is not a valid row is corruption: refused, file and line named
    (
        "journal-row-without-decision-id",
        "journal",
        "missing",
        set_journal_line(3, lambda r: r.pop("decision_id")),
        (JOURNAL, "line 3", "'decision_id'"),
    ),
    (
        "journal-row-without-block-size",
        "journal",
        "missing",
        set_journal_line(2, lambda r: r.pop("block_size")),
        (JOURNAL, "line 2", "'block_size'"),
    ),
    (
        "journal-row-decision-id-a-number",
        "journal",
        "type",
        set_journal_line(4, lambda r: r.update(decision_id=7)),
        (JOURNAL, "line 4", "decision_id"),
    ),
    (
        "journal-row-block-size-a-string",
        "journal",
        "type",
        set_journal_line(2, lambda r: r.update(block_size="4")),
        (JOURNAL, "line 2", "block_size"),
    ),
    (
        "journal-row-time-a-string",
        "journal",
        "type",
        set_journal_line(5, lambda r: r.update(time="yesterday")),
        (JOURNAL, "line 5", "time"),
    ),
    (
        "journal-row-reward-a-list",
        "journal",
        "type",
        set_journal_line(3, lambda r: r.update(reward=[1])),
        (JOURNAL, "line 3"),
    ),
    (
        "journal-row-probs-a-number",
        "journal",
        "type",
        set_journal_line(3, lambda r: r.update(probs=1.0)),
        (JOURNAL, "line 3"),
    ),
    (
        "journal-row-propensity-mismatch",
        "journal",
        "range",
        set_journal_line(2, lambda r: r.update(propensity=0.5)),
        (JOURNAL, "line 2", "propensity"),
    ),
    (
        "journal-row-new-tokens-negative",
        "journal",
        "range",
        set_journal_line(4, lambda r: r.update(new_tokens=-3)),
        (JOURNAL, "line 4", "new_tokens"),
    ),
    (
        "journal-row-new-tokens-2-62",
        "journal",
        "range",
        set_journal_line(4, lambda r: r.update(new_tokens=2**62)),
        (JOURNAL, "line 4", "new_tokens", "0..100000000"),
    ),
    (
        "journal-row-an-unknown-column",
        "journal",
        "type",
        set_journal_line(2, lambda r: r.update(colour="red")),
        (JOURNAL, "line 2", "colour"),
    ),
    (
        "journal-header-created-ns-a-string",
        "journal",
        "type",
        set_journal_line(1, lambda r: r.update(created_ns="x")),
        (JOURNAL, "line 1", "created_ns"),
    ),
    (
        "journal-line-not-utf8",
        "journal",
        "decode",
        lambda d: (d / JOURNAL).write_bytes(
            (d / JOURNAL).read_bytes().replace(b'"variant": "A"', b'"variant": "\xff"', 1)
        ),
        (JOURNAL, "line 2", "not valid JSON"),
    ),
    (
        "journal-line-deeply-nested",
        "journal",
        "decode",
        lambda d: (d / JOURNAL).write_text(
            (d / JOURNAL).read_text() + "[" * 100000 + "\n" + json.dumps(_decision_rows(1, 9)[0]) + "\n"
        ),
        (JOURNAL, "line 6", "not valid JSON"),
    ),
]


def test_the_case_ids_are_unique_and_every_reader_meets_every_class():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))
    classes = {"truncated", "empty", "type", "range", "missing", "decode"}
    for reader in ("dense", "drafter-adaptspec", "drafter-dflash", "checkpoint", "corpus", "head", "latency"):
        assert {c[2] for c in CASES if c[1] == reader} == classes, reader


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_reads_its_good_artefact(tmp_path, reader):
    r = READERS[reader]
    r.read(r.make(tmp_path))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_bad_file_is_one_line_naming_the_file_and_the_field(tmp_path, case):
    _, reader, _, corrupt, needles = case
    r = READERS[reader]
    where = r.make(tmp_path)  # the artefact's directory (a checkpoint's ckpt-* one)
    corrupt(where)
    with pytest.raises(AdaptspecError) as e:
        r.read(where)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_dense_replay_never_sees_a_clipped_accept(tmp_path):
    """The silent wrong result of item 6: an accept of 200 at block size 4 used to be clipped to
    3 and `traces derive` wrote a plausible tau. Now the set is refused before any replay, and
    an in-range set gives the tau a hand count of its table gives."""
    from adaptspec.traces.dense import DenseTraceSet, replay

    d = make_dense(tmp_path)
    ((_, _, req),) = [x for x in DenseTraceSet.open(d).requests() if x[0] == "r0"]
    # hand count, B = 2 (column 0): each round commits accept[m - 1, 0] + 1 tokens, stopping at the end
    m, want = 1, []
    while m < len(req.tokens):
        j = min(int(req.accept[m - 1, 0]), 1, len(req.tokens) - 1 - m)
        want.append(j + 1)
        m += j + 1
    assert replay(req.accept, len(req.tokens), 8, 2) == want


# ============================================================================ command line
def _cli(capsys, *argv: str) -> tuple[int, str]:
    from adaptspec.cli import main

    rc = main(list(argv))
    return rc, capsys.readouterr().err


CLI_CASES = [
    (
        "simulate-steps-1e12",
        ["simulate", "ts", "--steps", str(10**12)],
        "argument --steps: expected an integer in 1..10000000",
    ),
    ("simulate-steps-1e30", ["simulate", "ts", "--steps", str(10**30)], "argument --steps"),
    (
        "train-head-epochs-huge",
        ["train-head", "ts", "--out", "h", "--epochs", str(10**20)],
        "argument --epochs: expected an integer >= 1 (at most",
    ),
    ("serve-decide-timeout-huge", ["serve", "--decide-timeout", "1e300"], "argument --decide-timeout"),
    (
        "collect-device-tpu9",
        ["collect", "--out", "x", "--device", "tpu9"],
        "argument --device: expected cpu, cuda, cuda:N or mps, got 'tpu9'",
    ),
    ("serve-device-tpu9", ["serve", "--device", "tpu9"], "argument --device"),
    (
        "profile-latency-device-cuda-99",
        ["profile-latency", "--device", "cuda:99"],
        "argument --device: cuda:99",
    ),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_a_bad_flag_is_exit_2_and_one_line(capsys, case):
    _, argv, needle = case
    rc, err = _cli(capsys, *argv)
    assert rc == 2 and err.count("\n") == 1 and needle in err, (rc, err)


def test_device_cuda_is_refused_at_parsing_exactly_when_this_machine_has_none(capsys):
    import argparse

    from adaptspec.cli._types import device

    if torch.cuda.is_available():
        assert device("cuda") == "cuda" and device("cuda:0") == "cuda:0"
    else:
        rc, err = _cli(capsys, "collect", "--out", "x", "--device", "cuda")
        assert rc == 2 and "argument --device: cuda: this machine has no CUDA device" in err
        with pytest.raises(argparse.ArgumentTypeError):
            device("cuda:0")


# ============================================================================ the real commands (subprocess)
def _run(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "adaptspec", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _one_line_exit_2(p: subprocess.CompletedProcess, command: str, *needles: str) -> None:
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 2 and p.stderr.count("\n") == 1, (p.returncode, p.stderr)
    assert p.stderr.startswith(f"adaptspec {command}: error: "), p.stderr
    for n in needles:
        assert n in p.stderr, (n, p.stderr)


@pytest.mark.slow
@pytest.mark.integration
def test_traces_derive_refuses_an_impossible_accept_and_writes_nothing(tmp_path):
    d = make_dense(tmp_path)
    set_cell(d / P0, "accept", 1, 4, 200)
    p = _run(tmp_path, "traces", "derive", str(d), "--out", "derived", "--arms", "1,2,4")
    _one_line_exit_2(p, "traces", P0, "'accept'", "row 1", "200")
    assert not (tmp_path / "derived").exists()


@pytest.mark.slow
@pytest.mark.integration
def test_simulate_steps_beyond_the_bound_is_refused(tmp_path):
    make_traceset(tmp_path)
    _one_line_exit_2(_run(tmp_path, "simulate", "ts", "--steps", str(10**12)), "simulate", "argument --steps")


@pytest.mark.slow
@pytest.mark.integration
def test_serve_refuses_a_truncated_checkpoint_at_start(tmp_path):
    """A server that checkpointed, then its policy.npz truncated (a crash of the disk, not of
    adaptspec): the next start is one line naming the file, before it serves anything."""
    from fastapi.testclient import TestClient

    from adaptspec.cli import build_parser
    from adaptspec.cli.serve import build as build_service
    from adaptspec.serving import create_app

    args = [
        "serve",
        "--tiny",
        "--threads",
        "1",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--checkpoint-every",
        "1",
    ]
    svc = build_service(build_parser("serve").parse_args(args))
    with TestClient(create_app(svc)) as c:
        assert c.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2}).status_code == 200
    npz = sorted((tmp_path / "ck").rglob("policy.npz"))
    assert npz, "the first run wrote no checkpoint"
    truncate(npz[-1])
    p = _run(tmp_path, *args)
    _one_line_exit_2(p, "serve", "policy.npz", "truncated or corrupted")


def _no_room_beyond_4_kb() -> None:
    """In the child: every write past 4 kB of a file fails (EFBIG), as on a full disk, but unprivileged."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


@pytest.mark.slow
@pytest.mark.integration
def test_train_head_onto_a_full_disk_is_one_line(tmp_path):
    """The head's weights (~17 kB) cannot be written: one line naming the head, exit 2, nothing
    left at --out (safetensors raised its own error type, a traceback, before)."""
    make_traceset(tmp_path)
    env = {
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "PATH": "/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "adaptspec",
            "train-head",
            "ts",
            "--out",
            "head",
            "--epochs",
            "2",
            "--hidden",
            "64,32",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        preexec_fn=_no_room_beyond_4_kb,
    )
    _one_line_exit_2(p, "train-head", "head: cannot write (File too large)")
    assert not (tmp_path / "head").exists() and not list(tmp_path.glob(".head.*"))


# ============================================================================ issue 38: journals, /ab, unreadable files
def test_a_torn_last_journal_line_is_skipped_and_every_acknowledged_row_recovered(tmp_path):
    """The documented policy (adaptspec/_util/jsonlines.py): a last line without its newline is a
    write that never returned (never acknowledged), skipped whatever it holds; every complete row
    before it becomes part of the log."""
    from adaptspec.traces import DecisionLog

    d = make_journal(tmp_path)
    with open(d / JOURNAL, "a") as f:
        f.write('{"decision_id": "torn", "time": 1.7e9, "pol')
    assert read_journal(d) == 4
    assert sorted(DecisionLog.read(d).table.column("decision_id").to_pylist()) == ["d0", "d1", "d2", "d3"]
    assert not (d / JOURNAL).exists()


def test_a_refused_journal_is_left_as_it_was_and_recovers_once_repaired(tmp_path):
    """A corrupted line in the middle refuses the start (one line naming the file and the line);
    nothing is deleted or rewritten, so no acknowledged decision is lost: removing the bad line
    lets the next start recover every other row."""
    from adaptspec.traces import DecisionLog
    from adaptspec.traces.log_writer import journal_rows, log_rows

    d = make_journal(tmp_path)
    set_journal_line(3, lambda r: r.pop("decision_id"))(d)
    before = (d / JOURNAL).read_bytes()
    for read in (read_journal, journal_rows, log_rows):
        with pytest.raises(
            AdaptspecError, match=r"\.journal-A-00000001\.jsonl: line 3 is not a valid decision-log row"
        ):
            read(d)
    assert (d / JOURNAL).read_bytes() == before and not list(d.glob("part-*"))
    lines = before.decode().splitlines(keepends=True)
    (d / JOURNAL).write_text("".join(lines[:2] + lines[3:]))
    assert read_journal(d) == 3
    assert sorted(DecisionLog.read(d).table.column("decision_id").to_pylist()) == ["d0", "d2", "d3"]


@pytest.mark.parametrize("bad", ["part", "journal"])
def test_ab_on_a_live_log_with_a_bad_file_is_a_503_with_a_reason(tmp_path, bad, caplog):
    """Issue 38, item 5: a file named part-*.parquet that is not Parquet made GET /ab a 500
    (ArrowInvalid escaped); a journal line without decision_id was a KeyError too. Issue 46,
    item 11: the client gets the reason without the server's paths; the server's log names the file."""
    from fastapi.testclient import TestClient

    from adaptspec.serving import CompletionService, ServerLimits, create_app
    from adaptspec.serving.tiny import tiny_speculator

    spec, codec = tiny_speculator(0)
    svc = CompletionService.build(
        spec,
        {"A": "fixed:4"},
        codec=codec,
        log_dir=tmp_path / "log",
        limits=ServerLimits(max_context=512, vocab_size=128),
    )
    with TestClient(create_app(svc)) as client:
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        assert client.get("/ab").status_code == 200
        if bad == "part":
            f = tmp_path / "log" / "part-99999999999999999999-1-000000.parquet"
            f.write_bytes(b"PAR1 but not really Parquet\x00\xff" * 4)
        else:
            f = tmp_path / "log" / ".journal-Z-00000001.jsonl"
            f.write_text(
                json.dumps({"__journal__": 1, "writer": "Z", "created_ns": 1})
                + "\n"
                + json.dumps({"time": 1.7e9, "policy": "fixed:4", "block_size": 4})
                + "\n"
            )
        r = client.get("/ab")
        assert r.status_code == 503, r.text
        msg = r.json()["error"]["message"]
        assert msg and "\n" not in msg and str(tmp_path) not in msg and f.name not in msg, msg
        assert f.name in caplog.text, "the server's log keeps the detail"
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def _without_root_overrides() -> None:
    """In a child before exec: as root, give up overriding file permissions, as a user has none."""
    import ctypes
    import os

    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH (PR_CAPBSET_DROP = 24)
            if libc.prctl(24, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.slow
@pytest.mark.integration
def test_an_unreadable_meta_json_is_reported_as_unreadable(tmp_path):
    """Issue 38, unclear messages: a meta.json the user may not read said "not valid JSON ([Errno 13]
    Permission denied)"; it is unreadable, and says so."""
    ts = make_traceset(tmp_path)
    (ts / "meta.json").chmod(0)
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    p = subprocess.run(
        [sys.executable, "-m", "adaptspec", "traces", "validate", str(ts)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        preexec_fn=_without_root_overrides,
    )
    _one_line_exit_2(p, "traces", "meta.json: cannot read a trace set's meta.json (Permission denied)")
    assert "not valid JSON" not in p.stderr


@pytest.mark.slow
@pytest.mark.integration
def test_serve_refuses_a_corrupted_journal_at_start_and_keeps_it(tmp_path):
    """Issue 38, item 7: a journal line that is valid JSON without decision_id crashed start-up with
    a KeyError. Now: exit 2, one line naming the segment and the line, and the segment untouched."""
    log = tmp_path / "log"
    log.mkdir()
    seg = log / ".journal-default-00000001.jsonl"
    rows = [{"__journal__": 1, "writer": "default", "created_ns": 1}] + _decision_rows(2)
    del rows[1]["decision_id"]
    seg.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = seg.read_bytes()
    p = _run(tmp_path, "serve", "--tiny", "--threads", "1", "--log-dir", str(log))
    # the server logs its start-up (INFO lines) to stderr before it reads the log; the error is one line
    p.stderr = "".join(ln for ln in p.stderr.splitlines(keepends=True) if not ln.startswith("INFO "))
    _one_line_exit_2(p, "serve", ".journal-default-00000001.jsonl: line 2", "'decision_id'")
    assert seg.read_bytes() == before
