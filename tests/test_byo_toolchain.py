"""The toolchain for a speculator defined outside adaptspec: ``--speculator MODULE:FACTORY``.

The speculator is the example's DFlash-style loop (examples/byo_dflash.py: a tiny Qwen3
target, a one-pass block drafter, its own draft/verify loop), reached through a module
``mymod`` written into the test's directory, as a user would write one. End to end, through
the installed ``adaptspec`` command run from that directory: collect -> train-head -> serve an
A/B test on 127.0.0.1 -> ab-report. The served tokens are checked against the target's own
greedy continuation, recomputed here with plain transformers forward passes; every refusal is
one line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings, strategies as st

from adaptspec.cli import build_parser, main
from adaptspec.errors import AdaptspecError

ROOT = Path(__file__).resolve().parents[1]
ADAPTSPEC = Path(sys.executable).parent / "adaptspec"  # the installed command

MYMOD = """
from examples.byo_dflash import TinyDFlash

def make():
    return TinyDFlash(max_block_size=8)

def make16():
    return TinyDFlash(max_block_size=16)

NOT_CALLABLE = 3

def raises():
    raise RuntimeError("no GPU here")

def not_a_speculator():
    return object()

def no_codec():
    s = TinyDFlash(max_block_size=8)
    del s.codec
    return s

def bad_vocab():
    s = TinyDFlash(max_block_size=8)
    s.vocab_size = 0
    return s

def claims_1000():  # its drafter drafts blocks of 8 at most: asked for 12, its loop raises IndexError
    s = TinyDFlash(max_block_size=8)
    s.max_block_size = 1000
    return s

from adaptspec import Outcome, Round

class Changed:
    # TinyDFlash(8) with what its decode returns changed by change(outcome, block_size, prefill)

    def __init__(self, change, feature_dim=129):
        self.inner = TinyDFlash(max_block_size=8)
        self.max_block_size, self.feature_dim, self.codec = 8, feature_dim, self.inner.codec
        self.change = change

    def prefill(self, prompt_ids, temperature=0.0, seed=None):
        return self.inner.prefill(prompt_ids, temperature, seed)

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        return self.change(self.inner.decode(prefill, block_size, max_new_tokens, temperature, seed), block_size, prefill)

def boom(o, b, pre):
    raise RuntimeError("decode boom")

def untimed_rounds(o):
    return [Round(r.block_size, r.tau, 0.0, 0.0) for r in o.rounds]

def by_context(o, b, pre):  # a target pass costs 10 us per context token past the 10th, nothing fixed
    ctx, rounds = pre.prompt_tokens + 1, []
    for r in o.rounds:
        rounds.append(Round(r.block_size, r.tau, 0.0, 1e-5 * (ctx - 10)))
        ctx += r.tau
    return Outcome(o.tokens, rounds, sum(r.verify_s for r in rounds), o.finish_reason)

def raising():
    return Changed(boom)

def too_many():
    return Changed(lambda o, b, pre: Outcome(o.tokens + [65] * 3, o.rounds, o.decode_s))

def bigger_rounds():
    return Changed(lambda o, b, pre: Outcome(o.tokens, [Round(2 * r.block_size, r.tau, r.draft_s, r.verify_s)
                                                    for r in o.rounds], o.decode_s))

def wrong_width():
    return Changed(lambda o, b, pre: o, feature_dim=40)

def untimed():
    return Changed(lambda o, b, pre: Outcome(o.tokens, untimed_rounds(o), o.decode_s, o.finish_reason))

def no_times():
    return Changed(lambda o, b, pre: Outcome(o.tokens, untimed_rounds(o), 0.0, o.finish_reason))

def timed_by_context():
    return Changed(by_context)
