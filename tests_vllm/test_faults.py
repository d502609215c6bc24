"""Bad input and faults: a bad ``adaptspec`` entry is one line at vLLM's start naming the key (and
logged first), another vLLM release is refused in one line naming both, a SIGKILL of the engine
loses no acknowledged decision; a policy that sleeps or never returns costs another variant's
requests nothing, every fallback, fault and update error is in the counters by variant and reason,
and a client's variant is cut in the log, not echoed (the engine of ``_faulty_engine.py``, run in a
process of its own: this module starts its own engine first, and vLLM 0.32 starts one a process)."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _faulty_engine import REPEATS, TOKENS
from adaptspec.errors import AdaptspecError
from conftest import make_llm

HERE = Path(__file__).parent


def test_vllm_refuses_to_start_on_a_bad_entry_in_one_line(models):
    # first in the module: it starts an engine, which vLLM 0.32 cannot after numba is loaded (conftest.make_llm)
    # the real start: the scheduler is built with the entry, and the first line vLLM raises names the key
    with pytest.raises(AdaptspecError) as e:
        make_llm(
            models["target"],
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2},
            {"variants": {"A": "no-such-policy"}},
        )
    msg = str(e.value)
    assert msg.startswith("additional_config adaptspec.variants.A: ") and "\n" not in msg


@pytest.mark.parametrize(
    "entry, key",
    [
        ({"log-dir": "x"}, "'log-dir'"),
        ({"checkpoint_every": 0}, "checkpoint_every"),
        ({"load_rule": "sometimes"}, "adaptspec.load_rule: expected one of"),
        ({"variants": {"A": "fixed:2"}, "split": "1,2"}, "adaptspec.split has 2 weights for 1 variants"),
        ({"seed": -5}, "adaptspec.seed: "),
        ({"decide_timeout": float("inf")}, "adaptspec.decide_timeout: "),
        ({"log_dir": ""}, "adaptspec.log_dir: "),
        ({"variants": {"A b": "fixed:2"}}, "'A b'"),
        ({"attribution": "marginal"}, "attribution 'marginal' needs latency"),
        ({"decide_timeout": "fast"}, "decide_timeout"),
        ({"shared": "http://nowhere"}, "shared"),
    ],
)
def test_a_bad_entry_is_one_line_naming_the_key(entry, key):
    from adaptspec.vllm.config import plugin_settings

    with pytest.raises(AdaptspecError) as e:
        plugin_settings({"adaptspec": entry})
    assert key in str(e.value) and "\n" not in str(e.value)


def test_a_folder_that_cannot_hold_the_log_is_one_line(tmp_path):
    from adaptspec.vllm.config import plugin_settings

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(AdaptspecError, match=r"adaptspec.log_dir: .*is not a directory"):
        plugin_settings({"adaptspec": {"log_dir": str(blocker / "log")}})


def test_another_vllm_release_is_refused_in_one_line_naming_both():
    code = "import vllm; vllm.__version__ = '0.31.2'; import adaptspec.vllm.scheduler"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("adaptspec.errors.AdaptspecError: ")
        and "vLLM 0.32.0" in last
        and "vLLM 0.31.2" in last
    )


KILLED = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {here!r})
    from pathlib import Path
    from conftest import make_llm, prompts
    from vllm import SamplingParams
    llm = make_llm(Path({model!r}), {{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}},
                   {{"log_dir": {log!r}}})
    outs = llm.generate(prompts(5), SamplingParams(temperature=0.0, max_tokens=9), use_tqdm=False)
    print("served", len(outs), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_sigkill_loses_no_acknowledged_decision(models, tmp_path):
    from adaptspec.traces.log_writer import log_rows

    log = tmp_path / "log"
    script = KILLED.format(here=str(HERE), model=str(models["target"]), log=str(log))
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert "served 5" in out.stdout
    rows = log_rows(log)  # the journal the killed engine left, read as any log reader does
    assert len(rows) == 5 and all(r["reward"] is not None and r["new_tokens"] == 9 for r in rows)


REFUSED = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    from pathlib import Path
    from conftest import make_llm
    make_llm(Path({model!r}), {{"method": "draft_model", "model": {model!r}, "num_speculative_tokens": 2}},
             {{"seed": -5}})
""")


