"""Bad input never gets a 5xx from the server, and the server refuses, at start, state it could not use (issue 18).

Everything runs in-process over the tiny random model (``adaptspec serve --tiny``'s): the
FastAPI app through ``fastapi.testclient``, hypothesis-generated JSON bodies against it
(never a 5xx, and the server answers normally afterwards), and the start-up checks of the
decision-log and checkpoint directories. The kill/restart tests with a real server are in
test_serving.py. Case names ``test_dN_...`` are the numbered defects of the issue.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from adaptspec import AdaptspecError
from adaptspec._util.append import LineAppender
from adaptspec.control.policy_checkpoint import latest_checkpoint, load_policy, read_checkpoint, state_digest
from adaptspec.serving import CompletionService, ServerLimits, create_app
from adaptspec.serving.codec import CharCodec
from adaptspec.traces import DecisionLog

fastapi_testclient = pytest.importorskip("fastapi.testclient")
TINY_DEFAULT_ARMS = (1, 2, 4, 6, 8, 10, 12, 16)  # DEFAULT_ARMS up to the tiny drafter's 16
LIMITS = ServerLimits(
    max_prompt_tokens=32,
    max_tokens=4,
    default_max_tokens=2,
    max_context=512,
    vocab_size=128,
    max_body_bytes=1 << 20,
)


@pytest.fixture(scope="module")
def spec():
    from adaptspec.serving.tiny import tiny_speculator

    return tiny_speculator(0)[0]


def build(spec, root: Path | None = None, **kw) -> CompletionService:
    opts = dict(codec=CharCodec(), limits=LIMITS, model_name="tiny", checkpoint_every=1)
    if root is not None:
        opts.update(log_dir=root / "log", checkpoint_dir=root / "ck")
    return CompletionService.build(spec, {"A": "ucb", "B": "fixed:4"}, **{**opts, **kw})


@pytest.fixture
def client(spec, tmp_path):
    with fastapi_testclient.TestClient(create_app(build(spec, tmp_path))) as c:
        yield c


def post(client, body: bytes | dict):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post("/v1/completions", content=data, headers={"content-type": "application/json"})


def metric(client, name: str, **labels) -> float:
    """The value of the sample of /metrics with these labels (0 when absent)."""
    for line in client.get("/metrics").text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name and dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")) == labels:
            return float(m.group(3))
    return 0.0


# ============================================================================ requests
@pytest.mark.parametrize(
    "body,param,needle",
    [
        (
            {"prompt": "hi", "seed": 1180591620717411303424, "temperature": 0.7},
            "seed",
            "seed must be an integer in 0..",
        ),
        ({"prompt": "hi", "seed": -1}, "seed", "seed must be an integer"),
        (
            {"prompt": "hi", "temperature": 1e-300},
            "temperature",
            "temperature must be 0 (greedy) or a number in",
        ),
        ({"prompt": "hi", "temperature": 1e300}, "temperature", "temperature"),
        ({"prompt": "hi", "logprobs": 0}, "logprobs", "logprobs=0 is not supported"),
        ({"prompt": "hi", "n": True}, "n", "n=True is not supported"),
        ({"prompt": [1, 2, 2**70]}, "prompt", "outside the vocabulary"),
    ],
    ids=[
        "d4-seed-overflow",
        "d4-seed-negative",
        "d4-temperature-underflows-logits",
        "d4-temperature-huge",
        "d11-logprobs-zero-refused",
        "n-true-is-not-one",
        "prompt-token-id-overflow",
    ],
)
def test_bad_fields_get_a_400_naming_them(client, body, param, needle):
    r = post(client, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"] and "\n" not in err["message"]


@pytest.mark.parametrize(
    "body,needle",
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"prompt": ' + b"[" * 50_000 + b"1" + b"]" * 50_000 + b"}", "nested too deeply"),
        (b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "a number that cannot be read"),
    ],
    ids=["d4-deeply-nested-array", "d4-deeply-nested-prompt", "d4-integer-of-5000-digits"],
)
def test_d4_bodies_json_cannot_hold_get_a_400(client, body, needle):
    r = post(client, body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"]
    assert post(client, {"prompt": "still up", "max_tokens": 2}).status_code == 200


_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=12)
)
_JSON = st.recursive(
    _LEAF,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=10,
)
_FIELDS = {
    "prompt": st.one_of(
        st.text(max_size=40),
        st.lists(st.integers(-3, 300), max_size=40),
        st.lists(st.lists(st.integers(0, 127), max_size=3), max_size=2),
        _JSON,
    ),
    "max_tokens": st.one_of(st.integers(-2, 6), _JSON),
    "temperature": st.one_of(st.just(0), st.floats(0, 3), _JSON),
    "seed": st.one_of(st.none(), st.integers(-2, 2**70), _JSON),
    "stream": st.one_of(st.booleans(), _JSON),
    "user": st.one_of(st.text(max_size=8), _JSON),
    "variant": st.one_of(st.sampled_from(["A", "B", "C"]), _JSON),
    "n": st.one_of(st.just(1), _JSON),
    "logprobs": _JSON,
    "stop": _JSON,
    "echo": _JSON,
    "extra": _JSON,
}
_VALID = {  # requests that should run: the generated ones above are mostly refused
    "prompt": st.one_of(
        st.text(min_size=1, max_size=20), st.lists(st.integers(0, 127), min_size=1, max_size=20)
    ),
    "max_tokens": st.integers(1, 4),
    "temperature": st.one_of(st.just(0), st.floats(0.001, 2), st.floats(0, 1e-250), st.floats(2, 1e308)),
    "seed": st.one_of(st.none(), st.integers(0, 2**63 - 1), st.integers(2**64, 2**80)),
    "stream": st.booleans(),
    "user": st.text(max_size=8),
    "variant": st.sampled_from(["A", "B"]),
}
_BODIES = st.one_of(
    st.fixed_dictionaries(
        {k: _VALID[k] for k in ("prompt", "max_tokens", "temperature", "seed")},
        optional={k: _VALID[k] for k in ("stream", "user", "variant")},
    ).map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({}, optional=_FIELDS).map(lambda d: json.dumps(d).encode()),
    _JSON.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
)


_STATUSES: list[int] = []


def _no_server_error_in(r) -> bool:
    """A streamed answer is a 200 whose events may carry an error: none may be a server error."""
    if not r.headers.get("content-type", "").startswith("text/event-stream"):
        return True
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            if "error" in chunk and chunk["error"]["code"] >= 500:
                return False
    return True


@pytest.fixture(scope="module")
def shared_client(spec, tmp_path_factory):
    """One server for every generated body (and the test after them)."""
    with fastapi_testclient.TestClient(create_app(build(spec, tmp_path_factory.mktemp("generated")))) as c:
        yield c


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=st.data())
def test_generated_bodies_never_get_a_5xx_and_the_server_stays_up(shared_client, body):
    data = body.draw(_BODIES)
    r = post(shared_client, data)
    _STATUSES.append(r.status_code)
    assert r.status_code < 500, (data[:300], r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert _no_server_error_in(r), r.text[:500]


def test_after_the_generated_bodies_the_server_answers_and_nothing_failed(shared_client):
    c = shared_client
    if len(_STATUSES) < 120:  # the generated bodies ran in another process (pytest -n): send them here too
        test_generated_bodies_never_get_a_5xx_and_the_server_stays_up(c)
    assert len(_STATUSES) >= 120
    assert _STATUSES.count(200) >= 3 and sum(400 <= x < 500 for x in _STATUSES) >= 30  # both kinds were tried
    assert post(c, {"prompt": "ok", "max_tokens": 3, "user": "u"}).status_code == 200
    h = c.get("/health").json()
    assert h["status"] == "ok", h
    for v in ("A", "B"):
        assert metric(c, "adaptspec_requests_total", variant=v, status="error") == 0
        assert metric(c, "adaptspec_log_errors_total", variant=v) == 0


# ============================================================================ state the server cannot use
def _rows(n: int, width: int) -> list[dict]:
    return [
        {
            "decision_id": f"old-{i}",
            "time": 1.7e9 + i,
            "policy": "ucb",
            "variant": "A",
            "block_size": 4,
            "propensity": 1.0,
            "probs": [0.0, 0.0, 1.0],
            "arms": [1, 2, 4],
            "reward": 1.0,
            "features": [0.5] * width,
        }
        for i in range(n)
    ]


def test_d5_a_log_with_contexts_of_another_width_is_refused_at_start(spec, tmp_path):
    DecisionLog(tmp_path / "log").append(_rows(3, width=3))
    with pytest.raises(
        AdaptspecError, match="holds contexts of 3 features, the speculator's prefill gives 129"
    ):
        build(spec, tmp_path)
    assert len(DecisionLog.read(tmp_path / "log")) == 3  # untouched


def test_d5_a_log_with_a_truncated_part_is_refused_at_start(spec, tmp_path):
    part = DecisionLog(tmp_path / "log").append(_rows(3, width=129))
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    with pytest.raises(AdaptspecError, match="not a readable Parquet file"):
        build(spec, tmp_path)
    assert part.read_bytes() == data[: len(data) // 2]


def test_d5_a_failed_log_write_is_a_503_not_an_applied_feedback(client):
    svc = client.app.state.service
    assert post(client, {"prompt": "first", "variant": "A"}).status_code == 200
    writer = svc.controllers["A"]._log
    with writer._lock:  # the disk is full from now on (a real device that refuses every write)
        if writer._file is not None:
            writer._file.close()
        segment, writer._file = writer._file, LineAppender("/dev/full", fsync=False)
    try:
        r = post(client, {"prompt": "second", "variant": "A"})
        assert r.status_code == 503 and "decision log cannot be written" in r.json()["error"]["message"]
        assert metric(client, "adaptspec_feedback_total", variant="A", status="applied") == 1
        assert metric(client, "adaptspec_feedback_total", variant="A", status="log_error") == 1
        assert metric(client, "adaptspec_log_errors_total", variant="A") == 1
        h = client.get("/health").json()
        assert h["status"] == "degraded" and "decision log" in h["variants"]["A"]["last_error"]
        assert post(client, {"prompt": "other variant", "variant": "B"}).status_code == 200  # B keeps serving
    finally:
        with writer._lock:  # the disk has room again: appends go to the journal segment they went to
            full, writer._file = (
                writer._file,
                None if segment is None else LineAppender(segment.path, fsync=False),
            )
        with contextlib.suppress(OSError):
            full.close()
    assert post(client, {"prompt": "third", "variant": "A"}).status_code == 200
    assert len(writer.pending_rows()) == 2  # first and third: the refused one was never acknowledged


def test_d6_a_checkpoint_dir_that_is_a_file_is_refused_at_start(spec, tmp_path):
    (tmp_path / "ck").write_text("a regular file")
    with pytest.raises(AdaptspecError, match="cannot keep checkpoints here"):
        build(spec, tmp_path)
    assert (tmp_path / "ck").read_text() == "a regular file"


def test_d6_checkpoint_failures_after_start_show_in_metrics_and_health(client, tmp_path):
    ck = tmp_path / "ck" / "A"
    shutil.rmtree(ck)
    ck.write_text("the checkpoint directory was replaced by a file")
    assert post(client, {"prompt": "learn", "variant": "A"}).status_code == 200
    svc = client.app.state.service
    svc.controllers["A"].sync()
    for _ in range(100):
        if metric(client, "adaptspec_checkpoint_errors_total", variant="A") >= 1:
            break
        time.sleep(0.05)
    assert metric(client, "adaptspec_checkpoint_errors_total", variant="A") >= 1
    h = client.get("/health").json()
    assert h["status"] == "degraded" and h["variants"]["A"]["checkpoint_errors"] >= 1
    assert "checkpoint" in h["variants"]["A"]["last_error"]


# ============================================================================ serve --tiny
def _serve_args(*argv: str):
    from adaptspec.cli import build_parser

    return build_parser("serve").parse_args(["serve", *argv])


def test_d7_serve_tiny_starts_with_its_defaults(tmp_path):
    from adaptspec.cli.serve import build as build_service

    svc = build_service(_serve_args("--tiny", "--threads", "1", "--log-dir", str(tmp_path / "log")))
    with fastapi_testclient.TestClient(create_app(svc)) as c:
        ctl = svc.controllers["default"]
        assert ctl.arms == TINY_DEFAULT_ARMS and svc.router.specs["default"] == "fi-ucb"
        r = post(c, {"prompt": "hello", "max_tokens": 4})
        assert r.status_code == 200 and r.json()["adaptspec"]["block_size"] in TINY_DEFAULT_ARMS


def test_d7_serve_tiny_takes_arms_up_to_its_max_block_size(tmp_path):
    from adaptspec.cli.serve import build as build_service

    svc = build_service(_serve_args("--tiny", "--arms", "1,2,4,8,16"))
    try:
        assert svc.controllers["default"].arms == (1, 2, 4, 8, 16)
    finally:
        svc.close()


# ============================================================================ restart
def test_d11_a_restart_that_replayed_the_log_checkpoints_at_shutdown(spec, tmp_path):
    """The first run checkpoints at 2 updates and at shutdown (3). Drop the last checkpoint:
    the restart resumes at 2 and replays the third from the log; closing it with no new
    update must write that state, equal to the first run's own final checkpoint."""
    from adaptspec import AdaptiveController
    from adaptspec.policies import make_policy

    opts = dict(
        log_dir=tmp_path / "log", checkpoint_dir=tmp_path / "ck", checkpoint_every=2, variant="A", seed=0
    )
    with AdaptiveController(spec, "ucb", **opts) as c:
        for i in range(3):
            c.generate(CharCodec().encode(f"request {i}"), max_new_tokens=3)
    final = latest_checkpoint(tmp_path / "ck")
    assert read_checkpoint(final)["updates"] == 3
    first = make_policy("ucb", TINY_DEFAULT_ARMS, seed=0)
    load_policy(final, first)
    shutil.rmtree(final)
    with AdaptiveController(spec, "ucb", **opts) as c:
        assert c.resumed["updates_at_checkpoint"] == 2 and c.resumed["replayed"] == 1
    again = latest_checkpoint(tmp_path / "ck")
    assert read_checkpoint(again)["updates"] == 3
    resumed = make_policy("ucb", TINY_DEFAULT_ARMS, seed=0)
    load_policy(again, resumed)
    assert state_digest(resumed) == state_digest(first)


