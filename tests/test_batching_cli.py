"""profile-latency's batched-round options: bad values end in one line and exit 2, before any model loads."""

from __future__ import annotations

import pytest

from adaptspec.cli import main


@pytest.mark.parametrize(
    "argv, word",
    [
        (["--batch-only"], "--batch-only needs --batch-rows"),
        (["--batch-rows", "0,2"], "positive integers"),
        (["--batch-rows", "2", "--batch-contexts", "a"], "positive integers"),
    ],
)
def test_bad_batch_options_are_one_line(argv, word, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        rc = main(["profile-latency", "--out", str(tmp_path / "p.json"), *argv])
        raise SystemExit(rc)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and word in err and len(err.splitlines()) == 1 and "Traceback" not in err
