"""The rows' share of a target pass that also ran joining prompts' chunks (costs/rows_pass.py).

Expected values: an exponential average and a linear interpolation written out here, and in the
engine the same average recomputed from its own rows-only rounds (their ``verify_s``).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from _batching_helpers import one_thread  # noqa: F401  (autouse: one torch thread per module)
from adaptspec.batching import BatchEngine
from adaptspec.costs.rows_pass import RowsPassCost
from adaptspec.decoding import BlockDiffusionDrafter, TargetModel
from decoding_helpers import tiny_target

seconds = st.floats(1e-5, 1.0)


@given(
    passes=st.lists(st.tuples(st.integers(1, 6), seconds), max_size=30),
    alpha=st.floats(0.01, 1.0),
    positions=st.integers(1, 8),
    pass_s=seconds,
    prompt=st.integers(1, 128),
)
def test_the_rows_are_charged_the_average_of_their_own_passes(passes, alpha, positions, pass_s, prompt):
    cost = RowsPassCost(alpha)
    for n, s in passes:
        assert cost.rows_share(s, n, 0) == s  # a rows-only pass is all the rows'
    averages: dict[int, float] = {}
    for n, s in passes:  # the exponential average, by hand
        averages[n] = s if n not in averages else (1 - alpha) * averages[n] + alpha * s
    sizes = sorted(averages)
    if not sizes:
        expected = pass_s * positions / (positions + prompt)  # nothing seen: by positions
    elif positions in averages:
        expected = averages[positions]
    elif positions < sizes[0]:
        expected = averages[sizes[0]]
    elif positions > sizes[-1]:
        expected = averages[sizes[-1]]
    else:
        lo = max(n for n in sizes if n < positions)
        hi = min(n for n in sizes if n > positions)
        expected = averages[lo] + (averages[hi] - averages[lo]) * (positions - lo) / (hi - lo)
    expected = min(expected, pass_s) if sizes else expected
    assert cost.rows_share(pass_s, positions, prompt) == pytest.approx(expected, rel=1e-9)


def test_a_pass_with_chunks_teaches_nothing_and_bad_alpha_is_refused():
    cost = RowsPassCost(0.5)
    cost.rows_share(0.05, 4, 0)
    cost.rows_share(9.0, 4, 64)  # a chunk's pass: not a rows-only measurement
    assert cost.estimate(4) == 0.05
    assert cost.rows_share(1.0, 0, 64) == 0.0  # no rows
    for alpha in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            RowsPassCost(alpha)


def test_the_engine_charges_rows_beside_a_chunk_their_own_pass_not_a_share_by_positions():
    """Two rows decode alone at B = 1 (2 positions a pass); then a 96-token prompt joins in chunks of
    64: in those passes the rows' verify_s is the exponential average of their rows-only passes'
    (recomputed here from the engine's records), not 2/66 of a pass that is far longer."""
    torch.manual_seed(0)
    model = tiny_target("llama", vocab=96, eos=None, layers=4)
    target = TargetModel(model)
    engine = BatchEngine(
        target, BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0), max_rows=4, chunk_tokens=64
    )
    rows = [engine.submit([3, 1, 4], block_size=1, max_new_tokens=60) for _ in range(2)]
    for _ in range(12):
        engine.step()
    joining = engine.submit(list(range(96)), block_size=1, max_new_tokens=4)
    average = None
    checked = 0
    for record in list(engine.history):  # the rows-only rounds so far, as the engine saw them
        if record.prompt_tokens == 0 and len(record.requests) == 2:
            s = record.verify_s
            average = s if average is None else average + 0.1 * (s - average)
    while not joining.done:
        record = engine.step()
        if record is None:
            continue
        if record.prompt_tokens and len(record.requests) == 2:
            # min(the pass, the average): the average, or the whole pass where it took less (a busy host
            # can slow the rows-only passes the average was made of; the pass itself is not recorded)
            assert record.verify_s == pytest.approx(average, rel=1e-9) or record.verify_s < average
            assert record.join_s > 0
            checked += 1
        elif record.prompt_tokens == 0 and len(record.requests) == 2:
            average += 0.1 * (record.verify_s - average)
    assert checked >= 2  # 96 prompt tokens in chunks of 64 rode in two passes beside the rows
    assert all(not h.done for h in rows)
