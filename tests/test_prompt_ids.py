"""``--prompts`` of token ids (issue 46, item 17): a target without a tokenizer is collected and
profiled from a JSON-lines file whose rows carry ``prompt_ids``, end to end through the CLI.

The target is the published-format tiny pair in ``tests/data/dflash-reference-tiny-b8`` (a
target with no tokenizer, vocabulary 256, no EOS; a drafter of blocks of 8 at most). Every
expected value comes from the ids file or from the pair's config: the trace set holds one request
per row with the row's domain and the row's number of ids as its prompt length, and (no EOS)
every block size decodes exactly ``--max-new-tokens`` tokens. The bad-id cases, each one line,
are in tests/test_bad_input_cli.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from adaptspec.cli import main
from adaptspec.errors import AdaptspecError
from adaptspec.models.prompts import MAX_PROMPT_IDS, Prompt, check_prompt_ids, read_prompts, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "tests" / "data" / "dflash-reference-tiny-b8"
MODEL = [
    "--target",
    str(PAIR / "target"),
    "--drafter",
    str(PAIR / "drafter"),
    "--threads",
    "1",
    "--dtype",
    "float32",
]
ROWS = [
    {"prompt_ids": [5, 17, 33, 2, 9, 101], "domain": "alpha"},
    {"prompt_ids": [40, 41, 255], "domain": "beta"},
    {"prompt_ids": [0], "domain": "alpha"},
]


def _ids_file(tmp_path: Path, rows=ROWS) -> Path:
    f = tmp_path / "ids.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def _error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if "Loading weights" not in ln]  # transformers' own bar
    assert len(lines) == 1, err
    return lines[0]


def test_the_pair_has_no_tokenizer_and_the_vocabulary_the_rows_assume():
    config = json.loads((PAIR / "target" / "config.json").read_text())
    assert config["vocab_size"] == 256 and config.get("eos_token_id") is None
    assert not any((PAIR / "target" / name).exists() for name in ("tokenizer.json", "tokenizer_config.json"))
    assert max(i for r in ROWS for i in r["prompt_ids"]) == config["vocab_size"] - 1  # the last id is in


def test_a_prompt_file_of_ids_and_text_round_trips_through_write_and_read(tmp_path):
    ps = [Prompt("", "alpha", (5, 9, 2)), Prompt("some text", "beta")]
    write_jsonl(ps, tmp_path / "p.jsonl")
    back = read_prompts(tmp_path / "p.jsonl")
    assert back == ps and [p.where for p in back] == [
        f"{tmp_path / 'p.jsonl'}:1",
        f"{tmp_path / 'p.jsonl'}:2",
    ]


def test_check_prompt_ids_bounds_are_inclusive_as_stated():
    # the vocabulary is 0..V-1, the context holds ids + new tokens up to max_context exactly
    at_edge = Prompt("", "d", (0, 9), "f:1")
    check_prompt_ids([at_edge], 10, 6, 4, "the target's")
    with pytest.raises(
        AdaptspecError, match=r"^f:1: prompt_ids\[1\] is 9, outside the target's vocabulary 0..8$"
    ):
        check_prompt_ids([at_edge], 9, None, 4, "the target's")
    with pytest.raises(
        AdaptspecError, match=r"^f:1: 2 prompt ids and --max-new-tokens 5 exceed the target's context"
    ):
        check_prompt_ids([at_edge], 10, 6, 5, "the target's")
    check_prompt_ids([Prompt("text", "d")], 1, 1, 100, "x")  # text prompts are the tokenizer's to check


def test_a_row_of_max_prompt_ids_is_read_and_one_more_is_refused(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt_ids": [1] * MAX_PROMPT_IDS}) + "\n")
    assert len(read_prompts(f)[0].prompt_ids) == MAX_PROMPT_IDS
    f.write_text(json.dumps({"prompt_ids": [1] * (MAX_PROMPT_IDS + 1)}) + "\n")
    with pytest.raises(
        AdaptspecError, match=rf"p.jsonl:1: prompt_ids has {MAX_PROMPT_IDS + 1} token ids, more than"
    ):
        read_prompts(f)


@pytest.mark.slow
def test_collect_a_target_without_a_tokenizer_from_a_file_of_token_ids(tmp_path, capsys):
    from adaptspec.traces import TraceSet

    ids = _ids_file(tmp_path)
    assert (
        main(
            ["collect", *MODEL, "--prompts", str(ids), "--out", str(tmp_path / "t"), "--max-new-tokens", "6"]
        )
        == 0
    )
    ts = TraceSet.read(tmp_path / "t")
    assert ts.arms == (1, 2, 4, 6, 8)  # the default sizes, cut at the drafter's 8
    assert list(ts.request_ids) == ["alpha-0000", "beta-0001", "alpha-0002"]
    assert list(ts.prompt_tokens) == [len(r["prompt_ids"]) for r in ROWS]
    assert (ts.new_tokens_matrix() == 6).all()  # no EOS: every block size decodes all 6


@pytest.mark.slow
def test_profile_latency_a_target_without_a_tokenizer_from_a_file_of_token_ids(tmp_path, capsys):
    from adaptspec.costs.latency import LatencyProfile

    ids = _ids_file(tmp_path)
    out = tmp_path / "p.json"
    assert (
        main(
            [
                "profile-latency",
                *MODEL,
                "--prompts",
                str(ids),
                "--out",
                str(out),
                "--max-new-tokens",
                "6",
                "--json",
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)
    assert [r["block_size"] for r in got["fit"]] == [1, 2, 4, 8] and got["times"] == "per-round"
    assert LatencyProfile.load(out).name == "cpu-measured"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["collect", "profile-latency"])
def test_text_prompts_on_a_target_without_a_tokenizer_say_exactly_what_works(tmp_path, capsys, command):
    out = ["--out", str(tmp_path / ("t" if command == "collect" else "p.json"))]
    assert main([command, *MODEL, *out, "--max-new-tokens", "4"]) == 2
    err = _error_line(capsys.readouterr().err)
    assert f"this target has no tokenizer, so {command} cannot encode" in err
    assert re.search(
        r'--prompts FILE.jsonl whose rows are \{"prompt_ids": \[12, 345, \.\.\.\], "domain": "\.\.\."\}', err
    ), err
    assert not (tmp_path / "t").exists() and not (tmp_path / "p.json").exists()
