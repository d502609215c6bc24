"""The replace rule (issue 30, items 1-2): a writer replaces only what adaptspec wrote there, and
nothing else in the folder; a user's file planted next to any ``--force`` / ``--overwrite`` /
``--docs`` target survives every command.

Every writer of the command line that takes one of those flags is in :data:`WRITERS` (grep
``force``/``overwrite``/``docs`` in ``adaptspec/cli/``: synth, import-blockpilot, collect,
traces derive, train-head, simulate --log; evaluate --docs has its own tests below). Each is
run in-process on a folder planted three ways, and the folder must come out byte-for-byte as
it went in. Expected outcomes come from the rule as the issue states it, not from the code.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from adaptspec._util.outputs import MARKER, check_output, write_dir
from adaptspec.cli import main
from adaptspec.errors import AdaptspecError
from adaptspec.traces.dense import DenseRequest, DenseTraceSet

ROOT = Path(__file__).resolve().parents[1]
USER_TEXT = "a user's data: nothing may delete it\n"


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def _dense(path: Path, n: int = 4) -> Path:
    """A small dense trace set (every draft rejected: a valid, simple set)."""
    ds = DenseTraceSet.create(path, {"max_new_tokens": 13, "max_block_size": 4})
    ds.write_part(
        [
            (
                f"r{i}",
                "gsm8k",
                DenseRequest(
                    np.arange(13),
                    np.zeros((12, 3), np.uint8),
                    np.full((12, 3), 0.5, np.float32),
                    np.zeros((12, 3), np.float32),
                    np.zeros(2, np.float32),
                    5,
                    "length",
                ),
            )
            for i in range(n)
        ]
    )
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """Inputs every writer reads: a trace set with features, a dense set, a BlockPilot folder."""
    from test_cli_sim import write_bp

    w = tmp_path_factory.mktemp("inputs")
    assert main(["synth", "--out", str(w / "ts"), "--requests", "40", "--summary-only"]) == 0
    _dense(w / "dense")
    write_bp(w / "bp", n=6)
    return w


# name -> (argv given the output path and the inputs, kind of artefact, the replace flag, a positive run is cheap)
WRITERS = {
    "synth": (
        lambda out, w: ["synth", "--out", out, "--requests", "12", "--summary-only"],
        "traceset",
        "--force",
        True,
    ),
    "import-blockpilot": (
        lambda out, w: ["import-blockpilot", str(w / "bp"), "--out", out],
        "traceset",
        "--force",
        True,
    ),
    "collect": (lambda out, w: ["collect", "--out", out, "--limit", "1"], "traceset", "--force", False),
    "traces-derive": (
        lambda out, w: ["traces", "derive", str(w / "dense"), "--out", out, "--arms", "1,2,4"],
        "traceset",
        "--force",
        True,
    ),
    "train-head": (
        lambda out, w: ["train-head", str(w / "ts"), "--out", out, "--epochs", "2", "--hidden", "4"],
        "head",
        "--overwrite",
        True,
    ),
    "simulate-log": (
        lambda out, w: [
            "simulate",
            str(w / "ts"),
            "--policy",
            "fixed:4",
            "--log",
            out,
            "--steps",
            "20",
            "--seeds",
            "1",
            "--no-progress",
        ],
        "decision-log",
        "--force",
        True,
    ),
}

#: what makes a folder look like each kind to a careless rule (the issue's meta.json case, a head's config, a log part)
LOOKALIKE = {
    "traceset": {"meta.json": json.dumps({"schema_version": 1})},
    "head": {"config.json": json.dumps({"kind": "adaptspec-offline-head", "format": 1})},
    "decision-log": {"part-00000000000000000001-1-000000.parquet": "not really parquet"},
}


def _write_own(out: Path, kind: str) -> None:
    """An artefact of ``kind`` as adaptspec writes it (marker and all), without running a command."""
    files = {
        "traceset": ["meta.json", "requests.parquet", "outcomes.parquet"],
        "head": ["config.json", "model.safetensors"],
        "decision-log": ["part-00000000000000000001-1-000000.parquet"],
    }[kind]
    write_dir(
        out, kind, False, lambda tmp: [(tmp / f).write_text(LOOKALIKE[kind].get(f, "x")) for f in files]
    )


@pytest.mark.parametrize(
    "planted", ["lookalike-plus-user-file", "own-artefact-plus-user-file", "user-folder"]
)
@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_user_file_next_to_the_target_survives_force(tmp_path, world, capsys, name, planted):
    argv, kind, flag, _ = WRITERS[name]
    out = tmp_path / "out"
    if planted == "lookalike-plus-user-file":
        out.mkdir()
        for f, text in LOOKALIKE[kind].items():
            (out / f).write_text(text)
    elif planted == "own-artefact-plus-user-file":
        _write_own(out, kind)
    else:
        out.mkdir()
    (out / "important.csv").write_text(USER_TEXT)
    before = _snapshot(tmp_path)
    assert main([*argv(str(out), world), flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to replace it" in err, err
    assert _snapshot(tmp_path) == before
    assert (out / "important.csv").read_text() == USER_TEXT


@pytest.mark.parametrize("name", sorted(n for n, w in WRITERS.items() if w[3]))
def test_force_replaces_what_the_command_wrote_and_nothing_beside_it(tmp_path, world, capsys, name):
    argv, kind, flag, _ = WRITERS[name]
    out = tmp_path / "out"
    (tmp_path / "important.csv").write_text(USER_TEXT)  # beside the target, not in it
    assert main(argv(str(out), world)) == 0
    first = json.loads((out / MARKER).read_text())
    assert first["kind"] == kind and first["written_by"] == "adaptspec"
    assert sorted(first["files"]) == sorted(
        str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != MARKER
    )
    assert main(argv(str(out), world)) == 2  # without the flag: refused
    assert f"pass {flag}" in capsys.readouterr().err
    assert main([*argv(str(out), world), flag]) == 0
    assert (tmp_path / "important.csv").read_text() == USER_TEXT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["important.csv", "out"]  # no temporary left behind


def test_the_issue_reproduction_keeps_important_csv(tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    (d / "meta.json").write_text("{}")
    (d / "important.csv").write_text("x\n")
    assert main(["synth", "--out", str(d), "--requests", "10", "--force"]) == 2
    assert (d / "important.csv").read_text() == "x\n" and (d / "meta.json").read_text() == "{}"


@pytest.mark.parametrize("target", ["same", "inside", "around"])
def test_traces_derive_never_writes_over_its_own_dense_set(tmp_path, capsys, target):
    dense = _dense(tmp_path / "D")
    out = {"same": dense, "inside": dense / "sub", "around": tmp_path}[target]
    before = _snapshot(tmp_path)
    assert main(["traces", "derive", str(dense), "--out", str(out), "--arms", "1,2,4", "--force"]) == 2
    assert "overlaps this command's own input" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before
    assert len(DenseTraceSet.open(dense).request_ids()) == 4


# ---------------------------------------------------------------------- artefacts from before the marker
BUNDLED = (
    [("traceset", ROOT / "adaptspec/data/traces" / n) for n in ("benchmarks", "sampled-t1", "templates")]
    + [
        ("head", ROOT / "adaptspec/models/weights" / n)
        for n in ("smollm2-135m-head", "smollm2-135m-head-templates")
    ]
    + [("drafter", ROOT / "adaptspec/models/weights/smollm2-135m-drafter")]
)


@pytest.mark.parametrize("kind,src", BUNDLED, ids=[p.name for _, p in BUNDLED])
def test_bundled_artefacts_stay_replaceable_but_not_with_a_stranger_inside(tmp_path, kind, src):
    """benchmarks/refresh_bundled.sh rewrites these with --force / --overwrite: a copy (no
    marker) is replaceable; with any other file in it, it is not."""
    copy = tmp_path / src.name
    shutil.copytree(src, copy)
    (copy / MARKER).unlink(missing_ok=True)
    check_output(copy, kind, replace=True)
    (copy / "notes.txt").write_text(USER_TEXT)
    with pytest.raises(AdaptspecError, match="holds notes.txt, which adaptspec did not write"):
        check_output(copy, kind, replace=True)


def test_the_refresh_script_replaces_the_bundled_artefacts_with_the_flags():
    lines = (ROOT / "benchmarks/refresh_bundled.sh").read_text().replace("\\\n", " ").splitlines()
    command = {
        w: next(ln for ln in lines if ln.startswith(w))
        for w in ("adaptspec traces derive", "adaptspec train-head", "python benchmarks/evaluate.py")
    }
    assert "--out adaptspec/data/traces/benchmarks" in command["adaptspec traces derive"]
    assert "--force" in command["adaptspec traces derive"].split()
    assert "--out adaptspec/models/weights/smollm2-135m-head --overwrite" in command["adaptspec train-head"]
    assert "--force" in command["python benchmarks/evaluate.py"].split()


# ---------------------------------------------------------------------- the rule itself
def test_a_file_planted_while_the_writer_works_is_not_swept_away(tmp_path):
    out = tmp_path / "out"
    _write_own(out, "traceset")

    def write(tmp: Path) -> None:
        (tmp / "meta.json").write_text("{}")
        (out / "late.txt").write_text(USER_TEXT)  # the user saves a file meanwhile

    with pytest.raises(AdaptspecError, match="holds late.txt"):
        write_dir(out, "traceset", True, write)
    assert (out / "late.txt").read_text() == USER_TEXT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the temporary directory is gone


def test_a_marker_of_another_kind_or_a_symlink_is_refused(tmp_path):
    _write_own(tmp_path / "head", "head")
    with pytest.raises(AdaptspecError, match="is not an adaptspec trace set"):
        check_output(tmp_path / "head", "traceset", replace=True)
    _write_own(tmp_path / "real", "traceset")
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(AdaptspecError, match="symbolic link"):
        check_output(tmp_path / "link", "traceset", replace=True)


def test_a_subfolder_counts_as_a_stranger(tmp_path):
    _write_own(tmp_path / "ts", "traceset")
    (tmp_path / "ts" / "mine").mkdir()
    with pytest.raises(AdaptspecError, match="holds mine, which adaptspec did not write"):
        check_output(tmp_path / "ts", "traceset", replace=True)


# ---------------------------------------------------------------------- evaluate --docs
def _docs_with_an_earlier_report(d: Path) -> None:
    """What an earlier run left (its generated-by lines; results.json in the format it reads)."""
    (d / "evaluation").mkdir(parents=True)
    (d / "evaluation" / "results.json").write_text(json.dumps({"format": 1, "runs": {}, "sections": {}}))
    (d / "evaluation.md").write_text(
        "# Evaluation\n\n<!-- generated by `python benchmarks/evaluate.py` (= "
        "`adaptspec evaluate`); do not edit by hand -->\n"
    )
    (d / "evaluation_headline.md").write_text(
        "<!-- generated by `python benchmarks/evaluate.py`; section 1 has not been run -->\n"
    )


@pytest.mark.parametrize(
    "planted", ["user-report", "user-headline", "user-file-in-figures", "user-figures-file"]
)
def test_evaluate_never_replaces_a_file_it_did_not_write(tmp_path, capsys, planted):
    d = tmp_path / "docs"
    _docs_with_an_earlier_report(d)
    target = {
        "user-report": d / "evaluation.md",
        "user-headline": d / "evaluation_headline.md",
        "user-file-in-figures": d / "evaluation" / "mine.txt",
        "user-figures-file": None,
    }[planted]
    if target is None:
        shutil.rmtree(d / "evaluation")
        (d / "evaluation").write_text(USER_TEXT)
    else:
        target.write_text(USER_TEXT)
    before = _snapshot(tmp_path)
    assert main(["evaluate", "--docs", str(d), "--render-only", "--force"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to" in err and "adaptspec evaluate" in err.split("error:")[1], (
        err
    )
    assert _snapshot(tmp_path) == before


def test_evaluate_replaces_its_own_report_only_when_asked(tmp_path, capsys):
    d = tmp_path / "docs"
    _docs_with_an_earlier_report(d)
    (d / "notes.md").write_text(USER_TEXT)  # the user's file beside the report
    before = _snapshot(tmp_path)
    assert main(["evaluate", "--docs", str(d), "--render-only"]) == 2
    assert "pass --force to replace the evaluation report" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before
    assert main(["evaluate", "--docs", str(d), "--render-only", "--force"]) == 0
    assert (d / "notes.md").read_text() == USER_TEXT
    assert (
        d / "evaluation.md"
    ).read_text() != before and "<!-- generated by `python benchmarks/evaluate.py`" in (
        d / "evaluation.md"
    ).read_text()
    assert main(["evaluate", "--docs", str(d), "--render-only", "--force"]) == 0  # its own output again


def test_evaluate_into_a_new_folder_needs_no_flag(tmp_path, capsys):
    d = tmp_path / "new"
    (d / "evaluation").mkdir(parents=True)
    (d / "evaluation" / "results.json").write_text(json.dumps({"format": 1, "runs": {}, "sections": {}}))
    assert (
        main(["evaluate", "--docs", str(d), "--render-only"]) == 2
    )  # results.json is an earlier run's output
    shutil.rmtree(d)
    assert main(["evaluate", "--docs", str(d), "--render-only"]) == 2
    assert "which does not exist" in capsys.readouterr().err
    assert not d.exists()


# ---------------------------------------------------------------------- simulate --plot
def test_a_plot_replaces_only_a_png_adaptspec_wrote(tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    photo = tmp_path / "photo.png"
    fig = plt.figure()
    fig.savefig(photo)  # a PNG, but the user's
    plt.close(fig)
    before = photo.read_bytes()
    argv = ["simulate", "--policy", "fixed:4", "--steps", "30", "--seeds", "1", "--no-progress", "--plot"]
    assert main([*argv, str(photo)]) == 2
    assert "photo.png exists and is not an adaptspec plot" in capsys.readouterr().err
    assert photo.read_bytes() == before
    ours = tmp_path / "ours.png"
    assert main([*argv, str(ours)]) == 0
    first = ours.read_bytes()
    assert b"Software\x00adaptspec" in first[:4096]
    assert main([*argv, str(ours)]) == 0  # its own plot again


# ---------------------------------------------------------------------- train-drafter --export
@pytest.mark.parametrize(
    "files",
    [
        ("config.json", "model.safetensors", "tokenizer.json"),  # a model folder
        ("config.json", "model.safetensors"),
    ],
)  # a published drafter: no card
def test_train_drafter_export_never_writes_over_a_folder_it_did_not_export(tmp_path, capsys, files):
    folder = tmp_path / "model"
    folder.mkdir()
    for f in files:
        (folder / f).write_text(USER_TEXT)
    before = _snapshot(tmp_path)
    assert (
        main(["train-drafter", "--stage", "export", "--export", str(folder), "--work", str(tmp_path / "w")])
        == 2
    )
    assert "is not an adaptspec exported drafter: refusing to replace it" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before


def test_checkpoints_never_delete_a_users_file(tmp_path):
    from adaptspec.control.policy_checkpoint import checkpoints, write_checkpoint
    from adaptspec.policies import UCB

    root = tmp_path / "ckpt"
    first = write_checkpoint(root, UCB([1, 2, 4]), {"updates": 1}, keep=1)
    (first / "notes.txt").write_text("mine")
    write_checkpoint(root, UCB([1, 2, 4]), {"updates": 2}, keep=1)  # prunes the oldest: not this one
    write_checkpoint(root, UCB([1, 2, 4]), {"updates": 3}, keep=1)
    assert (first / "notes.txt").read_text() == "mine"
    assert [p.name for p in checkpoints(root)] == [first.name, "ckpt-000000000003"]  # ckpt 2 pruned
    (root / "ckpt-000000000003" / "keep.me").write_text("x")
    with pytest.raises(AdaptspecError, match="did not write"):  # the same count again: refused
        write_checkpoint(root, UCB([1, 2, 4]), {"updates": 3}, keep=1)
    assert (root / "ckpt-000000000003" / "keep.me").read_text() == "x"
