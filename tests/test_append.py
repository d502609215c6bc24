"""Appends whole or not at all (adaptspec/_util/append.py) and the logs that use it.

A write cut short for real: in a child process the file size limit (RLIMIT_FSIZE, SIGXFSZ
ignored) is set a few bytes past the file's end, so the kernel writes part of the record and
then refuses the rest (EFBIG), as a full disk would. The file is read back with json.loads,
line by line, not with the project's reader.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

resource = pytest.importorskip("resource")  # POSIX: CI and every supported platform have it

CHILD = textwrap.dedent("""
    import os, resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # refused writes raise EFBIG instead of killing the process
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

    def limited(path, room, fn):
        resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + room, hard))
        try:
            fn()
            print("no error")
        except Exception as e:
            print("failed:", type(e).__name__)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
""")


def run_child(body: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", CHILD + textwrap.dedent(body), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def lines_of(path) -> list[dict]:
    text = open(path, encoding="utf-8").read()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines() if line]


def test_a_record_cut_short_by_the_kernel_leaves_the_file_as_it_was(tmp_path):
    p = tmp_path / "log.jsonl"
    out = run_child(
        """
        from adaptspec._util.append import LineAppender
        p = sys.argv[1]
        with LineAppender(p, fsync=True) as f:
            f.append('{"a": 1}\\n')
            limited(p, 7, lambda: f.append('{"b": "' + "x" * 200 + '"}\\n'))
            print(os.path.getsize(p))
            f.append('{"c": 3}\\n')
    """,
        str(p),
    )
    assert out.split() == ["failed:", "OSError", str(len('{"a": 1}\n'))]
    assert lines_of(p) == [{"a": 1}, {"c": 3}]


def test_the_decision_log_and_the_slice_log_survive_a_failed_append(tmp_path):
    row = {
        "decision_id": "d{}",
        "time": 1.7e9,
        "policy": "fixed:4",
        "variant": "A",
        "block_size": 4,
        "propensity": 1.0,
        "probs": [0.0, 1.0],
        "arms": [1, 4],
        "reward": 1.0,
        "features": [0.5, 1.0],
    }
    out = run_child(
        """
        import json
        from adaptspec.traces.log_writer import DecisionLogWriter
        from adaptspec.traces.slice_log import SliceLogWriter
        log_dir, row = sys.argv[1], json.loads(sys.argv[2])
        r = lambda i, **kw: {**row, "decision_id": f"d{i}", **kw}
        w = DecisionLogWriter(log_dir, "A", roll_rows=1000)
        w.append(r(0))
        seg = w._segment
        limited(seg, 9, lambda: w.append(r(1, policy="p" * 300)))
        w.append(r(2))
        print(open(seg).read().count("\\n"))   # the header and two rows, each on its own line
        s = SliceLogWriter(log_dir, run="r1")
        s.append({"slice": 0})
        limited(s.file, 9, lambda: s.append({"slice": 1, "pad": "x" * 300}))
        s.append({"slice": 2})
        s.close()
        os._exit(0)   # a crash: the decision log's rows are still in its journal
    """,
        str(tmp_path),
        json.dumps(row),
    )
    assert out.split() == ["failed:", "AdaptspecError", "3", "failed:", "AdaptspecError"]
    assert [r["slice"] for r in lines_of(tmp_path / "slices-r1.jsonl")] == [0, 2]
    from adaptspec.traces.log_writer import DecisionLogWriter, log_rows

    with DecisionLogWriter(tmp_path, "A") as w:  # a new writer recovers the dead one's journal
        assert w.recovered == 2
    assert [r["decision_id"] for r in log_rows(tmp_path)] == ["d0", "d2"]
