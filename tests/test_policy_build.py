"""Which head a policy spec names, and the arms a spec string is built over."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptspec import AdaptspecError
from adaptspec.control.policy_build import make_learner, spec_head
from adaptspec.paths import BUNDLED_HEAD
from adaptspec.policies.offline_head import HeadModel


@pytest.mark.parametrize(
    "spec, head",
    [
        ("neural-linear", BUNDLED_HEAD),  # the factory's documented default
        ("neural-linear:alpha=0.2", BUNDLED_HEAD),
        ("neural-linear:head=/h", Path("/h")),
        ("neural-linear:/h,alpha=0.2", Path("/h")),  # first value = the factory's first option, head
        ("head:/h", Path("/h")),
        ("head:path=/h", Path("/h")),
        ("squarecb", None),
        ("squarecb:0.5", None),  # first value = gamma, not a head
        ("squarecb:head=/h", Path("/h")),
        ("ucb", None),
        ("linucb:alpha=1", None),
        (None, None),
    ],
)
def test_spec_head(spec, head):
    assert spec_head(spec) == head


def test_a_bare_neural_linear_spec_runs_over_the_bundled_heads_arms():
    spec, policy = make_learner("neural-linear", None, 16, seed=0)
    assert spec == "neural-linear"
    assert tuple(policy.arms) == tuple(HeadModel.load(BUNDLED_HEAD).arms)


def test_a_spec_naming_a_missing_head_says_so(tmp_path):
    with pytest.raises(AdaptspecError, match="not a saved head"):
        make_learner(f"neural-linear:head={tmp_path / 'none'}", None, 16, seed=0)
