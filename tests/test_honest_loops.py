"""Honest loops accepted, lies refused: the one outcome rule (issue 46, items 1 and 6).

A loop with the public DFlash reference loop's shape (z-lab/dflash ``dflash/model.py``: the
end is looked for before each round, ``while start < max_length``, and the output is cut to
``max_length`` and at the first stop token at the end) runs one more round when the output is
exactly full, and reports that round's tau uncut. Written here over a toy target (a fixed
function of the sequence) and a toy drafter that is sometimes wrong, wrapped as
docs/bring-your-own.md wraps a user's loop (``BlockSizeFirst``), it must decide and learn with
no policy argument at max block 8 and 16. Its tokens are checked against the toy target's own
greedy continuation, computed by a plain loop.

The rule is also checked against loops simulated here (the expected verdict comes from how the
outcome was made, not from the rule), and its time checks one line each, naming the field.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec import AdaptiveController, Outcome, Prefill, Round
from adaptspec.decoding.block_size_first import BlockSizeFirst
from adaptspec.errors import AdaptspecError
from adaptspec.speculator import outcome_fault

VOCAB, EOS = 41, 0


def target_next(seq: list[int]) -> int:
    """The toy target's greedy token after ``seq``."""
    return (seq[-1] * 7 + len(seq) * 3 + (seq[-2] if len(seq) > 1 else 5)) % VOCAB


def draft_next(seq: list[int]) -> int:
    """The toy drafter: the target's token, except at every fifth position."""
    t = target_next(seq)
    return (t + 1) % VOCAB if len(seq) % 5 == 0 else t


def greedy(prompt: list[int], max_new_tokens: int) -> list[int]:
    """The target alone, one token at a time, up to EOS or ``max_new_tokens``."""
    seq = list(prompt)
    while len(seq) - len(prompt) < max_new_tokens:
        seq.append(target_next(seq))
        if seq[-1] == EOS:
            break
    return seq[len(prompt) :]


def reference_shape_generate(prompt_ids, block_size, max_new_tokens, temperature=0.0, seed=None) -> Outcome:
    """A loop of the DFlash reference loop's shape: buffers of the prompt, the first token, then
    rounds while the last committed position is inside ``max_length``; each round drafts a block,
    verifies it, commits the accepted drafts and the target's token, and stops after a stop token
    appears; the output is cut at ``max_length`` and the first stop token at the end."""
    n = len(prompt_ids)
    max_length = n + max_new_tokens
    out = list(prompt_ids) + [target_next(list(prompt_ids))]
    start, rounds = n, []  # out[start]: the last committed token
    t0 = time.perf_counter()
    while start < max_length:
        ta = time.perf_counter()
        block = [out[start]]
        for _ in range(block_size - 1):
            block.append(draft_next(out[: start + 1] + block[1:]))
        tb = time.perf_counter()
        posterior = [target_next(out[: start + 1] + block[1 : i + 1]) for i in range(block_size)]
        accepted = 0
        while accepted < block_size - 1 and block[1 + accepted] == posterior[accepted]:
            accepted += 1
        out = out[: start + 1] + block[1 : accepted + 1] + [posterior[accepted]]
        start += accepted + 1
        rounds.append(Round(block_size, accepted + 1, tb - ta, time.perf_counter() - tb))
        if EOS in out[n:]:
            break
    new = out[n : min(start + 1, max_length)]
    if EOS in new:
        new = new[: new.index(EOS) + 1]
    return Outcome(new, rounds, time.perf_counter() - t0, "eos" if new[-1] == EOS else "length")


def look(prompt_ids, temperature=0.0, seed=None) -> Prefill:
    ids = list(prompt_ids)
    return Prefill(
        target_next(ids), len(ids), np.array([math.log1p(len(ids)), np.mean(ids) / VOCAB], np.float32)
    )


def prompts(k: int) -> list[list[int]]:
    return [[(7 * i + 3 * j) % (VOCAB - 1) + 1 for j in range(3 + i % 5)] for i in range(k)]


def cut_whole_last_round(outcome: Outcome) -> bool:
    """The last round's tokens were all cut (the output was full before it ran)."""
    return bool(outcome.rounds) and 1 + sum(r.tau for r in outcome.rounds[:-1]) == len(outcome.tokens)


