"""Every reader of a user's file caps the bytes it takes, by the kind of file (issue 46, item 13).

The one reader of a user's files (adaptspec/_util/files.py) refuses a file larger than its kind
holds from its size, before a byte is read, in one line naming the limit: a 2 GB file given as
a latency profile is refused at once instead of growing the process to 4 GB. The large files
here are sparse (``truncate``): they take no disk and no time to make, and a reader that read
them would allocate their size. The expected limits are the documented ones (docs/serving.md,
the module's docstring), written out here, not read from the code under test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adaptspec import AdaptspecError
from adaptspec._util.files import DATA_BYTES, JSON_BYTES, JSON_LINES_BYTES, read_bytes, read_json
from adaptspec._util.jsonlines import read_jsonl
from adaptspec.cli import main

MiB = 1 << 20


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_the_documented_limits_per_kind_of_file():
    assert (JSON_BYTES, JSON_LINES_BYTES, DATA_BYTES) == (64 * MiB, 4096 * MiB, 65536 * MiB)


@pytest.mark.parametrize(
    "kind, size, read",
    [
        ("a JSON document", 64 * MiB + 1, lambda p: read_json(p, "a JSON latency profile")),
        ("a JSON-lines file", 4096 * MiB + 1, lambda p: read_jsonl(p, "a decision log's journal")),
        ("a data file", 65536 * MiB + 1, lambda p: read_bytes(p, "a safetensors file", limit=DATA_BYTES)),
    ],
    ids=["json", "json-lines", "data"],
)
def test_a_file_one_byte_over_its_kinds_limit_is_one_line_naming_the_limit(tmp_path, kind, size, read):
    p = sparse(tmp_path / "big", size)
    with pytest.raises(AdaptspecError) as e:
        read(p)
    message = str(e.value)
    assert "\n" not in message
    assert (
        message.startswith(f"{p}: {size} bytes, more than ")
        and f"({kind}: at most {size - 1} bytes" in message
    )


def test_a_json_file_at_its_limit_is_read(tmp_path):
    """At the limit it is read (and then judged as JSON): the cap refuses only what is larger."""
    p = sparse(tmp_path / "profile.json", 64 * MiB)
    with pytest.raises(AdaptspecError, match="not valid JSON"):
        read_json(p, "a JSON latency profile")
    p.write_bytes(b'{"a": 1}')
    assert read_json(p, "a JSON latency profile") == {"a": 1}


def test_a_parquet_part_over_the_data_limit_is_refused_before_pyarrow_reads_it(tmp_path):
    from adaptspec.traces.decision_log import read_part

    p = sparse(tmp_path / "part-0.parquet", 65536 * MiB + 1)
    with pytest.raises(AdaptspecError, match=re.escape(f"{p}: {65536 * MiB + 1} bytes, more than")):
        read_part(p)


def test_serve_refuses_a_2_gb_latency_profile_in_one_line(tmp_path, capsys):
    big = sparse(tmp_path / "profile.json", 2 << 30)
    assert main(["serve", "--tiny", "--port", "0", "--reward", "modelled", "--latency", str(big)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert (
        f"{big}: {2 << 30} bytes, more than a JSON latency profile may hold (a JSON document: at most " in err
    )