"""

PROMPTS = [
    ("math", "What is 17 times 23?"),
    ("code", "def fibonacci(n):"),
    ("chat", "Write a haiku about the sea."),
    ("math", "Is 91 a prime number?"),
    ("code", "class Stack:"),
    ("chat", "Say hello in French."),
]


def write_module(where: Path, name: str) -> None:
    (where / f"{name}.py").write_text(MYMOD)


def run_cli(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # examples/ imports; mymod is found in the current directory
    return subprocess.run(
        [str(ADAPTSPEC), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def greedy(prompt_ids: list[int], max_tokens: int) -> list[int]:
    """The example target's greedy continuation, one plain forward pass per token (no cache, no drafts)."""
    import torch

    from examples.byo_dflash import EOS, tiny_target

    model, seq = tiny_target(0), list(prompt_ids)
    with torch.no_grad():
        while len(seq) - len(prompt_ids) < max_tokens:
            seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
            if seq[-1] == EOS:
                break
    return seq[len(prompt_ids) :]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.integration
def test_collect_train_serve_report_with_a_speculator_of_your_own(tmp_path):
    from examples.byo_dflash import ByteCodec

    write_module(tmp_path, "mymod")
    with open(tmp_path / "prompts.jsonl", "w") as f:
        for domain, prompt in PROMPTS:
            f.write(json.dumps({"prompt": prompt, "domain": domain}) + "\n")
    # collect: the output's parent directories do not exist yet; default arms are those up to max_block_size 8
    p = run_cli(
        tmp_path,
        "collect",
        "--speculator",
        "mymod:make",
        "--prompts",
        "prompts.jsonl",
        "--out",
        "runs/new/traces",
        "--max-new-tokens",
        "10",
        "--threads",
        "1",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "wrote runs/new/traces: 6 requests x 5 block sizes" in p.stdout
    from adaptspec.traces import TraceSet

    ts = TraceSet.read(tmp_path / "runs/new/traces")
    assert ts.arms == (1, 2, 4, 6, 8) and ts.features.shape == (6, 129)  # the example's features, not 1153
    codec = ByteCodec()
    want = [len(greedy(codec.encode(q), 10)) for _, q in PROMPTS]
    assert ts.new_tokens_matrix().tolist() == [[n] * 5 for n in want]

    p = run_cli(
        tmp_path, "train-head", "runs/new/traces", "--out", "runs/head", "--pca", "4", "--epochs", "30"
    )
    assert p.returncode == 0, p.stderr[-3000:]

    port = free_port()
    out = open(tmp_path / "server.out", "w+")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    server = subprocess.Popen(
        [
            str(ADAPTSPEC),
            "serve",
            "--speculator",
            "mymod:make",
            "--threads",
            "1",
            "--variant",
            "A=neural-linear:head=runs/head",
            "--variant",
            "B=fixed:4",
            "--log-dir",
            "runs/log",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=tmp_path,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    served = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            deadline = time.monotonic() + 120
            while True:
                assert server.poll() is None and time.monotonic() < deadline, (
                    out.seek(0) or out.read()[-3000:]
                )
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            for i in range(10):
                prompt = PROMPTS[i % len(PROMPTS)][1]
                r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "user": f"u{i}"})
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["choices"][0]["token_ids"] == greedy(codec.encode(prompt), 8)  # lossless
                served.append((body["adaptspec"]["variant"], body["adaptspec"]["block_size"]))
            assert (
                c.post("/v1/completions", json={"prompt": [500], "max_tokens": 2}).status_code == 400
            )  # vocab_size
            too_long = {"prompt": [65] * 1010, "max_tokens": 8}  # 1018 > max_context 1024 - 8
            assert c.post("/v1/completions", json=too_long).status_code == 400
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
        out.close()
    assert {b for v, b in served if v == "B"} <= {4} and {b for v, b in served if v == "A"} <= set(ts.arms)

    p = run_cli(tmp_path, "ab-report", "runs/log", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout)
    assert report["decisions"] == 10
    assert {v: d["decisions"] for v, d in report["variants"].items()} == {
        v: sum(s == v for s, _ in served) for v in {s for s, _ in served}
    }


@pytest.fixture()
def errmod(tmp_path, monkeypatch):
    """``mymod_e`` and ``brokenmod`` in the current directory, importable in this process."""
    write_module(tmp_path, "mymod_e")
    (tmp_path / "brokenmod.py").write_text("import not_installed_dependency_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--speculator", "nomod_xyz:make"], r"--speculator nomod_xyz:make: no module named 'nomod_xyz'"),
        (
            ["--speculator", "brokenmod:make"],
            r"importing brokenmod failed: No module named 'not_installed_dependency_xyz'",
        ),
        (["--speculator", "mymod_e:missing"], r"mymod_e has no attribute 'missing'"),
        (["--speculator", "mymod_e:NOT_CALLABLE"], r"NOT_CALLABLE is a int, not callable"),
        (["--speculator", "mymod_e:raises"], r"raises\(\) raised RuntimeError: no GPU here"),
        (["--speculator", "mymod_e:not_a_speculator"], r"returned a object, not a speculator: .*prefill"),
        (["--speculator", "mymod_e:no_codec"], r"without a codec"),
        (["--speculator", "mymod_e:bad_vocab"], r"whose vocab_size is 0"),
        (["--speculator", "examples/byo_dflash.py"], r"expected MODULE:FACTORY"),
        (
            ["--speculator", "mymod_e:make", "--target", "x"],
            r"--target chooses or places adaptspec's own models",
        ),
        (["--speculator", "mymod_e:make", "--dtype", "float32"], r"drop --dtype"),
        (["--speculator", "mymod_e:make", "--dense"], r"--dense runs adaptspec's own models"),
        (
            ["--speculator", "mymod_e:make", "--arms", "1,16"],
            r"max_block_size is 8, so block sizes \[16\] cannot be drafted",
        ),
        # what the speculator's decode does, checked as the controller checks it (issue 46, items 4, 7 and 18)
        (
            ["--speculator", "mymod_e:raising"],
            r"request \S+: decode at block size 1 raised RuntimeError: decode boom$",
        ),
        (
            ["--speculator", "mymod_e:claims_1000"],
            r"request \S+: decode at block size 12 raised IndexError: ",
        ),
        (
            ["--speculator", "mymod_e:too_many"],
            r"decode at block size 1 is refused: it has \d+ tokens, more than "
            r"max_new_tokens=4",
        ),
        (
            ["--speculator", "mymod_e:bigger_rounds"],
            r"decode at block size 1 is refused: round 0 ran block size 2, "
            r"larger than the 1 decided",
        ),
        (
            ["--speculator", "mymod_e:wrong_width"],
            r"features have 129 values, speculator Changed declares feature_dim 40",
        ),
    ],
)
def test_collect_refusals_are_one_line(errmod, capsys, argv, message):
    assert main(["collect", "--out", "t", "--limit", "1", "--max-new-tokens", "4", *argv]) == 2
    err = "\n".join(
        line for line in capsys.readouterr().err.strip().splitlines() if not re.match(r"collect: +\d+%", line)
    )  # the progress bar, before the first prompt ended
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not (errmod / "t").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--batched"],
            r"--batched applies to the batched engine; --speculator mymod_e:make returned a TinyDFlash, not "
            r"adaptspec's SpeculativeDecoder, so it is served one request at a time",
        ),
        (["--tiny"], r"--tiny chooses or places adaptspec's own models"),
        (["--chat"], r"drop --chat"),
        (["--arms", "1,2,16"], r"max_block_size is 8, so block sizes \[16\] cannot be drafted"),
    ],
)
def test_serve_refusals_are_one_line(errmod, argv, message):
    from adaptspec.cli.serve import build

    args = build_parser("serve").parse_args(["serve", "--speculator", "mymod_e:make", "--port", "0", *argv])
    with pytest.raises(AdaptspecError, match=message) as e:
        build(args).close()
    assert "\n" not in str(e.value)