@pytest.mark.parametrize("max_block_size", [8, 16])
def test_the_reference_loops_shape_decides_and_learns_with_no_policy_argument(max_block_size, tmp_path):
    spec = BlockSizeFirst(look, reference_shape_generate, max_block_size=max_block_size, feature_dim=2)
    requests = [(p, 1 + (3 * i) % 23) for i, p in enumerate(prompts(24))]
    with AdaptiveController(spec, log_dir=tmp_path / "log") as c:
        gens = [c.generate(p, max_new_tokens=m) for p, m in requests]
        c.sync()
        stats = c.stats()
    for (p, m), g in zip(requests, gens):
        assert g.tokens == greedy(p, m)  # lossless: the target's own greedy continuation
    assert (
        sum(cut_whole_last_round(g.outcome) for g in gens) >= 3
    )  # the round past a full output, met and accepted
    assert stats["feedback"].get("decode_error", 0) == 0
    assert stats["feedback"]["applied"] == len(requests)
    assert stats["updates"] == len(requests)  # it learns from every request
    assert {g.decision.block_size for g in gens} <= set(c.arms) and max(c.arms) == max_block_size


# ---------------------------------------------------------------------------- the rule, against simulated loops
@st.composite
def honest_outcomes(draw):
    """An outcome made by one of three honest loop shapes, with its block size and max_new_tokens:
    'before' looks for the end before each round and for EOS after it (the reference loop),
    'after' stops once the output is full or ends in EOS and reports each round's tau as cut
    (examples/byo_dflash.py), 'engine' stops at the same point but commits a round's tokens past
    max_tokens and cuts them from the output only."""
    shape = draw(st.sampled_from(["before", "after", "engine"]))
    b, m = draw(st.integers(1, 16)), draw(st.integers(1, 40))
    eos_at = draw(st.one_of(st.none(), st.integers(0, 45)))  # where the first EOS is in the target's stream

    def eos_in(c):  # an EOS among the first c tokens
        return eos_at is not None and eos_at < c

    taus, committed = [], 1  # the first token, from the prefill
    if shape == "before":
        while committed <= m:
            taus.append(draw(st.integers(1, b)))
            committed += taus[-1]
            if eos_in(committed):
                break
    else:
        while committed < m and not eos_in(committed):
            tau = draw(st.integers(1, b))
            if shape == "after":  # the loop cuts its own round at max_new_tokens and at EOS
                tau = min(tau, m - committed, (eos_at + 1 - committed) if eos_in(committed + tau) else tau)
            taus.append(tau)
            committed += tau
    n = min(committed, m, eos_at + 1 if eos_in(committed) else committed)
    return Outcome([1] * n, [Round(b, t, 0.001, 0.002) for t in taus], 0.003 * len(taus) + 0.001), b, m


@settings(max_examples=120, deadline=None)
@given(honest_outcomes())
def test_every_honest_loops_outcome_is_accepted(case):
    outcome, b, m = case
    assert outcome_fault(outcome, b, m) is None


@settings(max_examples=100, deadline=None)
@given(
    honest_outcomes(), st.sampled_from(["round_after_end", "token_from_nowhere", "past_max", "larger_block"])
)
def test_what_no_honest_loop_produces_is_refused(case, lie):
    outcome, b, m = case
    tokens, rounds = list(outcome.tokens), list(outcome.rounds)
    if lie == "round_after_end":  # two rounds more: the second started with the output already over-full
        rounds += [Round(b, 1, 0.001, 0.002)] * 2
        want = "ran after the output had ended"
    elif lie == "token_from_nowhere":
        tokens += [1] * (2 + sum(r.tau for r in rounds) - len(tokens))
        want, m = "committed", None
    elif lie == "past_max":
        tokens += [1] * (m + 1 - len(tokens))  # refused whatever its rounds
        want = "more than max_new_tokens"
    else:
        rounds = [Round(b + 1, 1, 0.001, 0.002)] + rounds
        want = f"larger than the {b} decided"
    fault = outcome_fault(Outcome(tokens, rounds, 1.0), b, m)
    assert fault is not None and want in fault and "\n" not in fault


# ---------------------------------------------------------------------------- times
@pytest.mark.parametrize(
    "outcome, field",
    [
        (Outcome([1] * 5, [Round(4, 4, -5.0, 0.002)], 0.004), "round 0 draft_s is -5.0"),
        (Outcome([1] * 5, [Round(4, 4, 0.001, float("inf"))], 0.004), "round 0 verify_s is inf"),
        (Outcome([1] * 5, [Round(4, 4, 0.001, float("nan"))], 0.004), "round 0 verify_s is nan"),
        (Outcome([1] * 5, [Round(4, 4, 0.001, "0.002")], 0.004), "round 0 verify_s is '0.002', not a number"),
        (Outcome([1] * 5, [Round(4, 4, 0.001, 0.002)], -1.0), "decode_s is -1.0"),
        (Outcome([1] * 5, [Round(4, 4, 0.001, 0.002)], float("nan")), "decode_s is nan"),
        (Outcome([1] * 5, [Round(4, 4, 0.001, 0.002)], None), "decode_s is None, not a number"),
        (Outcome([1] * 5, [Round(4, 4, 0.1, 0.2)], 0.01), "under half of its rounds' 0.3 s"),
    ],
)
def test_outcome_times_that_are_not_seconds_are_refused_naming_the_field(outcome, field, tmp_path):
    with AdaptiveController.for_engine(arms=[1, 4], feature_dim=2, reward="tau", log_dir=tmp_path) as c:
        d = c.decide(np.ones(2))
        with pytest.raises(AdaptspecError) as e:
            c.feedback(d.decision_id, outcome)
        msg = str(e.value)
        assert (
            "\n" not in msg
            and msg.startswith(f"outcome of decision {d.decision_id} refused: ")
            and field in msg
        )
        assert c.sync().stats()["updates"] == 0  # the policy learnt nothing from it


