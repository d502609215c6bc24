"""The host's choice everywhere (issue 47 items 1-2): a library user's ``AdaptiveController(
load_speculator())`` gets the default priced by this host's curve, the one ``adaptspec demo`` and
``adaptspec serve`` get; ``adaptspec profile-latency`` says what the host measurement measured and
chose. Each runs on a host cost record written here (a curve of known shape), in a cache directory
of its own, so nothing is timed and the expected choice follows from the curve in closed form."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from adaptspec import AdaptiveController
from adaptspec.costs.latency import fit_round_totals
from adaptspec.host import for_models, for_speculator, models_key
from adaptspec.host.costs import HostCosts, write_record
from adaptspec.host.identity import host_key
from adaptspec.models.bundled import loaded_from
from adaptspec.paths import BUNDLED_HEAD
from adaptspec.traces import DEFAULT_TRACES, load_traces

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "tests" / "data" / "dflash-reference-tiny-b8"
HEAD_ARMS = (1, 2, 3, 4, 6, 8, 12, 16)


def rounds(plain_s: float, per_token_s: float) -> list[dict]:
    """Engine rounds whose cost is linear in the tokens verified: ``plain_s + per_token_s (rows B - 1)``."""
    return [
        dict(
            block_size=b,
            batch_size=m,
            context_tokens=128,
            draft_s=0.0,
            verify_s=plain_s + per_token_s * (b * m - 1),
        )
        for m, bs in ((1, (1, 2, 3, 4, 6, 8)), (4, (1, 2, 4)))
        for b in bs
    ]


def record(
    cache: Path,
    models: str,
    threads: int,
    bf16: tuple[float, float],
    fp32: tuple[float, float],
    mixed: tuple[float, float] | None = None,
) -> HostCosts:
    """A host cost record for ``models`` at ``threads`` in ``cache``/host: each dtype's (plain, per token)
    seconds (``mixed``: float32's unless given, so that the other two decide)."""
    curves = {"bfloat16": bf16, "float32": fp32, "mixed": mixed or fp32}
    costs = HostCosts(
        host_key(models, threads),
        {d: fit_round_totals(rounds(*c), d) for d, c in curves.items()},
        {d: 1.0 for d in curves},
        cache / "host",
        "2026-12-04T00:00:00Z",
    )
    write_record(costs)
    return costs


def prior_tau() -> dict[int, float]:
    """The bundled drafter's mean tokens per round at each of the head's block sizes, from the bundled trace set."""
    ts = load_traces(DEFAULT_TRACES)
    tau = np.nanmean(ts.tau_matrix(), axis=0)
    return {int(b): float(t) for b, t in zip(ts.arm_array, tau) if int(b) in HEAD_ARMS}


def best_by_closed_form(plain_s: float, per_token_s: float) -> int:
    """argmax over block sizes of tau(B) / (plain + per_token (B - 1)): tokens a second at one row."""
    tau = prior_tau()
    rate = {b: t / (plain_s + per_token_s * (b - 1)) for b, t in tau.items()}
    return max(sorted(rate), key=lambda b: rate[b])


@pytest.fixture(scope="module")
def bundled():
    from adaptspec.models import load_speculator

    return load_speculator()  # what a library user writes


@pytest.mark.slow  # loads the bundled pair and decodes three short requests
def test_a_library_users_default_is_priced_by_the_hosts_curve(bundled, tmp_path, monkeypatch):
    spec = bundled
    assert loaded_from(spec) is not None and loaded_from(spec).dtype == "bfloat16"
    monkeypatch.setenv("ADAPTSPEC_CACHE", str(tmp_path))  # this host's record: the one written here
    threads = torch.get_num_threads()
    models = models_key(None, None, "fast")
    # a curve on which speculating cannot pay: a 2-token verify costs 2x a 1-token one, 4 tokens 4x
    steep = (0.040, 0.040)
    assert all(
        t < 1 + (b - 1) for b, t in prior_tau().items() if b > 1
    )  # tau(B) < cost ratio B: no B > 1 pays
    record(tmp_path, models, threads, steep, (0.090, 0.040))
    assert best_by_closed_form(*steep) == 1
    served = for_models(None, None, "fast", threads, "bfloat16")  # what demo and serve run on this record
    with AdaptiveController(spec) as ctl:
        assert ctl.setup.spec == "fixed:1", (
            ctl.policy_choice
        )  # plain decoding: nothing beyond B = 1 pays here
        assert not served.speculation_pays and "speculation cannot pay" in str(ctl.policy_choice)
        assert ctl.fallback_block_size == 1  # a late decision plays plain decoding here
        from adaptspec.models.prompts import benchmark_prompts

        firsts = [
            ctl.generate(spec.target.encode_chat(p.prompt), max_new_tokens=6).decision.block_size
            for p in benchmark_prompts()[400:403]
        ]  # unseen by the head
        rest = [
            ctl.generate(spec.target.encode_chat(p.prompt), max_new_tokens=6).decision.block_size
            for p in benchmark_prompts()[403:409]
        ]
    assert firsts + rest == [1] * 9, (
        "plain decoding from the first request to the last where speculating cannot pay"
    )

    # a flat curve (a 4-token verify 1.15x a 1-token one): speculating pays, and the default starts there
    flat_dir = tmp_path / "flat"
    monkeypatch.setenv("ADAPTSPEC_CACHE", str(flat_dir))
    flat = (0.040, 0.002)
    record(flat_dir, models, threads, flat, (0.090, 0.040))
    want = best_by_closed_form(*flat)
    assert want > 1
    with AdaptiveController(spec) as ctl:
        choice = for_speculator(spec)
        assert choice.best_block_size == want and choice.chosen_by == "as loaded"
        assert ctl.setup.spec == f"neural-linear:head={choice.head}" and ctl.fallback_block_size == want
    # a policy given by the caller is not re-priced, and costs no host measurement
    with AdaptiveController(spec, "fixed:2") as ctl:
        assert ctl.setup.spec == "fixed:2" and ctl.policy_choice.startswith("fixed:2: given by the caller")


def test_a_speculator_of_ones_own_keeps_the_unpriced_default():
    from adaptspec.control.policy_build import default_on_host

    class Mine:  # not made by load_speculator: nothing times it
        max_block_size, feature_dim = 16, 1153

    assert loaded_from(Mine()) is None and for_speculator(Mine()) is None
    choice, fallback = default_on_host(16, 1153, None, lambda: for_speculator(Mine()))
    assert choice.spec == f"neural-linear:head={BUNDLED_HEAD}" and fallback is None
    # a decoder the bundled head does not fit never asks the host (no timing for a cold policy)
    asked = []
    choice, fallback = default_on_host(8, 1153, None, lambda: asked.append(1))
    assert choice.spec == "fi-ucb" and fallback is None and asked == []


@pytest.mark.slow  # loads the tiny pair and decodes a prompt twice: ~8 s on a busy 2-core host
def test_profile_latency_says_what_the_host_measurement_measured_and_chose(tmp_path, monkeypatch, capsys):
    from adaptspec.cli import main

    monkeypatch.setenv("ADAPTSPEC_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ids.jsonl").write_text('{"prompt_ids": [5, 17, 33], "domain": "a"}\n')
    # bfloat16 the faster: plain 48 ms against 90 ms; a B-token verify costs (B + 1) / 2 a 1-token one
    bf16 = (0.048, 0.024)
    record(tmp_path, models_key(str(PAIR / "target"), str(PAIR / "drafter"), "fast"), 1, bf16, (0.090, 0.030))
    argv = [
        "profile-latency",
        "--target",
        str(PAIR / "target"),
        "--drafter",
        str(PAIR / "drafter"),
        "--threads",
        "1",
        "--dtype",
        "float32",
        "--prompts",
        "ids.jsonl",
        "--max-new-tokens",
        "4",
        "--arms",
        "1,2",
        "--out",
        "p.json",
    ]
    threads = torch.get_num_threads()
    try:
        assert main(argv) == 0
        text = capsys.readouterr().out
        assert main([*argv, "--json"]) == 0
        report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    finally:
        torch.set_num_threads(threads)
    line = next(x for x in text.splitlines() if x.startswith("host measurement: "))
    assert "bfloat16" in line and "cannot pay" in line and "cached 2026-12-04T00:00:00Z" in line
    host = report["host"]
    assert host["dtype"] == host["fastest_dtype"] == "bfloat16" and host["chosen_by"].startswith("measured")
    assert host["best_block_size"] == best_by_closed_form(*bf16) == 1 and host["speculation_pays"] is False
    assert host["plain_round_ms"]["bfloat16"] == pytest.approx(48.0, rel=0.02)
    assert host["plain_round_ms"]["float32"] == pytest.approx(90.0, rel=0.02)
    assert host["round_ms"]["4"] == pytest.approx(48.0 + 3 * 24.0, rel=0.02)
    assert str(tmp_path) not in json.dumps(host)  # file names, never paths


def test_a_server_runs_the_dtype_nearest_the_faster_one_at_every_load_a_single_request_the_faster_at_one(
    tmp_path, monkeypatch
):
    """bf16 cheap at one row and steep in positions, fp32 dear and flat (the AVX2 kind's shape): one request
    runs bf16; a server of 8 rows (``server_rows``, what ``adaptspec serve`` passes) fp32, whose worst ratio
    over rows 1, 2, 4, 8 (its one row: 0.55x bf16's) beats bf16's (at 8 rows, ~0.37x fp32's), by closed form."""
    from adaptspec.host import server_rows

    monkeypatch.setenv("ADAPTSPEC_CACHE", str(tmp_path))
    models = models_key(None, None, "fast")
    bf16, fp32 = (0.030, 0.015), (0.055, 0.002)
    record(tmp_path, models, 1, bf16, fp32)

    def plain_rate(plain_s, per_token_s, rows):  # plain decoding at ``rows`` rows: rows tokens a round
        return rows / (plain_s + per_token_s * (rows - 1))

    worst = {
        name: min(plain_rate(*c, r) / max(plain_rate(*bf16, r), plain_rate(*fp32, r)) for r in (1, 2, 4, 8))
        for name, c in (("bfloat16", bf16), ("float32", fp32))
    }
    assert worst["float32"] > worst["bfloat16"]  # the closed form's verdict on plain decoding
    one = for_models(None, None, "fast", 1)
    served = for_models(None, None, "fast", 1, rows=server_rows(8))
    assert one.dtype == "bfloat16" and one.chosen_by == "measured: the faster here"
    assert served.dtype == "float32" and served.chosen_by == "measured: the faster here at 1-8 rows"
