"""Issue 38, items 16 and 18: nothing read from a user's folder runs code; nothing a server shows
tells where its files live or what the Redis password is.

- a river policy's state is data only: a checkpoint holding a pickle (a hostile one whose
  ``__reduce__`` would create a marker file) is refused with one line and the marker is never
  created, from the library, ``ab-report --checkpoint-dir`` and ``serve --checkpoint-dir``;
- ``/health`` shows checkpoint and log folders by their names, not their paths;
- a ``--shared`` URL's password never appears in a message.
"""

from __future__ import annotations

import builtins
import json
import pickle
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from _controller_helpers import FakeSpeculator
from _redis import free_port
from adaptspec.control.policy_checkpoint import latest_checkpoint, state_digest
from adaptspec.errors import AdaptspecError
from adaptspec.fleet.redis_backend import parse_url, redact
from adaptspec.policies.river_adapter import river_policy
from adaptspec.policies.spec import make_policy

ARMS = [1, 4, 8]
PRESETS = ["ucb", "eps-greedy", "ts", "exp3", "linucb", "random", "linear"]


class Hostile:
    """Unpickling this creates ``marker`` (an ``open(marker, "w")``): proof that a load ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


def hostile_river_state(path: Path, marker: Path, label: str = "river:ucb", arms=ARMS) -> None:
    """A policy.npz in the river adapter's former format: its state a pickle (here a hostile one)."""
    rng = make_policy("ucb", arms, seed=0).state_dict()["rng"]
    meta = {
        "name": "river",
        "label": label,
        "arms": list(arms),
        "version": 3,
        "dim": None,
        "rng": rng,
        "state": {"mode": "bandit", "pickle": {"__array__": "s/state/pickle"}},
    }
    with open(path, "wb") as f:
        np.savez(
            f,
            __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8),
            **{"s/state/pickle": np.frombuffer(pickle.dumps(Hostile(marker)), np.uint8)},
        )


def step(pol, x, rewards):
    ctx = x if pol.contextual else None
    d = pol.decide(ctx)
    pol.update(ctx, d.block_size, float(rewards[pol.arm_index(d.block_size)]))
    return d.block_size, d.propensity


# ----------------------------------------------------------------------------- the package's readers
def test_no_reader_in_the_package_can_unpickle():
    """Every np.load says allow_pickle=False, every torch.load weights_only=True, and nothing calls
    pickle.load(s) (read from the source, so a new reader is held to it too)."""
    import ast

    import adaptspec

    bad = []
    for path in sorted(Path(adaptspec.__file__).parent.rglob("*.py")):
        text = path.read_text()
        if not any(w in text for w in (".load(", ".loads(")):
            continue
        for node in ast.walk(ast.parse(text, str(path))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
            ):
                continue
            mod, fn = node.func.value.id, node.func.attr
            kw = {k.arg: k.value for k in node.keywords}
            where = f"{path.name}:{node.lineno}"
            if mod in ("np", "numpy") and fn == "load":
                ok = isinstance(kw.get("allow_pickle"), ast.Constant) and kw["allow_pickle"].value is False
                bad += [] if ok else [f"{where} np.load without allow_pickle=False"]
            elif mod == "torch" and fn == "load":
                ok = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
                bad += [] if ok else [f"{where} torch.load without weights_only=True"]
            elif mod in ("pickle", "cloudpickle", "dill", "marshal") and fn in ("load", "loads"):
                bad.append(f"{where} {mod}.{fn}")
    assert not bad, bad


# ----------------------------------------------------------------------------- river state: data only
@pytest.mark.parametrize("model", PRESETS)
def test_a_river_policy_resumes_exactly_from_its_data_only_state(model, tmp_path):
    """Second method: the policy that was never saved. Saved, loaded into a fresh one and both fed the
    same stream, they make the same decisions with the same propensities."""
    pol = river_policy(ARMS, model=model, seed=3)
    rng = np.random.default_rng(0)
    for _ in range(40):
        step(pol, rng.normal(size=3), rng.normal(size=3))
    pol.save_state(tmp_path / "policy.npz")
    with np.load(tmp_path / "policy.npz", allow_pickle=False) as z:  # every array plain numbers or text
        assert all(z[k].dtype.kind in "biufcU" for k in z.files)
    back = river_policy(ARMS, model=model, seed=3)
    back.load_state(tmp_path / "policy.npz")
    assert state_digest(back) == state_digest(pol)
    rng = np.random.default_rng(1)
    for _ in range(60):
        x, r = rng.normal(size=3), rng.normal(size=3)
        assert step(back, x, r) == step(pol, x, r)