def test_a_batched_rounds_times_may_exceed_its_attributed_decode_time():
    # a round that carried 3 rows timed their whole passes; the request's decode_s is its share
    shared = Outcome([1] * 5, [Round(4, 4, 0.03, 0.06, rows=3)], 0.03)
    assert outcome_fault(shared, 4) is None


def test_a_nan_decode_time_from_generate_is_refused_not_a_log_failure(tmp_path):
    def nan_loop(prompt_ids, block_size, max_new_tokens, temperature=0.0, seed=None):
        out = reference_shape_generate(prompt_ids, block_size, max_new_tokens)
        return Outcome(out.tokens, out.rounds, float("nan"), out.finish_reason)

    with AdaptiveController(
        BlockSizeFirst(look, nan_loop, 8, feature_dim=2), "fixed:4", log_dir=tmp_path
    ) as c:
        with pytest.raises(AdaptspecError) as e:
            c.generate(prompts(1)[0], max_new_tokens=8)
        assert "decode_s is nan: seconds must be finite and >= 0" in str(e.value)
        assert c.stats()["feedback"]["decode_error"] == 1


# ---------------------------------------------------------------------------- the trace reader, by the same rule
def test_a_trace_set_whose_last_round_was_cut_whole_reads_and_one_token_less_does_not(tmp_path):
    from adaptspec.traces import TraceSet

    taus = [
        [3, 2, 4],
        [1],
    ]  # 1 + 5 tokens before the last round; the second: the first token, a round past it
    for new, ok in (([6, 1], True), ([5, 1], False)):
        ts = TraceSet.from_arrays(
            ["a", "b"],
            ["d", "d"],
            [4],
            np.array([[3.0], [1.0]]),
            prompt_tokens=[4, 4],
            new_tokens=np.array([[new[0]], [new[1]]]),
            rounds=np.array([[3], [1]]),
            tau=taus,
        )
        out = tmp_path / f"ts{new[0]}"
        ts.write(out)
        if ok:
            assert TraceSet.read(out).new_tokens_matrix().tolist() == [[6], [1]]
        else:
            with pytest.raises(
                AdaptspecError, match=r"column 'new_tokens', row 0: 5 tokens, but its rounds produced 9"
            ):
                TraceSet.read(out)


# ---------------------------------------------------------------------------- the reference loop's own recorded rounds
def reference_runs():
    """What the public DFlash reference loop (z-lab/dflash dflash_generate @44947fb, T=0) recorded on three
    prompts at seven block sizes (tests/data/README.md): its output tokens and each round's acceptance
    length (the tau the round committed, before the output was cut)."""
    import json
    from pathlib import Path

    golden = json.loads((Path(__file__).parent / "data" / "dflash-trained-tiny" / "golden.json").read_text())
    for run in golden["runs"]:
        for b, r in run["by_block_size"].items():
            yield (
                int(b),
                len(run["greedy"]),
                Outcome(
                    list(r["tokens"]),
                    [Round(int(b), int(t), 0.001, 0.002) for t in r["acceptance_lengths"]],
                    1.0,
                ),
            )


def test_every_outcome_the_reference_loop_recorded_is_accepted_by_the_rule_and_by_feedback():
    runs = list(reference_runs())
    # 14 of its 21 outputs were exactly full before its last round, which it ran anyway, then cut whole
    assert sum(cut_whole_last_round(o) for _, _, o in runs) == 14
    for b, max_new, outcome in runs:
        assert outcome_fault(outcome, b, max_new) is None
    by_block = {}
    for b, _, outcome in runs:
        by_block.setdefault(b, []).append(outcome)
    with AdaptiveController.for_engine(arms=sorted(by_block), feature_dim=2) as c:  # the default policy
        for i in range(3 * len(runs)):  # each decision fed one of the recorded outcomes at its block size
            d = c.decide(np.ones(2))
            recorded = by_block[d.block_size]
            assert c.feedback(d.decision_id, recorded[i % len(recorded)]) == "applied"
        assert c.sync().stats()["updates"] == 3 * len(runs)
