"""A latency profile fitted from rounds timed on a busy host is still a profile (issue 46, item 0).

A few contexts timed while other work shares the cores can line up so that the context terms
take all of a target pass's time (``t = a * context`` fits exactly): the fit then said a pass over
no context is free, and the profile it made was refused (``verify times must be > 0 s``). The
fit now leaves the context cost out in that case; what it gives is the closed form of the
context-free least-squares fit, the mean time of each block size's passes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.costs.latency import fit_profile

BLOCKS = (1, 2, 4, 8, 16)


def proportional_rounds(contexts, slope_s=1e-5):
    """Verify passes whose time is exactly proportional to their context (no fixed cost at all)."""
    return [
        {
            "block_size": b,
            "draft_s": 0.0 if b == 1 else 2e-4,
            "verify_s": slope_s * c * (1 + 0.01 * b),
            "context_tokens": c,
        }
        for b in BLOCKS
        for c in contexts
    ]


def test_context_terms_that_take_the_whole_pass_are_left_out():
    p = fit_profile(proportional_rounds([40, 80]), "busy")
    # the context-free least-squares fit of each block size: the mean of its two passes, 1e-5 * 60 * (1 + 0.01 b)
    want = [1e-5 * 60 * (1 + 0.01 * b) for b in BLOCKS]
    assert np.allclose([float(p.verify_s(b, 0)) for b in BLOCKS], want, rtol=1e-9)
    assert p.verify.per_context_s == 0 and p.verify.per_pair_s == 0


def test_a_context_cost_the_data_support_is_kept():
    rs = [
        {"block_size": b, "draft_s": 0.0, "verify_s": 1e-3 + 1e-6 * c, "context_tokens": c}
        for b in BLOCKS
        for c in (40, 80, 160)
    ]
    p = fit_profile(rs, "quiet")
    assert p.verify.per_context_s + p.verify.per_pair_s * 1 > 0
    assert float(p.verify_s(1, 100)) == pytest.approx(1e-3 + 1e-4, rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(1e-4, 1e-1), min_size=len(BLOCKS) * 2, max_size=len(BLOCKS) * 2),
    st.lists(st.integers(1, 4000), min_size=2, max_size=2, unique=True),
)
def test_any_positive_verify_times_fit_a_profile(times, contexts):
    # any positive times at two contexts (what a noisy host may measure) give a profile, never a refusal
    rs = [
        {"block_size": b, "draft_s": 0.0, "verify_s": times[2 * i + j], "context_tokens": c}
        for i, b in enumerate(BLOCKS)
        for j, c in enumerate(contexts)
    ]
    p = fit_profile(rs, "any")
    assert p.verify.values_s[0] >= 0.01 * min(times)
