"""The target and the DFlash drafter exported as vLLM's ``dflash`` method reads them, and the
bundled drafter re-laid into the DFlash architecture (runnable without vLLM; the load into vLLM
itself is tests_vllm/test_dflash_drafter_vllm.py).

Expected values: the DFlash reference's own drafter file (tests/data/dflash-reference-tiny, made
with z-lab/dflash), the target's own weight file read with safetensors, and vLLM's rule for a
reduced vocabulary written out here from its source (``DFlashQwen3ForCausalLM.compute_logits``:
draft row ``i`` scores target token ``i + d2t[i]``, every other token minus infinity).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from adaptspec.cli import main
from adaptspec.decoding import BlockDiffusionDrafter, dflash_format
from adaptspec.errors import AdaptspecError
from adaptspec.models.relayout import to_dflash_layout
from adaptspec.models.vllm_export import D2T, LM_HEAD, draft_vocab_of, export_drafter, export_target

torch.set_num_threads(1)

REFERENCE = Path(__file__).resolve().parent / "data" / "dflash-reference-tiny"


@pytest.fixture(scope="module")
def reference_target():
    return AutoModelForCausalLM.from_pretrained(REFERENCE / "target", dtype=torch.float32).eval()


def reduced_vocab_drafter(target, tmp_path: Path, vocab: list[int]) -> Path:
    torch.manual_seed(0)
    d = BlockDiffusionDrafter.for_target(
        target,
        num_layers=2,
        target_layers=[2, 4, 5],
        max_block_size=16,
        draft_vocab=vocab,
        layout="dflash",
        mask_token_id=255,
    )
    with torch.no_grad():
        for p in d.parameters():
            p.normal_(0, 0.1)
    path = tmp_path / "dflash"
    dflash_format.save(d, path, dtype=torch.float32)
    return path


def test_full_vocabulary_drafter_is_the_reference_file(tmp_path):
    out = export_drafter(REFERENCE / "drafter", REFERENCE / "target", tmp_path / "vllm", dtype=torch.float32)
    mine, ref = load_file(out / "model.safetensors"), load_file(REFERENCE / "drafter" / "model.safetensors")
    assert sorted(mine) == sorted(ref)
    assert all(torch.equal(mine[k], ref[k]) for k in ref)
    cfg = json.loads((out / "config.json").read_text())
    ref_cfg = json.loads((REFERENCE / "drafter" / "config.json").read_text())
    for key in (
        "architectures",
        "model_type",
        "block_size",
        "dflash_config",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "num_target_layers",
        "rms_norm_eps",
        "rope_theta",
        "layer_types",
    ):
        assert cfg[key] == ref_cfg[key], key
    assert "draft_vocab_size" not in cfg and dflash_format.DRAFT_VOCAB_KEY not in cfg
    assert draft_vocab_of(out) is None


def test_reduced_vocabulary_in_vllms_form(tmp_path, reference_target):
    vocab = [255, 3, 17, 200, 4, 99, 128, 0]  # any order: d2t maps each row to its own id
    src = reduced_vocab_drafter(reference_target, tmp_path, vocab)
    out = export_drafter(src, REFERENCE / "target", tmp_path / "vllm", dtype=torch.float32)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == len(vocab) and dflash_format.DRAFT_VOCAB_KEY not in cfg
    stored = load_file(out / "model.safetensors")
    assert dflash_format.DRAFT_VOCAB_TENSOR not in stored
    assert draft_vocab_of(out).tolist() == vocab
    target_file = load_file(REFERENCE / "target" / "model.safetensors")
    head = target_file.get("lm_head.weight", target_file["model.embed_tokens.weight"])
    assert torch.equal(stored[LM_HEAD], head[vocab])
    # every DFlash tensor is the one dflash_format wrote
    written = load_file(src / "model.safetensors")
    assert sorted(set(stored) - {LM_HEAD, D2T}) == sorted(set(written) - {dflash_format.DRAFT_VOCAB_TENSOR})
    assert all(torch.equal(stored[k], written[k]) for k in stored if k not in (LM_HEAD, D2T))
    # vLLM's rule for the draft logits gives adaptspec's drafts: same best token for any final state
    d = BlockDiffusionDrafter.from_pretrained(src, reference_target, dtype=torch.float32)
    h = torch.randn(32, cfg["hidden_size"])
    draft_logits = h @ stored[LM_HEAD].T
    full = torch.full((32, cfg["vocab_size"]), float("-inf"))
    full[:, torch.arange(len(vocab)) + stored[D2T]] = draft_logits
    mine = d.draft_vocab[(h @ d.lm_weight().T).argmax(-1)]
    assert torch.equal(full.argmax(-1), mine)


def test_export_drafter_refusals(tmp_path, reference_target):
    adaptspec_layout = tmp_path / "mine"
    BlockDiffusionDrafter.for_target(reference_target, num_layers=1).save_pretrained(adaptspec_layout)
    with pytest.raises(AdaptspecError, match="not a DFlash v1 drafter"):
        export_drafter(adaptspec_layout, REFERENCE / "target", tmp_path / "a")
    other = tmp_path / "other-target"
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=300,
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).save_pretrained(other)
    src = reduced_vocab_drafter(reference_target, tmp_path, [1, 2, 3])
    with pytest.raises(AdaptspecError, match="vocab_size 256, this target has 300"):
        export_drafter(src, other, tmp_path / "b")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(AdaptspecError, match="refusing to replace"):
        export_drafter(src, REFERENCE / "target", tmp_path / "taken", replace=True)
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_export_target_copies_the_model_and_replaces_only_its_own(tmp_path):
    out = export_target(tmp_path / "t", REFERENCE / "target")
    for name in ("config.json", "model.safetensors"):
        assert (out / name).read_bytes() == (REFERENCE / "target" / name).read_bytes()
    with pytest.raises(AdaptspecError, match="already exists"):
        export_target(out, REFERENCE / "target")
    export_target(out, REFERENCE / "target", replace=True)
    (out / "extra.bin").write_bytes(b"x")
    with pytest.raises(AdaptspecError, match="extra.bin"):
        export_target(out, REFERENCE / "target", replace=True)


def test_relayout_keeps_every_shared_tensor(reference_target):
    torch.manual_seed(1)
    src = BlockDiffusionDrafter.for_target(
        reference_target,
        num_layers=2,
        target_layers=[2, 4, 5],
        max_block_size=32,
        draft_vocab=list(range(0, 256, 4)),
    )
    with torch.no_grad():
        for p in src.parameters():
            p.normal_(0, 0.1)
    out, fresh = to_dflash_layout(src, reference_target, mask_token_id=7, max_block_size=16)
    assert fresh == [f"layers.{i}.{n}.weight" for i in (0, 1) for n in ("k_norm", "q_norm")]
    theirs, mine = src.state_dict(), out.state_dict()
    assert set(theirs) - set(mine) == {"mask_embedding"}
    assert all(torch.equal(theirs[k], mine[k]) for k in theirs if k != "mask_embedding")
    assert all(torch.equal(mine[k], torch.ones_like(mine[k])) for k in fresh)
    assert (
        out.config.qk_norm,
        out.config.mask_token_id,
        out.max_block_size,
        out.config.num_target_layers,
    ) == (True, 7, 16, 6)
    assert torch.equal(out.draft_vocab, src.draft_vocab)
    assert dflash_format.unsupported(out.config) is None  # it saves in the DFlash v1 layout
    # the mask is now the target's embedding of token 7
    assert torch.equal(out.mask_vector(), reference_target.get_input_embeddings().weight[7])


def test_relayout_refuses_normalised_context_layers(reference_target):
    src = BlockDiffusionDrafter.for_target(reference_target, num_layers=1, normalize_context_layers=True)
    with pytest.raises(AdaptspecError, match="normalize_context_layers"):
        to_dflash_layout(src, reference_target, mask_token_id=7)


def test_cli_export_vllm(tmp_path, capsys):
    assert (
        main(
            [
                "export-vllm",
                str(tmp_path / "out"),
                "--drafter",
                str(REFERENCE / "drafter"),
                "--target",
                str(REFERENCE / "target"),
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    said = capsys.readouterr().out
    assert '"method": "dflash"' in said and str(tmp_path / "out" / "drafter") in said
    assert (tmp_path / "out" / "target" / "model.safetensors").is_file()
    assert (
        load_file(tmp_path / "out" / "drafter" / "model.safetensors").keys()
        == load_file(REFERENCE / "drafter" / "model.safetensors").keys()
    )
    # again: refused without --force, with nothing changed; replaced with it
    assert (
        main(
            [
                "export-vllm",
                str(tmp_path / "out"),
                "--drafter",
                str(REFERENCE / "drafter"),
                "--target",
                str(REFERENCE / "target"),
            ]
        )
        == 2
    )
    assert "already exists" in capsys.readouterr().err
    assert (
        main(
            [
                "export-vllm",
                str(tmp_path / "out"),
                "--drafter",
                str(REFERENCE / "drafter"),
                "--target",
                str(REFERENCE / "target"),
                "--force",
            ]
        )
        == 0
    )


def exit_status(argv: list[str]) -> int:
    """``main(argv)``'s status, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--target", "somewhere"], "needs its own drafter"),
        (["--drafter", "no-such-dir"], "not a DFlash v1 drafter"),
        (["--dtype", "int8"], "invalid choice"),
    ],
)
def test_cli_export_vllm_bad_input_is_one_line(tmp_path, capsys, argv, says):
    assert exit_status(["export-vllm", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_qk_scales_are_the_mean_head_rms(reference_target):
    from adaptspec.models.relayout import qk_scales

    torch.manual_seed(2)
    d = BlockDiffusionDrafter.for_target(reference_target, num_layers=2, target_layers=[2, 4, 5])
    z = torch.randn(3, 5, d.config.hidden_size)
    scales = qk_scales(d, lambda: [(layer.q_proj(z), layer.k_proj(z)) for layer in d.layers])
    hd = d.config.head_dim
    for layer, (q, k) in zip(d.layers, scales):
        qh = (
            (z @ layer.q_proj.weight.detach().T).reshape(-1, hd).double()
        )  # by hand: every head of every position
        kh = (z @ layer.k_proj.weight.detach().T).reshape(-1, hd).double()
        assert q == pytest.approx(float(qh.pow(2).mean(1).sqrt().mean()), rel=1e-5)
        assert k == pytest.approx(float(kh.pow(2).mean(1).sqrt().mean()), rel=1e-5)
    with pytest.raises(AdaptspecError, match="no queries or keys"):
        qk_scales(d, lambda: None)


def test_calibrated_norms_keep_a_head_of_typical_length(reference_target):
    from adaptspec.models.relayout import calibrate_qk_norms

    d = BlockDiffusionDrafter.for_target(
        reference_target, num_layers=2, target_layers=[2, 4, 5], layout="dflash"
    )
    calibrate_qk_norms(d, [(0.7, 1.3), (2.0, 0.5)])
    hd = d.config.head_dim
    for layer, s in zip(d.layers, (0.7, 2.0)):
        q = torch.randn(4, hd)
        q = q / q.pow(2).mean(-1, keepdim=True).sqrt() * s  # every head's RMS is the scale
        assert torch.allclose(layer.q_norm(q), q, atol=1e-5)
    with pytest.raises(AdaptspecError, match="2 scales"):
        calibrate_qk_norms(d, [(1.0, 1.0)])


def test_shipped_dflash_drafter_is_for_the_bundled_target():
    from adaptspec.models.bundled import BUNDLED_DRAFTER
    from adaptspec.models.vllm_export import SHIPPED_DFLASH_DRAFTER

    config, tensors = dflash_format.load(SHIPPED_DFLASH_DRAFTER)
    raw = json.loads((SHIPPED_DFLASH_DRAFTER / "config.json").read_text())
    bundled = json.loads((BUNDLED_DRAFTER / "drafter_config.json").read_text())
    assert raw["dflash_config"] == {
        "mask_token_id": 16,
        "target_layer_ids": [i - 1 for i in bundled["target_layers"]],
    }
    assert (raw["num_target_layers"], raw["hidden_size"], raw["head_dim"], raw["vocab_size"]) == (
        30,
        576,
        64,
        49152,
    )
    assert config.qk_norm and config.draft_vocab_size == 8192
    # the same draft vocabulary as the bundled drafter it was made from
    from safetensors.torch import load_file as load

    assert torch.equal(
        tensors[dflash_format.DRAFT_VOCAB_TENSOR],
        load(BUNDLED_DRAFTER / "drafter.safetensors")["draft_vocab"],
    )


@pytest.mark.slow
def test_shipped_dflash_drafter_exports_for_vllm(tmp_path):
    from adaptspec.models.vllm_export import SHIPPED_DFLASH_DRAFTER

    out = export_drafter(SHIPPED_DFLASH_DRAFTER, None, tmp_path / "vllm")  # the bundled target's head rows
    stored = load_file(out / "model.safetensors")
    assert stored[LM_HEAD].shape == (8192, 576) and stored[D2T].shape == (8192,)
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == 8192
