"""The engine's passes on prepacked linear weights (batching/prepacked.py).

Expected values: ``torch.nn.functional.linear`` on each layer's own weight, and the engine with
packing off.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from adaptspec.batching import BatchEngine
from adaptspec.batching.prepacked import Prepacked, PrepackedLinear
from adaptspec.decoding import BlockDiffusionDrafter, TargetModel

from _batching_helpers import one_thread  # noqa: F401  (autouse: one torch thread per module)
from decoding_helpers import tiny_target

def test_packed_layers_compute_what_the_layer_computes_on_its_own_weight():
    """Every plain linear layer of a bfloat16 model is packed; inside ``on()`` each gives, bit for bit,
    ``F.linear`` on its own weight at 1..300 rows (1-D to 3-D inputs); outside it is a plain layer."""
    model = tiny_target("llama", vocab=96).to(torch.bfloat16)
    plain = [m for m in model.modules() if type(m) is nn.Linear]
    packed = Prepacked(model)
    assert [layer for layer, _ in packed.layers] == plain
    g = torch.Generator().manual_seed(0)
    with packed.on():
        assert all(type(m) is PrepackedLinear for m in plain)
        for layer in plain:
            for shape in [(1,), (3,), (2, 5), (300,), (2, 3, 7)]:
                x = torch.randn(*shape, layer.in_features, generator=g).to(torch.bfloat16)
                assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias)), (layer, shape)
    assert all(type(m) is nn.Linear and not hasattr(m, "packed") for m in plain)


def test_float32_layers_run_onednn_s_product_and_exact_targets_are_left_as_they_are():
    """float32 layers are packed too: oneDNN's product instead of MKL's, the same function to rounding;
    an exact target's row-padded layers are not plain ``nn.Linear`` ones: nothing is packed."""
    model = tiny_target("llama", vocab=96)
    packed = Prepacked(model)
    assert len(packed.layers) == sum(type(m) is nn.Linear for m in model.modules()) > 0
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    layer = packed.layers[0][0]
    with packed.on():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
    exact = TargetModel(tiny_target("llama", vocab=96).to(torch.bfloat16), verification="exact")
    assert Prepacked(exact.model).layers == []


@pytest.mark.slow
def test_on_an_avx2_host_bfloat16_weights_are_not_packed():
    """The AVX2-only host kind (no AVX-512 BW/VL/DQ: oneDNN cannot reorder bfloat16 weights) is
    reproduced by restricting oneDNN's ISA: there bfloat16 layers are left as they are, float32 packed."""
    import os
    import subprocess
    import sys

    code = ("import torch; from adaptspec.batching.prepacked import reorders; "
            "print(reorders(torch.bfloat16), reorders(torch.float32))")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]


def test_an_engine_on_packed_weights_decodes_what_it_decodes_without():
    """bfloat16, fast verification: the same tokens and the same rounds with packing on and off, and the
    model is plain again between rounds."""
    model = tiny_target("llama", vocab=96, eos=None).to(torch.bfloat16)
    target = TargetModel(model)
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=8).to(torch.bfloat16)
    outs = []
    for prepacked in (True, False):
        engine = BatchEngine(target, drafter, max_rows=3, prepacked=prepacked)
        assert bool(engine.prepacked.layers) == prepacked
        hs = [engine.submit(list(range(i + 1, i + 9)), block_size=b, max_new_tokens=20) for i, b in enumerate((1, 3, 4, 2))]
        engine.run_until_done()
        assert all(type(m) is not PrepackedLinear for m in model.modules())
        outs.append([(h.result().tokens, [r.tau for r in h.result().rounds]) for h in hs])
    assert outs[0] == outs[1]
