"""Bring your own speculator (issue 39): a speculator written here, with its own draft/verify
loop (pure Python, not adaptspec's decoder), through the controller's defaults, ``generate``,
the split form with no speculator object, and the protocol's checks, each refusal one line."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from adaptspec import AdaptiveController, AdaptspecError
from adaptspec.control.policy_build import DEFAULT_ARMS, default_policy_spec
from adaptspec.paths import BUNDLED_HEAD
from adaptspec.speculator import Outcome, Prefill, Round

VOCAB = 50
WIDTH = 40  # not the bundled model's


def target_next(prefix: list[int]) -> int:
    """The toy target: a deterministic function of the prefix."""
    return (7 * prefix[-1] + 3 * len(prefix) + (prefix[-2] if len(prefix) > 1 else 0)) % VOCAB


class ToyDFlash:
    """A DFlash-style speculator: the target above, and a drafter that guesses the target's next
    token right with a probability fixed by the prompt (``features[0]`` reveals it). Each round
    drafts ``b - 1`` tokens, the target checks them, the longest right prefix is kept plus the
    target's own token. Timings are computed: a draft costs 1 ms a token, a verify 10 ms + 1 ms
    a position."""

    def __init__(
        self,
        max_block_size: int = 8,
        declare_width: bool = True,
        per_round: bool = False,
        hit: float | None = None,
    ) -> None:
        self.max_block_size = max_block_size
        self.hit = hit  # the drafter's hit rate on every prompt (None: set by the prompt)
        if declare_width:
            self.feature_dim = WIDTH
        self.per_round = per_round

    def prefill(self, prompt_ids, temperature=0.0, seed=None):
        ids = [int(i) for i in prompt_ids]
        rng = np.random.default_rng(ids)
        f = rng.normal(size=WIDTH).astype(np.float32)
        f[0] = 0.3 + 0.6 * (sum(ids) % 5) / 4 if self.hit is None else self.hit  # the drafter's hit rate
        return Prefill(
            first_token=target_next(ids),
            prompt_tokens=len(ids),
            features=f,
            state={"ids": ids, "hit": float(f[0]), "seed": sum(ids)},
        )

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        return toy_loop(
            prefill.state, prefill.first_token, block_size, max_new_tokens, self.per_round, on_round
        )


def toy_loop(
    state: dict,
    first: int,
    block_size: Any,
    max_new_tokens: int,
    per_round: bool = False,
    on_round: Any = None,
) -> Outcome:
    """The toy's draft/verify loop: a block size, or a schedule asked every round (``per_round``)
    or once."""
    rng = np.random.default_rng(state["seed"])
    seq = list(state["ids"]) + [first]
    out, rounds = [first], []
    once = block_size if isinstance(block_size, int) else block_size.draft_size([])
    while len(out) < max_new_tokens:
        b = block_size.draft_size(rounds) if per_round and not isinstance(block_size, int) else once
        b = min(b, max_new_tokens - len(out))
        accepted = 0
        for _ in range(b - 1):  # the drafts, checked against the target in order
            if rng.random() >= state["hit"]:
                break
            accepted += 1
        new = []
        for _ in range(accepted + 1):  # the accepted drafts (the target's tokens) and the bonus token
            new.append(target_next(seq + new))
        seq += new
        out += new
        r = Round(b, accepted + 1, 0.001 * (b - 1), 0.010 + 0.001 * b)
        rounds.append(r)
        if on_round is not None:
            on_round(new, r)
    return Outcome(out, rounds, sum(r.draft_s + r.verify_s for r in rounds))


def prompt(i: int) -> list[int]:
    return [(i * 7 + k) % VOCAB for k in range(5 + i % 4)]


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert isinstance(e.value, AdaptspecError) and msg and "\n" not in msg, msg
    return msg


# ============================================================================ defaults
@pytest.mark.parametrize("max_b", [8, 16])
@pytest.mark.parametrize("declare", [True, False])
def test_default_construction_decides_and_learns_from_the_first_request(max_b, declare, caplog):
    cold = [a for a in DEFAULT_ARMS if a <= max_b]  # 8 and 16 are both among the default arms
    with caplog.at_level(logging.INFO, logger="adaptspec.control.controller"):
        c = AdaptiveController(ToyDFlash(max_b, declare_width=declare), reward="tau")
    with c:
        assert c.policy_spec == "fi-ucb" and list(c.arms) == cold
        assert c.policy_choice.startswith("fi-ucb: no head fits: ")
        assert any(c.policy_choice in r.getMessage() for r in caplog.records)
        g = c.generate(prompt(0), max_new_tokens=24)
        assert g.fallback is None and g.decision.block_size in cold and g.reward is not None
        s = c.sync().stats()
        assert (
            s["updates"] == 1 and sum(s["fallbacks"].values()) == 0 and s["policy_choice"] == c.policy_choice
        )
        with pytest.raises(
            AdaptspecError
        ) as e:  # the first request fixed the width, or the speculator declared it
            c.decide(np.zeros(50))
        assert one_line(e).startswith("features have 50 values, ") and one_line(e).endswith(f" {WIDTH}")


def test_why_the_bundled_head_does_not_fit_is_said():
    assert "beyond max_block_size 8" in AdaptiveController(ToyDFlash(8), reward="tau").policy_choice
    with AdaptiveController(ToyDFlash(16), reward="tau") as c:
        assert f"the decoder's features have {WIDTH}" in c.policy_choice
    with AdaptiveController(ToyDFlash(16, declare_width=False), reward="tau") as c:
        assert "declares no feature_dim" in c.policy_choice


def test_default_policy_spec_reads_the_protocol_only():
    class Wide(ToyDFlash):
        feature_dim = 1153  # the bundled model's

        def __init__(self, max_b: int) -> None:
            super().__init__(max_b, declare_width=False)

    assert default_policy_spec(speculator=ToyDFlash(16)) == "fi-ucb"
    assert default_policy_spec(speculator=ToyDFlash(8)) == "fi-ucb"
    assert default_policy_spec(speculator=Wide(16)) == f"neural-linear:head={BUNDLED_HEAD}"
    assert default_policy_spec(speculator=Wide(8)) == "fi-ucb"  # the head's arms go to 16
    with AdaptiveController(Wide(16), reward="tau") as c:  # the same rule in the controller
        assert c.policy_spec == f"neural-linear:head={BUNDLED_HEAD}" and c.policy_choice.startswith(
            "neural-linear"
        )


def test_over_many_requests_the_default_learns_the_toys_best_block_size():
    # tau reward: the toy's expected tau at block b and hit rate h is (1 - h^b) / (1 - h) (before the
    # last round's cut at max_new_tokens): at h = 0.8, 4.16 at b = 8 against 3.69 at 6 and 2.95 at 4
    # (a cold learner may settle on 6 for a while after unlucky draws at 8: the two best, far above the rest)
    with AdaptiveController(ToyDFlash(8, hit=0.8), reward="tau", seed=1) as c:
        picks = [c.generate(prompt(i), max_new_tokens=64).decision.block_size for i in range(80)]
        assert c.sync().stats()["updates"] == 80
    # cold fi-ucb first plays the largest block, whose rounds show every smaller one
    assert picks[0] == 8 and set(picks[-20:]) <= {6, 8}


def test_an_explicit_head_of_another_width_is_refused_at_construction():
    with pytest.raises(AdaptspecError) as e:
        AdaptiveController(ToyDFlash(16), "neural-linear")
    assert "1153" in one_line(e) and f"have {WIDTH}" in one_line(e)
    with pytest.raises(AdaptspecError) as e:
        AdaptiveController.for_engine(
            arms=[1, 2, 3, 4, 6, 8, 12, 16], feature_dim=WIDTH, policy="neural-linear"
        )
    assert "1153" in one_line(e)


# ============================================================================ the split form, no speculator
def test_an_engine_decides_and_feeds_back_without_a_speculator():
    spec = ToyDFlash(8)  # its parts, used here as an engine would: its own prefill and loop
    with AdaptiveController.for_engine(arms=[1, 2, 4, 8], feature_dim=WIDTH, reward="tau") as c:
        assert c.policy_spec == "fi-ucb" and c.arms == (1, 2, 4, 8)
        for i in range(6):
            pre = spec.prefill(prompt(i))
            d = c.decide(pre.features)
            out = toy_loop(pre.state, pre.first_token, d.block_size, 16)
            assert c.feedback(d.decision_id, out) == "applied"
        assert c.sync().stats()["updates"] == 6
        with pytest.raises(AdaptspecError) as e:
            c.generate(prompt(0))
        assert "decide() and feedback()" in one_line(e)
        with pytest.raises(AdaptspecError) as e:
            c.decide(np.zeros(WIDTH + 1))
        assert one_line(e) == f"features have {WIDTH + 1} values, the controller's feature_dim is {WIDTH}"


def test_an_engine_controller_needs_its_arms_and_has_no_per_round_options():
    with pytest.raises(AdaptspecError) as e:
        AdaptiveController(None)
    assert "needs arms" in one_line(e)
    with pytest.raises(AdaptspecError) as e:
        AdaptiveController.for_engine(arms=[1, 4], redecide_every=2)
    assert "inside generate()" in one_line(e)
    with pytest.raises(AdaptspecError) as e:
        AdaptiveController.for_engine(arms=[1, 4], policy="fixed:8")
    assert "block size 8 is not one of the arms [1, 4]" in one_line(e)
    with pytest.raises(
        AdaptspecError
    ) as e:  # the bundled head's arms, where the engine cannot decode 3, 6 or 12
        AdaptiveController.for_engine(arms=[1, 2, 4, 8, 16], feature_dim=1153, policy="neural-linear")
    assert "the engine decodes only [1, 2, 4, 8, 16]" in one_line(e)
    with AdaptiveController.for_engine(
        arms=[1, 2, 4, 8, 16], feature_dim=1153
    ) as c:  # so the default is cold
        assert c.policy_spec == "fi-ucb" and "not all among the arms" in c.policy_choice
    with AdaptiveController.for_engine(arms=[1, 3, 5]) as c:  # arms need not be the default ones
        assert c.arms == (1, 3, 5) and c.decide(np.ones(7)).block_size in (1, 3, 5)


# ============================================================================ the protocol, checked
GOOD_PREFILL = [
    "self, prompt_ids, temperature=0.0, seed=None",
    "self, prompt_ids, **kw",
    "self, *args, **kwargs",
    "self, prompt_ids, temperature=0.0, seed=None, extra=1",
]
BAD_PREFILL = [
    "self, prompt_ids",
    "self, prompt_ids, temperature=0.0",
    "self, prompt_ids, seed=None",
    "self",
    "self, prompt_ids, *, t=0.0, seed=None",
    "self, a, b, temperature=0.0, seed=None",
]
GOOD_DECODE = [
    "self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None",
    "self, prefill, block_size, max_new_tokens, **kw",
    "self, *a, **kw",
    "self, prefill, block_size, max_new_tokens, *, temperature=0.0, seed=None, on_round=None",
]
BAD_DECODE = [
    "self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None",
    "self, prefill, block_size, max_new_tokens, temperature=0.0, on_round=None",
    "self, prefill, block_size, temperature=0.0, seed=None, on_round=None",
    "self, prefill, block_size, max_new_tokens",
    "self, prefill, *, block_size, max_new_tokens, **kw",
]


def make_speculator(prefill: str | None, decode: str | None, max_b: Any = 8) -> Any:
    body = {}
    if prefill is not None:
        exec(f"def prefill({prefill}): pass", body)
    if decode is not None:
        exec(f"def decode({decode}): pass", body)
    attrs = {k: v for k, v in body.items() if k in ("prefill", "decode")}
    if max_b is not None:
        attrs["max_block_size"] = max_b
    return type("UserSpec", (), attrs)()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(st.none(), st.sampled_from(GOOD_PREFILL), st.sampled_from(BAD_PREFILL)),
    st.one_of(st.none(), st.sampled_from(GOOD_DECODE), st.sampled_from(BAD_DECODE)),
    st.sampled_from([8, 16, None, 0, 2.5, "8", True]),
)
def test_a_protocol_violation_is_refused_in_one_line_naming_the_method(prefill, decode, max_b):
    spec = make_speculator(prefill, decode, max_b)
    # which part is wrong, by the tables above, in the order the protocol is checked
    wrong = (
        "prefill"
        if prefill is None or prefill in BAD_PREFILL
        else "decode"
        if decode is None or decode in BAD_DECODE
        else "max_block_size"
        if not (type(max_b) is int and max_b >= 1)
        else None
    )
    if wrong is None:
        with AdaptiveController(spec, "fixed:1", arms=[1]) as c:
            assert c.max_block_size == max_b
        return
    with pytest.raises(AdaptspecError) as e:
        AdaptiveController(spec, "fixed:1", arms=[1])
    msg = one_line(e)
    assert msg.startswith("speculator UserSpec")
    if wrong == "prefill":
        assert "prefill" in msg and msg.endswith(
            "the protocol's is prefill(prompt_ids, temperature=0.0, seed=None) -> Prefill"
        )
    elif wrong == "decode":
        assert "decode" in msg and msg.endswith(
            "the protocol's is decode(prefill, block_size, max_new_tokens, "
            "temperature=0.0, seed=None, on_round=None) -> Outcome"
        )
    else:
        assert "max_block_size" in msg


@pytest.mark.parametrize("option", [{"redecide_every": 2}, {"round_rule": "history"}])
def test_per_round_options_need_a_speculator_that_declares_per_round(option):
    with pytest.raises(AdaptspecError) as e:
        AdaptiveController(ToyDFlash(8), "random", **option)
    assert "does not declare per_round = True" in one_line(e)
    with AdaptiveController(ToyDFlash(8, per_round=True), "random", seed=3, reward="tau", **option) as c:
        g = c.generate(prompt(1), max_new_tokens=40)
        assert all(r.block_size <= 8 for r in g.outcome.rounds)
        if "redecide_every" in option:  # a re-decision every 2 rounds, each checked against its rounds
            assert len(g.decisions) == (len(g.outcome.rounds) + 1) // 2


# ============================================================================ outcomes, checked
@st.composite
def outcomes(draw):
    """A decided block size and an outcome an honest loop could have produced for it (taus, then
    the tokens cut at EOS or max_new_tokens inside the last round, all of its tokens included: a
    loop that checks for the end before a round runs one round past an exactly full output), and
    a corruption of it."""
    decided = draw(st.sampled_from([1, 2, 4, 8]))
    taus = draw(st.lists(st.integers(1, decided), min_size=0, max_size=6))
    last = taus[-1] if taus else 0
    n = 1 + sum(taus) - draw(st.integers(0, last))  # a stop may cut any part of the last round, or all of it
    rounds = [Round(decided, t, 0.0, 0.01) for t in taus]
    corruption = draw(st.sampled_from(["none", "extra_round", "extra_token", "bigger_block"]))
    if corruption == "extra_round":  # two verify rounds after the output: the second ran after it had ended
        rounds += [Round(decided, 1, 0.0, 0.01)] * 2
    elif corruption == "extra_token":
        n = 1 + sum(taus) + draw(st.integers(1, 3))
    elif corruption == "bigger_block":
        if not rounds:
            rounds, n = [Round(decided, 1, 0.0, 0.01)], 2
        rounds[draw(st.integers(0, len(rounds) - 1))] = Round(decided * 2, 1, 0.0, 0.01)
        n = 1 + sum(r.tau for r in rounds)
    return decided, Outcome([5] * n, rounds, 0.01 * max(1, len(rounds))), corruption


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(outcomes())
def test_an_outcome_whose_rounds_do_not_add_up_is_refused_in_one_line(case):
    decided, outcome, corruption = case
    with AdaptiveController.for_engine(arms=[decided], reward="tau", decide_timeout_s=5.0) as c:
        d = c.decide(np.ones(3))
        assert d.block_size == decided
        if corruption == "none":
            assert c.feedback(d.decision_id, outcome) in ("applied", "no_reward")
            return
        with pytest.raises(AdaptspecError) as e:
            c.feedback(d.decision_id, outcome)
        msg = one_line(e)
        assert msg.startswith(f"outcome of decision {d.decision_id} refused: ")
        want = {
            "extra_round": "ran after the output had ended",
            "extra_token": "committed",
            "bigger_block": f"larger than the {decided}",
        }
        assert want[corruption] in msg


def test_generate_refuses_a_decode_that_runs_rounds_after_its_output_ended(tmp_path):
    class ExtraRounds(ToyDFlash):  # two more verify rounds after the last token: the second one no loop runs
        def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
            out = super().decode(prefill, block_size, max_new_tokens, temperature, seed, on_round)
            extra = [Round(out.rounds[-1].block_size, 1, 0.0, 0.01)] * 2
            return Outcome(out.tokens, out.rounds + extra, out.decode_s + 0.02)

    with AdaptiveController(ExtraRounds(8), "fixed:4", log_dir=tmp_path) as c:
        with pytest.raises(AdaptspecError) as e:
            c.generate(prompt(2), max_new_tokens=12)
        assert "ran after the output had ended" in one_line(e)
        s = c.stats()
        assert s["feedback"]["decode_error"] == 1 and s["updates"] == 0 and s["pending"] == 0


# ============================================================================ directories and checkpoints
def test_the_same_directory_for_log_and_checkpoints_is_refused(tmp_path):
    for ck in (tmp_path, tmp_path / "ck"):
        with pytest.raises(AdaptspecError) as e:
            AdaptiveController(ToyDFlash(8), "ucb", log_dir=tmp_path, checkpoint_dir=ck)
        assert "must hold the log alone" in one_line(e)


def test_a_checkpoint_that_learnt_another_width_is_refused_at_resume(tmp_path):
    ck = tmp_path / "ck"
    with AdaptiveController(ToyDFlash(8), "linucb", checkpoint_dir=ck, reward="tau") as c:
        for i in range(3):
            c.generate(prompt(i), max_new_tokens=8)

    with pytest.raises(AdaptspecError) as e:
        AdaptiveController(
            ToyDFlash(8, declare_width=False),
            "linucb",
            checkpoint_dir=ck,
            reward="tau",
            feature_dim=WIDTH + 10,
        )
    assert f"learnt contexts of {WIDTH} values, this controller's have {WIDTH + 10}" in one_line(e)
    # undeclared: the resumed policy fixes the width, and a request of another width is refused
    with AdaptiveController.for_engine(
        arms=[1, 2, 4, 6, 8], policy="linucb", checkpoint_dir=ck, reward="tau"
    ) as c:
        assert c.resumed["updates_at_checkpoint"] == 3
        with pytest.raises(AdaptspecError) as e:
            c.decide(np.ones(WIDTH + 10))
        assert one_line(e) == f"features have {WIDTH + 10} values, policy linucb has learnt {WIDTH}"
        assert c.decide(np.ones(WIDTH)).extras.get("fallback") is None


# ============================================================================ the features helper
def test_prefill_features_is_what_the_bundled_decoder_gives_on_a_real_prompt():
    import torch

    import adaptspec
    from adaptspec.decoding import TargetModel
    from adaptspec.serving.tiny import tiny_model, tiny_speculator

    spec, codec = tiny_speculator(seed=0)
    ids = codec.encode("Write a haiku about speculative decoding.")
    model = tiny_model(seed=0)  # the same weights, run here as a user runs their own target
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    mine = adaptspec.prefill_features(out)
    assert mine.dtype == np.float32 and mine.shape == (spec.feature_dim,)
    np.testing.assert_array_equal(mine, spec.prefill(ids).features)  # the decoder calls it: bit for bit
    # by hand: the last layer at the last position, the middle layer (4 layers: 2) averaged, log(1 + length)
    hs = out.hidden_states
    by_hand = np.concatenate([hs[4][0, -1].numpy(), hs[2][0].mean(0).numpy(), [np.log1p(len(ids))]])
    np.testing.assert_allclose(mine, by_hand, rtol=1e-6, atol=1e-6)
    # another spec, with the projected logits, as a TargetModel of that spec computes it
    other = TargetModel(tiny_model(seed=0), features="logits:8,mean:1,len")
    np.testing.assert_allclose(
        adaptspec.prefill_features(out, spec="logits:8,mean:1,len"),
        other.prefill(ids).features,
        rtol=1e-5,
        atol=1e-5,
    )
    with pytest.raises(AdaptspecError) as e:
        with torch.no_grad():
            adaptspec.prefill_features(model(torch.tensor([ids])))
    assert "output_hidden_states=True" in one_line(e)


# ============================================================================ cold start to a head of its own
def test_traces_of_the_toy_train_a_head_the_controller_then_runs_on(tmp_path, capsys):
    from adaptspec.cli import main
    from adaptspec.collect import collect_traces

    spec = ToyDFlash(8)
    prompts = [(f"r{i}", "toy", prompt(i)) for i in range(40)]
    ts = collect_traces(
        spec, prompts, [1, 2, 4, 8], tmp_path / "new" / "traces", max_new_tokens=24, progress=False
    )
    assert ts.features.shape == (40, WIDTH)
    assert (
        main(
            [
                "train-head",
                str(tmp_path / "new" / "traces"),
                "--out",
                str(tmp_path / "head"),
                "--epochs",
                "30",
            ]
        )
        == 0
    )
    capsys.readouterr()
    with AdaptiveController(spec, f"neural-linear:head={tmp_path / 'head'}", reward="tau") as c:
        assert c.arms == (1, 2, 4, 8) and c.policy_choice.endswith("given by the caller")
        for i in range(5):
            assert c.generate(prompt(100 + i), max_new_tokens=16).fallback is None
        assert c.sync().stats()["updates"] == 5
    with pytest.raises(AdaptspecError) as e:  # the same head on a speculator of another width
        AdaptiveController(
            ToyDFlash(8, declare_width=False),
            f"neural-linear:head={tmp_path / 'head'}",
            feature_dim=WIDTH + 1,
        )
    assert f"reads prefill features of {WIDTH} values" in one_line(e)
    # the default rule, over this head: it fits the toy at 8 (arms 1-8, width 40), not at another width or arms
    from adaptspec.control.policy_build import choose_default_policy

    head = tmp_path / "head"
    assert default_policy_spec(head, speculator=spec) == f"neural-linear:head={head}"
    assert choose_default_policy(8, WIDTH + 1, head=head).reason.startswith(
        f"no head fits: head {head} reads {WIDTH} feature values, the decoder's features have {WIDTH + 1}"
    )
    assert (
        "not all among the arms [1, 2, 8]"
        in choose_default_policy(8, WIDTH, arms=[1, 2, 8], head=head).reason
    )
    assert choose_default_policy(4, WIDTH, head=head).spec == "fi-ucb"


def test_a_re_decisions_rounds_are_checked_against_its_own_block_size():
    class FirstAnswer:  # asks the schedule every round, keeps its first answer
        def __init__(self, schedule: Any) -> None:
            self.schedule, self.first = schedule, None

        def draft_size(self, rounds: list) -> int:
            b = self.schedule.draft_size(rounds)
            self.first = b if self.first is None else self.first
            return self.first

    class KeepsTheFirst(ToyDFlash):  # declares per_round, asks, but ignores every re-decision
        def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
            return toy_loop(
                prefill.state, prefill.first_token, FirstAnswer(block_size), max_new_tokens, True, on_round
            )

    with AdaptiveController(
        KeepsTheFirst(8, per_round=True, hit=0.9), "random", seed=0, redecide_every=1, reward="tau"
    ) as c:
        refused = 0
        for i in range(20):
            try:
                g = c.generate(prompt(i), max_new_tokens=24)
            except AdaptspecError as e:
                assert "\n" not in str(e) and "larger than the" in str(e)
                refused += 1
            else:  # every re-decision happened to choose at least the first one's block size
                assert all(r.block_size <= d.block_size for d, r in zip(g.decisions, g.outcome.rounds))
        assert refused > 0 and c.stats()["feedback"]["decode_error"] >= refused


def test_a_decision_log_fixes_the_width_of_a_controller_that_does_not_know_it(tmp_path):
    with AdaptiveController(
        ToyDFlash(8, declare_width=False), "ucb", log_dir=tmp_path / "log", reward="tau"
    ) as c:
        c.generate(prompt(0), max_new_tokens=8)
    with AdaptiveController.for_engine(arms=[1, 2, 4, 8], policy="ucb", log_dir=tmp_path / "log") as c:
        with pytest.raises(AdaptspecError) as e:  # refused now, not when the row is written
            c.decide(np.ones(WIDTH - 1))
        assert (
            one_line(e)
            == f"features have {WIDTH - 1} values, the decision log in {tmp_path / 'log'} holds {WIDTH}"
        )


def test_a_checkpoint_that_disagrees_with_the_decision_log_on_the_width_is_refused(tmp_path):
    with AdaptiveController.for_engine(
        arms=[1, 2, 4, 8], policy="linucb", checkpoint_dir=tmp_path / "ck"
    ) as c:
        c.feedback(c.decide(np.ones(30)).decision_id, reward=1.0)  # learns contexts of 30 values
    with AdaptiveController.for_engine(arms=[1, 2, 4, 8], policy="ucb", log_dir=tmp_path / "log") as c:
        c.feedback(c.decide(np.ones(WIDTH)).decision_id, reward=1.0)  # logs features of 40
    with pytest.raises(AdaptspecError) as e:
        AdaptiveController.for_engine(
            arms=[1, 2, 4, 8], policy="linucb", checkpoint_dir=tmp_path / "ck", log_dir=tmp_path / "log"
        )
    assert one_line(e).startswith(
        f"policy linucb has learnt contexts of 30 values, but the decision log in "
        f"{tmp_path / 'log'} holds {WIDTH} feature values"
    )


def test_generate_streams_every_round_of_the_bundled_decoder_and_of_the_toy():
    from adaptspec.serving.tiny import tiny_speculator

    spec, codec = tiny_speculator(seed=0)
    for speculator, ids in ((spec, codec.encode("Stream me, round by round.")), (ToyDFlash(8), prompt(3))):
        got: list[list[int]] = []
        with AdaptiveController(speculator, "fixed:4", arms=[1, 4], reward="tau") as c:
            g = c.generate(ids, max_new_tokens=20, on_tokens=got.append)
        assert len(got) == 1 + len(g.outcome.rounds)  # the first token, then one call per round
        assert [t for chunk in got for t in chunk] == g.tokens