def test_a_bad_value_is_refused_in_one_line_naming_the_key_and_logged_before_vllms_traceback(models):
    # a negative seed once passed the check and failed in numpy, naming no key; the engine's process logs
    # the refusal as one line of its own before vLLM's traceback (a served vLLM's front end raises its own last)
    script = REFUSED.format(here=str(HERE), model=str(models["target"]))
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    lines = [
        line.removeprefix("[rank0]: ") for line in out.stderr.strip().splitlines()
    ]  # torch's prefix, in-process
    assert out.returncode == 1
    assert (
        lines[-1].startswith("adaptspec.errors.AdaptspecError: additional_config adaptspec.seed: ")
        and "-5" in lines[-1]
    )
    refusal = lines[-1].removeprefix("adaptspec.errors.AdaptspecError: ")
    logged = [i for i, line in enumerate(lines) if "adaptspec.vllm: vLLM cannot start: " in line]
    assert len(logged) == 1 and lines[logged[0]].endswith("adaptspec.vllm: vLLM cannot start: " + refusal)
    assert logged[0] < lines.index("Traceback (most recent call last):")


#: the decisions of variants B and S at block size 2, and of F at 3 (_faulty_engine.py)
B2, S2 = (
    "adaptspec_vllm_decisions_total{block_size=2,variant=B}",
    "adaptspec_vllm_decisions_total{block_size=2,variant=S}",
)
F3 = "adaptspec_vllm_decisions_total{block_size=3,variant=F}"


def fallbacks(reason: str, variant: str = "S") -> str:
    return f"adaptspec_vllm_fallbacks_total{{reason={reason},variant={variant}}}"


@pytest.fixture(scope="module")
def faulty(models):
    """What ``_faulty_engine.py`` measured, run in a process of its own (its docstring lists the scenarios)."""
    out = subprocess.run(
        [sys.executable, str(HERE / "_faulty_engine.py"), str(models["target"])],
        capture_output=True,
        text=True,
        timeout=900,
        env=os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scenario", ["never", "slow"])
def test_a_policy_that_never_returns_or_sleeps_costs_another_variants_requests_nothing(faulty, scenario):
    # 4 requests of B and 2 of S, S's policy stuck (or 8 s a decision): before, each S decision held vLLM's step
    # (a batch took 16.7 s against 0.43 s, and a stuck policy hung vLLM). Now the first waits decide_timeout
    # (0.05 s), the next ones get the fallback at once. Against the same batch with F's healthy policy in
    # S's place (the same lengths), each batch right after one of those. The host is shared, and a batch there
    # took from 0.4 s to 7 s whatever its policies did: the fastest of the 5 against the 5 healthy ones' median.
    sc = faulty["scenarios"]
    took, base = sc[scenario]["seconds"], sc[f"base_{scenario}"]["seconds"]
    assert min(took) <= 1.5 * statistics.median(base), (took, base)
    assert sc[scenario]["tokens"] == [TOKENS] * 6 * REPEATS  # every request served in full
    assert sc[scenario]["counters"] == {
        B2: 4 * REPEATS,
        fallbacks("timeout"): 2 * REPEATS,
    }  # no S decision used
    assert sc[f"base_{scenario}"]["counters"] == {B2: 4 * REPEATS, F3: 2 * REPEATS}


def test_a_late_answer_is_dropped_and_said_so(faulty):
    # the decision that never returned, once released (and the slow ones that returned before the engine ended)
    late = [line for line in faulty["log"] if "answered" in line and "its answer was dropped" in line]
    assert 1 <= len(late) <= 1 + REPEATS and all(line.startswith("S: policy ") for line in late)


@pytest.mark.parametrize("scenario, reason", [("raise", "error"), ("invalid", "invalid")])
def test_a_broken_policys_fallbacks_are_counted_by_variant_and_reason_not_as_decisions(
    faulty, scenario, reason
):
    sc = faulty["scenarios"][scenario]
    assert sc["counters"] == {B2: 4, fallbacks(reason): 2}
    assert sc["tokens"] == [TOKENS] * 6


def test_a_policys_update_errors_are_counted_as_faults_of_its_variant(faulty):
    sc = faulty["scenarios"]["update"]
    assert sc["counters"] == {B2: 4, S2: 2, "adaptspec_vllm_faults_total{variant=S,where=update}": 2}


def test_a_clients_variant_is_cut_and_counted_in_the_log_not_echoed(faulty):
    sc = faulty["scenarios"]["long_variant"]
    assert sc["counters"] == {B2: 1, fallbacks("unknown_variant", variant=""): 1}  # no label of the client's
    assert sc["tokens"] == [TOKENS, TOKENS]
    said = [line for line in faulty["log"] if "adaptspec_variant" in line]
    assert len(said) == 1 and "(10000 characters)" in said[0] and "x" * 33 not in said[0]
    assert max(len(line) for line in faulty["log"]) < 300
