"""The batch-invariant linear layer (adaptspec.decoding.batch_invariant): each row's bits are the same
whatever the number of rows in the call, both where padding to a multiple of 4 suffices on this host
and where every product runs in calls of 4 rows (an Intel Xeon with AMX: the module docstring)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adaptspec.decoding import batch_invariant
from adaptspec.decoding.batch_invariant import RowPaddedLinear


@pytest.mark.parametrize("units", [False, True], ids=["host's choice", "calls of 4 rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_is_computed_alike_in_a_call_of_any_row_count(monkeypatch, units, dtype):
    if units:  # the path a host where padding does not suffice takes, whatever this host is
        monkeypatch.setattr(batch_invariant, "padding_suffices", lambda dtype: False)
    g = torch.Generator().manual_seed(3)
    layer = nn.Linear(576, 1536).to(dtype)
    layer.__class__ = RowPaddedLinear
    x = torch.randn(40, 576, generator=g).to(dtype)
    with torch.inference_mode():
        alone = torch.cat(
            [layer(x[i : i + 1]) for i in range(len(x))]
        )  # one row a call: a decoding step each
        for m in (2, 3, 4, 5, 7, 8, 15, 16, 17, 33, 40):
            assert torch.equal(layer(x[:m]), alone[:m]), m
            assert torch.equal(layer(x[:m].unsqueeze(0))[0], alone[:m]), (
                m
            )  # [batch, rows, features] as models call it