#: a factory returning adaptspec's own SpeculativeDecoder (the tiny bundled-test pair), as a user would build one
TINYMOD = """
from adaptspec.serving.tiny import TINY_MAX_POSITIONS, tiny_speculator

def make():
    spec, codec = tiny_speculator(0, verification="exact")
    spec.codec, spec.vocab_size, spec.max_context = codec, spec.target.vocab_size, TINY_MAX_POSITIONS
    return spec
"""


@pytest.mark.parametrize(
    "flag",
    [
        ["--max-rows", "4"],
        ["--max-queue", "4"],
        ["--attribution", "tokens"],
        ["--load-rule", "goodput"],
        ["--load-features"],
        ["--batched"],
    ],
)
def test_serve_refuses_engine_options_when_the_factorys_speculator_is_served_one_request_at_a_time(
    errmod, capsys, flag
):
    assert main(["serve", "--speculator", "mymod_e:make", "--port", "0", *flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert (
        f"{flag[0]} applies to the batched engine; --speculator mymod_e:make returned a TinyDFlash, not "
        "adaptspec's SpeculativeDecoder, so it is served one request at a time: drop it"
    ) in err


def test_serve_runs_a_factorys_speculative_decoder_on_the_engine_with_the_engine_options(errmod, capsys):
    import torch
    from fastapi.testclient import TestClient

    from adaptspec.cli.serve import build
    from adaptspec.serving.app import create_app
    from adaptspec.serving.codec import CharCodec
    from adaptspec.serving.tiny import tiny_model

    (errmod / "tinymod.py").write_text(TINYMOD)
    # the engine decides once per request: re-deciding is refused, in one line naming what the factory returned
    assert main(["serve", "--speculator", "tinymod:make", "--port", "0", "--redecide-every", "2"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and (
            "--redecide-every: --speculator tinymod:make returned a SpeculativeDecoder, "
            "which runs on the batched engine"
        )
        in err
    ), err
    args = build_parser("serve").parse_args(
        [
            "serve",
            "--speculator",
            "tinymod:make",
            "--port",
            "0",
            "--max-rows",
            "2",
            "--max-queue",
            "5",
            "--load-rule",
            "fixed:2",
            "--variant",
            "A=fixed:4",
        ]
    )
    service = build(args)
    try:
        assert (
            service.runner.describe()
            == "batched engine: 2 rows, queue 5, attribution marginal, load rule fixed:2"
        )
        prompts = ["Hello there", "def f(x):", "1 + 1 ="]
        with TestClient(create_app(service)) as client:
            got = [client.post("/v1/completions", json={"prompt": p, "max_tokens": 12}) for p in prompts]
        model, codec = tiny_model(0), CharCodec()
        for p, r in zip(prompts, got):
            assert r.status_code == 200, r.text
            ids = codec.encode(p)
            want = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12)[
                0, len(ids) :
            ].tolist()
            assert (
                r.json()["choices"][0]["token_ids"] == want
            )  # exact verification: the target's own greedy tokens
        assert service.runner.loop.rounds > 0  # decoded by the engine's rounds
    finally:
        service.close()


def test_profile_latency_times_your_speculator(errmod, capsys):
    import torch
    from mymod_e import make16

    from adaptspec.models.prompts import heldout_prompts
    from examples.byo_dflash import ByteCodec

    assert (
        main(["profile-latency", "--speculator", "mymod_e:make", "--batch-rows", "1,2", "--out", "p.json"])
        == 2
    )
    assert "--batch-rows times adaptspec's batched engine" in capsys.readouterr().err
    torch.set_num_threads(1)
    assert (
        main(
            [
                "profile-latency",
                "--speculator",
                "mymod_e:make16",
                "--prompts",
                "2",
                "--max-new-tokens",
                "6",
                "--out",
                "p.json",
                "--json",
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)
    arms = [1, 2, 4, 8, 12, 16]  # the default block sizes up to max_block_size 16
    assert [r["block_size"] for r in got["fit"]] == arms
    # the rounds it fitted: decoding the first held-out prompt of the first two domains at every block size
    pool = heldout_prompts()
    picked = [next(p for p in pool if p.domain == d) for d in sorted({p.domain for p in pool})[:2]]
    spec, codec = make16(), ByteCodec()
    pres = [spec.prefill(codec.encode(p.prompt)) for p in picked]
    assert got["rounds"] == sum(len(spec.decode(pre, b, 6).rounds) for pre in pres for b in arms)
    assert json.loads((errmod / "p.json").read_text())


def test_serve_refuses_variants_whose_heads_bring_different_featurizers(errmod):
    import numpy as np

    from adaptspec.cli.serve import build
    from adaptspec.policies.featurizer import Featurizer

    rng = np.random.default_rng(0)
    for name in ("h1", "h2"):  # two featurizers fitted on different data
        Featurizer.fit(rng.normal(size=(40, 129)).astype(np.float32), dim=4).save(errmod / name)
    args = build_parser("serve").parse_args(
        [
            "serve",
            "--speculator",
            "mymod_e:make",
            "--port",
            "0",
            "--variant",
            "A=neural-linear:head=h1",
            "--variant",
            "B=neural-linear:head=h2",
        ]
    )
    with pytest.raises(
        AdaptspecError,
        match=r"variants A and B bring different featurizers with their heads .*"
        r"give --featurizer DIR",
    ) as e:
        build(args)
    assert "\n" not in str(e.value)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab_.:1 /-", max_size=16))
def test_any_speculator_flag_parses_or_is_one_line(text):
    import argparse

    from adaptspec.cli.user_speculator import speculator_path

    name = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"  # a dotted Python name, ASCII
    valid = re.fullmatch(f"{name}:{name}", text) is not None
    try:
        assert speculator_path(text) == text and valid
    except argparse.ArgumentTypeError as e:
        assert not valid and "\n" not in str(e) and str(e).startswith("expected MODULE:FACTORY")


def _one_error_line(err: str, bar: str) -> str:
    """stderr without the progress bar's lines."""
    return "\n".join(line for line in err.strip().splitlines() if not re.match(rf"{bar}: +\d+%", line))


@pytest.mark.parametrize(
    "factory, message",
    [
        (
            "raising",
            r"^adaptspec profile-latency: error: --speculator mymod_e:raising, held-out prompt 0: decode at block "
            r"size 1 raised RuntimeError: decode boom$",
        ),
        ("claims_1000", r"held-out prompt 0: decode at block size 12 raised IndexError: "),
        ("too_many", r"decode at block size 1 is refused: it has \d+ tokens, more than max_new_tokens=4"),
        (
            "no_times",
            r"--speculator mymod_e:no_times reports no times: its rounds' verify_s and its outcomes' decode_s "
            r"are 0",
        ),
    ],
)
def test_profile_latency_refusals_are_one_line(errmod, capsys, factory, message):
    argv = [
        "profile-latency",
        "--speculator",
        f"mymod_e:{factory}",
        "--prompts",
        "1",
        "--max-new-tokens",
        "4",
        "--out",
        "p.json",
    ]
    assert main(argv) == 2
    err = _one_error_line(capsys.readouterr().err, "profile")
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not (errmod / "p.json").exists()


def test_profile_latency_times_a_speculator_whose_rounds_carry_no_times_from_its_decode_times(errmod, capsys):
    from adaptspec.costs.latency import LatencyProfile

    assert (
        main(
            [
                "profile-latency",
                "--speculator",
                "mymod_e:untimed",
                "--prompts",
                "2",
                "--max-new-tokens",
                "6",
                "--out",
                "p.json",
                "--json",
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)
    assert got["times"] == "whole-request" and got["rounds"] > 0
    assert all(r["verify_ms"] > 0 and r["draft_ms"] == 0 for r in got["fit"])
    assert "whole-request decode_s" in LatencyProfile.load(errmod / "p.json").source


def test_profile_latency_fits_rounds_whose_time_is_all_context(errmod, capsys):
    # what a busy host measured for make16's two prompts, made exact: verify = 10 us per context token past
    # the 10th, nothing fixed; the least-squares fit's constant is then exactly 0 (it was refused:
    # "verify times must be > 0 s (a target pass takes time), got values_s [0.0, 0.0, ...]")
    from adaptspec.costs.latency import LatencyProfile

    assert (
        main(
            [
                "profile-latency",
                "--speculator",
                "mymod_e:timed_by_context",
                "--prompts",
                "2",
                "--max-new-tokens",
                "6",
                "--out",
                "p.json",
                "--json",
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)
    assert got["times"] == "per-round" and all(r["verify_ms"] > 0 for r in got["fit"])
    assert LatencyProfile.load(errmod / "p.json").verify.values_s[0] > 0


@pytest.mark.slow
def test_collect_cuts_the_default_arms_at_the_drafters_max_block_and_says_what_works_without_a_tokenizer(
    tmp_path, capsys
):
    # a published-format pair whose drafter drafts 8 at most and whose target has no tokenizer: no --arms is
    # no longer "--arms [12, 16] outside 1..8" (the defaults are cut at 8), and the text prompts that cannot
    # be encoded are one line saying what works (issue 46, items 15 and 17)
    pair = ROOT / "tests" / "data" / "dflash-reference-tiny-b8"
    argv = [
        "collect",
        "--target",
        str(pair / "target"),
        "--drafter",
        str(pair / "drafter"),
        "--out",
        str(tmp_path / "t"),
        "--limit",
        "1",
        "--threads",
        "1",
    ]
    assert main(argv) == 2
    err = _one_error_line(capsys.readouterr().err, "Loading weights")
    assert len(err.splitlines()) == 1 and "outside" not in err, err
    assert "this target has no tokenizer, so collect cannot encode its text prompts" in err
    assert "collect_traces(spec, [(request_id, domain, token_ids), ...]" in err
    assert (
        main(argv + ["--arms", "4,16"]) == 2
    )  # a given --arms beyond it is still refused, naming the drafter
    assert (
        "--arms 4,16: the drafter's max_block_size is 8, so block sizes [16] cannot be drafted"
        in capsys.readouterr().err
    )


@pytest.mark.slow
def test_collect_with_a_drafter_of_max_block_8_and_no_arms_collects_the_default_arms_up_to_8(tmp_path):
    # the same pair with a tokenizer of its own (one id per printable character, built here): collect runs,
    # at the default block sizes cut at the drafter's 8 (issue 46, item 15)
    import shutil

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from adaptspec.traces import TraceSet

    pair = ROOT / "tests" / "data" / "dflash-reference-tiny-b8"
    target = tmp_path / "target"
    shutil.copytree(pair / "target", target)
    tok = Tokenizer(
        models.WordLevel({"[UNK]": 0, **{chr(c): c - 31 for c in range(32, 127)}}, unk_token="[UNK]")
    )
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(target)
    assert (
        main(
            [
                "collect",
                "--target",
                str(target),
                "--drafter",
                str(pair / "drafter"),
                "--out",
                str(tmp_path / "t"),
                "--limit",
                "2",
                "--max-new-tokens",
                "6",
                "--threads",
                "1",
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    ts = TraceSet.read(tmp_path / "t")
    assert ts.arms == (1, 2, 4, 6, 8) and ts.n_requests == 2


@pytest.mark.slow
def test_serve_chat_on_a_target_without_a_tokenizer_is_refused_at_start():
    # it started, then answered every chat request 400 (issue 46, item 17)
    from adaptspec.cli.serve import build

    pair = ROOT / "tests" / "data" / "dflash-reference-tiny-b8"
    args = build_parser("serve").parse_args(
        [
            "serve",
            "--target",
            str(pair / "target"),
            "--drafter",
            str(pair / "drafter"),
            "--chat",
            "--port",
            "0",
        ]
    )
    with pytest.raises(
        AdaptspecError,
        match=r"--chat wraps prompts in the target's chat template, but --target \S+ has "
        r"no tokenizer \(its prompts are token ids\): drop --chat",
    ) as e:
        build(args).close()
    assert "\n" not in str(e.value)
