"""A target's passes on prepacked linear weights (decoding/prepacked.py), on whatever host runs them.

Expected values: ``torch.nn.functional.linear`` on each layer's own weight, and the decoder and
the engine with packing off. Which layers a host packs is read independently, from its CPU flags
and ``ONEDNN_MAX_CPU_ISA`` (tests/_host_kernels.py): a bfloat16 weight is packed where oneDNN can
reorder it (AVX-512 BW/VL/DQ or AVX-NE-CONVERT), and elsewhere (the AVX2 kind) its layer is left as
it is and computes ``F.linear``; every test here checks the path this host takes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _batching_helpers import one_thread  # noqa: F401  (autouse: one torch thread per module)
from _host_kernels import onednn_reorders
from adaptspec.batching import BatchEngine
from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
from adaptspec.decoding.prepacked import Prepacked, PrepackedLinear
from decoding_helpers import tiny_target

DTYPES = [torch.bfloat16, torch.float32]


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    """bfloat16: bit for bit (oneDNN's product on a reordered weight or on its own); float32: oneDNN's
    product instead of MKL's, the same function to rounding."""
    if a.dtype == torch.bfloat16:
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_layers_compute_what_the_layer_computes_on_its_own_weight(dtype):
    """Every plain linear layer of a model is packed where this host reorders its dtype, none
    elsewhere; inside ``on()`` each gives ``F.linear`` on its own weight at 1..300 rows (1-D to 3-D
    inputs), packed or not; outside it is a plain layer."""
    model = tiny_target("llama", vocab=96).to(dtype)
    plain = [m for m in model.modules() if type(m) is nn.Linear]
    packs = onednn_reorders(dtype)
    packed = Prepacked(model)
    assert packed.layers == (plain if packs else [])
    g = torch.Generator().manual_seed(0)
    with packed.on():
        assert all(type(m) is (PrepackedLinear if packs else nn.Linear) for m in plain)
        for layer in plain:
            for shape in [(1,), (3,), (2, 5), (300,), (2, 3, 7)]:
                x = torch.randn(*shape, layer.in_features, generator=g).to(dtype)
                same(layer(x), F.linear(x, layer.weight, layer.bias))
    assert all(type(m) is nn.Linear for m in plain)


def test_an_exact_target_s_row_padded_layers_are_left_as_they_are():
    """An exact target's row-padded layers are not plain ``nn.Linear`` ones: nothing is packed."""
    exact = TargetModel(tiny_target("llama", vocab=96).to(torch.bfloat16), verification="exact")
    assert Prepacked(exact.model).layers == []


@pytest.mark.slow
def test_on_an_avx2_host_bfloat16_weights_are_not_packed():
    """The AVX2-only host kind (no AVX-512 BW/VL/DQ: oneDNN cannot reorder bfloat16 weights) is
    reproduced by restricting oneDNN's ISA: there bfloat16 layers are left as they are, float32 packed."""
    import os
    import subprocess
    import sys

    code = (
        "import torch; from adaptspec.decoding.prepacked import reorders; "
        "print(reorders(torch.bfloat16), reorders(torch.float32))"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]


def test_on_nests_and_holds_until_the_last_open_block_ends_in_any_thread():
    """Nested and concurrent ``on()`` blocks: the layers stay packed while any block is open (a
    thread's block ending does not unpack another's layers mid-pass) and are plain after the last
    (float32 layers: packed wherever oneDNN runs)."""
    import threading

    assert onednn_reorders(torch.float32), "a torch build without oneDNN: nothing is ever packed"
    model = tiny_target("llama", vocab=96)
    packed = Prepacked(model)
    layers = packed.layers
    inside, leave = threading.Event(), threading.Event()
    seen = []

    def other():
        with packed.on():
            inside.set()
            leave.wait(30)
            seen.append(all(type(m) is PrepackedLinear for m in layers))

    t = threading.Thread(target=other)
    t.start()
    inside.wait(30)
    with packed.on():
        with packed.on():
            assert all(type(m) is PrepackedLinear for m in layers)
        assert all(type(m) is PrepackedLinear for m in layers)
    assert all(type(m) is PrepackedLinear for m in layers)  # the other thread's block is still open
    leave.set()
    t.join(30)
    assert seen == [True] and all(type(m) is nn.Linear for m in layers)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_layer_patched_since_is_left_as_it_is(dtype):
    """A layer whose class changed after packing (another wrapper's patch) is neither switched nor
    restored; the other layers are switched where this host packs their dtype."""

    class Patched(nn.Linear):
        pass

    model = tiny_target("llama", vocab=96).to(dtype)
    first, second = [m for m in model.modules() if type(m) is nn.Linear][:2]
    packed = Prepacked(model)
    first.__class__ = Patched
    with packed.on():
        assert type(first) is Patched
        assert type(second) is (PrepackedLinear if onednn_reorders(dtype) else nn.Linear)
    assert type(first) is Patched and type(second) is nn.Linear


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_weight_changed_after_packing_is_packed_again_before_it_is_used(dtype):
    """Written in place (as ``load_state_dict`` does), replaced, or cast: inside the next block each
    layer computes ``F.linear`` on its weight as it is now (packed where this host packs the dtype)."""
    model = tiny_target("llama", vocab=96).to(dtype)
    first, second = [m for m in model.modules() if type(m) is nn.Linear][:2]
    packed = Prepacked(model)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        first.weight.copy_(torch.randn(first.weight.shape, generator=g).to(dtype))  # in place
        second.weight.data = torch.randn(second.weight.shape, generator=g).to(dtype)  # replaced
    x = torch.randn(3, first.in_features, generator=g).to(dtype)
    with packed.on():
        kind = PrepackedLinear if onednn_reorders(dtype) else nn.Linear
        assert type(first) is kind and type(second) is kind
        same(first(x), F.linear(x, first.weight, first.bias))
        same(second(x), F.linear(x, second.weight, second.bias))
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    model.to(other)  # cast: packed again for the new dtype where this host packs it
    with packed.on():
        assert type(first) is (
            PrepackedLinear if onednn_reorders(dtype) and onednn_reorders(other) else nn.Linear
        )
        y = first(x.to(other))
    same(y, F.linear(x.to(other), first.weight, first.bias))


def _decode_both_ways(make_target, drafter, prompts):
    outs = []
    for prepacked in (True, False):
        target = make_target(prepacked)
        assert bool(target.prepacked.layers) == (prepacked and onednn_reorders(torch.bfloat16))
        engine = BatchEngine(target, drafter, max_rows=3)
        hs = [engine.submit(p, block_size=b, max_new_tokens=20) for p, b in prompts]
        engine.run_until_done()
        decoder = SpeculativeDecoder(target, drafter)
        single = [decoder.generate(p, b, max_new_tokens=20) for p, b in prompts]
        assert all(type(m) is not PrepackedLinear for m in target.model.modules())
        outs.append(
            (
                [(h.result().tokens, [r.tau for r in h.result().rounds]) for h in hs],
                [(o.tokens, [r.tau for r in o.rounds]) for o in single],
            )
        )
    return outs


def test_the_engine_and_the_decoder_on_packed_weights_decode_what_they_decode_without():
    """bfloat16, fast verification: the same tokens and the same rounds with packing on and off, in the
    engine and in the single-request decoder, and the model is plain again between passes (where this
    host cannot pack bfloat16, "on" leaves the layers as they are: the same decoding twice)."""
    model = tiny_target("llama", vocab=96, eos=None).to(torch.bfloat16)
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8).to(
        torch.bfloat16
    )
    prompts = [(list(range(i + 1, i + 9)), b) for i, b in enumerate((1, 3, 4, 2))]
    with_packing, without = _decode_both_ways(lambda on: TargetModel(model, prepacked=on), drafter, prompts)
    assert with_packing == without


