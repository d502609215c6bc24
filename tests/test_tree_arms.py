"""Tree arms (issue 47 item 4, phase 2): a decision may choose the best draft tree of N nodes (the
arm ``-N``) where the speculator declares ``draft_trees``; its rounds price every chain and every
smaller tree (full information), the decision log and trace sets keep it as an int, and a
chain-only speculator or user sees nothing new.

Expected values come from the definitions, written out here: a tree arm ``-M`` commits what the
first ``M`` nodes of the round's tree would have (``TreeOutcomes.tree``), a chain ``B`` what the
tree shows of its rank-0 path (``TreeOutcomes.chain``), each arm's time its own rounds' cost on the
profile, scaled by the measured over the modelled time of what ran.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaptspec import AdaptiveController
from adaptspec.control.policy_build import (
    DEFAULT_TREE_NODES,
    TREE_MARGIN,
    TREE_VERIFY_RATIO,
    default_on_host,
    tree_default,
)
from adaptspec.costs.latency import CostCurve, LatencyProfile, get_profile
from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
from adaptspec.errors import AdaptspecError
from adaptspec.reward.counterfactual import from_outcome
from adaptspec.speculator import (
    TREE_ARM_DEPTH,
    Outcome,
    Prefill,
    Round,
    TreeOutcomes,
    arm_label,
    check_block_sizes,
    parse_arm,
    tree_arm,
    verified_positions,
)
from adaptspec.traces import DecisionLog
from decoding_helpers import reference_greedy, tiny_target
from test_tree_decoding import TreePeekingDrafter

torch.set_num_threads(1)
PROFILE = get_profile("cpu-smollm2-fast")


def tiny_tree_decoder(peek: bool = True):
    model = tiny_target("llama", seed=4)
    target = TargetModel(model, verification="fast")
    drafter = BlockDiffusionDrafter.for_target(model, num_layers=1, seed=0, max_block_size=16)
    if peek:
        prompt_seq = [7, 8, 9, 10] + reference_greedy(model, [7, 8, 9, 10], 64)
        drafter = TreePeekingDrafter(drafter, prompt_seq, 3)
    return model, SpeculativeDecoder(target, drafter)


# ---------------------------------------------------------------------- arms as ints
def test_arm_labels_parse_and_checks():
    assert [parse_arm(arm_label(a)) for a in (1, 4, -16)] == [1, 4, -16]
    assert verified_positions(np.array([1, 4, -16])).tolist() == [1, 4, 17]
    for bad in ("0", "tree:0", "tree:x", "-3", "x"):
        with pytest.raises(AdaptspecError, match="is not an arm"):
            parse_arm(bad)
    assert check_block_sizes([tree_arm(8), 2, 1], 4, trees=True) == (-8, 1, 2)
    with pytest.raises(AdaptspecError, match="need a speculator that declares draft_trees"):
        check_block_sizes([tree_arm(8), 2], 4)
    with pytest.raises(AdaptspecError, match="at most 256 nodes"):
        check_block_sizes([tree_arm(300)], 4, trees=True)
    with pytest.raises(AdaptspecError, match="distinct integers >= 1"):
        check_block_sizes([0, 2], 4, trees=True)


def test_the_profile_prices_a_tree_arm_as_its_draft_and_its_nodes_plus_one():
    for n in (1, 8, 64):
        assert float(PROFILE.round_s(tree_arm(n))) == pytest.approx(
            float(PROFILE.draft_s(TREE_ARM_DEPTH + 1)) + float(PROFILE.verify_s(n + 1))
        )
    assert float(PROFILE.draft_s(1)) == 0.0 and float(PROFILE.round_s(4)) == pytest.approx(
        float(PROFILE.draft_s(4) + PROFILE.verify_s(4))
    )


# ---------------------------------------------------------------------- the decoder
def test_a_tree_arm_decodes_the_best_tree_and_reports_what_it_showed():
    model, dec = tiny_tree_decoder()
    pre = dec.prefill([7, 8, 9, 10])
    out = dec.decode(pre, tree_arm(12), 40)
    assert dec.draft_trees and out.tokens == reference_greedy(
        model, [7, 8, 9, 10], 40
    )  # the drafter does not change them
    trees = [r for r in out.rounds if r.tree]
    assert trees and all(r.block_size <= 13 and r.tree_outcomes is not None for r in trees)
    for r in trees:  # the round's own tau is its whole tree's
        assert r.tree_outcomes.tree(12) == r.tau and r.tree_outcomes.chain(1) == 1
    assert dec.decode(pre, tree_arm(12), 40).tokens == dec.decode(pre, 4, 40).tokens


# ---------------------------------------------------------------------- full information
def outcome_of(rounds, decode_s=0.05):
    committed = sum(r.tau for r in rounds)
    return Outcome([1] * (1 + committed), rounds, decode_s)


def test_counterfactuals_of_a_tree_request_follow_the_tree_outcomes():
    a = TreeOutcomes(tree_tau=(1, 2, 2, 3, 3), chain_tau=(1, 2, 3, None), chain_floor=(1, 2, 3, 3))
    b = TreeOutcomes(tree_tau=(1, 1, 1, 1, 2), chain_tau=(1, 1, 1, 1), chain_floor=(1, 1, 1, 1))
    rounds = [
        Round(5, 3, 0.001, 0.01, drafted=4, tree=True, tree_outcomes=a),
        Round(5, 2, 0.001, 0.01, drafted=4, tree=True, tree_outcomes=b),
        Round(1, 1, 0.0, 0.01),
    ]  # the last token's plain step
    arms = (tree_arm(8), tree_arm(4), tree_arm(2), 1, 2, 3, 4, 6)
    cf = from_outcome(outcome_of(rounds), tree_arm(4), arms, 30, PROFILE)
    by = dict(zip(cf.arms, cf.tokens.tolist()))
    # trees: the first M nodes of each round; chains: each round's rank-0 path; the plain step: 1 everywhere
    assert by[-4] == 3 + 2 + 1 and by[-2] == 2 + 1 + 1 and by[-8] == 3 + 2 + 1
    assert (
        by[1] == 3 and by[2] == 2 + 1 + 1 and by[3] == 3 + 1 + 1 and by[4] == 3 + 1 + 1 and by[6] == 3 + 1 + 1
    )
    cens = dict(zip(cf.arms, cf.censored.tolist()))
    assert cens[-8]  # larger than the trees that ran
    assert cens[4] and cens[6]  # round a's chain accepted down to depth 3, which the tree did not hold
    assert not any(cens[x] for x in (-4, -2, 1, 2, 3))
    approx = dict(zip(cf.arms, cf.approximate.tolist()))
    assert not any(approx[x] for x in (-8, -4, -2, 1)) and all(approx[x] for x in (2, 3, 4, 6))
    # time: each arm's own rounds, scaled as what ran was measured
    ctx = np.array([30 + 1, 30 + 1 + 3, 30 + 1 + 5])
    ran = sum(
        float(PROFILE.draft_s(d, c) + PROFILE.verify_s(v, c)) for d, v, c in zip((4, 4, 1), (5, 5, 1), ctx)
    )
    for arm in (-2, 3):
        own = sum(float(PROFILE.round_s(arm if v > 1 else 1, c)) for v, c in zip((5, 5, 1), ctx))
        assert dict(zip(cf.arms, cf.decode_s.tolist()))[arm] == pytest.approx(0.05 / ran * 6 / by[arm] * own)


def test_a_chain_request_tells_nothing_of_tree_arms_and_a_tree_without_outcomes_only_itself():
    chain = [Round(4, 2, 0.001, 0.01), Round(4, 4, 0.001, 0.01), Round(4, 1, 0.001, 0.01)]
    cf = from_outcome(outcome_of(chain), 4, (tree_arm(16), 1, 2, 4, 8), 30, PROFILE)
    assert cf.censored.tolist() == [True, False, False, False, True]
    bare = [Round(9, 3, 0.001, 0.01, drafted=16, tree=True), Round(9, 2, 0.001, 0.01, drafted=16, tree=True)]
    cf = from_outcome(outcome_of(bare), tree_arm(8), (tree_arm(8), tree_arm(4), 1, 4), 30, PROFILE)
    assert cf.censored.tolist() == [False, True, False, True]
    assert cf.tokens.tolist() == [5, 2, 2, 2]  # tree:8 ran (3 + 2); the others at least a token a round


# ---------------------------------------------------------------------- the learner
def test_fi_ucb_pairs_every_arm_with_the_plain_step_which_chain_requests_show_too():
    """The paired means' reference is the smallest block size (every request shows it), not the
    largest tree that sorts first (a chain's request censors it). Means written out:
    ``mean_k = mean(r_1) + mean over the requests showing k and 1 of (r_k - r_1)``."""
    from adaptspec.policies.fi_ucb import FullInfoUCB

    pol = FullInfoUCB([tree_arm(8), 1, 2], seed=0)
    assert pol.decide().block_size == tree_arm(8)  # the largest tree first: it shows every arm
    pol.update_full(None, [3.0, 1.0, 2.0], [True, True, True])  # a tree request
    pol.update_full(None, [0.0, 1.0, 5.0], [False, True, True])  # a chain request: the tree censored
    pol.update_full(None, [0.0, 3.0, 4.0], [False, True, True])
    ref = (1.0 + 1.0 + 3.0) / 3
    assert pol.means().tolist() == pytest.approx(
        [ref + (3 - 1), ref, ref + ((2 - 1) + (5 - 1) + (4 - 3)) / 3]
    )
    trees_only = FullInfoUCB(
        [tree_arm(8), tree_arm(2)], seed=0
    )  # the smallest tree: shown by every larger one
    trees_only.update_full(None, [4.0, 2.0], [True, True])
    trees_only.update_full(None, [0.0, 1.0], [False, True])
    assert trees_only.means().tolist() == pytest.approx([1.5 + 2.0, 1.5])


# ---------------------------------------------------------------------- the controller
def test_the_controller_decides_tree_arms_learns_every_arm_and_logs_ints(tmp_path):
    model, dec = tiny_tree_decoder()
    arms = (tree_arm(12), tree_arm(4), 1, 2, 4)
    with AdaptiveController(
        dec, "fi-ucb", arms=arms, log_dir=tmp_path / "log", latency="cpu-smollm2-fast"
    ) as c:
        gens = [c.generate([7, 8, 9, 10], max_new_tokens=24) for _ in range(4)]
        c.sync()
        assert c.stats()["update_errors"] == 0
    assert gens[0].decision.block_size == tree_arm(
        12
    )  # fi-ucb starts from the largest tree: it shows the most
    assert all(g.tokens == reference_greedy(model, [7, 8, 9, 10], 24) for g in gens)
    log = DecisionLog.read(tmp_path / "log")
    assert log.block_sizes[0] == -12 and list(log.arms) == sorted(arms)
    first = log.table.to_pylist()[
        0
    ]  # the largest tree ran: the smaller tree, plain steps and B = 2 are known
    assert [c for a, c in zip(sorted(arms), first["cf_censored"]) if a in (-12, -4, 1, 2)] == [False] * 4
    assert log.cf_observed[0].sum() >= 4 and np.isfinite(log.cf_rewards[0]).all()


def test_a_fixed_tree_policy_plays_its_tree(tmp_path):
    model, dec = tiny_tree_decoder()
    with AdaptiveController(dec, "fixed:-8", arms=(1, tree_arm(8)), latency="cpu-smollm2-fast") as c:
        g = c.generate([7, 8, 9, 10], max_new_tokens=16)
    assert g.decision.block_size == -8 and g.tokens == reference_greedy(model, [7, 8, 9, 10], 16)
    assert any(r.tree and r.block_size <= 9 for r in g.outcome.rounds)


def test_a_trace_set_keeps_tree_arms(tmp_path):
    """A trace set collected at a tree arm holds what FixedTree(N) decodes (its own budget, the
    second way to ask for the same tree), and replays as it."""
    from adaptspec.collect.every_arm import collect_traces
    from adaptspec.decoding import FixedTree
    from adaptspec.traces import TraceSet

    _, dec = tiny_tree_decoder(peek=False)
    prompts = [("a", "x", [7, 8, 9, 10]), ("b", "x", [3, 4, 5])]
    collect_traces(dec, prompts, [1, 2, tree_arm(4)], tmp_path / "ts", max_new_tokens=16, progress=False)
    ts = TraceSet.read(tmp_path / "ts")
    assert ts.arms == (-4, 1, 2)
    for i, (_, _, ids) in enumerate(prompts):
        out = dec.generate(ids, FixedTree(4), 16)
        assert ts.tau_matrix()[i, 0] == pytest.approx(np.mean([r.tau for r in out.rounds]))
        assert ts.new_tokens_matrix()[i, 0] == out.new_tokens
    from adaptspec.simulators.replay import replay  # a fixed tree replayed: its column's mean tau

    rep = replay(ts, ["fixed:-4"], reward="tau", seeds=[0])
    assert rep.policies[0].mean("mean_tau") == pytest.approx(ts.tau_matrix()[:, 0].mean())


def test_a_checkpoint_of_a_policy_over_tree_arms_resumes(tmp_path):
    _, dec = tiny_tree_decoder(peek=False)
    arms = (tree_arm(8), 1, 2, 4)
    with AdaptiveController(
        dec,
        "fi-ucb",
        arms=arms,
        checkpoint_dir=tmp_path / "ck",
        checkpoint_every=1,
        latency="cpu-smollm2-fast",
    ) as c:
        for _ in range(3):
            c.generate([7, 8, 9, 10], max_new_tokens=12)
        c.sync()
    with AdaptiveController(
        dec, "fi-ucb", arms=arms, checkpoint_dir=tmp_path / "ck", latency="cpu-smollm2-fast"
    ) as c:
        assert c.stats()["resumed"]["updates_at_checkpoint"] == 3 and c.arms == tuple(sorted(arms))


def test_tree_arms_are_refused_where_the_speculator_does_not_verify_trees(tmp_path):
    class Chains:
        max_block_size = 8
        feature_dim = 2

        def prefill(self, prompt_ids, temperature=0.0, seed=None):
            return Prefill(1, len(prompt_ids), np.zeros(2, np.float32))

        def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
            return Outcome([1], [], 0.0)

    with pytest.raises(
        AdaptspecError, match=r"tree arms \[tree:8\] need a speculator that declares draft_trees"
    ):
        AdaptiveController(Chains(), "fi-ucb", arms=(1, 4, tree_arm(8)))
    with pytest.raises(AdaptspecError, match=r"tree arms \[tree:8\] need"):  # no engine decodes trees yet
        AdaptiveController(None, "fi-ucb", arms=(1, 4, tree_arm(8)))
    _, dec = tiny_tree_decoder(peek=False)
    with pytest.raises(
        AdaptspecError, match="hold draft trees, which redecide_every and round_rule cannot choose"
    ):
        AdaptiveController(dec, "fi-ucb", arms=(1, 4, tree_arm(8)), redecide_every=2)


# ---------------------------------------------------------------------- the default
class Host:
    """What default_on_host reads of a host measurement."""

    def __init__(self, profile, head):
        from adaptspec.host.pricing import expected_speeds, prior_tokens_per_round
        from adaptspec.policies.offline_head import HeadModel

        self.profile, self.head, self.dtype = profile, head, "bfloat16"
        self.speeds = expected_speeds(profile, prior_tokens_per_round(HeadModel.load(head).arms))
        self.best_block_size = max(self.speeds, key=self.speeds.get)
        self.speculation_pays = self.best_block_size > 1


def curve(ratio4: float, per_token_after: float) -> LatencyProfile:
    """A host whose 4-token verify costs ``ratio4`` times a 1-token one (50 ms), then
    ``per_token_after`` ms a position."""
    v1 = 0.050
    return LatencyProfile(
        "t",
        draft=CostCurve((2, 16), (0.004, 0.006)),
        verify=CostCurve((1, 4, 65), (v1, v1 * ratio4, v1 * ratio4 + 61 * per_token_after / 1e3)),
    )


def test_the_default_never_plays_a_tree_where_a_wide_verify_is_not_cheap():
    from adaptspec.paths import BUNDLED_HEAD

    steep = Host(curve(2.55, 5.0), BUNDLED_HEAD)  # the AVX2 host of issue 47
    choice, fallback = default_on_host(16, 1153, None, lambda: steep, trees=True)
    assert (
        choice.arms is None and choice.spec == "fixed:1" and fallback == 1
    )  # nothing beyond B = 1 pays there
    assert tree_default(steep.profile, steep.speeds, (1, 2, 4)) is None
    assert float(steep.profile.verify_s(4)) / float(steep.profile.verify_s(1)) > TREE_VERIFY_RATIO


def test_the_default_adds_trees_only_where_they_beat_the_best_chain_on_the_hosts_curve():
    from adaptspec.paths import BUNDLED_HEAD

    flat = Host(curve(1.02, 0.2), BUNDLED_HEAD)  # a GPU-like curve: a wide verify nearly free
    choice, fallback = default_on_host(16, 1153, None, lambda: flat, trees=True)
    assert choice.spec == "fi-ucb" and {tree_arm(n) for n in DEFAULT_TREE_NODES} <= set(choice.arms)
    assert fallback < 0 and "draft trees pay" in choice.reason
    chains_only, _ = default_on_host(16, 1153, None, lambda: flat, trees=False)  # a speculator without trees
    assert chains_only.arms is None and "neural-linear" in chains_only.spec
    given, _ = default_on_host(
        16, 1153, (1, 2, 3, 4, 6, 8, 12, 16), lambda: flat, trees=True
    )  # arms given: kept
    assert given.arms is None
    # a tree that only ties the best chain at the prior is not added
    best_chain = max(flat.speeds.values())
    tie = {n: best_chain * float(flat.profile.round_s(tree_arm(n))) * (1 + TREE_MARGIN / 2) for n in (8, 16)}
    assert tree_default(flat.profile, flat.speeds, (1, 2, 4), prior=tie) is None


def test_on_the_measured_avx512_curve_the_default_keeps_chains():
    """The passes bench_trees.py timed on the AVX-512 host (benchmarks/results/trees-avx512-346.json,
    CPU ms, one thread, bfloat16): there the best fixed tree decoded 1.06x [1.01, 1.11] the best
    chain, under the 1.10x bar TREE_MARGIN states, and the curve prices it under it too."""
    from adaptspec.host.pricing import expected_speeds, prior_tokens_per_round

    verify_ms = {1: 57.1, 2: 56.2, 3: 58.5, 4: 62.4, 6: 72.2, 8: 66.6, 16: 79.3, 32: 105.2, 64: 162.4}
    sizes = sorted(verify_ms)
    envelope = np.maximum.accumulate([verify_ms[b] / 1e3 for b in sizes])  # a cost curve never decreases
    measured = LatencyProfile(
        "avx512",
        draft=CostCurve((4, 16), (0.00508, 0.00691)),
        verify=CostCurve(tuple(sizes), tuple(envelope.tolist())),
    )
    chains = (1, 2, 3, 4, 6, 8, 12, 16)
    speeds = expected_speeds(measured, prior_tokens_per_round(chains))
    assert (
        float(measured.verify_s(4)) / float(measured.verify_s(1)) <= TREE_VERIFY_RATIO
    )  # a wide pass is cheap here
    assert tree_default(measured, speeds, chains) is None
    assert (
        tree_default(measured, speeds, chains, prior={8: 2.2}) is not None
    )  # at the tau issue 47 asks of trees
