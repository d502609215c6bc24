"""Issue 30, items 11-12: refusals come early (before a model loads or anything is created),
say what is wrong in one line, and a checkpoint is loaded as tensors only.

Each case is one command a careless user could type; the expected line names the flag, file
or setting at fault, and the folder the command was pointed at is left as it was.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from adaptspec.cli import main
from adaptspec.errors import AdaptspecError

ROOT = Path(__file__).resolve().parents[1]


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def _refused(capsys, argv: list[str], needle: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert needle in err, err
    return err


@pytest.fixture
def notes(tmp_path) -> Path:
    d = tmp_path / "notes"
    d.mkdir()
    (d / "todo.txt").write_text("a user's notes\n")
    return d


# ---------------------------------------------------------------------- serve
def test_serve_refuses_a_log_dir_of_other_files(tmp_path, notes, capsys):
    before = _snapshot(tmp_path)
    _refused(
        capsys, ["serve", "--tiny", "--log-dir", str(notes)], "is not a decision log: refusing to log into it"
    )
    (notes / "part-00000000000000000001-1-000000.parquet").write_bytes(b"")  # a log's part beside the notes
    _refused(
        capsys,
        ["serve", "--tiny", "--log-dir", str(notes)],
        "holds todo.txt, which is not part of a decision log",
    )
    (notes / "part-00000000000000000001-1-000000.parquet").unlink()
    assert _snapshot(tmp_path) == before


def test_a_log_dir_of_what_log_writers_write_is_accepted(tmp_path):
    from adaptspec.cli._types import log_dir

    d = tmp_path / "log"
    d.mkdir()
    for name in (
        "part-00000000000000000001-7-000000.parquet",
        ".journal-default-00000001.jsonl",
        ".writer-default.lock",
        ".part-00000000000000000002-7-000001.parquet.tmp",
    ):
        (d / name).write_bytes(b"")
    assert log_dir(str(d)) == d
    assert log_dir(str(tmp_path / "new" / "log")) == tmp_path / "new" / "log"
    (d / "sub").mkdir()
    with pytest.raises(argparse.ArgumentTypeError, match="holds sub, which is not part of a decision log"):
        log_dir(str(d))


def test_serve_on_a_port_in_use_is_one_line_and_creates_nothing(tmp_path, capsys):
    pytest.importorskip("uvicorn")  # the serve extra; without it serve says so in one line
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        _refused(
            capsys,
            [
                "serve",
                "--tiny",
                "--port",
                str(port),
                "--log-dir",
                str(tmp_path / "log"),
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
            ],
            f"--port {port}: cannot listen on 127.0.0.1:{port}",
        )
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- a FIFO where a file belongs
@pytest.mark.slow  # a fresh interpreter per case (~6 s): a hang must not hang the test session
@pytest.mark.parametrize("name", ["meta.json", "requests.parquet"])
def test_a_fifo_in_a_trace_set_is_refused_not_read(tmp_path, capsys, name):
    ts = tmp_path / "T"
    assert main(["synth", "--out", str(ts), "--requests", "10", "--summary-only"]) == 0
    (ts / name).unlink()
    os.mkfifo(ts / name)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "adaptspec", "simulate", str(ts), "--policy", "random"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )  # before the fix: it hung here
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"{ts / name}: not a regular file" in p.stderr


# ---------------------------------------------------------------------- train-drafter
def _corpus(path: Path) -> Path:
    """An empty distillation corpus, described as `adaptspec distill` describes one."""
    from adaptspec.models.corpus import FORMAT

    path.mkdir()
    (path / "corpus.json").write_text(
        json.dumps(
            {
                "format": FORMAT,
                "target": "smollm2-135m-instruct",
                "max_new_tokens": 256,
                "max_prompt_tokens": 384,
                "prompts_per_shard": 32,
            }
        )
    )
    return path


def test_train_drafter_eval_dense_default_is_the_checkouts_not_the_working_directorys(tmp_path, monkeypatch):
    from adaptspec.cli.train_drafter import _eval_dense

    monkeypatch.chdir(tmp_path)
    got = _eval_dense(argparse.Namespace(eval_dense=None, stage="train"))
    assert got == ROOT / "datasets" / "dense" / "benchmarks-fast"


def test_train_drafter_checks_eval_dense_before_creating_work(tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus")
    work = tmp_path / "work"
    _refused(
        capsys,
        [
            "train-drafter",
            "--corpus",
            str(corpus),
            "--work",
            str(work),
            "--eval-dense",
            str(tmp_path / "nope"),
        ],
        f"--eval-dense {tmp_path / 'nope'}: no such dense trace set",
    )
    assert not work.exists()


def test_train_drafter_work_that_is_a_file(tmp_path, capsys):
    (tmp_path / "afile").write_text("x\n")
    _refused(
        capsys,
        ["train-drafter", "--work", str(tmp_path / "afile"), "--stage", "train"],
        "--work " + str(tmp_path / "afile") + ": exists and is not a directory",
    )


# ---------------------------------------------------------------------- collect --dense, demo: before the model
def test_collect_dense_into_a_foreign_folder_is_refused_before_the_model(tmp_path, notes, capsys):
    before = _snapshot(tmp_path)
    _refused(
        capsys,
        ["collect", "--dense", "--out", str(notes), "--limit", "1"],
        f"{notes}: exists and is not a dense trace set",
    )
    _refused(
        capsys,
        ["collect", "--dense", "--out", str(tmp_path / "new"), "--arms", "1"],
        "--dense needs a block size >= 2",
    )
    assert _snapshot(tmp_path) == before


def test_collect_dense_resume_with_other_settings_names_them(tmp_path, capsys):
    from adaptspec.traces.dense import DenseTraceSet

    out = tmp_path / "dense"
    # what `collect --dense --arms 1,16 --max-new-tokens 96` writes (its defaults otherwise)
    DenseTraceSet.create(
        out,
        {
            "max_new_tokens": 96,
            "max_block_size": 16,
            "verification": "fast",
            "target": "smollm2-135m-instruct",
            "drafter": "bundled",
            "dtype": "bfloat16",
            "device": "cpu",
            "features": "last:-1,mean:mid,len",
        },
    )
    before = _snapshot(tmp_path)
    err = _refused(
        capsys,
        ["collect", "--dense", "--out", str(out), "--arms", "1,8", "--max-new-tokens", "64"],
        "a dense trace set made with other settings",
    )
    assert "max_new_tokens 96, now 64" in err and "max_block_size 16, now 8" in err
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("nope", "unknown policy 'nope'"),
        ("ucb:zz=1", "unknown option 'zz'"),
        ("ucb:c=x", "ucb: c must be a number, got 'x'"),
    ],
)
def test_demo_checks_the_policy_spec_before_the_model(capsys, monkeypatch, spec, needle):
    import adaptspec.models as models

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the spec was checked")

    monkeypatch.setattr(models, "load_speculator", no_model)
    _refused(capsys, ["demo", "--policy", spec], needle)


# ---------------------------------------------------------------------- clearer messages
@pytest.mark.parametrize(
    "argv,needle",
    [
        (["traces", "info"], "a trace set also needs meta.json"),
        (["simulate"], "a trace set needs meta.json"),
        (
            ["ope", "--policy", "fixed:4"],
            "holds a trace set's requests.parquet/outcomes.parquet (without its meta.json)",
        ),
        (["ab-report"], "holds a trace set's requests.parquet/outcomes.parquet (without its meta.json)"),
    ],
)
def test_a_trace_set_without_meta_json_says_so(tmp_path, capsys, argv, needle):
    ts = tmp_path / "T"
    assert main(["synth", "--out", str(ts), "--requests", "10", "--summary-only"]) == 0
    (ts / "meta.json").unlink()
    err = _refused(
        capsys,
        [argv[0], *argv[1:2], str(ts), *argv[2:]] if argv[0] == "traces" else [argv[0], str(ts), *argv[1:]],
        needle,
    )
    assert "decision_id" not in err


@pytest.mark.slow  # builds and saves a reference-shaped drafter (~10 s)
def test_a_drafter_missing_its_draft_vocab_tensor_reads_clearly(tmp_path):
    from safetensors.torch import load_file, save_file

    from adaptspec.decoding import dflash_format
    from adaptspec.decoding.drafter import BlockDiffusionDrafter
    from test_dflash_export import reference_shaped

    dflash_format.save(reference_shaped(draft_vocab=list(range(0, 256, 4))), tmp_path, dtype=torch.float32)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["draft_vocab"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        AdaptspecError, match="model.safetensors has no draft_vocab tensor but config.json sets"
    ):
        BlockDiffusionDrafter.from_pretrained(tmp_path)


# ---------------------------------------------------------------------- item 11: tensors only
class _Hostile:
    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __reduce__(self):
        return (Path.touch, (self.flag,))  # what loading it would run


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    from adaptspec.models.train_drafter import load_state

    flag = tmp_path / "ran"
    torch.save({"model": {}, "step": 1, "x": _Hostile(flag)}, tmp_path / "state.pt")
    assert not flag.exists()
    with pytest.raises(AdaptspecError, match="objects other than tensors and plain values; refused"):
        load_state(tmp_path / "state.pt")
    assert not flag.exists()
    torch.load(tmp_path / "state.pt", weights_only=False)  # the file is hostile: a full unpickle runs it
    assert flag.exists()
    (tmp_path / "cut.pt").write_bytes((tmp_path / "state.pt").read_bytes()[:40])
    with pytest.raises(AdaptspecError, match="cut.pt: not a readable training checkpoint"):
        load_state(tmp_path / "cut.pt")


def test_a_training_checkpoint_loads_as_it_was_saved(tmp_path):
    from adaptspec.models.train_drafter import load_state

    rng = np.random.default_rng(3)
    rng.random(5)
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(lin.parameters(), betas=(0.9, 0.95))
    lin(torch.ones(1, 3)).sum().backward()
    opt.step()
    st = {
        "model": lin.state_dict(),
        "opt": opt.state_dict(),
        "step": 7,
        "rng": rng.bit_generator.state,
        "draft_vocab": torch.arange(0, 256, 4),
        "cfg": {"num_layers": 2, "gamma": None, "extra": {"steps_before": 3}},
    }
    torch.save(st, tmp_path / "state.pt")
    back = load_state(tmp_path / "state.pt")
    assert back["step"] == 7 and back["cfg"] == st["cfg"] and back["rng"] == st["rng"]
    assert all(torch.equal(back["model"][k], v) for k, v in st["model"].items())
    assert torch.equal(back["draft_vocab"], st["draft_vocab"])
    again = np.random.default_rng(0)
    again.bit_generator.state = back["rng"]
    assert again.random() == rng.random()  # the generator resumes where it was


def test_no_torch_load_in_the_package_without_weights_only():
    import re

    calls = [
        (p, m.group(0))
        for p in (ROOT / "adaptspec").rglob("*.py")
        for m in re.finditer(r"torch\.load\([^)]*\)", p.read_text())
    ]
    assert calls, "the checkpoint loader was not found: update this test"
    assert all("weights_only=True" in c for _, c in calls), calls
