"""Published DFlash v1 drafters load as they are and draft exactly as the reference does.

The expected values come from the DFlash reference implementation (z-lab/dflash
``dflash/model.py``), through the fixtures in ``tests/data`` (see its README): one drafter
pass from fixed target hidden states (``golden_forward.safetensors``) and the reference
decoder's every drafted block and acceptance length at several block sizes (``golden.json``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from adaptspec.cli import main
from adaptspec.decoding import BlockDiffusionDrafter
from adaptspec.errors import AdaptspecError
from adaptspec.models import load_speculator

torch.set_num_threads(1)

DATA = Path(__file__).resolve().parent / "data"
TRAINED_B16 = DATA / "dflash-reference-tiny"  # float32, block_size 16 at the top level, taps 1,3,4
TRAINED_B8 = DATA / "dflash-reference-tiny-b8"  # bfloat16, block_size 8 inside dflash_config, taps 1,4,6
FIXTURES = [TRAINED_B16, TRAINED_B8]
# a drafter distilled for TRAINED_B16's target (its drafts are often accepted), with the reference
# decoder's rounds on three prompts at seven block sizes
DISTILLED = DATA / "dflash-trained-tiny"

_SPECULATORS: dict = {}


def speculator(fixture: Path, target: Path | None = None):
    if fixture not in _SPECULATORS:
        _SPECULATORS[fixture] = load_speculator(
            target or fixture / "target", fixture / "drafter", dtype="float32"
        )
    return _SPECULATORS[fixture]


def golden(fixture: Path) -> dict:
    return json.loads((fixture / "golden.json").read_text())


class DraftRecorder:
    """Records the argmax of every block the drafter drafts, leaving the drafts unchanged."""

    def __init__(self, drafter: BlockDiffusionDrafter) -> None:
        self.blocks: list[list[int]] = []
        self._draft_logits = drafter.draft_logits

    def __call__(self, state, last_token, block_size):
        logits = self._draft_logits(state, last_token, block_size)
        self.blocks.append(logits.argmax(-1).tolist())
        return logits


def decode_recording(spec, prompt, block_size, max_new):
    recorder = DraftRecorder(spec.drafter)
    spec.drafter.draft_logits = recorder
    try:
        out = spec.generate(prompt, block_size=block_size, max_new_tokens=max_new)
    finally:
        del spec.drafter.draft_logits
    return out, recorder.blocks


# ---------------------------------------------------------------------- the drafter alone
@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name)
def test_draft_logits_match_the_reference_forward_pass(fixture):
    target = AutoModelForCausalLM.from_pretrained(fixture / "target", dtype=torch.float32).eval()
    drafter = BlockDiffusionDrafter.from_pretrained(fixture / "drafter", target=target, dtype=torch.float32)
    g = load_file(str(fixture / "golden_forward.safetensors"))
    block = g["noise_ids"][0]
    # the reference's input: the last committed token, then mask_token_id in every other slot
    assert (block[1:] == golden(fixture)["mask_token_id"]).all()
    assert g["position_ids"][0].tolist() == list(range(g["target_hidden"].shape[1] + len(block)))
    state = drafter.new_state(g["target_hidden"][0])
    logits = drafter.draft_logits(state, int(block[0]), len(block))
    assert logits.shape == g["draft_logits"][0].shape
    assert (logits - g["draft_logits"][0]).abs().max().item() <= 1e-5


def test_config_facts_are_read_as_published():
    d16 = BlockDiffusionDrafter.from_pretrained(TRAINED_B16 / "drafter").config
    d8 = BlockDiffusionDrafter.from_pretrained(TRAINED_B8 / "drafter").config
    # target_layer_ids count decoder layers from 0; hidden_states[0] is the embeddings
    assert d16.target_layers == [i + 1 for i in golden(TRAINED_B16)["target_layer_ids"]] == [2, 4, 5]
    assert d8.target_layers == golden(TRAINED_B8)["hidden_states_index_of_taps"] == [2, 5, 7]
    assert (d16.max_block_size, d8.max_block_size) == (16, 8)  # top level / inside dflash_config
    assert d16.qk_norm and d16.mask_token_id == 255 and d16.num_target_layers == 6
    assert d16.rope_theta == 1e6 and d16.rms_norm_eps == 1e-6


def test_the_mask_is_the_targets_embedding_of_mask_token_id():
    spec = speculator(TRAINED_B16)
    d = spec.drafter
    assert d.mask_embedding is None and "mask_embedding" not in d.state_dict()
    emb = spec.target.model.get_input_embeddings().weight[255]
    assert torch.equal(d.mask_vector(), emb)


def test_a_loaded_dflash_drafter_saves_and_reloads_in_adaptspecs_format(tmp_path):
    spec = speculator(TRAINED_B16)
    spec.drafter.save_pretrained(tmp_path, dtype=torch.float32)
    again = BlockDiffusionDrafter.from_pretrained(tmp_path, target=spec.target.model)
    ctx = torch.randn(7, spec.drafter.context_width, generator=torch.Generator().manual_seed(0))
    a = spec.drafter.draft_logits(spec.drafter.new_state(ctx), 3, 16)
    b = again.draft_logits(again.new_state(ctx), 3, 16)
    assert torch.equal(a, b)


# ---------------------------------------------------------------------- decoding
def check_rounds_against_reference(spec, run: dict) -> None:
    n = len(run["greedy"])
    for b, ref in run["by_block_size"].items():
        b = int(b)
        # The reference runs rounds until n + 1 tokens are committed and then cuts to n; ask
        # for more so that none of its rounds is shortened here.
        out, blocks = decode_recording(spec, run["prompt"], b, n + 2 * b)
        assert out.tokens[:n] == ref["tokens"] == run["greedy"]
        if b == 1:
            assert blocks == []
            continue
        k = len(ref["drafted_blocks"])
        assert blocks[:k] == ref["drafted_blocks"]
        # golden's acceptance lengths were counted against the n greedy tokens only
        taus, pos = [], 0
        for r in out.rounds[:k]:
            taus.append(min(r.tau, n - pos))
            pos += r.tau
        assert taus == ref["acceptance_lengths"]


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name)
def test_every_round_drafts_and_accepts_what_the_reference_does(fixture):
    check_rounds_against_reference(speculator(fixture), golden(fixture))


def test_a_drafter_whose_drafts_are_accepted_matches_the_reference_round_by_round():
    runs = golden(DISTILLED)["runs"]
    spec = speculator(DISTILLED, target=TRAINED_B16 / "target")
    for run in runs:
        check_rounds_against_reference(spec, run)
    longest = max(max(r["acceptance_lengths"]) for run in runs for r in run["by_block_size"].values())
    assert longest >= 8  # rounds that accept many drafts are part of the check


@pytest.mark.parametrize(
    "fixture, schedule",
    [(TRAINED_B16, [16, 3, 7, 2, 1, 11, 5]), (TRAINED_B8, [8, 3, 5, 2, 1, 6])],
    ids=["b16", "b8"],
)
def test_greedy_is_lossless_when_the_block_size_changes_every_round(fixture, schedule):
    g = golden(fixture)
    spec = speculator(fixture)
    assert spec.max_block_size == schedule[0]  # the trained block size is the largest allowed
    out = spec.generate(
        g["prompt"], block_size=lambda i, rounds: schedule[i % len(schedule)], max_new_tokens=len(g["greedy"])
    )
    assert out.tokens == g["greedy"]
    assert [r.block_size for r in out.rounds[: len(schedule)]] == schedule
    with pytest.raises(AdaptspecError, match=f"outside 1..{schedule[0]}"):
        spec.generate(g["prompt"], block_size=schedule[0] + 1, max_new_tokens=4)


def test_bfloat16_drafts_agree_with_the_reference_and_decoding_stays_lossless():
    """The b8 checkpoint stored in bfloat16 and run in bfloat16 (the reference ran it in float32)."""
    g = golden(TRAINED_B8)
    spec = load_speculator(TRAINED_B8 / "target", TRAINED_B8 / "drafter", dtype="float32")
    spec.drafter.to(torch.bfloat16)
    n = len(g["greedy"])
    same = total = 0
    for b, ref in g["by_block_size"].items():
        b = int(b)
        out, blocks = decode_recording(spec, g["prompt"], b, n + 2 * b)
        assert out.tokens[:n] == g["greedy"]
        for mine, theirs in zip(blocks, ref["drafted_blocks"]):
            same += sum(x == y for x, y in zip(mine, theirs))
            total += len(theirs)
    assert total == sum(len(blk) for r in g["by_block_size"].values() for blk in r["drafted_blocks"])
    assert same / total >= 0.98


# ---------------------------------------------------------------------- refusals
def _edit(raw: dict, change) -> dict:
    raw = json.loads(json.dumps(raw))
    change(raw)
    return raw


def _without(*keys):
    def change(c):
        for k in keys:
            parent = c
            *path, last = k.split(".")
            for p in path:
                parent = parent[p]
            parent.pop(last, None)

    return change


BAD_CONFIGS = {
    "attention_bias": (lambda c: c.update(attention_bias=True), "attention_bias"),
    "rope_scaling": (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling"),
    "rope_parameters": (
        lambda c: c.update(rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0}),
        "rope_parameters",
    ),
    "no_rope_theta": (_without("rope_theta", "rope_parameters"), "rope_theta"),
    "rope_theta_disagree": (lambda c: c.update(rope_theta=10000.0), "rope_theta"),
    "sliding_window": (lambda c: c.update(use_sliding_window=True, sliding_window=64), "sliding-window"),
    "sliding_layer": (
        lambda c: c.update(layer_types=["sliding_attention", "full_attention"]),
        "sliding-window",
    ),
    "projector_type": (lambda c: c.update(projector_type="mlp"), "projector_type"),
    "dflash2_key": (lambda c: c["dflash_config"].update(use_swa=True), "dflash_config.use_swa"),
    "mask_outside_vocab": (lambda c: c["dflash_config"].update(mask_token_id=256), "mask_token_id"),
    "no_mask": (_without("dflash_config.mask_token_id"), "mask_token_id"),
    "tap_too_deep": (lambda c: c["dflash_config"].update(target_layer_ids=[1, 3, 6]), "target_layer_ids"),
    "no_taps": (_without("dflash_config.target_layer_ids"), "target_layer_ids"),
    "no_block_size": (_without("block_size"), "block_size"),
    "block_sizes_disagree": (lambda c: c["dflash_config"].update(block_size=8), "block_size"),
    "no_num_target_layers": (_without("num_target_layers"), "num_target_layers"),
    "hidden_act": (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    "shape": (lambda c: c.update(intermediate_size=96), "shape"),
}


def _bad_drafter(tmp_path: Path, change) -> Path:
    d = tmp_path / "drafter"
    d.mkdir()
    raw = json.loads((TRAINED_B16 / "drafter" / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(_edit(raw, change)))
    shutil.copy(TRAINED_B16 / "drafter" / "model.safetensors", d / "model.safetensors")
    return d


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_unsupported_configs_are_refused_with_one_line(tmp_path, name):
    change, word = BAD_CONFIGS[name]
    with pytest.raises(AdaptspecError) as e:
        BlockDiffusionDrafter.from_pretrained(_bad_drafter(tmp_path, change))
    assert word in str(e.value) and "\n" not in str(e.value)


def test_weights_that_do_not_fit_are_refused(tmp_path):
    d = tmp_path / "drafter"
    d.mkdir()
    shutil.copy(TRAINED_B16 / "drafter" / "config.json", d / "config.json")
    tensors = load_file(str(TRAINED_B16 / "drafter" / "model.safetensors"))
    tensors.pop("layers.1.self_attn.q_norm.weight")
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(AdaptspecError, match=r"missing \['layers.1.q_norm.weight'\]"):
        BlockDiffusionDrafter.from_pretrained(d)
    tensors["layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(AdaptspecError, match="q_proj.bias.*not part of the DFlash v1 layout"):
        BlockDiffusionDrafter.from_pretrained(d)


def _tiny_qwen3(**change) -> Qwen3ForCausalLM:
    cfg = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    cfg.update(change)
    return Qwen3ForCausalLM(Qwen3Config(**cfg)).eval()


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(num_hidden_layers=8), "num_target_layers"),
        (dict(hidden_size=32, head_dim=8), "hidden_size"),
        (dict(vocab_size=300), "vocab_size"),
    ],
)
def test_a_target_that_does_not_fit_is_refused_naming_the_field(change, field):
    with pytest.raises(AdaptspecError, match=field) as e:
        BlockDiffusionDrafter.from_pretrained(TRAINED_B16 / "drafter", target=_tiny_qwen3(**change))
    assert "\n" not in str(e.value)


def test_load_speculator_refuses_a_drafter_for_another_target():
    with pytest.raises(
        AdaptspecError,
        match="num_target_layers: drafter was trained on a target of 6 layers, this target has 8",
    ):
        load_speculator(TRAINED_B8 / "target", TRAINED_B16 / "drafter", dtype="float32")


def test_a_directory_in_neither_format_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    with pytest.raises(AdaptspecError, match="not a drafter: neither drafter_config.json"):
        BlockDiffusionDrafter.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "command",
    [["demo"], ["collect", "--out", "OUT"], ["profile-latency", "--out", "OUT"], ["serve"]],
    ids=lambda c: c[0],
)
def test_every_command_that_loads_a_speculator_refuses_a_bad_drafter(tmp_path, capsys, command):
    bad = _bad_drafter(tmp_path, BAD_CONFIGS["projector_type"][0])
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    assert main(argv + ["--target", str(TRAINED_B16 / "target"), "--drafter", str(bad)]) == 2
    err = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.strip() and not line.startswith("Loading weights")
    ]
    assert (
        len(err) == 1 and err[0].startswith(f"adaptspec {command[0]}: error: ") and "projector_type" in err[0]
    )
