"""The evaluation report: each section computes what it claims, on small trace sets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adaptspec.errors import AdaptspecError
from adaptspec.evaluation import Outputs, Request, Settings, findings as F, run_evaluation
from adaptspec.evaluation.coldstart import crossing, section_coldstart
from adaptspec.evaluation.core import Scorer, shuffled_stream, split_requests
from adaptspec.evaluation.drift import drift_stream, recovery_time
from adaptspec.evaluation.e2e import run_e2e
from adaptspec.evaluation.replay_sections import evaluate_lineup, section_blockpilot
from adaptspec.simulators.synthetic import generate
from adaptspec.speculator import Outcome, Prefill, Round
from adaptspec.traces import TraceSet

TINY = dict(
    splits=1,
    orders=2,
    passes=2,
    blockpilot_passes=3,
    drift_phase_steps=120,
    drift_synthetic_requests=300,
    coldstart_repeats=1,
    batch_sizes=(1, 32),
    progress=False,
)


@pytest.fixture(scope="module")
def synth() -> TraceSet:
    return generate("cpu-small", n_requests=90, seed=3, per_round=False, progress=False)


@pytest.fixture(scope="module")
def lineup(synth: TraceSet):
    return evaluate_lineup(
        synth, "throughput", None, 1, Settings(**{**TINY, "splits": 2}), domains=True, curves=True
    ).data


def _rows(rows):
    return {r["policy"]: r for r in rows}


# ============================================================================ splits and streams
def test_split_is_disjoint_stratified_and_seeded(synth: TraceSet) -> None:
    tr, ev = split_requests(synth.domains, 0.5, seed=4)
    assert not set(tr) & set(ev) and len(tr) + len(ev) == synth.n_requests
    for d in set(synth.domains):
        m = synth.domains == d
        assert m[tr].sum() >= 1 and m[ev].sum() >= 1
        assert abs(m[tr].sum() - m.sum() / 2) <= 1
    tr2, _ = split_requests(synth.domains, 0.5, seed=4)
    tr3, _ = split_requests(synth.domains, 0.5, seed=5)
    assert np.array_equal(tr, tr2) and not np.array_equal(tr, tr3)
    with pytest.raises(AdaptspecError, match="train fraction"):
        split_requests(synth.domains, 1.0, 0)


def _wide_traces(real: bool) -> TraceSet:
    """Collect-style ids and meta, 100 features (wider than the raw limit), the last one the log prompt length."""
    from adaptspec.models.prompts import heldout_prompts

    pool = heldout_prompts()[:40]
    n = len(pool)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 100)).astype(np.float32)
    tau = np.stack([np.ones(n), 1 + rng.uniform(0, 3, n)], axis=1)
    meta = {
        "source": "adaptspec collect" if real else {"kind": "synthetic"},
        "features": "last:-1,mean:mid,len",
    }
    return TraceSet.from_arrays(
        [f"{p.domain}-{i:04d}" for i, p in enumerate(pool)],
        [p.domain for p in pool],
        [1, 4],
        tau,
        features=X,
        new_tokens=np.full(n, 50),
        rounds=np.full((n, 2), 20),
        decode_ms=rng.uniform(500, 900, (n, 2)),
        meta=meta,
    )


def test_wide_features_are_reduced_on_the_training_split_only() -> None:
    from adaptspec.evaluation.core import PCA_DIM, make_contexts

    ts = _wide_traces(True)
    tr, ev = split_requests(ts.domains, 0.5, 0)
    ctx = make_contexts(ts, tr)
    assert ctx.X.shape == (ts.n_requests, min(PCA_DIM, len(tr) - 1) + 1)  # components + the kept log length
    assert np.allclose(ctx.featurizer.mean, ts.features[tr].mean(axis=0), atol=1e-5)
    assert not np.allclose(ctx.featurizer.mean, ts.features[ev].mean(axis=0), atol=1e-3)
    assert make_contexts(ts, tr) is ctx  # shared by the sections


def test_e2e_policy_uses_the_traces_head_only_when_it_fits_the_decoder() -> None:
    from adaptspec.evaluation.e2e import e2e_policy, pick_prompts
    from adaptspec.policies import NeuralLinear

    real = _wide_traces(True)
    pol, feat, how = e2e_policy(real, 100, 0.5)
    assert (
        isinstance(pol, NeuralLinear) and feat is not None and feat.in_dim == 100 and "training split" in how
    )
    spec, feat, how = e2e_policy(real, 1153, 0.5)  # another decoder's features: the product default instead
    assert isinstance(spec, str) and feat is None and "not this decoder's" in how
    assert "synthetic" in e2e_policy(_wide_traces(False), 100, 0.5)[2]
    prompts, how = pick_prompts(real, 5, 0.5)
    _, ev = split_requests(real.domains, 0.5, 0)
    held = {str(real.request_ids[j]) for j in ev}
    known = set(map(str, real.request_ids))
    assert len(prompts) == 5 and all(rid in held or rid not in known for rid, _, _ in prompts)


def test_e2e_prompts_of_the_bundled_set_are_its_held_out_benchmark_prompts() -> None:
    from collections import Counter

    from adaptspec.evaluation.e2e import pick_prompts
    from adaptspec.models.prompts import benchmark_prompts
    from adaptspec.traces import load_traces

    ts = load_traces()  # the bundled default: the public benchmark prompts
    prompts, how = pick_prompts(ts, 30, 0.5)
    tr, _ = split_requests(ts.domains, 0.5, 0)
    trained = {str(ts.request_ids[j]) for j in tr}
    pool = benchmark_prompts()
    for rid, domain, text in prompts:
        i = int(rid.rsplit("-", 1)[1])
        assert (pool[i].domain, pool[i].prompt) == (domain, text) and rid not in trained
    assert Counter(d.split("/")[0] for _, d, _ in prompts) == {"gsm8k": 10, "humaneval": 10, "mt-bench": 10}
    assert how.startswith("public benchmark prompts")


def test_stream_passes_are_permutations() -> None:
    pool = np.array([3, 5, 9, 11])
    s = shuffled_stream(pool, 10, seed=1)
    assert len(s) == 10 and sorted(s[:4]) == [3, 5, 9, 11] and sorted(s[4:8]) == [3, 5, 9, 11]


def test_scorer_percentages() -> None:
    R = np.array([[1.0, 3.0], [4.0, 2.0]])
    sc = Scorer(R, np.ones_like(R))
    idx = np.array([0, 1, 0, 1])
    s = sc.score(idx, np.array([1, 1, 1, 1]))  # always arm 1: 3, 2, 3, 2 against the oracle's 3, 4, 3, 4
    assert s["pct_oracle"] == pytest.approx(100 * 10 / 14)
    assert s["gain_pct"] == pytest.approx(
        0.0
    )  # arm 1 (sum 10) is the best fixed arm, arm 0 sums 10 too: tie -> 0
    assert sc.score(idx, sc.oracle_choice(idx))["pct_oracle"] == pytest.approx(100.0)
    assert sc.regret(idx, np.array([0, 0, 0, 0])).tolist() == [2.0, 2.0, 4.0, 4.0]


# ============================================================================ section 1 (and 2's engine)
def test_oracle_bounds_every_policy_and_percentages_agree(lineup) -> None:
    rows = _rows(lineup["stream"])
    oracle = rows["oracle"]
    best = rows["best fixed"]
    assert oracle["pct_oracle"]["values"] == [100.0] * lineup["runs"]
    for name, r in rows.items():
        # % of oracle and gain are ratios of the same streams' rewards (means over runs of equal length)
        assert r["mean_reward"]["mean"] <= oracle["mean_reward"]["mean"] + 1e-6, name
        assert r["pct_oracle"]["mean"] <= 100.0 + 1e-9
        if "values" in r["gain_pct"]:
            assert len(r["gain_pct"]["values"]) == lineup["runs"]
            for g, p, bb in zip(
                r["gain_pct"]["values"], r["pct_oracle"]["values"], best["pct_oracle"]["values"]
            ):
                assert g == pytest.approx(100 * (p / bb - 1), abs=1e-2), name  # run by run
        if r["kind"] == "fixed":  # the best fixed block is the best in hindsight
            assert r["gain_pct"]["hi"] <= 1e-9
    assert {f"fixed:{a}" for a in lineup["arms"]} <= set(rows)
    assert rows[f"fixed:{lineup['best_fixed']}"]["gain_pct"]["mean"] == pytest.approx(0.0)
    for name in (
        "ucb-throughput",
        "head, classifier (BlockPilot-style)",
        "neural-linear (default)",
        "linucb (cold)",
        "squarecb (cold)",
    ):
        assert name in rows
        lo, m, hi = (rows[name]["pct_oracle"][k] for k in ("lo", "mean", "hi"))
        assert lo <= m <= hi <= 100.0 + 1e-9
    assert lineup["n_train"] + lineup["n_eval"] == 90 and lineup["steps"] == 2 * lineup["n_eval"]


def test_domain_breakdown_sums_to_the_whole(lineup) -> None:
    doms = lineup["domains"]
    assert sum(d["share"] for d in doms) == pytest.approx(1.0, abs=1e-3)
    for d in doms:  # nothing beats the per-request oracle, domain by domain
        g = d["gain_pct"]
        assert all(v["mean"] <= g["oracle"]["mean"] + 1e-9 for v in g.values())


def test_findings_follow_the_intervals(lineup) -> None:
    assert F.verdict({"mean": 2.0, "lo": 1.0, "hi": 3.0}).startswith("beats")
    assert F.verdict({"mean": -2.0, "lo": -3.0, "hi": -1.0}).startswith("loses to")
    assert F.verdict({"mean": 0.5, "lo": -1.0, "hi": 2.0}).startswith("cannot be told apart")
    assert "in every run" in F.verdict({"mean": 1.0, "lo": 1.0, "hi": 1.0})
    text = "\n".join(F.replay_findings(lineup))
    assert f"B={lineup['best_fixed']}" in text
    oracle_gain = _rows(lineup["stream"])["oracle"]["gain_pct"]["mean"]
    assert f"{oracle_gain:+.1f}%" in text


def test_no_headroom_is_reported_as_such() -> None:
    """When one block size is best for every request, the text must say adaptation cannot help."""
    n = 24
    tau = np.tile([1.0, 2.0, 2.5], (n, 1))
    dec = np.tile([400.0, 300.0, 320.0], (n, 1)) * (1 + 0.01 * np.arange(n))[:, None]
    ts = TraceSet.from_arrays(
        [f"r{i}" for i in range(n)],
        ["a", "b"] * (n // 2),
        [1, 4, 8],
        tau,
        features=np.random.default_rng(0).normal(size=(n, 3)),
        new_tokens=np.full(n, 60),
        rounds=np.full((n, 3), 30),
        decode_ms=dec,
    )
    st = Settings(**{**TINY, "orders": 1})
    data = evaluate_lineup(ts, "throughput", None, 1, st, domains=True).data
    assert data["best_fixed"] == 4 and _rows(data["stream"])["oracle"]["gain_pct"]["mean"] == pytest.approx(
        0.0
    )
    lines = F.where_it_does_not_help({"replay": {"data": data}})
    assert any("only +0.0% above the best fixed block" in x for x in lines)


# ============================================================================ section 3
def _blockpilot_folder(root: Path) -> Path:
    f = root / "toy_0T0.0"
    f.mkdir()
    rng = np.random.default_rng(2)
    taus = {
        b: {str(i): float(np.clip(b * 0.4 + rng.normal(0, 0.3), 1, b)) for i in range(6)} for b in (4, 8, 12)
    }
    for b, d in taus.items():
        (f / f"{b}.json").write_text(json.dumps(d))
    choice = {k: max(taus, key=lambda b: taus[b][k]) for k in taus[4]}
    (f / "1.json").write_text(json.dumps(choice))
    (f / "mapped_from_1.json").write_text(json.dumps({k: taus[b][k] for k, b in choice.items()}))
    return f


def test_blockpilot_section(tmp_path: Path) -> None:
    st = Settings(**TINY)
    d, _ = section_blockpilot(_blockpilot_folder(tmp_path), st)
    assert d["status"] == "ok" and d["traces"]["features"] is None
    for rw in d["rewards"]:
        rows = _rows(rw["policies"])
        assert not any(r["kind"] == "contextual" for r in rows.values())  # no features: no contextual policy
        sel = rows["BlockPilot's selector (released choices)"]
        assert sel["pct_oracle"]["mean"] == pytest.approx(100.0)  # the toy choices are the per-prompt best
        assert all(r["pct_oracle"]["mean"] <= 100.0 + 1e-9 for r in rows.values())
    missing, _ = section_blockpilot(tmp_path / "nowhere", st)
    assert missing["status"] == "absent"
    none, _ = section_blockpilot(None, st)
    assert none["status"] == "not-run"


# ============================================================================ section 4
def test_recovery_time_finds_a_known_change() -> None:
    r = np.concatenate([np.zeros(50), np.ones(200)])
    assert recovery_time(r, np.ones(250), window=10) == 50
    assert recovery_time(np.ones(30), np.ones(30), window=10) == 0
    assert recovery_time(np.full(30, 0.9), np.ones(30), window=10) is None


def _two_domain_traces(n: int = 120) -> TraceSet:
    """Domain a: B=8 doubles throughput; domain b: B=8 takes 25% longer, so B=8 is best on the mix
    (by any reward) and B=1 on domain b alone. Features reveal the domain."""
    rng = np.random.default_rng(1)
    dom = np.array(["a", "b"] * (n // 2))
    isa = (dom == "a").astype(float)
    X = np.stack([isa, 1 - isa, rng.normal(0, 0.1, n)], axis=1)
    dec = np.stack([np.full(n, 4000.0), np.where(isa == 1, 2000.0, 5000.0)], axis=1) * rng.uniform(
        0.98, 1.02, (n, 2)
    )
    tau = np.stack([np.ones(n), np.where(isa == 1, 3.0, 1.2)], axis=1)
    return TraceSet.from_arrays(
        [f"r{i}" for i in range(n)],
        dom,
        [1, 8],
        tau,
        features=X,
        new_tokens=np.full(n, 100),
        rounds=np.full((n, 2), 40),
        decode_ms=dec,
    )


def test_drift_recovery_detected() -> None:
    st = Settings(**{**TINY, "drift_phase_steps": 300})
    d, plot = drift_stream(_two_domain_traces(), "toy", st, train_fraction=0.5)
    rows = _rows(d["policies"])
    assert d["phase_a"] == ["a"] and d["phase_b"] == ["b"]
    assert d["phase_best_fixed"] == [(8, 1)] * st.orders
    assert rows["best fixed of each phase (reference)"]["recovery"] == [0] * st.orders
    # fixed B=8 (best on the mixed training split) is wrong for phase b and never recovers
    assert rows["fixed:8 (best on the training split)"]["recovery"] == [None] * st.orders
    # UCB without forgetting needs ~600 requests to unlearn 300 of phase a: not within the phase
    assert rows["ucb-throughput"]["recovered_runs"] == 0
    # the head reads the domain from the features: no drift for it
    assert rows["head, classifier (BlockPilot-style)"]["recovery"] == [0] * st.orders
    assert plot["change"] == 300 and len(plot["steps"]) == len(plot["curves"]["oracle"])
    text = "\n".join(F.drift_findings({"streams": [d]}))
    assert "moves the best fixed block from B=8 to B=1" in text and "`ucb-throughput`" in text


# ============================================================================ section 5
def test_coldstart_curve(synth: TraceSet) -> None:
    d, _ = section_coldstart(synth, Settings(**TINY))
    assert d["status"] == "ok" and d["sizes"][0] == 8 and d["sizes"][-1] == d["n_train"]
    for h in d["horizons"].values():
        curve = h["warm"]["neural-linear (warm)"]
        assert [p["size"] for p in curve] == d["sizes"]
        assert all(0 < p["pct_oracle"]["mean"] <= 100 for p in curve)
        best_cold = max(
            (c for c in h["cold"] if c["policy"] != "best fixed"), key=lambda c: c["pct_oracle"]["mean"]
        )
        assert h["best_cold"] == best_cold["policy"]
        nl = [p["pct_oracle"]["mean"] for p in curve]
        assert h["crossing"] == crossing(d["sizes"], nl, best_cold["pct_oracle"]["mean"])
    no_feat = TraceSet.from_arrays(["a", "b"], ["x", "y"], [1, 2], np.array([[1.0, 1.5], [1.0, 1.2]]))
    assert section_coldstart(no_feat, Settings(**TINY))[0]["status"] == "no-features"


# ============================================================================ section 6
class ToySpeculator:
    """Lossless by construction (tokens do not depend on B) unless ``lossy``; timings computed."""

    max_block_size = 8

    def __init__(self, lossy: bool = False) -> None:
        self.lossy = lossy

    def prefill(self, prompt_ids, **kw):
        ids = [int(i) for i in prompt_ids]
        acc = 0.5 + (sum(ids) % 7) / 14
        return Prefill(sum(ids) % 50, len(ids), np.array([acc, len(ids) / 10.0], np.float32), {"acc": acc})

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        acc = prefill.state["acc"]
        out, rounds = [prefill.first_token], []
        while len(out) < max_new_tokens:
            b = block_size(len(rounds), rounds) if callable(block_size) else block_size
            b = min(b, max_new_tokens - len(out))
            tau = min(b, 1 + int(acc * (b - 1)))
            rounds.append(Round(b, tau, 0.001 * (b > 1), 0.010 + 0.001 * b))
            for _ in range(tau):
                out.append((out[-1] + 1 + (self.lossy and b > 1)) % 50)
        return Outcome(out[:max_new_tokens], rounds, sum(r.draft_s + r.verify_s for r in rounds))


def _toy_walk(ids, b: int, max_new_tokens: int) -> tuple[int, float]:
    """New tokens and decode seconds of ToySpeculator at fixed block size ``b``, by its stated rule."""
    acc = 0.5 + (sum(ids) % 7) / 14
    n, s = 1, 0.0
    while n < max_new_tokens:
        bb = min(b, max_new_tokens - n)
        s += 0.001 * (bb > 1) + 0.010 + 0.001 * bb
        n += min(bb, 1 + int(acc * (bb - 1)))
    return min(n, max_new_tokens), s


def test_e2e_summary_is_consistent() -> None:
    prompts = [(f"p{i}", "toy", [3 + i, 5, 7 * i]) for i in range(4)]
    d = run_e2e(ToySpeculator(), prompts, 4, "ucb", max_new_tokens=20, progress=False)
    m = d["methods"]
    assert d["prompts"] == 4 and d["identical_outputs"] == 4
    c = d["controller"]
    # expected totals from the toy's timing rule, walked here independently of run_e2e
    plain = [_toy_walk(ids, 1, 20) for _, _, ids in prompts]
    fixed = [_toy_walk(ids, 4, 20) for _, _, ids in prompts]
    ctrl = [_toy_walk(ids, b, 20) for (_, _, ids), b in zip(prompts, c["block_sizes"])]
    tps = {
        k: sum(n for n, _ in w) / sum(s for _, s in w)
        for k, w in (("plain", plain), ("fixed", fixed), ("controller", ctrl))
    }
    for k in ("plain", "fixed", "controller"):
        assert m[k]["new_tokens"] == 80
        assert m[k]["tokens_per_s"] == pytest.approx(tps[k], rel=1e-3)
        assert m[k]["speedup"] == pytest.approx(tps[k] / tps["plain"], rel=1e-3)
    assert m["plain"]["mean_tau"] == 1.0 and m["fixed"]["speedup"] > 1.0
    assert len(c["block_sizes"]) == 4 and c["updates"] == 4 and c["fallbacks"] == 0
    dec = sum(r["controller"]["decode_s"] for r in d["rows"])
    ov = sum(r["controller"]["overhead_s"] for r in d["rows"])
    assert c["overhead_pct_of_decode"] == pytest.approx(100 * ov / dec, rel=1e-3)
    bad = run_e2e(ToySpeculator(lossy=True), prompts, 4, "ucb", max_new_tokens=20, progress=False)
    assert bad["identical_outputs"] < 4
    assert any("Outputs differed" in x for x in F.e2e_findings({**bad, "max_new_tokens": 20}))


# ============================================================================ the report
def test_report_written_and_sections_carried_over(tmp_path: Path, synth: TraceSet) -> None:
    traces = synth.write(tmp_path / "traces")
    out = Outputs(
        tmp_path / "docs" / "evaluation.md", tmp_path / "docs" / "headline.md", tmp_path / "docs" / "eval"
    )
    first = run_evaluation(
        Request(
            traces=str(traces),
            settings=Settings(**TINY),
            command="test run 1",
            blockpilot=str(tmp_path / "absent"),
        ),
        out,
        log=lambda s: None,
    )
    md = out.report.read_text()
    for title in (
        "1. Replay",
        "2. Same acceptance",
        "3. Real published",
        "4. Drift",
        "5. Cold start",
        "6. End to end",
        "7. Per-round schedules",
        "8. Under load",
        "9. Full information",
        "10. What the numbers say",
        "Where adaptation does not help",
    ):
        assert title in md
    assert "Not run: the trace set names no dense set" in md.split("## 7.")[1]  # synthetic: no dense traces
    assert "this trace set is SYNTHETIC" in md and "absent" in md and "--blockpilot" in md
    assert "Not run yet" in md.split("## 6.")[1]  # the expensive section needs its own flag
    for png in ("replay", "hardware", "drift", "coldstart"):
        p = out.folder / f"{png}.png"
        assert p.stat().st_size > 10_000 and f"eval/{png}.png" in md
    head = out.headline.read_text()
    assert "neural-linear (default)" in head and "synthetic placeholder" in head
    run1 = first["sections"]["replay"]["run"]

    second = run_evaluation(
        Request(traces=str(traces), sections=("coldstart",), settings=Settings(**TINY), command="test run 2"),
        out,
        log=lambda s: None,
    )
    run2 = second["sections"]["coldstart"]["run"]
    assert second["sections"]["replay"]["run"] == run1 and run2 > run1
    stored = json.loads((out.folder / "results.json").read_text())
    assert set(stored["runs"]) == {run1, run2}
    assert stored["sections"]["coldstart"]["run"] == run2 and stored["sections"]["drift"]["run"] == run1
    md2 = out.report.read_text()
    assert "test run 1" in md2 and "test run 2" in md2
    out.report.unlink()
    third = run_evaluation(
        Request(traces=str(traces), sections=(), settings=Settings(**TINY)), out, log=lambda s: None
    )
    assert set(third["runs"]) == {run1, run2} and out.report.read_text() == md2  # render only: same report


def test_bad_requests_fail_with_one_line(tmp_path: Path) -> None:
    from adaptspec.cli import main

    with pytest.raises(AdaptspecError, match="splits"):
        Settings(splits=0)
    with pytest.raises(AdaptspecError, match="unknown section"):
        run_evaluation(Request(sections=("nope",)), Outputs.default(tmp_path), log=lambda s: None)
    with pytest.raises(AdaptspecError, match="--e2e"):
        run_evaluation(Request(sections=("e2e",)), Outputs.default(tmp_path), log=lambda s: None)
    assert main(["evaluate", "--sections", "nope", "--docs", str(tmp_path), "--no-progress"]) == 2
    assert not (tmp_path / "evaluation.md").exists()


def test_only_the_template_set_gets_the_in_distribution_note():
    # the bundled default (public benchmark prompts) is the headline; the template set is labelled in-distribution
    from adaptspec.evaluation.core import provenance
    from adaptspec.evaluation.report import _in_distribution_note
    from adaptspec.traces import TEMPLATE_TRACES, load_traces

    assert _in_distribution_note(provenance(load_traces())) == []
    note = _in_distribution_note(provenance(load_traces(TEMPLATE_TRACES)))
    assert note and note[0].startswith("**In-distribution figures.**")
