"""read_jsonl: the complete lines of an append-only JSON-lines file, whatever tail a crash left."""

import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from adaptspec._util.jsonlines import read_jsonl
from adaptspec.errors import AdaptspecError

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_records = st.lists(st.dictionaries(st.text(max_size=8), _json, max_size=4), max_size=6)


@settings(max_examples=200, deadline=None)
@given(records=_records, ascii_only=st.booleans(), cut=st.floats(0, 1, exclude_max=True), data=st.data())
def test_a_torn_tail_cut_at_any_byte_reads_back_as_the_complete_lines(
    tmp_path_factory, records, ascii_only, cut, data
):
    lines = [(json.dumps(r, ensure_ascii=ascii_only) + "\n").encode() for r in records]
    extra = data.draw(st.dictionaries(st.text(max_size=8), _json, min_size=1, max_size=4))
    torn_line = (json.dumps(extra, ensure_ascii=ascii_only) + "\n").encode()
    torn = torn_line[: int(cut * len(torn_line))]  # 0 .. len-1 bytes: never the whole line with its newline
    p = tmp_path_factory.mktemp("j") / "f.jsonl"
    p.write_bytes(b"".join(lines) + torn)
    got = read_jsonl(p)
    assert got.records == records  # what json.loads of each complete line gives: the records themselves
    assert got.end == sum(len(x) for x in lines)
    assert got.end + len(torn) == os.path.getsize(p)


def test_a_bad_line_that_is_not_the_last_is_an_error_naming_file_and_line(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_bytes(b'{"a": 1}\n\n{"a": 2, "b\n{"a": 3}\n')
    with pytest.raises(AdaptspecError, match=r"f\.jsonl: line 3 is not valid JSON"):
        read_jsonl(p)
    p.write_bytes(b'{"a": 1}\n[1, 2]\n')
    with pytest.raises(AdaptspecError, match=r"f\.jsonl: line 2 is not a JSON object"):
        read_jsonl(p)
    p.write_bytes(b'{"a": 1}\n{"a": "\xff"}\n')  # bad UTF-8 on a finished line
    with pytest.raises(AdaptspecError, match=r"f\.jsonl: line 2 is not valid JSON"):
        read_jsonl(p)


def test_a_missing_file_is_an_error_unless_missing_ok(tmp_path):
    with pytest.raises(AdaptspecError, match="no such file"):
        read_jsonl(tmp_path / "absent.jsonl", "a slice log")
    assert read_jsonl(tmp_path / "absent.jsonl", missing_ok=True) == ([], 0, [])
