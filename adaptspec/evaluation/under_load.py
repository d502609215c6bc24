"""Section 8: block-size rules under load, on the dense traces through the load simulator.

The dense set section 7 reads is split in two (even-numbered requests tune, odd-numbered ones
are measured) and replayed through :func:`~adaptspec.simulators.load_sim.simulate` at each load level
(closed-loop clients) and over a *day* whose client count changes: plain decoding and every
fixed block size, the static table tuned on the other half (the best fixed size per level there),
the goodput rule (SmartSpec-style, its prior acceptance measured on the other half), the learned
rule cold (LinTS after a warm-up run on the other half) and warm (started from the goodput model's
prediction, measured from its first round), each also with full information (learning from each
round every block size shorter than the one it played), over several seeds, and the per-level
oracle (each level's best fixed size on the measured requests). Optionally the same with a cost
model that misjudges the verify pass (:func:`~adaptspec.simulators.load_sim.misjudged`), to see which
rules correct it.
``benchmarks/bench_load_sim.py`` runs :func:`compare_under_load` with more requests.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from .core import Settings

ARMS = (1, 2, 3, 4, 6, 8)
#: client counts per profile: the CPU profile at 1-16 rows (the batched engine's whole rounds measured on
#: this CPU, the batched server's cost model), the GPU profile at 1-64 (a roofline, not a measurement)
LEVELS = {"cpu-smollm2-batched": (1, 2, 4, 8, 16), "h100-qwen3-8b": (1, 2, 4, 8, 16, 32, 64)}
#: what each profile of :data:`LEVELS` is, said under its tables (profiles not named here get no note)
PROFILE_NOTES = {
    "cpu-smollm2-batched": "the batched engine's whole rounds measured on this CPU "
    "(`adaptspec/data/latency/cpu-smollm2-batched.json`, the batched server's "
    "cost model)",
    "h100-qwen3-8b": "a roofline of published H100 SXM and Qwen3-8B figures, not a measurement",
}
#: what the section's rules are called in the results (the fixed sizes are "plain" and "fixed:B")
RULES = (
    "table",
    "goodput",
    "learned (cold)",
    "learned (cold, full info)",
    "learned (warm)",
    "learned (warm, full info)",
)
#: their column names in the section's tables
RULE_LABELS = {
    "table": "table",
    "goodput": "goodput",
    "learned (cold)": "cold",
    "learned (cold, full info)": "cold, full info",
    "learned (warm)": "warm",
    "learned (warm, full info)": "warm, full info",
}
#: the day's rules: those plus the per-level oracle
DAY_RULES = (*RULES, "per-level oracle")
MAX_NEW_TOKENS = 128
#: the warm learned rule's prior, in row-rounds per level and block size (the rule's default)
PRIOR_WEIGHT = 32.0
#: seeds of each learned rule in the section (each cold one with its own warm-up run)
SEEDS = 3


def _fixed_name(b: int) -> str:
    return "plain" if b == 1 else f"fixed:{b}"


def day_phases(profile: Any, levels: Sequence[int], requests: int) -> list[tuple[float, int]]:
    """Low, middle, highest, second, second-highest, lowest again: every level out of order, each
    phase as long as ``requests / 4`` requests of 128 tokens take plain at one client."""
    lv = sorted(levels)
    order = [lv[0], lv[len(lv) // 2], lv[-1], lv[1 % len(lv)], lv[-2] if len(lv) > 2 else lv[-1], lv[0]]
    phase_s = requests / 4 * MAX_NEW_TOKENS * float(profile.verify_s(1, 300, 1))
    return [(phase_s, c) for c in order]


def compare_under_load(
    tune: Sequence[Any],
    test: Sequence[Any],
    profile_name: str,
    levels: Sequence[int],
    requests: int,
    arms: Sequence[int] = ARMS,
    wrong: Sequence[float] = (),
    say: Callable[[str], None] = lambda s: None,
    seeds: int = 1,
) -> dict[str, Any]:
    """Every rule at every level and over the day on one profile; ``wrong``: per-token factors of
    misjudged cost models given to the goodput and warm learned rules (and, in a third run, to the
    engine's attribution too). Returns tok/s, p50/p95 latency and block sizes per run. ``seeds``:
    the learned rules run with seeds 0 to ``seeds - 1`` (each its own warm-up for a cold rule);
    their tok/s is the mean, each seed's in ``seed_tokens_per_s``."""
    from ..costs.latency import get_profile

    bench = _LoadBench(tune, test, get_profile(profile_name), arms, wrong, seeds)
    rows, tuned, oracle = [], {}, {}
    for c in levels:
        row = bench.level(c, requests)
        tuned[c], oracle[c] = row["tuned_fixed"], row["best_fixed"]
        rows.append(row)
        say(f"{profile_name}, {c} clients: best fixed B = {oracle[c]}")
    phases = day_phases(bench.prof, levels, requests)
    arr = {"day": phases, "requests": 100_000}
    day = bench.day(arr, tuned, oracle)
    say(f"{profile_name}, the day: done")
    out = {
        "profile": profile_name,
        "prior_acceptance": bench.prior,
        "prior_weight": PRIOR_WEIGHT,
        "context": bench.ctx,
        "seeds": seeds,
        "levels": rows,
        "day": {"phases": [list(p) for p in phases], "runs": day, "wrong": bench.wrong_runs(arr)},
        "tuned_table": {str(k): v for k, v in tuned.items()},
        "oracle_table": {str(k): v for k, v in oracle.items()},
    }
    return with_ratios(out)


class _LoadBench:
    """The rules of :func:`compare_under_load` simulated on one profile: tuned on ``tune``,
    measured on ``test``; the warm learned rules' prior is the tuning half's draft acceptance
    at its mean context."""

    def __init__(
        self, tune: Sequence[Any], test: Sequence[Any], prof: Any, arms: Sequence[int], wrong, seeds: int
    ) -> None:
        from ..simulators.load_sim import draft_acceptance

        self.tune, self.test, self.prof, self.wrong, self.seeds = tune, test, prof, wrong, seeds
        self.arms = sorted(int(a) for a in arms)
        self.prior = draft_acceptance(tune, max(a for a in self.arms if a <= tune[0].accept.shape[1] + 1))
        self.ctx = sum(r.prompt_tokens for r in tune) / len(tune) + MAX_NEW_TOKENS / 2

    def run(self, rule: Any, pool: Sequence[Any], model: Any = None, **arrivals: Any) -> dict[str, Any]:
        """One simulation of ``rule`` on ``pool``: tok/s, p50/p95 latency, requests, block sizes."""
        from ..simulators.load_sim import simulate

        s = simulate(
            rule, pool, self.prof, max_rows=64, max_new_tokens=MAX_NEW_TOKENS, model=model, **arrivals
        ).summary()
        return {k: s[k] for k in ("tokens_per_s", "p50_s", "p95_s", "requests", "block_sizes")}

    def warm(self, model: Any) -> Any:
        """A learned rule warm-started from ``model`` at the tuning half's acceptance."""
        from ..load_rules import Learned

        return Learned(self.arms, model, prior=self.prior, prior_weight=PRIOR_WEIGHT, context=self.ctx)

    def level(self, c: int, requests: int) -> dict[str, Any]:
        """Every rule with ``c`` clients: the fixed sizes (the best on the tuning half is the
        table's), the table, goodput, the learned rules and the misjudged cost models."""
        from ..load_rules import Fixed, Goodput, Table

        arms, test = self.arms, self.test
        arr = {"clients": c, "requests": max(requests, 4 * c)}
        tuning = {b: self.run(Fixed(b), self.tune, **arr)["tokens_per_s"] for b in arms}
        tuned = max(tuning, key=tuning.get)
        fixed = {_fixed_name(b): self.run(Fixed(b), test, **arr) for b in arms}
        oracle = arms[max(range(len(arms)), key=lambda i: fixed[_fixed_name(arms[i])]["tokens_per_s"])]
        runs = {
            **fixed,
            "table": self.run(Table({c: tuned}), test, **arr),
            "goodput": self.run(Goodput(arms, self.prof, prior=self.prior), test, **arr),
            **self.learned(test, arr),
        }
        return {
            "clients": c,
            "requests": arr["requests"],
            "best_fixed": oracle,
            "tuned_fixed": tuned,
            "runs": runs,
            "wrong": self.wrong_runs(arr),
        }

    def day(self, arr: dict[str, Any], tuned: dict[int, int], oracle: dict[int, int]) -> dict[str, Any]:
        """Every rule over the day: the fixed sizes, the tuned table, goodput, the learned rules
        and the per-level oracle."""
        from ..load_rules import Fixed, Goodput, Table

        test = self.test
        day = {_fixed_name(b): self.run(Fixed(b), test, **arr) for b in self.arms}
        day.update(
            {
                "table": self.run(Table(tuned), test, **arr),
                "goodput": self.run(Goodput(self.arms, self.prof, prior=self.prior), test, **arr),
                **self.learned(test, arr),  # the cold ones after a warm-up day on the tuning half
                "per-level oracle": self.run(Table(oracle), test, **arr),
            }
        )
        return day

    def wrong_runs(self, arrivals: dict[str, Any]) -> dict[str, Any]:
        """The goodput and warm learned rules on each misjudged cost model (the last with the
        engine's attribution misjudged too)."""
        from ..load_rules import Goodput
        from ..simulators.load_sim import misjudged

        out = {}
        for f in self.wrong:
            m = misjudged(self.prof, f)
            out[f"{f:g}"] = {
                "goodput": self.run(Goodput(self.arms, m, prior=self.prior), self.test, **arrivals),
                "learned (warm)": self.run(self.warm(m), self.test, **arrivals),
                "learned (warm), attribution misjudged too": self.run(
                    self.warm(m), self.test, model=m, **arrivals
                ),
            }
        return out

    def learned(self, pool: Sequence[Any], arrivals: dict[str, Any]) -> dict[str, Any]:
        """The learned rules, each over ``seeds`` seeds: the cold ones after a warm-up run on the tuning half."""
        from ..load_rules import Learned

        arms, prof, prior, ctx = self.arms, self.prof, self.prior, self.ctx
        out = {}
        for name, make, warm_up in (
            ("learned (cold)", lambda s: Learned(arms, prof, seed=s), True),
            ("learned (cold, full info)", lambda s: Learned(arms, prof, seed=s, full_info=True), True),
            (
                "learned (warm)",
                lambda s: Learned(arms, prof, seed=s, prior=prior, prior_weight=PRIOR_WEIGHT, context=ctx),
                False,
            ),
            (
                "learned (warm, full info)",
                lambda s: Learned(
                    arms, prof, seed=s, prior=prior, prior_weight=PRIOR_WEIGHT, context=ctx, full_info=True
                ),
                False,
            ),
        ):
            runs = []
            for s in range(self.seeds):
                rule = make(s)
                if warm_up:
                    self.run(rule, self.tune, **arrivals)
                runs.append(self.run(rule, pool, **arrivals))
            out[name] = {
                **runs[0],
                "tokens_per_s": sum(r["tokens_per_s"] for r in runs) / self.seeds,
                "seed_tokens_per_s": [r["tokens_per_s"] for r in runs],
            }
        return out


def with_ratios(p: dict[str, Any]) -> dict[str, Any]:
    """Add to one profile's results what the report prints: every run's tok/s over plain and over the
    best fixed size of its level (or of the day), and issue 28's targets for each adaptive rule."""
    for part in (*p["levels"], p["day"]):
        runs = part["runs"]
        part["best"] = best_fixed(runs)
        plain, best = runs["plain"]["tokens_per_s"], runs[part["best"]]["tokens_per_s"]
        for r in [*runs.values(), *(x for w in part.get("wrong", {}).values() for x in w.values())]:
            r["over_plain"], r["over_best_fixed"] = r["tokens_per_s"] / plain, r["tokens_per_s"] / best
            if len(r.get("seed_tokens_per_s", ())) > 1:  # a 95% interval of the mean over seeds
                r["over_best_fixed_ci"] = list(mean_ci([x / best for x in r["seed_tokens_per_s"]])[1:])
    p["targets"] = {rule: targets(p, rule) for rule in ("goodput", *RULES[2:]) if rule in p["day"]["runs"]}
    return p


def section_load(traces: Any, st: Settings) -> dict[str, Any]:
    """The comparison on the dense set the trace set names, on the CPU and the GPU profiles."""
    from ..traces.dense import DenseTraceSet

    where = (getattr(traces, "meta", None) or {}).get("dense")
    if not where or not (Path(where) / "meta.json").is_file():
        return {
            "status": "absent",
            "reason": f"the trace set names no dense set on disk (meta.json dense: {where!r}); "
            "collect one with `adaptspec collect --dense`",
        }
    reqs = [r for _, _, r in DenseTraceSet.open(where).requests()]
    if len(reqs) < 2:
        return {"status": "absent", "reason": f"the dense set {where} has fewer than two requests"}
    say = (
        (lambda s: print(f"evaluate: load: {s}", file=sys.stderr, flush=True))
        if st.progress
        else (lambda s: None)
    )
    profiles = [
        compare_under_load(reqs[0::2], reqs[1::2], name, levels, st.load_requests, say=say, seeds=SEEDS)
        for name, levels in LEVELS.items()
    ]
    return {
        "status": "ok",
        "dense": str(where),
        "requests": len(reqs),
        "arms": list(ARMS),
        "load_requests": st.load_requests,
        "profiles": profiles,
    }


# ============================================================================ figures from results
def best_fixed(runs: dict[str, Any]) -> str:
    """The fixed size (plain included) with the most tok/s."""
    return max(
        (k for k in runs if k == "plain" or k.startswith("fixed:")), key=lambda k: runs[k]["tokens_per_s"]
    )


def targets(p: dict[str, Any], rule: str) -> dict[str, Any]:
    """Issue 28's simulation targets for ``rule`` on one profile's results: its worst ratio to the best
    of plain and every fixed size over the levels; on the day its ratio to the best single fixed size,
    to the table tuned on the other half, and the share of the per-level oracle's gain it captures."""
    at = min(
        p["levels"],
        key=lambda r: r["runs"][rule]["tokens_per_s"] / r["runs"][best_fixed(r["runs"])]["tokens_per_s"],
    )
    worst = at["runs"][rule]["tokens_per_s"] / at["runs"][best_fixed(at["runs"])]["tokens_per_s"]
    day = p["day"]["runs"]
    bf = day[best_fixed(day)]["tokens_per_s"]
    gain = day["per-level oracle"]["tokens_per_s"] - bf
    got = day[rule]["tokens_per_s"] - bf
    t = {
        "worst_level": worst,
        "day_over_best_fixed": day[rule]["tokens_per_s"] / bf,
        "day_over_table": day[rule]["tokens_per_s"] / day["table"]["tokens_per_s"],
        "oracle_gain_captured": got / gain if gain > 0 else None,
    }
    t["worst_clients"] = at["clients"]
    if "over_best_fixed_ci" in at["runs"][rule]:
        t["worst_level_ci"] = at["runs"][rule]["over_best_fixed_ci"]
    t["met"] = bool(
        worst >= 0.98 and got > 0 and t["day_over_table"] >= 0.98 and (gain <= 0 or got >= gain / 2)
    )
    return t


def mean_ci(xs: Sequence[float]) -> tuple[float, float, float]:
    """The mean of ``xs`` and a 95% Student-t interval of it.

    >>> [round(x, 3) for x in mean_ci([1.0, 2.0, 3.0])]     # 2 +- 4.303 x 1 / sqrt(3)
    [2.0, -0.484, 4.484]
    """
    from scipy import stats

    n = len(xs)
    m = sum(xs) / n
    sd = (sum((x - m) ** 2 for x in xs) / (n - 1)) ** 0.5
    h = float(stats.t.ppf(0.975, n - 1)) * sd / n**0.5
    return m, m - h, m + h


def render_load(d: dict[str, Any] | None, figs: list[str] | None = None) -> str:
    """The section's markdown, from its results only."""
    from .._util.markdown import table

    if not d or d.get("status") != "ok":
        return f"Not run: {d.get('reason') if d else 'never run'}."
    arms = d["arms"]
    out = [
        f"The dense set `{d['dense']}` ({d['requests']} requests) through the load simulator "
        "(`adaptspec/simulators/load_sim.py`: continuous batching, closed-loop clients, each round's cost from the "
        "profile's batched cost model, each round's time attributed to its rows by their marginal cost). "
        "Even-numbered requests tune (the static table, the goodput rule's prior acceptance, the cold learned "
        "rule's warm-up run), odd-numbered ones are measured; at least "
        f"{d['load_requests']} requests per level (4 per client at higher loads). Values: aggregate tok/s over "
        "plain decoding at that level. *cold*: LinTS on the load level, every block size starting at plain's "
        "speed, after a warm-up run on the other half (*cold, full info*: the same, learning from each round "
        "every block size shorter than the one it played, not only that one); "
        "*warm*: the same bandit started from the goodput model's predicted reward per level and block size "
        f"(weighted as {d['profiles'][0]['prior_weight']:g} observations), measured from its first round "
        "(*warm, full info*: with full information).",
        "",
    ]
    for p in d["profiles"]:
        rules = [
            k for k in RULES if all(k in r["runs"] for r in p["levels"])
        ]  # earlier results lack the newer rules
        head = ["clients"] + [_label(b) for b in arms] + [RULE_LABELS[k] for k in rules] + ["warm / best"]
        rows = []
        for r in p["levels"]:
            x = r["runs"]
            rows.append(
                [r["clients"]]
                + [f"{x[_fixed_name(b)]['over_plain']:.3f}" for b in arms]
                + [f"{x[k]['over_plain']:.3f}" for k in rules]
                + [f"{x['learned (warm)']['over_best_fixed']:.3f}"]
            )
        day, bf = p["day"]["runs"], p["day"]["best"]
        drows = [
            [
                k,
                f"{v['tokens_per_s']:.1f}",
                f"{v['over_plain']:.3f}",
                f"{v['over_best_fixed']:.3f}",
                f"{v['p50_s']:.2f}",
                f"{v['p95_s']:.2f}",
            ]
            for k, v in day.items()
        ]
        phases = ", ".join(str(c) for _, c in p["day"]["phases"])
        note = f"{PROFILE_NOTES[p['profile']]}; " if p["profile"] in PROFILE_NOTES else ""
        out += [
            f"**{p['profile']}** ({note}prior acceptance {p['prior_acceptance']:.3f}, measured on the tuning half):",
            "",
            table(head, rows, "r" * len(head)),
            "",
            f"The day on `{p['profile']}`: clients {phases}, {p['day']['phases'][0][0]:.1f} s each "
            f"(best single fixed size: {bf}):",
            "",
            table(["rule", "tok/s", "over plain", "over best fixed", "p50 s", "p95 s"], drows, "lrrrrr"),
            "",
        ]
        if p.get("seeds", 1) > 1:
            out += _render_seeds(p, rules) + [""]
        if p["levels"] and p["levels"][0].get("wrong"):
            out += _render_wrong(p) + [""]
    out += [bullets_of(load_findings(d))]
    return "\n".join(out)


def _label(b: int) -> str:
    return "plain" if b == 1 else f"B={b}"


def _render_seeds(p: dict[str, Any], rules: Sequence[str]) -> list[str]:
    """The learned rules' tok/s over the best fixed size per level and over the day: mean over seeds
    [95% interval]."""
    from .._util.markdown import table

    learned = [k for k in rules if k.startswith("learned")]
    rows = []
    for r in [*p["levels"], {**p["day"], "clients": "day"}]:
        cells = []
        for k in learned:
            x = r["runs"][k]
            lo, hi = x.get("over_best_fixed_ci", (x["over_best_fixed"],) * 2)
            cells.append(f"{x['over_best_fixed']:.3f} [{lo:.3f}, {hi:.3f}]")
        rows.append([r["clients"], r["best"].replace("fixed:", "B=")] + cells)
    return [
        f"The learned rules on `{p['profile']}` over {p['seeds']} seeds (a cold rule's warm-up run is its own "
        "per seed): tok/s over the best fixed size of the level (of the day: the best single one), mean "
        "[95% interval]:",
        "",
        table(["clients", "best fixed"] + [RULE_LABELS[k] for k in learned], rows, "r" * (2 + len(learned))),
    ]


def _render_wrong(p: dict[str, Any]) -> list[str]:
    from .._util.markdown import table

    out = []
    for f in p["levels"][0]["wrong"]:
        rows = []
        for r in [*p["levels"], {**p["day"], "clients": "day"}]:
            w = r["wrong"][f]
            rows.append(
                [r["clients"]]
                + [
                    f"{x['over_best_fixed']:.3f}"
                    for x in (
                        r["runs"]["goodput"],
                        w["goodput"],
                        r["runs"]["learned (warm)"],
                        w["learned (warm)"],
                        w["learned (warm), attribution misjudged too"],
                    )
                ]
            )
        out += [
            f"A misjudged cost model on `{p['profile']}`: the rules are given a profile whose verify cost per "
            f"token is {f}x the true one (tok/s over the best fixed size; the last column: the engine's "
            "attribution of round time uses the misjudged model too):",
            "",
            table(
                [
                    "clients",
                    "goodput",
                    f"goodput, x{f}",
                    "warm",
                    f"warm, x{f}",
                    f"warm, x{f}, attribution too",
                ],
                rows,
                "rrrrrr",
            ),
            "",
        ]
    return out


def load_findings(d: dict[str, Any]) -> list[str]:
    """What the section's numbers say about issue 28's simulation targets, per profile."""
    out = []
    for p in d["profiles"]:
        for rule in (
            "learned (warm)",
            "learned (warm, full info)",
            "learned (cold)",
            "learned (cold, full info)",
            "goodput",
        ):
            if rule not in p["targets"]:
                continue
            t = p["targets"][rule]
            cap = (
                "n/a (the per-level oracle gains nothing)"
                if t["oracle_gain_captured"] is None
                else f"{100 * t['oracle_gain_captured']:.0f}%"
            )
            ci = (
                (
                    f" at {t['worst_clients']} clients, 95% interval over {p['seeds']} seeds "
                    f"{t['worst_level_ci'][0]:.3f}-{t['worst_level_ci'][1]:.3f}"
                )
                if "worst_level_ci" in t
                else ""
            )
            out.append(
                f"`{p['profile']}`, {rule}: worst level {t['worst_level']:.3f}x{ci} the best of plain and every "
                f"fixed size (target >= 0.98); the day {t['day_over_best_fixed']:.3f}x the best single fixed "
                f"size, {t['day_over_table']:.3f}x the table tuned on the other half (target >= 0.98), "
                f"{cap} of the per-level oracle's gain (target >= 50%): "
                f"{'all targets met' if t['met'] else 'targets not all met'}."
            )
    return out


def bullets_of(lines: list[str]) -> str:
    return "\n".join(f"- {x}" for x in lines) if lines else "- (nothing to report)"
