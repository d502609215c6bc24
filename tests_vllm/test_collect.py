"""``adaptspec collect-vllm`` against the real engine, and ``export-vllm-table``'s table in one.

The collection: ten prompts at block sizes 1, 2, 3 (vLLM at K = 2, the noisy tiny drafter,
``draft_model``), interrupted when it sends its fifth (the partial file keeps four rows), then
resumed by the ``adaptspec collect-vllm`` command in a process of its own (this one has loaded
numba with the plug-in: conftest.make_llm), which runs only the other six. Every arm's tokens are
checked against vLLM's greedy text without speculation (T = 0, fp32: lossless), and the trace set
is read by ``simulate``, ``train-head`` and ``evaluate``.

The table: two hand-built trace sets with a known best block size at batch sizes 1 and 4 are
exported by ``adaptspec export-vllm-table``, and an engine is started with that
``speculative_config``: vLLM's own parser takes it, and its text is vLLM's without speculation.

Engines, in this order (see conftest.make_llm): the table's, the reference, the collection's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ENGINE, make_llm, shut_down

ARMS = [1, 2, 3]
M = 12  # new tokens a request
PROMPT_IDS = [np.random.default_rng(7 + i).integers(1, 500, 10 + 3 * i).tolist() for i in range(10)]
STOP = 4  # the collection in this process is stopped when it sends this prompt
RIDS = [f"t-{i:04d}" for i in range(len(PROMPT_IDS))]  # the command's ids: domain "t", the prompt's number
#: collect_vllm sets max_num_seqs (its concurrency) and the seed itself
ENGINE_ARGS = {k: v for k, v in ENGINE.items() if k not in ("max_num_seqs", "seed")}
TABLE = [[1, 3, 2], [4, 8, 0]]  # what the hand-built sets' closed form gives (see _hand_built_sets)


class Interrupted(Exception):
    """The collection stopped by the test, as a crash or ^C would stop it."""


def _greedy(llm, ids_list):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=ids) for ids in ids_list],
        [SamplingParams(temperature=0.0, max_tokens=M)] * len(ids_list),
        use_tqdm=False,
    )
    return [list(o.outputs[0].token_ids) for o in outs]


def _hand_built_sets(root):
    """Two trace sets of 2 requests x block sizes 1, 2, 3 with known decode times: at concurrency 1
    B = 3 decodes 10 tokens after the first in 0.5 s (20 tok/s; B = 2: 10 in 0.8 s, B = 1: 10 in 1 s),
    at concurrency 4 B = 1 is fastest (10 in 0.2 s, against 0.4 and 0.6 s): K = 2 up to 3 rows, 0 from 4."""
    from adaptspec.traces import TraceSet

    paths = []
    for c, secs in ((1, [1.0, 0.8, 0.5]), (4, [0.2, 0.4, 0.6])):
        taus = [[1] * 10, [2] * 5, [3, 3, 3, 1]] * 2
        ts = TraceSet.from_arrays(
            ["a", "b"],
            ["x", "x"],
            ARMS,
            np.array([[np.mean(t) for t in taus[:3]]] * 2),
            new_tokens=np.full((2, 3), 11),
            rounds=np.array([[len(t) for t in taus[:3]]] * 2),
            decode_ms=np.array([secs, secs]) * 1e3,
            tau=taus,
            prompt_tokens=[10, 10],
            meta={"concurrency": c},
        )
        paths.append(ts.write(root / f"c{c}"))
    return paths


@pytest.fixture(scope="module")
def run(models, tmp_path_factory):
    import vllm

    root = tmp_path_factory.mktemp("collect")
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}

    # the table: exported by the command, then given to vLLM as its speculative_config
    sets = _hand_built_sets(root)
    export = subprocess.run(
        [
            sys.executable,
            "-m",
            "adaptspec",
            "export-vllm-table",
            *map(str, sets),
            "--max-batch",
            "8",
            "--out",
            str(root / "table.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert export.returncode == 0, export.stderr
    entry = json.loads((root / "table.json").read_text())
    llm = make_llm(
        models["target"], {"method": "draft_model", "model": str(models["drafter"]), **entry}, plugin=False
    )
    try:
        table_parsed = llm.llm_engine.vllm_config.speculative_config.num_speculative_tokens_per_batch_size
        table_text = _greedy(llm, PROMPT_IDS)
    finally:
        shut_down(llm)

    llm = make_llm(models["target"], plugin=False)
    try:
        reference = _greedy(llm, PROMPT_IDS)
    finally:
        shut_down(llm)

    # the collection, stopped when prompt STOP is sent: every call vLLM served is recorded
    from adaptspec.vllm.collect import collect_vllm

    out = root / "traces"
    spec = {"method": "draft_model", "model": str(models["drafter"])}
    sent = []
    generate = vllm.LLM.generate

    def watched(self, prompts, params, **kwargs):
        ids = [list(p["prompt_token_ids"]) for p in prompts]
        if PROMPT_IDS[STOP] in ids:
            raise Interrupted
        outs = generate(self, prompts, params, **kwargs)
        sent.extend(
            (i, p.extra_args["adaptspec_variant"], list(o.outputs[0].token_ids))
            for i, p, o in zip(ids, params, outs)
        )
        return outs

    triples = [(rid, "t", ids) for rid, ids in zip(RIDS, PROMPT_IDS)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vllm.LLM, "generate", watched)
        with pytest.raises(Interrupted):
            collect_vllm(
                models["target"],
                spec,
                triples,
                ARMS,
                out,
                max_new_tokens=M,
                engine_args=ENGINE_ARGS,
                progress=False,
            )
    partial = [json.loads(line) for line in (root / "traces.partial.jsonl").read_text().splitlines()]

    # resumed by the command, in a process of its own
    prompts_file = root / "prompts.jsonl"
    prompts_file.write_text(
        "".join(json.dumps({"prompt_ids": ids, "domain": "t"}) + "\n" for ids in PROMPT_IDS)
    )
    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "adaptspec",
            "collect-vllm",
            "--target",
            str(models["target"]),
            "--drafter",
            str(models["drafter"]),
            "--method",
            "draft_model",
            "--prompts",
            str(prompts_file),
            "--arms",
            "1,2,3",
            "--out",
            str(out),
            "--max-new-tokens",
            str(M),
            "--max-model-len",
            "512",
            "--engine-args",
            json.dumps({"enforce_eager": True, "gpu_memory_utilization": 0.05}),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    return dict(
        root=root,
        out=out,
        reference=reference,
        sent=sent,
        partial=partial,
        resumed=resumed,
        table_parsed=table_parsed,
        table_text=table_text,
        entry=entry,
    )


def test_the_exported_table_is_the_closed_forms_and_vllm_runs_it(run):
    assert run["entry"] == {"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": TABLE}
    assert [list(r) for r in run["table_parsed"]] == TABLE  # vLLM's parser took it as it is
    assert run["table_text"] == run["reference"]  # and its text is vLLM's without speculation


def test_every_arm_gives_vllms_text_without_speculation(run):
    # the two prompts collected in this process, each at every block size, through the plug-in's variants
    assert sorted((PROMPT_IDS.index(i), v) for i, v, _ in run["sent"]) == [
        (p, f"b{b}") for p in range(STOP) for b in ARMS
    ]
    for ids, _, tokens in run["sent"]:
        assert tokens == run["reference"][PROMPT_IDS.index(ids)]
    assert [r["request_id"] for r in run["partial"]] == RIDS[:STOP]  # the interruption kept what was done


def test_the_command_resumes_and_writes_one_row_per_prompt_with_every_arm(run):
    from adaptspec.traces import TraceSet
    from adaptspec.vllm.features import prompt_features

    assert run["resumed"].returncode == 0, run["resumed"].stderr
    assert f"{len(RIDS)} requests x 3 block sizes" in run["resumed"].stdout
    ts = TraceSet.read(run["out"])
    assert list(ts.request_ids) == RIDS and ts.arms == tuple(ARMS)
    assert not list(run["root"].glob("traces.partial*"))
    new, rounds, tau = ts.new_tokens_matrix(), ts.rounds_matrix(), ts.tau_matrix()
    lengths = np.array([len(t) for t in run["reference"]])
    assert np.array_equal(new, np.repeat(lengths[:, None], 3, axis=1))  # every arm: the reference's length
    # B = 1: every step commits one token, after the prefill's first
    assert np.array_equal(rounds[:, 0], lengths - 1) and np.all(tau[:, 0] == 1.0)
    assert np.all(tau <= np.array(ARMS)) and np.all(rounds[:, 1:] <= rounds[:, :1])
    assert np.all(ts.decode_s_matrix() > 0)
    # the rows collected before the interruption are the partial file's, not run again
    for i, row in enumerate(run["partial"]):
        for j, b in enumerate(ARMS):
            assert ts.decode_s_matrix()[i, j] * 1e3 == pytest.approx(
                row["outcomes"][str(b)]["decode_ms"], rel=1e-9
            )
    assert np.allclose(ts.features, np.stack([prompt_features(ids) for ids in PROMPT_IDS]))
    meta = ts.meta
    assert meta["engine"].startswith("vLLM 0.32") and meta["method"] == "draft_model"
    assert meta["num_speculative_tokens"] == 2 and meta["concurrency"] == 1 and meta["dropped"] == {}
    assert meta["max_new_tokens"] == M and meta["temperature"] == 0.0


def test_simulate_train_head_and_evaluate_read_the_trace_set(run, tmp_path, capsys):
    from adaptspec.cli import main

    assert main(["simulate", str(run["out"]), "--policy", "fixed:2", "--policy", "ucb", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report
    assert main(["train-head", str(run["out"]), "--out", str(tmp_path / "head"), "--epochs", "3"]) == 0
    assert (tmp_path / "head").is_dir()
    assert (
        main(
            [
                "evaluate",
                "--traces",
                str(run["out"]),
                "--sections",
                "replay",
                "--quick",
                "--docs",
                str(tmp_path / "docs"),
                "--no-progress",
            ]
        )
        == 0
    )
