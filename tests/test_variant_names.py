"""Issue 38, item 17: a variant's name becomes a folder and a Redis key, so names that are paths
(``..``, ``.``, ``a/b``), options (``-x``), empty, too long, or hold NUL, a newline or ``:`` are
refused where they enter: one line from the library, exit 2 and one line from the CLI, nothing
written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from _redis import free_port
from adaptspec.ab.router import ABRouter
from adaptspec.ab.variants import check_variant_name, named_specs, parse_ab_specs
from adaptspec.errors import AdaptspecError
from adaptspec.fleet import MemoryBackend, SharedState

GOOD = ["A", "b", "default", "v1.0", "ctl_2", "x-y", "9", "A" * 32]
BAD = [
    "",
    ".",
    "..",
    "../x",
    "a/b",
    "/abs",
    "a\\b",
    "a\x00b",
    "-x",
    "_x",
    ".hidden",
    "A" * 33,
    "A" * 5000,
    "A\n",
    "a:b",
    " A",
    "a b",
    "é",
]


@pytest.mark.parametrize("name", GOOD)
def test_good_names_pass_everywhere(name):
    assert check_variant_name(name) == name
    assert named_specs([f"{name}=ucb"], "--variant", "A=fixed:16") == {name: "ucb"}
    assert ABRouter({name: 1.0}).variants == (name,)


@pytest.mark.parametrize("name", BAD)
def test_bad_names_are_one_line_everywhere(name):
    for call in (
        lambda: check_variant_name(name),
        lambda: ABRouter({name: 1.0}),
        lambda: SharedState(MemoryBackend(), "r1").claim(name or "\x00"),
    ):
        with pytest.raises(AdaptspecError) as e:
            call()
        msg = str(e.value)
        assert "use 1-32 letters, digits or _.-" in msg and "\n" not in msg and len(msg) < 200, msg
    if name and name == name.strip():  # NAME=SPEC pieces (spaces around a name are dropped; empty: malformed)
        with pytest.raises(AdaptspecError, match="use 1-32 letters"):
            named_specs([f"{name}=ucb"], "--variant", "A=fixed:16")


@pytest.mark.parametrize("name", [None, 5, b"A"])
def test_a_name_that_is_not_a_string_is_refused(name):
    with pytest.raises(AdaptspecError, match="variant name"):
        check_variant_name(name)


def test_simulate_ab_names_are_checked_too():
    with pytest.raises(AdaptspecError, match="'\\.\\.'"):
        parse_ab_specs("..=fixed:4,B=ucb")


@pytest.mark.integration
@pytest.mark.parametrize("variant", ["..=ucb", ".=ucb", "a/b=ucb", "-x=ucb", "A" * 200 + "=ucb"])
def test_serve_refuses_a_path_as_a_variant_name_and_writes_nothing(tmp_path, variant):
    ck, log = tmp_path / "run" / "ck", tmp_path / "run" / "log"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "adaptspec",
            "serve",
            "--tiny",
            f"--variant={variant}",
            "--checkpoint-dir",
            str(ck),
            "--log-dir",
            str(log),
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "use 1-32 letters" in lines[0], p.stderr
    assert os.listdir(tmp_path) == []  # no checkpoint folder, inside or outside DIR