def test_a_tree_pass_runs_on_the_packed_weights_as_a_chain_pass_does():
    """The decoder's tree rounds (verify_tree) and its chain rounds: every linear layer's call in a
    pass is the packed layer's (where this host packs bfloat16; else the plain layer's), and the
    tokens are those decoded without packing (bfloat16)."""
    model = tiny_target("llama", vocab=96, eos=None).to(torch.bfloat16)
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8).to(
        torch.bfloat16
    )
    prompt = list(range(3, 13))
    outs = []
    for on in (True, False):
        target = TargetModel(model, prepacked=on)
        layer = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        seen = []
        hook = layer.register_forward_pre_hook(lambda m, args: seen.append(type(m) is PrepackedLinear))
        try:
            decoder = SpeculativeDecoder(target, drafter)
            outs.append([decoder.generate(prompt, b, max_new_tokens=16).tokens for b in (-8, 4)])
        finally:
            hook.remove()
        assert seen and all(s == (on and onednn_reorders(torch.bfloat16)) for s in seen)
    assert outs[0] == outs[1]


def test_small_products_run_on_the_small_copy_and_larger_ones_on_the_float32_weight():
    """A float32 model holding bfloat16 copies (the dtype ``mixed``): inside ``on()`` a product of at
    most SMALL_ROWS rows is, bit for bit, ``F.linear`` of the input and the weight both rounded to
    bfloat16, cast back to float32; a larger one is ``F.linear`` in float32 (to rounding); a weight
    written in place is copied again before its next use."""
    from adaptspec.decoding.prepacked import SMALL_ROWS, SmallCopyLinear

    assert onednn_reorders(torch.float32), "a torch build without oneDNN: nothing is ever packed"
    model = tiny_target("llama", vocab=96)
    plain = [m for m in model.modules() if type(m) is nn.Linear]
    packed = Prepacked(model, small_dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(4)

    def small_product(layer, x):
        bias = None if layer.bias is None else layer.bias.to(torch.bfloat16)
        return F.linear(x.to(torch.bfloat16), layer.weight.to(torch.bfloat16), bias).float()

    with packed.on():
        assert all(type(m) is SmallCopyLinear for m in plain)
        for layer in plain:
            for shape in [(1,), (SMALL_ROWS,), (1, SMALL_ROWS), (SMALL_ROWS + 1,), (2, 5)]:
                x = torch.randn(*shape, layer.in_features, generator=g)
                rows = x.numel() // layer.in_features
                if rows <= SMALL_ROWS:
                    assert torch.equal(layer(x), small_product(layer, x)), (layer, shape)
                else:
                    same(layer(x), F.linear(x, layer.weight, layer.bias))
    first = plain[0]
    with torch.no_grad():
        first.weight.copy_(torch.randn(first.weight.shape, generator=g))
    x = torch.randn(1, first.in_features, generator=g)
    with packed.on():
        assert torch.equal(first(x), small_product(first, x))
    assert all(type(m) is nn.Linear for m in plain)


def test_a_mixed_speculator_is_a_float32_pair_whose_target_holds_bfloat16_copies():
    from adaptspec.decoding.prepacked import SmallCopyLinear
    from adaptspec.models.bundled import MIXED, load_speculator, loaded_from

    pair = Path(__file__).parent / "data" / "dflash-reference-tiny-b8"
    spec = load_speculator(str(pair / "target"), str(pair / "drafter"), dtype=MIXED)
    assert loaded_from(spec).dtype == MIXED
    assert spec.target.dtype == torch.float32 and next(spec.drafter.parameters()).dtype == torch.float32
    assert spec.target.prepacked.small_dtype == torch.bfloat16
    with spec.target.prepacked.on():
        assert {type(m) for m in spec.target.prepacked.layers} == {SmallCopyLinear}
