"""A drafter built or trained by adaptspec is saved in the published DFlash v1 layout.

Expected values come from outside the code under test: the original module's own draft
logits (a round trip must reproduce them), and the layout written by the DFlash reference
implementation (``tests/data/dflash-reference-tiny/drafter``, see ``tests/data/README.md``):
its tensor names and shapes and its ``config.json`` fields.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from adaptspec.cli import main
from adaptspec.decoding import BlockDiffusionDrafter, dflash_format
from adaptspec.errors import AdaptspecError

torch.set_num_threads(1)

REFERENCE = Path(__file__).resolve().parent / "data" / "dflash-reference-tiny"
# config.json keys the reference writes that save() leaves out: the reference's remote-code
# hook (adaptspec ships no DFlash code), the writer's version, token ids a drafter does not use,
# and the init scale of training (no effect on a trained drafter)
NOT_WRITTEN = {"auto_map", "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id"}
DIFFERENT_VALUE = {"initializer_range"}

_TARGET: list = []


def target():
    if not _TARGET:
        _TARGET.append(AutoModelForCausalLM.from_pretrained(REFERENCE / "target", dtype=torch.float32).eval())
    return _TARGET[0]


def reference_shaped(draft_vocab=None, seed=0, **kw) -> BlockDiffusionDrafter:
    """A DFlash-layout drafter of the reference fixture's shape, every weight randomised (so that
    a swapped or misplaced tensor changes the drafts; fresh norms are all ones)."""
    d = BlockDiffusionDrafter.for_target(
        target(),
        num_layers=2,
        target_layers=[2, 4, 5],
        max_block_size=16,
        layout="dflash",
        mask_token_id=255,
        draft_vocab=draft_vocab,
        seed=seed,
        **kw,
    )
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return d.eval()


def logits(d: BlockDiffusionDrafter, seed=0, block=16) -> torch.Tensor:
    ctx = torch.randn(9, d.context_width, generator=torch.Generator().manual_seed(seed))
    return d.draft_logits(d.new_state(ctx), 3, block)


# ---------------------------------------------------------------------- round trip
def test_float32_round_trip_gives_identical_draft_logits(tmp_path):
    d = reference_shaped()
    dflash_format.save(d, tmp_path, dtype=torch.float32)
    again = BlockDiffusionDrafter.from_pretrained(tmp_path, target=target(), dtype=torch.float32)
    assert again.config.qk_norm and again.config.mask_token_id == 255 and again.mask_embedding is None
    for k, v in d.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k
    for seed, block in [(0, 16), (1, 5), (2, 2)]:
        assert torch.equal(logits(again, seed, block), logits(d, seed, block))


def test_bfloat16_round_trip_gives_identical_draft_logits(tmp_path):
    d = reference_shaped()
    dflash_format.save(d, tmp_path)  # bfloat16 by default, as published drafters are
    assert {v.dtype for v in load_file(str(tmp_path / "model.safetensors")).values()} == {torch.bfloat16}
    again = BlockDiffusionDrafter.from_pretrained(tmp_path, target=target(), dtype=torch.bfloat16)
    d.to(torch.bfloat16)
    assert torch.equal(logits(again), logits(d))


def test_the_written_tensors_are_those_the_reference_writes(tmp_path):
    dflash_format.save(reference_shaped(), tmp_path, dtype=torch.float32)
    mine = {k: tuple(v.shape) for k, v in load_file(str(tmp_path / "model.safetensors")).items()}
    ref = {k: tuple(v.shape) for k, v in load_file(str(REFERENCE / "drafter" / "model.safetensors")).items()}
    assert mine == ref
    own = set(reference_shaped().state_dict())
    for name in mine:
        assert dflash_format.to_adaptspec_names(name) in own
        assert dflash_format.to_dflash_names(dflash_format.to_adaptspec_names(name)) == name


def test_the_written_config_carries_the_reference_fields(tmp_path):
    dflash_format.save(reference_shaped(), tmp_path, dtype=torch.float32)
    mine = json.loads((tmp_path / "config.json").read_text())
    ref = json.loads((REFERENCE / "drafter" / "config.json").read_text())
    assert dflash_format.is_dflash_dir(tmp_path)
    for key, value in ref.items():
        if key in NOT_WRITTEN:
            assert key not in mine, key
        elif key not in DIFFERENT_VALUE:
            assert mine[key] == value, key
    assert mine["torch_dtype"] == "float32"
    # read back as the reference's own config is
    a = dataclasses.asdict(dflash_format.read_config(mine))
    b = dataclasses.asdict(dflash_format.read_config(ref))
    a.pop("target_name"), b.pop("target_name")
    assert a == b


# ---------------------------------------------------------------------- refusals
def _learned_mask():
    return BlockDiffusionDrafter.for_target(target(), num_layers=1, target_layers=[2, 4, 5], seed=0)


def _no_qk_norm():  # the target's mask embedding, adaptspec layout (no q/k norm)
    return BlockDiffusionDrafter.for_target(
        target(), num_layers=1, target_layers=[2, 4, 5], mask_token_id=255, seed=0
    )


def _layer_norm():
    c = dataclasses.replace(reference_shaped().config, normalize_context_layers=True)
    return BlockDiffusionDrafter(c)


def _no_depth():
    return BlockDiffusionDrafter(dataclasses.replace(reference_shaped().config, num_target_layers=None))


def _embedding_tap():
    return BlockDiffusionDrafter(dataclasses.replace(reference_shaped().config, target_layers=[0, 4, 5]))


@pytest.mark.parametrize(
    "make, word",
    [
        (_learned_mask, "mask_token_id None"),
        (_no_qk_norm, "qk_norm"),
        (_layer_norm, "normalize_context_layers"),
        (_no_depth, "num_target_layers"),
        (_embedding_tap, "target_layers"),
    ],
    ids=["learned_mask", "no_qk_norm", "normalize_context_layers", "no_depth", "embedding_tap"],
)
def test_an_architecture_the_layout_cannot_express_is_refused_with_one_line(tmp_path, make, word):
    out = tmp_path / "out"
    with pytest.raises(AdaptspecError) as e:
        dflash_format.save(make(), out)
    assert word in str(e.value) and "DFlash v1" in str(e.value) and "\n" not in str(e.value)
    assert not out.exists()


def test_for_target_refuses_a_dflash_layout_it_cannot_build():
    with pytest.raises(AdaptspecError, match="normalize_context_layers"):
        BlockDiffusionDrafter.for_target(target(), layout="dflash", normalize_context_layers=True)
    with pytest.raises(AdaptspecError, match="embeddings"):
        BlockDiffusionDrafter.for_target(target(), layout="dflash", target_layers=[0, 3])
    with pytest.raises(AdaptspecError, match="layout 'eagle'"):
        BlockDiffusionDrafter.for_target(target(), layout="eagle")
    with pytest.raises(AdaptspecError, match="mask_token_id 256"):
        BlockDiffusionDrafter.for_target(target(), layout="dflash", mask_token_id=256)


def test_a_fresh_dflash_drafter_reads_the_mask_from_the_target():
    d = BlockDiffusionDrafter.for_target(target(), num_layers=1, layout="dflash", seed=0)
    # the fixture target has no pad token: the last id of its 256
    assert d.config.mask_token_id == 255 and d.config.qk_norm and d.config.num_target_layers == 6
    assert torch.equal(d.mask_vector(), target().get_input_embeddings().weight[255])


def test_saving_over_an_adaptspec_drafter_is_refused(tmp_path):
    _learned_mask().save_pretrained(tmp_path)
    with pytest.raises(AdaptspecError, match="drafter_config.json"):
        dflash_format.save(reference_shaped(), tmp_path)


# ---------------------------------------------------------------------- the draft-vocabulary extension
def test_a_reduced_draft_vocabulary_round_trips_as_the_documented_extension(tmp_path):
    vocab = sorted(torch.randperm(256, generator=torch.Generator().manual_seed(5))[:40].tolist())
    d = reference_shaped(draft_vocab=vocab)
    dflash_format.save(d, tmp_path, dtype=torch.float32)
    raw = json.loads((tmp_path / "config.json").read_text())
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert raw["adaptspec_draft_vocab_size"] == 40
    assert tensors["draft_vocab"].tolist() == vocab and tensors["draft_vocab"].dtype == torch.int64
    # besides the extension, every name is a DFlash v1 one, and no other key is adaptspec's
    assert {k for k in tensors if k != "draft_vocab"} == set(
        load_file(str(REFERENCE / "drafter" / "model.safetensors"))
    )
    assert [k for k in raw if "adaptspec" in k] == ["adaptspec_draft_vocab_size"]
    again = BlockDiffusionDrafter.from_pretrained(tmp_path, target=target())
    assert again.config.draft_vocab_size == 40 and again.draft_vocab.tolist() == vocab
    a, b = logits(d), logits(again)
    assert a.shape == (15, 40) and torch.equal(a, b)
    assert torch.equal(again.to_target_ids(b.argmax(-1)), torch.tensor(vocab)[a.argmax(-1)])


def test_a_full_vocabulary_drafter_writes_no_extension(tmp_path):
    dflash_format.save(reference_shaped(), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert not [k for k in raw if "adaptspec" in k]
    assert "draft_vocab" not in load_file(str(tmp_path / "model.safetensors"))
    assert BlockDiffusionDrafter.from_pretrained(tmp_path).draft_vocab is None


def test_a_half_written_extension_is_refused(tmp_path):
    dflash_format.save(reference_shaped(draft_vocab=list(range(0, 256, 4))), tmp_path, dtype=torch.float32)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.pop("adaptspec_draft_vocab_size")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(AdaptspecError, match="has a draft_vocab tensor but config.json does not set"):
        BlockDiffusionDrafter.from_pretrained(tmp_path)
    raw["adaptspec_draft_vocab_size"] = 64
    (tmp_path / "config.json").write_text(json.dumps(raw))
    tensors["draft_vocab"] = (
        tensors["draft_vocab"] + 4
    )  # its last id, 252, becomes 256: outside the vocabulary
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(AdaptspecError, match="outside 0..255"):
        BlockDiffusionDrafter.from_pretrained(tmp_path)


# ---------------------------------------------------------------------- training
def _shards(root: Path, n=6, length=24, width=3 * 64, seed=0) -> Path:
    rng = np.random.default_rng(seed)
    (root / "shards").mkdir(parents=True)
    np.savez(
        root / "shards" / "shard-00000.npz",
        lengths=np.full(n, length),
        prompt_lens=np.full(n, 6),
        tokens=rng.integers(0, 256, n * length),
        hidden=rng.standard_normal((n * length, width)).astype(np.float16),
        domains=np.array(["math"] * n),
    )
    return root


def test_training_in_the_dflash_layout_resumes_and_exports_it(tmp_path):
    from adaptspec.cli.train_drafter import _load_checkpoint
    from adaptspec.models.train_drafter import TrainConfig, export, load_state, train

    data = _shards(tmp_path / "train")
    cfg = TrainConfig(
        num_layers=1,
        layout="dflash",
        mask_token_id=7,
        block_size=4,
        draft_vocab_size=None,
        seqs_per_step=2,
        anchors_per_seq=2,
        max_seq_len=24,
        warmup_steps=1,
        total_steps=2,
        log_every=1,
    )
    d = train(target(), [data], [], tmp_path / "ckpt", cfg, log=lambda *a: None, target_layers=[2, 4, 5])
    assert d.config.qk_norm and d.config.mask_token_id == 7 and d.config.max_block_size == 4
    # resuming with the default layout still rebuilds the checkpoint's architecture
    lines: list[str] = []
    cfg2 = dataclasses.replace(cfg, layout="adaptspec", mask_token_id=None, block_size=16, total_steps=3)
    d2 = train(target(), [data], [], tmp_path / "ckpt", cfg2, log=lines.append, target_layers=[2, 4, 5])
    assert "resumed from step 2" in lines and any("layout dflash" in line for line in lines)
    # and trains at the checkpoint's block size, not the CLI's default of 16
    assert load_state(tmp_path / "ckpt" / "state.pt")["cfg"]["block_size"] == 4
    assert d2.config.qk_norm and d2.config.mask_token_id == 7 and d2.mask_embedding is None
    d3 = _load_checkpoint(target(), tmp_path / "ckpt", cfg2, [2, 4, 5])
    assert dataclasses.asdict(d3.config) == dataclasses.asdict(d2.config)
    assert export(d3, tmp_path / "out", {"steps": 3}) == "dflash"
    assert (
        dflash_format.is_dflash_dir(tmp_path / "out")
        and not (tmp_path / "out" / "drafter_config.json").exists()
    )
    again = BlockDiffusionDrafter.from_pretrained(tmp_path / "out", target=target(), dtype=torch.bfloat16)
    assert torch.equal(logits(again, block=4), logits(d3.to(torch.bfloat16), block=4))


def test_training_in_the_adaptspec_layout_still_exports_its_own_format(tmp_path):
    from adaptspec.models.train_drafter import TrainConfig, export, train

    cfg = TrainConfig(
        num_layers=1,
        block_size=4,
        max_block_size=8,
        draft_vocab_size=32,
        seqs_per_step=2,
        anchors_per_seq=2,
        max_seq_len=24,
        warmup_steps=1,
        total_steps=1,
        log_every=1,
    )
    d = train(
        target(),
        [_shards(tmp_path / "train")],
        [],
        tmp_path / "ckpt",
        cfg,
        log=lambda *a: None,
        target_layers=[2, 4, 5],
    )
    assert not d.config.qk_norm and d.mask_embedding is not None and d.config.max_block_size == 8
    assert export(d, tmp_path / "out") == "adaptspec"
    assert (tmp_path / "out" / "drafter_config.json").exists() and not (
        tmp_path / "out" / "config.json"
    ).exists()


def test_train_drafter_refuses_an_unknown_layout(capsys):
    assert main(["train-drafter", "--layout", "eagle"]) == 2
    assert "argument --layout: invalid choice: 'eagle'" in capsys.readouterr().err
