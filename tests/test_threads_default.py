"""Issue 38, item 19: on a busy machine the command line shortens OpenMP's spin before torch is
loaded; a setting of the user's own wins.

The subprocess cases run ``python -m adaptspec demo`` in a fresh interpreter with an import
hook that, at the first ``import torch``, prints the OpenMP variables as they are then and the
machine's load, and ends the process: what libgomp would read when torch loads it, with no
model loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptspec._util.threads import spin_count

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import os, sys

class AtTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("torch", os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"),
                  os.getloadavg()[0], flush=True)
            os._exit(0)
        return None

sys.meta_path.insert(0, AtTorch())
sys.argv = ["adaptspec", "demo", "--prompts", "1", "--max-new-tokens", "1"]
import runpy
runpy.run_module("adaptspec", run_name="__main__", alter_sys=True)
"""


def _at_torch(**env: str) -> tuple[str, str, float]:
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    r = subprocess.run(
        [sys.executable, "-c", CHILD],
        env={**base, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = [line.split() for line in r.stdout.splitlines() if line.startswith("torch ")]
    assert len(lines) == 1, (r.stdout, r.stderr)  # the command did reach torch
    _, spin, policy, load = lines[0]
    return spin, policy, float(load)


@pytest.mark.parametrize(
    "env, load, expected",
    [
        ({}, 0.0, None),  # idle cores: libgomp's own spin, which is fastest alone
        ({}, 0.49, None),
        (
            {},
            0.5,
            "10000",
        ),  # half a core's work already there: the short spin (BENCHMARKS.md, "Shared cores")
        ({}, 7.0, "10000"),
        ({"GOMP_SPINCOUNT": "300000"}, 7.0, None),  # the user's own value stays
        ({"GOMP_SPINCOUNT": "INFINITE"}, 7.0, None),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, 7.0, None),  # a spin count would override the policy's own
        ({"OMP_WAIT_POLICY": "ACTIVE"}, 0.0, None),
    ],
)
def test_the_rule(env, load, expected):
    assert spin_count(env, load) == expected


def test_the_cli_decides_before_torch_loads():
    spin, policy, load = _at_torch()
    assert policy == "None"
    # The load average moves slowly; near the threshold it may have crossed it since the start.
    if load >= 0.6:
        assert spin == "10000"
    elif load <= 0.4:
        assert spin == "None"
    else:
        assert spin in ("10000", "None")


@pytest.mark.parametrize(
    "env, seen",
    [
        ({"GOMP_SPINCOUNT": "300000"}, ("300000", "None")),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, ("None", "PASSIVE")),
    ],
)
def test_a_setting_of_the_users_own_reaches_torch_as_it_is(env, seen):
    assert _at_torch(**env)[:2] == seen
