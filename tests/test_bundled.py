"""The bundled speculator (SmolLM2-135M-Instruct + its trained drafter) is lossless in bfloat16.

This loads the real models (the GGUF target is converted once to the cache directory), so it
is the slowest test file; it is what guards "lossless is sacred" on the shipped models.
"""

from __future__ import annotations

import pytest
import torch

from adaptspec.models import BUNDLED_DRAFTER, load_speculator
from adaptspec.models.prompts import demo_prompts


@pytest.fixture(scope="module")
def speculator():
    torch.set_num_threads(2)
    return load_speculator()


def test_bundled_drafter_ships_small():
    size = sum(p.stat().st_size for p in BUNDLED_DRAFTER.iterdir())
    assert size < 21_000_000


@pytest.mark.parametrize("index", [0, 3])
def test_greedy_output_equals_the_targets_own(speculator, index):
    prompt = demo_prompts()[index].prompt
    ids = speculator.target.encode_chat(prompt)
    n = 40
    ref = speculator.target.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)[0, len(ids):].tolist()
    pre = speculator.prefill(ids)
    taus = []
    for b in (1, 4, 12):
        out = speculator.decode(pre, b, n)
        assert out.tokens == ref, f"block size {b}"
        taus.append(out.mean_tau)
    assert taus[0] == 1.0 and max(taus[1:]) > 1.0  # the trained drafter is accepted sometimes


def test_sampling_is_reproducible(speculator):
    ids = speculator.target.encode_chat(demo_prompts()[1].prompt)
    a = speculator.generate(ids, 8, 24, temperature=1.0, seed=7).tokens
    b = speculator.generate(ids, 8, 24, temperature=1.0, seed=7).tokens
    assert a == b