def test_a_pickled_river_state_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    hostile_river_state(tmp_path / "policy.npz", marker)
    pol = river_policy(ARMS, model="ucb", seed=0)
    before = state_digest(pol)
    with pytest.raises(AdaptspecError) as e:
        pol.load_state(tmp_path / "policy.npz")
    assert "pickled river state" in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists() and state_digest(pol) == before


@pytest.mark.parametrize("spec", ["ucb", "ts"])
def test_a_pickled_array_in_any_policy_state_is_refused_and_runs_nothing(tmp_path, spec):
    marker = tmp_path / "pwned"
    pol = make_policy(spec, ARMS, seed=0)
    with open(tmp_path / "policy.npz", "wb") as f:
        np.savez(
            f,
            __meta__=np.frombuffer(b"{}", np.uint8),
            evil=np.array([Hostile(marker)], dtype=object),
            allow_pickle=True,
        )
    with pytest.raises(AdaptspecError):
        pol.load_state(tmp_path / "policy.npz")
    assert not marker.exists()


def _ucb_state() -> dict:
    pol = river_policy(ARMS, model="ucb", seed=0)
    for b, r in ((1, 1.0), (4, 0.0), (8, 2.0)):
        pol.update(None, b, r)
    return pol.state_dict()


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: {"obj": {}, "type": "os.system", "id": 0},  # a type the policy does not hold
        lambda m: {**m, "type": "builtins.object"},
        lambda m: {**m, "obj": {**m["obj"], "__class__": {"keep": True}}},  # dunder attributes
        lambda m: {
            **m,
            "obj": {**m["obj"], "_rng": {"random": [3, [1, 2], None]}},
        },  # not a generator's state
        lambda m: {**m, "obj": {**m["obj"], "_rewards": 5}},  # a number for a mapping
        lambda m: {**m, "obj": {**m["obj"], "_rewards": {"ref": 99}}},  # a reference to nothing
        lambda m: {
            **m,
            "obj": {**m["obj"], "_rewards": {"map": [[{"x": 1}, 1.0]], "id": 50}},
        },  # a key not plain
        lambda m: {**m, "obj": {**m["obj"], "reward_obj": {"map": [], "id": 51}}},  # a mapping for an object
        lambda m: {**m, "obj": {**m["obj"], "_n": {"call": "os.system"}}},  # an unknown entry
        lambda m: {"list": [m]},
        lambda m: [m],
        lambda m: "river",
    ],
)
def test_a_crafted_data_state_cannot_build_or_call_anything(tmp_path, edit):
    state = _ucb_state()
    state["state"]["model"] = edit(state["state"]["model"])
    pol = river_policy(ARMS, model="ucb", seed=0)
    before = state_digest(pol)
    with pytest.raises(AdaptspecError) as e:
        pol.load_state_dict(state)
    assert "\n" not in str(e.value) and state_digest(pol) == before


def cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "adaptspec", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


# ----------------------------------------------------------------------------- the Redis password
@pytest.mark.parametrize(
    "url",
    [
        "redis://admin:hunter2@127.0.0.1:99999/x",
        "redis://:hunter2@127.0.0.1:6379/",
        "redis://admin:hunter2@127.0.0.1:6379/a?b",
        "http://u:hunter2@h/x",
        "redis://u:hun/ter2@h/x",
        "redis://u:hunter2@[::1/x",
    ],
)
def test_a_bad_shared_url_never_shows_its_password(url):
    with pytest.raises(AdaptspecError) as e:
        parse_url(url)
    assert "hunter2" not in str(e.value) and "hun/ter2" not in str(e.value) and "***" in str(e.value)


