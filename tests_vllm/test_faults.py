"""Bad input and faults: a bad ``adaptspec`` entry is one line at vLLM's start naming the key,
another vLLM release is refused in one line naming both, and a SIGKILL of the engine loses no
acknowledged decision."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from adaptspec.errors import AdaptspecError
from conftest import make_llm

HERE = Path(__file__).parent


def test_vllm_refuses_to_start_on_a_bad_entry_in_one_line(models):
    # first in the module: it starts an engine, which vLLM 0.32 cannot after numba is loaded (conftest.make_llm)
    # the real start: the scheduler is built with the entry, and the first line vLLM raises names the key
    with pytest.raises(AdaptspecError) as e:
        make_llm(models["target"], {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2},
                 {"variants": {"A": "no-such-policy"}})
    msg = str(e.value)
    assert msg.startswith("additional_config adaptspec.variants.A: ") and "\n" not in msg


@pytest.mark.parametrize("entry, key", [
    ({"log-dir": "x"}, "'log-dir'"),
    ({"checkpoint_every": 0}, "checkpoint_every"),
    ({"load_rule": "sometimes"}, "--load-rule 'sometimes'"),
    ({"variants": {"A": "fixed:2"}, "split": "1,2"}, "--split has 2 weights for 1 variants"),
    ({"variants": {"A b": "fixed:2"}}, "'A b'"),
    ({"attribution": "marginal"}, "attribution 'marginal' needs latency"),
    ({"decide_timeout": "fast"}, "decide_timeout"),
    ({"shared": "http://nowhere"}, "shared"),
])
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
    assert last.startswith("adaptspec.errors.AdaptspecError: ") and "vLLM 0.32.0" in last and "vLLM 0.31.2" in last


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
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env=os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert "served 5" in out.stdout
    rows = log_rows(log)            # the journal the killed engine left, read as any log reader does
    assert len(rows) == 5 and all(r["reward"] is not None and r["new_tokens"] == 9 for r in rows)
