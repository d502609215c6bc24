"""The vLLM plug-in's default cost profile (``vllm-cpu-smollm2``) against the steps it was fitted to:
the shipped file is what ``benchmarks/fit_vllm_profile.py`` makes of the committed steps, and it
prices each (requests, block size) measured often as the logged steps' medians (read straight from
the logs) and a short block against plain under load as they did, and the learned rule warm from it
prefers what those steps and vLLM's measured acceptance make best."""

from __future__ import annotations

import importlib.util
import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from adaptspec.costs.latency import get_profile
from adaptspec.vllm.config import PLUGIN_PROFILE

ROOT = Path(__file__).resolve().parent.parent
RESULTS = [ROOT / "benchmarks" / "results" / name for name in ("vllm-steps.json", "vllm-steps-2-4.json")]


def fit_module():
    spec = importlib.util.spec_from_file_location(
        "fit_vllm_profile", ROOT / "benchmarks" / "fit_vllm_profile.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_shipped_profile_is_the_fit_of_the_committed_steps():
    mod = fit_module()
    shipped = get_profile(PLUGIN_PROFILE)
    again = mod.fit([s for r in RESULTS for s in mod.decode_steps(r)], shipped.source)
    assert (again.verify, again.draft, again.name) == (shipped.verify, shipped.draft, PLUGIN_PROFILE)


def measured_medians(min_steps: int = 8) -> dict[tuple[int, int], tuple[float, int]]:
    """(requests, block size) -> the median seconds of the decode steps logged there (a step's block
    size: its tokens over its requests, when they divide) and how many there were."""
    seen: dict[tuple[int, int], list[float]] = defaultdict(list)
    for result in RESULTS:
        for line in (result.with_suffix(".steps") / "dflash.jsonl").read_text().splitlines():
            s = json.loads(line)
            if s["prefill_tokens"] == 0 and s["rows"] in (1, 2, 4, 8) and s["tokens"] % s["rows"] == 0:
                seen[(s["rows"], s["tokens"] // s["rows"])].append(s["step_s"])
    return {k: (statistics.median(v), len(v)) for k, v in seen.items() if len(v) >= min_steps}


def test_the_profile_prices_every_measured_step_within_a_tenth_of_its_median():
    """Against the logged steps' medians read straight from the logs (the profile's are of the steps
    moved to as many drafter queries as tokens verified: within 10%). A curve that never decreases
    cannot do this: vLLM's 1-request steps took 56 / 65 / 51 / 49 ms at B = 1 / 2 / 3 / 4."""
    profile = get_profile(PLUGIN_PROFILE)
    medians = measured_medians()
    assert {(r, b) for r in (1, 2, 4, 8) for b in (1, 2, 4, 6)} <= set(medians)
    for (rows, block), (median, _) in medians.items():
        assert float(profile.verify_s(block, None, rows)) == pytest.approx(median, rel=0.1), (rows, block)


def test_the_profile_prices_a_short_block_against_plain_as_measured_at_4_and_8_requests():
    """What the load rule decides by under load: a 2-token step's cost over a plain one's at the same
    request count, within 5% of the logged medians' ratio."""
    profile = get_profile(PLUGIN_PROFILE)
    medians = measured_medians()
    for rows in (4, 8):
        measured = medians[(rows, 2)][0] / medians[(rows, 1)][0]
        modelled = float(profile.verify_s(2, None, rows) / profile.verify_s(1, None, rows))
        assert modelled == pytest.approx(measured, rel=0.05), rows


def test_the_plugins_warm_prior_prefers_what_the_logged_steps_and_vllms_acceptance_say():
    """The learned rule warm from the plug-in's defaults (its profile, its prior acceptance, its margin)
    prefers at 1, 2, 4 and 8 requests a block size within 3% of the best by the logged steps' medians
    and the acceptance vLLM measured for the bundled pair (``vllm-tau.json``, per position; none
    counted past the third), closed form: tokens a row ``1 + the accepted shares of the positions
    below B`` over the median step, a speculating size's speed divided by ``1 + margin``; plain at
    4 and 8 requests, a speculating size at 1 and 2."""
    from adaptspec.load_rules import Learned
    from adaptspec.load_rules.learned import SPECULATION_MARGIN
    from adaptspec.vllm.config import PLUGIN_PRIOR
    from adaptspec.vllm.step_costs import StepCosts

    shares = json.loads((ROOT / "benchmarks" / "results" / "vllm-tau.json").read_text())["vllm"][
        "accepted_per_position"
    ]
    medians = measured_medians()
    rule = Learned(
        list(range(1, 10)),
        StepCosts(get_profile(PLUGIN_PROFILE), max_block_size=9),
        prior=PLUGIN_PRIOR,
        full_info=True,
        margin=SPECULATION_MARGIN,
    )
    for rows in (1, 2, 4, 8):
        speed = {
            b: (1 + sum(shares[: b - 1])) / medians[(rows, b)][0] / (1 + SPECULATION_MARGIN * (b > 1))
            for b in range(1, 10)
            if (rows, b) in medians
        }
        best, chosen = max(speed, key=speed.get), rule.preference(rows)
        assert speed[chosen] >= 0.97 * speed[best], (rows, chosen, best, speed)
        assert (chosen > 1) == (best > 1) == (rows <= 2), (rows, chosen, best)