def test_redact_keeps_the_user_and_host():
    assert redact("redis://admin:pw@10.0.0.5:6380/prod") == "redis://admin:***@10.0.0.5:6380/prod"
    assert redact("redis://10.0.0.5:6380/prod") == "redis://10.0.0.5:6380/prod"
    assert redact("redis://token@h/x") == "redis://***@h/x"


@pytest.mark.integration
@pytest.mark.parametrize(
    "url", ["redis://admin:hunter2@127.0.0.1:99999/fleet", "redis://admin:hunter2@127.0.0.1:{closed}/fleet"]
)
def test_serve_never_prints_the_redis_password(url):
    p = cli("serve", "--tiny", "--shared", url.format(closed=free_port()), "--port", str(free_port()))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "hunter2" not in p.stderr + p.stdout


# ----------------------------------------------------------------------------- /health and paths
@pytest.mark.integration
@pytest.mark.slow
def test_health_shows_folder_names_not_paths(tmp_path):
    from test_serving import Server, complete

    srv = Server(tmp_path, "--checkpoint-every", "1")
    srv.start()
    try:
        for i in range(3):
            complete(srv.url, {"prompt": [5, 6, 7 + i], "max_tokens": 4, "variant": "A"})
    finally:
        srv.stop()
    srv.start()  # resumes from a checkpoint
    try:
        text = httpx.get(srv.url + "/health", timeout=60).text
        resumed = json.loads(text)["variants"]["A"]["resumed"]
        assert resumed["checkpoint"].startswith("A/ckpt-"), resumed
        assert str(tmp_path) not in text and str(tmp_path.resolve()) not in text
    finally:
        srv.stop()


def _tamper(ck: Path, marker: Path) -> None:
    """Replace the newest checkpoint's policy.npz by a hostile pickle of the same policy and arms."""
    last = latest_checkpoint(ck)
    info = json.loads((last / "checkpoint.json").read_text())
    hostile_river_state(last / "policy.npz", marker, label=info["policy_label"], arms=info["arms"])


@pytest.mark.slow
def test_ab_report_reads_a_river_checkpoint_and_refuses_a_pickled_one(tmp_path, capsys):
    from adaptspec import AdaptiveController
    from adaptspec.cli import main

    spec = FakeSpeculator()
    log, ck, marker = tmp_path / "log", tmp_path / "ck", tmp_path / "pwned"
    a = AdaptiveController(spec, "river:ucb", variant="A", log_dir=log, checkpoint_dir=ck / "A", roll_rows=10)
    b = AdaptiveController(spec, "fixed:2", variant="B", log_dir=log, checkpoint_dir=ck / "B", roll_rows=10)
    for i in range(40):
        (a if i % 2 else b).generate([i % 13 + 1, i % 7 + 20, i], max_new_tokens=8)
    a.close(), b.close()
    argv = ["ab-report", str(log), "--checkpoint-dir", str(ck), "--json", "--bootstrap", "20"]
    assert main(argv) == 0  # the data-only river checkpoint is read back
    capsys.readouterr()
    _tamper(ck / "A", marker)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pickled river state" in err[0], err
    assert not marker.exists()


@pytest.mark.integration
@pytest.mark.slow
def test_serve_refuses_a_pickled_river_checkpoint_at_start(tmp_path):
    from test_serving import Server, complete

    srv = Server(tmp_path, "--checkpoint-every", "1")
    srv.args[srv.args.index("A=linucb")] = "A=river:ucb"
    srv.start()
    try:
        for i in range(3):
            complete(srv.url, {"prompt": [5, 6, 7 + i], "max_tokens": 4, "variant": "A"})
    finally:
        srv.stop()
    marker = tmp_path / "pwned"
    _tamper(srv.ck / "A", marker)
    p = subprocess.run(
        [sys.executable, "-m", "adaptspec", *srv.args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "pickled river state" in lines[0], p.stderr[-2000:]
    assert not marker.exists()
