"""BlockSizeFirst: a whole-request loop that takes its block size before its prefill, as a speculator.

The loop here is written for the test: a deterministic toy target (the next token is a
function of the prefix) and a drafter that is right except every fifth position, with a real
draft/verify loop. The expected tokens are the target's own greedy continuation, computed
directly from that function.
"""

from __future__ import annotations

import numpy as np
import pytest

from adaptspec.decoding.block_size_first import BlockSizeFirst
from adaptspec.errors import AdaptspecError
from adaptspec.schedules import FixedBlock
from adaptspec.speculator import Outcome, Prefill, Round

VOCAB = 50


def target_next(prefix: list[int]) -> int:
    return (sum(prefix) * 31 + 7 * len(prefix)) % VOCAB


def greedy(ids: list[int], n: int) -> list[int]:
    out = list(ids)
    for _ in range(n):
        out.append(target_next(out))
    return out[len(ids) :]


def look(ids, temperature=0.0, seed=None):
    return Prefill(
        first_token=target_next(list(ids)),
        prompt_tokens=len(ids),
        features=np.array([len(ids), sum(ids) % 7], np.float32),
    )


def generate(ids, block_size, max_new_tokens, temperature=0.0, seed=None):
    """The whole loop: 'prefill' (the first token), then rounds of block_size - 1 drafts and a verify."""
    seq = list(ids) + [target_next(list(ids))]
    rounds = []
    while len(seq) - len(ids) < max_new_tokens:
        drafts, ctx = [], list(seq)
        for _ in range(block_size - 1):  # the drafter: the target's token, wrong at every fifth position
            d = target_next(ctx) if len(ctx) % 5 else (target_next(ctx) + 1) % VOCAB
            drafts.append(d)
            ctx.append(d)
        committed = []
        for d in drafts:  # verify: accept drafts while they are the target's, then its own token
            t = target_next(seq + committed)
            committed.append(t)
            if d != t:
                break
        else:
            committed.append(target_next(seq + committed))
        committed = committed[: max_new_tokens - (len(seq) - len(ids))]
        seq += committed
        rounds.append(Round(block_size, len(committed), 0.001, 0.002))
    return Outcome(seq[len(ids) :], rounds, decode_s=0.003 * len(rounds))


PROMPTS = [[3, 1, 4], [1, 5, 9, 2, 6], [5, 3]]


@pytest.mark.parametrize("b", [1, 2, 4, 8])
def test_decode_is_the_loop_at_the_decided_block_size(b):
    spec = BlockSizeFirst(look, generate, max_block_size=8)
    for ids in PROMPTS:
        streamed = []
        out = spec.decode(spec.prefill(ids), b, 17, on_round=lambda t, r: streamed.extend(t))
        assert out.tokens == greedy(ids, 17)
        assert [out.tokens[0]] + streamed == out.tokens  # every round's tokens, in order, after the first
        assert {r.block_size for r in out.rounds} == {b}


def test_a_schedule_is_asked_once_and_the_seed_of_prefill_reaches_the_loop():
    seen = []

    def loop(ids, block_size, max_new_tokens, temperature=0.0, seed=None):
        seen.append((block_size, temperature, seed))
        return generate(ids, block_size, max_new_tokens)

    class Counting(FixedBlock):
        asked = 0

        def draft_size(self, rounds):
            Counting.asked += 1
            return super().draft_size(rounds)

    spec = BlockSizeFirst(look, loop, max_block_size=8)
    spec.decode(spec.prefill([1, 2], temperature=0.5, seed=11), Counting(4), 9, temperature=0.5)
    assert Counting.asked == 1 and seen == [(4, 0.5, 11)]
    seen.clear()
    for _ in range(2):  # no seed at T > 0: a fresh one per request, the same for look and the loop
        pre = spec.prefill([1, 2], temperature=0.5)
        spec.decode(pre, 2, 5, temperature=0.5)
        assert seen[-1][2] == pre.state[1] and isinstance(pre.state[1], int)
    assert seen[0][2] != seen[1][2]


def test_through_the_controller_with_streaming():
    from adaptspec import AdaptiveController

    spec = BlockSizeFirst(look, generate, max_block_size=8, feature_dim=2)
    with AdaptiveController(spec, "fixed:4", arms=[1, 2, 4, 8], reward="tau") as ctl:
        streamed = []
        g = ctl.generate([3, 1, 4], max_new_tokens=12, on_tokens=streamed.extend)
        assert g.decision.block_size == 4 and g.tokens == greedy([3, 1, 4], 12) == streamed
        ctl.sync()
        assert ctl.stats()["updates"] == 1


def test_faults_are_one_line():
    spec = BlockSizeFirst(look, generate, max_block_size=8)
    other = BlockSizeFirst(
        lambda ids, temperature=0.0, seed=None: Prefill(99, len(ids), np.ones(2, np.float32)),
        generate,
        max_block_size=8,
    )
    cases = [
        (
            lambda: other.decode(other.prefill([1, 2]), 2, 5),
            r"the loop's first token \[\d+\] is not look's 99",
        ),
        (lambda: spec.decode(spec.prefill([1, 2]), 9, 5), "block size 9 outside 1..8"),
        (lambda: BlockSizeFirst(look, generate, max_block_size=0), "max_block_size must be an integer >= 1"),
        (lambda: BlockSizeFirst(look, None, max_block_size=8), "generate must be callable"),
        (
            lambda: BlockSizeFirst(look, generate, 8, feature_dim=True),
            "feature_dim must be an integer >= 1 or None",
        ),
        (
            lambda: BlockSizeFirst(lambda ids, **kw: None, generate, 8).prefill([1]),
            "look returned NoneType, not a Prefill",
        ),
        (
            lambda: BlockSizeFirst(look, lambda *a, **kw: [1], 8).decode(spec.prefill([1]), 2, 3),
            "generate returned list, not an Outcome",
        ),
    ]
    for call, message in cases:
        with pytest.raises(AdaptspecError, match=message) as e:
            call()
        assert "\n" not in str(e.value)


def test_a_served_stop_sequence_cuts_the_replayed_rounds():
    """The server halts decoding from on_round (serving.engine.halting): the loop has run to its end, and
    the outcome is the prefix up to the round at which the condition held."""
    from adaptspec.serving.engine.halting import HaltableSpeculator, halt_when

    spec = HaltableSpeculator(BlockSizeFirst(look, generate, max_block_size=8))
    pre = spec.prefill([1, 5, 9, 2, 6])
    full = greedy([1, 5, 9, 2, 6], 20)
    seen: list[int] = []
    with halt_when(lambda: len(seen) >= 5):
        out = spec.decode(pre, 4, 20, on_round=lambda new, r: seen.extend(new))
    assert out.finish_reason == "stop" and out.tokens == full[: len(out.tokens)]
    assert 1 + 5 <= len(out.tokens) < 1 + 5 + 4 and len(out.tokens) == 1 + sum(r.tau for r in out.rounds)