# ============================================================================ issue 38: routing and prompt shapes
def test_i38_variant_null_is_not_given_the_model_and_the_header_route(client):
    def variant(body, headers=None):
        r = client.post(
            "/v1/completions", json={"prompt": "hi", "max_tokens": 2, **body}, headers=headers or {}
        )
        assert r.status_code == 200, r.text
        return r.json()["adaptspec"]["variant"]

    assert {variant({"model": "tiny:B", "variant": None}) for _ in range(8)} == {"B"}
    assert {variant({"variant": None}, {"X-Adaptspec-Variant": "B"}) for _ in range(8)} == {"B"}
    assert (
        variant({"model": "tiny:A", "variant": None}, {"X-Adaptspec-Variant": "B"}) == "A"
    )  # the body first
    assert {variant({"variant": None}) for _ in range(40)} == {"A", "B"}  # no key, no name: random
    r = post(client, {"prompt": "hi", "model": "tiny:B", "variant": "A"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "variant"


@pytest.mark.parametrize(
    "prompt,status,needle",
    [
        ([["a"]], 400, "prompt must be a string or a list of integer token ids, got a list holding 'a'"),
        ([[1, "x"]], 400, "got a list holding 'x'"),
        ([1, None], 400, "got a list holding None"),
        ([[1, 2], [3]], 400, "one prompt per request, got 2"),
        (["a", "b", "c"], 400, "one prompt per request, got 3"),
        ([[72, 105]], 200, None),
        (["Hi"], 200, None),
    ],
    ids=[
        "i38-nested-string",
        "i38-mixed",
        "i38-null-id",
        "i38-two-prompts",
        "i38-three-texts",
        "one-id-list",
        "one-text",
    ],
)
def test_i38_a_prompt_of_the_wrong_shape_is_named(client, prompt, status, needle):
    r = post(client, {"prompt": prompt, "max_tokens": 2})
    assert r.status_code == status, r.text
    if needle is not None:
        assert needle in r.json()["error"]["message"] and r.json()["error"]["param"] == "prompt"


# ============================================================================ issue 46: serve says what runs, refuses what it would guess
#: a speculator of one's own (not adaptspec's SpeculativeDecoder: served one request at a time), as a factory module
MYLOOP = """
from adaptspec.serving.tiny import TINY_MAX_POSITIONS, tiny_speculator


class MyLoop:
    def __init__(self):
        self.inner, self.codec = tiny_speculator(0)
        self.max_block_size, self.feature_dim = self.inner.max_block_size, self.inner.feature_dim
        self.vocab_size, self.max_context = self.inner.target.vocab_size, TINY_MAX_POSITIONS

    def prefill(self, prompt_ids, temperature=0.0, seed=None):
        return self.inner.prefill(prompt_ids, temperature=temperature, seed=seed)

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        return self.inner.decode(prefill, block_size, max_new_tokens, temperature=temperature, seed=seed,
                                 on_round=on_round)


def make():
    return MyLoop()
"""


def test_i46_an_empty_load_rule_is_refused_in_one_line_not_taken_for_the_default(capsys):
    from adaptspec.cli import main

    assert main(["serve", "--tiny", "--port", "0", "--load-rule", ""]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "argument --load-rule: an empty rule: give learned, goodput, fixed:B or none" in err
    )


def test_i46_serve_help_names_the_cold_default_that_runs(capsys):
    from adaptspec.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser("serve").parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "else fi-ucb, UCB learning every block size a request's rounds reveal" in text
        and "else ucb)" not in text
    )
    assert "--stall-timeout S" in text and "(default 60)" in text


def test_i46_redecide_every_on_a_speculator_of_ones_own_names_its_class(tmp_path, monkeypatch, capsys):
    """The one-request-at-a-time runner wraps the speculator (to halt it at a stop sequence): every
    message still names the user's class, not the wrapper's."""
    from adaptspec.cli import main

    (tmp_path / "myloop.py").write_text(MYLOOP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["serve", "--speculator", "myloop:make", "--port", "0", "--redecide-every", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert (
        "redecide_every=4 needs a speculator whose decode asks its RoundSchedule every round: speculator MyLoop "
        "does not declare per_round = True" in err
    )
    assert "Haltable" not in err
