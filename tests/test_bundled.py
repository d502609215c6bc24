"""The bundled speculator (SmolLM2-135M-Instruct + its trained drafter) is lossless in bfloat16
(exact verification) and keeps fast verification's guarantee.

This loads the real models (the GGUF target is converted once to the cache directory), so it
is the slowest test file; it is what guards "lossless is sacred" on the shipped models.
"""

from __future__ import annotations

import pytest
import torch

from _bundled import bundled_exact
from _threads import torch_threads
from adaptspec.models import BUNDLED_DRAFTER, load_speculator
from adaptspec.models.prompts import demo_prompts


@pytest.fixture(scope="module", autouse=True)
def two_threads():
    """Two threads while this module decodes the 135M target; the modules after it get back the
    count they set for their tiny models."""
    with torch_threads(2):
        yield


@pytest.fixture(scope="module")
def speculator():
    return bundled_exact()


@pytest.fixture(scope="module")
def fast_speculator():
    return load_speculator()  # the product default: fast verification


def test_bundled_drafter_ships_small():
    size = sum(p.stat().st_size for p in BUNDLED_DRAFTER.iterdir())
    assert size < 21_000_000


def test_bundled_pair_names_the_published_target_not_a_cache_path(speculator):
    import json

    name = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the model on the hub that the GGUF package holds
    assert speculator.target.model.config._name_or_path == name
    assert json.loads((BUNDLED_DRAFTER / "drafter_config.json").read_text())["target_name"] == name


@pytest.mark.parametrize("index", [0, 3])
def test_greedy_output_equals_the_targets_own(speculator, index):
    prompt = demo_prompts()[index].prompt
    ids = speculator.target.encode_chat(prompt)
    n = 40
    ref = speculator.target.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)[
        0, len(ids) :
    ].tolist()
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


def test_fast_verification_is_plain_decoding_at_b1_and_differs_only_at_near_ties(fast_speculator):
    from adaptspec.decoding.greedy import TIE_GAP, divergence, plain_greedy

    spec = fast_speculator
    assert spec.verification == "fast"
    model, eos = spec.target.model, spec.target.eos_token_ids
    for index in (0, 3):
        ids = spec.target.encode_chat(demo_prompts()[index].prompt)
        plain = plain_greedy(model, ids, 40, eos)[0]
        pre = spec.prefill(ids)
        assert spec.decode(pre, 1, 40).tokens == plain  # the model's own step, bit for bit
        for b in (4, 12):
            out = spec.decode(pre, b, 40).tokens
            d = divergence(model, ids, out, plain)
            assert out == plain or d[1] <= TIE_GAP, (b, d)
