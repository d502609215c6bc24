"""The completion service behind the HTTP layer: request checks, routing, running, reports.

Everything here is plain Python (no web framework), so it is usable and testable on its own:
:meth:`CompletionService.parse` turns a request body into a checked
:class:`CompletionRequest` or raises :class:`RequestError` (an HTTP status and a one-line
message), :meth:`CompletionService.run` routes it to a variant's
:class:`~adaptspec.AdaptiveController` and generates, :meth:`CompletionService.ab_report`
analyses the decision log.

Shutting down (:mod:`adaptspec.serving.shutdown` drives it for the server):
:meth:`CompletionService.stop_admitting` refuses new requests with 503, :meth:`CompletionService.drain`
answers every request still waiting or decoding with 503, and :meth:`CompletionService.close`
closes the runner and the controllers.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .._util.guarded import STALL_S
from ..ab.router import ABRouter
from ..errors import AdaptspecError
from .cancelling import Cancellation
from .codec import Codec
from .openai_models import ChatRequest, GenerationOptions, validate
from .request import CompletionRequest, Output
from .request_error import SHUTTING_DOWN, RequestError, short as _short
from .responses import finish_reason, unavailable
from .runner import Runner

if TYPE_CHECKING:
    from ..control.controller import AdaptiveController
    from ..control.generation import Generation
    from ..speculator import BlockSpeculator
    from .engine.batched import EngineSettings
    from .metrics import ServingMetrics

__all__ = [
    "CompletionRequest",
    "CompletionService",
    "Output",
    "RequestError",
    "ServerLimits",
    "runs_on_engine",
]

#: fields of the OpenAI completions API that this server does not implement, with their neutral values
_UNSUPPORTED = {
    "n": (None, 1),
    "best_of": (None, 1),
    "logprobs": (None, False),
    "echo": (None, False),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
}


#: what ``temperature`` may be besides 0: below the minimum, logits / T overflow
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0
#: the largest ``seed`` (torch and numpy generators take 64-bit seeds)
MAX_SEED = 2**63 - 1
#: seconds :meth:`CompletionService.close` waits for the decoding thread: to finish the requests it
#: holds, or, once they were answered by a drain, to leave its round
CLOSE_WAIT_S, DRAINED_WAIT_S = 120.0, 1.0


def runs_on_engine(speculator: Any) -> bool:
    """Whether :meth:`CompletionService.build` decodes ``speculator`` on the batching engine: adaptspec's
    own target and drafter (a :class:`~adaptspec.decoding.SpeculativeDecoder`, however it was made)
    are; any other speculator is served one request at a time. ``adaptspec serve --speculator`` asks
    the same of what the factory returned before it accepts or refuses the engine's options."""
    from ..decoding.decoder import SpeculativeDecoder

    return isinstance(speculator, SpeculativeDecoder)


def _same(a: Any, b: Any) -> bool:
    """JSON equality that keeps types apart (``0`` is not ``false``, ``1.0`` is not ``1``)."""
    return type(a) is type(b) and a == b


@dataclass(frozen=True)
class ServerLimits:
    """What the server accepts."""

    max_prompt_tokens: int = 2048
    max_tokens: int = 1024
    default_max_tokens: int = 16
    max_context: int | None = None  # prompt + new tokens (the model's positions)
    max_body_bytes: int = 1 << 20
    body_timeout_s: float = 10.0  # a request body not whole by then gets 408 (a stalled client holds nothing)
    vocab_size: int | None = None


class CompletionService:
    """Controllers per variant, the router, the tokenizer and the limits; thread-safe."""

    def __init__(
        self,
        controllers: Mapping[str, "AdaptiveController"],
        router: ABRouter,
        runner: Runner,
        codec: Codec | None = None,
        limits: ServerLimits | None = None,
        model_name: str = "adaptspec",
        metrics: "ServingMetrics | None" = None,
        log_dir: str | Path | None = None,
        host: Mapping[str, Any] | None = None,
    ) -> None:
        missing = [v for v in router.variants if v not in controllers]
        if missing:
            raise AdaptspecError(f"no controller for variant {missing[0]!r}")
        self.controllers = dict(controllers)
        self.router = router
        self.codec = codec
        self.limits = limits or ServerLimits()
        self.model_name = model_name
        self.metrics = metrics
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.host = (
            None if host is None else dict(host)
        )  # what the host measurement chose (adaptspec.host), for /health
        self.started = time.time()
        self._admitting = True  # False once shutting down: new requests get 503
        self._drained = False  # every request held was answered 503 (drain): close waits for no decode
        self._closed = False
        self._close_lock = threading.Lock()
        self._parts_cache: dict[str, list[dict[str, Any]]] = {}
        self.runner = runner  # decodes the requests: a BatchedRunner (one engine) or a SequentialRunner

    @classmethod
    def build(
        cls,
        speculator: "BlockSpeculator",
        variants: Mapping[str, str],
        split: str | None = None,
        *,
        codec: Codec | None = None,
        log_dir: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        limits: ServerLimits | None = None,
        model_name: str = "adaptspec",
        metrics: bool = True,
        engine: "EngineSettings | None" = None,
        stall_s: float = STALL_S,
        host: Mapping[str, Any] | None = None,
        **controller_options: Any,
    ) -> "CompletionService":
        """A service with one :class:`~adaptspec.AdaptiveController` per variant over one speculator.

        ``variants`` maps name -> policy spec; ``split`` is ``"50,50"`` (default: equal).
        Every variant logs to ``log_dir`` (its name in the ``variant`` column) and checkpoints to
        ``checkpoint_dir/NAME``; ``controller_options`` go to every controller. ``host``: what the
        host measurement chose (:meth:`adaptspec.host.HostChoice.to_dict`), reported by ``/health``.

        adaptspec's own speculator (a :class:`~adaptspec.decoding.SpeculativeDecoder`: a target and
        a drafter; :func:`runs_on_engine`) is decoded by one batched engine, ``engine`` its
        :class:`~adaptspec.serving.engine.batched.EngineSettings` (default: 8 rows, queue 64); any other
        speculator one request at a time through its controllers
        (:class:`~adaptspec.serving.engine.sequential.SequentialRunner`), which alone re-decides inside a
        request (``redecide_every``). Either decodes on a watched thread: busy ``stall_s`` seconds
        with no progress (a round), it is stalled (:mod:`adaptspec.serving.runner`).
        """
        from .engine.batched import EngineSettings, batched_runner
        from .engine.halting import HaltableSpeculator
        from .engine.sequential import SequentialRunner
        from .metrics import ServingMetrics

        batched = runs_on_engine(speculator)
        _check_runner_settings(speculator, batched, engine, stall_s, controller_options)
        if not batched:
            speculator = HaltableSpeculator.around(
                speculator
            )  # a stop sequence ends decoding (serving.engine.halting)
        router = ABRouter.parse([f"{n}={s}" for n, s in variants.items()], split)
        if batched:  # the engine's thread decides
            controller_options = {"decide_on_caller": True} | controller_options
        controllers = _controllers(speculator, router, log_dir, checkpoint_dir, controller_options)
        try:
            runner: Runner = (
                batched_runner(
                    speculator, controllers, router.variants, log_dir, engine or EngineSettings(), stall_s
                )
                if batched
                else SequentialRunner(controllers, stall_s)
            )
        except BaseException:
            for c in controllers.values():
                c.close()
            raise
        served = ServingMetrics(controllers) if metrics else None
        if served is not None and batched:
            served.attach_engine(runner.loop.stats)
        return cls(controllers, router, runner, codec, limits, model_name, served, log_dir, host)

    # ------------------------------------------------------------------ requests
    def parse(self, body: bytes, variant_header: str | None = None) -> CompletionRequest:
        """Check a ``/v1/completions`` body; raises :class:`RequestError` naming the problem."""
        data = self.read_json(body)
        for name, neutral in _UNSUPPORTED.items():
            if name in data and not any(_same(data[name], v) for v in neutral):
                raise RequestError(f"{name}={_short(data[name])} is not supported by this server", param=name)
        return self.request(data, self._prompt_ids(data.get("prompt")), variant_header)

    def parse_chat(self, body: bytes, variant_header: str | None = None) -> CompletionRequest:
        """Check a ``/v1/chat/completions`` body; raises :class:`RequestError` naming the problem.

        The body is checked by :class:`~adaptspec.serving.openai_models.ChatRequest` (messages, stop,
        stream options, unsupported fields), its messages are rendered with the tokenizer's chat
        template ending with the assistant's turn, and from there it is a completion request like
        any other (:meth:`request`): the same limits, variant routing, decision log and metrics;
        ``max_completion_tokens`` is taken for ``max_tokens``."""
        data = self.read_json(body)
        chat = validate(ChatRequest, data)
        encode_chat = getattr(self.codec, "encode_chat", None)
        if encode_chat is None:
            raise RequestError(
                "this model has no tokenizer with a chat template: use /v1/completions", param="messages"
            )
        try:
            ids = encode_chat(chat.chat())
        except Exception as e:  # noqa: BLE001 - the template refusing these messages (raise_exception, types)
            why = " ".join(str(e).split()) or type(e).__name__
            raise RequestError(
                f"messages cannot be rendered with this model's chat template: {why}", param="messages"
            ) from None
        if chat.max_completion_tokens is not None:
            data = {**data, "max_tokens": chat.max_completion_tokens}
        return self.request(data, ids, variant_header, options=chat)

    def read_json(self, body: bytes) -> dict[str, Any]:
        """A request body as a JSON object, or a :class:`RequestError`."""
        lim = self.limits
        if len(body) > lim.max_body_bytes:
            raise RequestError(f"request body is {len(body)} bytes; the limit is {lim.max_body_bytes}", 413)
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"request body is not valid JSON: {e}") from None
        except ValueError as e:  # an integer literal of more digits than Python converts
            raise RequestError(f"request body has a number that cannot be read ({e})") from None
        except RecursionError:
            raise RequestError("request body is nested too deeply") from None
        if not isinstance(data, dict):
            raise RequestError(f"request body must be a JSON object, got {type(data).__name__}")
        return data

    def request(
        self,
        data: dict[str, Any],
        ids: list[int],
        variant_header: str | None = None,
        options: GenerationOptions | None = None,
    ) -> CompletionRequest:
        """Check the fields both endpoints share around the prompt's ``ids``; ``options`` if already checked."""
        lim = self.limits
        opts = options if options is not None else validate(GenerationOptions, data)
        if opts.stop and self.codec is None:
            raise RequestError("stop sequences need a tokenizer: this model has none", param="stop")
        if len(ids) > lim.max_prompt_tokens:
            raise RequestError(
                f"prompt has {len(ids)} tokens; this server accepts at most {lim.max_prompt_tokens}",
                param="prompt",
            )
        mt = data.get("max_tokens", lim.default_max_tokens)
        if mt is None:
            mt = lim.default_max_tokens
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {_short(mt)}", param="max_tokens")
        if mt > lim.max_tokens:
            raise RequestError(
                f"max_tokens={mt} exceeds this server's limit of {lim.max_tokens}", param="max_tokens"
            )
        if lim.max_context is not None and len(ids) + mt > lim.max_context:
            raise RequestError(
                f"prompt ({len(ids)} tokens) + max_tokens ({mt}) exceeds the model's context of "
                f"{lim.max_context} tokens",
                param="max_tokens",
            )
        temp = data.get("temperature", 0.0)
        if temp is None:
            temp = 0.0
        if (
            isinstance(temp, bool)
            or not isinstance(temp, (int, float))
            or not math.isfinite(temp)
            or not (temp == 0 or MIN_TEMPERATURE <= temp <= MAX_TEMPERATURE)
        ):
            raise RequestError(
                f"temperature must be 0 (greedy) or a number in {MIN_TEMPERATURE:g}..{MAX_TEMPERATURE:g}, "
                f"got {_short(temp)}",
                param="temperature",
            )
        seed = data.get("seed")
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED
        ):
            raise RequestError(f"seed must be an integer in 0..{MAX_SEED}, got {_short(seed)}", param="seed")
        stream = data.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError(f"stream must be true or false, got {_short(stream)}", param="stream")
        user = data.get("user")
        if user is not None and not isinstance(user, str):
            raise RequestError(f"user must be a string, got {_short(user)}", param="user")
        given = data.get("variant")  # null is "not given": the model's variant, the header, or the router
        named = self._model_variant(opts.model, given)
        variant = given if given is not None else named if named is not None else variant_header
        if variant is not None:
            if not isinstance(variant, str) or variant not in self.router.variants:
                raise RequestError(
                    f"unknown variant {_short(variant)}: this server has {', '.join(self.router.variants)}",
                    param="variant",
                )
        else:
            variant = self.router.assign(user)
        include_usage = opts.stream_options is not None and opts.stream_options.include_usage
        if not self._admitting:
            raise RequestError(SHUTTING_DOWN, 503)
        # the engine's queue: its place is taken now, the last check, so a stream refused is a 429 before its headers
        slot = self.runner.reserve()
        return CompletionRequest(
            ids, mt, float(temp), seed, stream, variant, user, opts.stop, include_usage, slot=slot
        )

    def model_ids(self) -> list[str]:
        """The names ``model`` may take: the served model, and ``MODEL:VARIANT`` for each of several variants."""
        variants = self.router.variants if len(self.router.variants) > 1 else ()
        return [self.model_name, *(f"{self.model_name}:{v}" for v in variants)]

    def _model_variant(self, model: str | None, variant: Any) -> str | None:
        """The variant ``model`` names (None: the router decides); unknown models get a 404."""
        if model is None or model == self.model_name:
            return None
        if model not in self.model_ids():
            raise RequestError(
                f"model {_short(model)} is not served here; GET /v1/models lists "
                f"{', '.join(self.model_ids())}",
                404,
                param="model",
            )
        named = model[len(self.model_name) + 1 :]
        if variant is not None and variant != named:
            raise RequestError(
                f"model {model!r} is variant {named!r} but variant is {_short(variant)}", param="variant"
            )
        return named

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if prompt is None:
            raise RequestError("prompt is required (a string, or a list of token ids)", param="prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            if len(prompt) > 1:  # the OpenAI API's batch of prompts
                raise RequestError(f"one prompt per request, got {len(prompt)}", param="prompt")
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if self.codec is None:
                raise RequestError(
                    "this model has no tokenizer: send the prompt as a list of token ids", param="prompt"
                )
            try:
                ids = self.codec.encode(prompt)
            except Exception as e:  # noqa: BLE001 - a tokenizer refusing the text (lone surrogates, ...)
                raise RequestError(
                    f"prompt cannot be tokenized ({type(e).__name__})", param="prompt"
                ) from None
        elif isinstance(prompt, list):
            bad = [t for t in prompt if not isinstance(t, int) or isinstance(t, bool)]
            if bad:
                raise RequestError(
                    f"prompt must be a string or a list of integer token ids, got a list holding "
                    f"{_short(bad[0], 30)}",
                    param="prompt",
                )
            ids = list(prompt)
        else:
            raise RequestError(
                f"prompt must be a string or a list of token ids, got {type(prompt).__name__}", param="prompt"
            )
        if not ids:
            raise RequestError("prompt is empty", param="prompt")
        v = self.limits.vocab_size if self.limits.vocab_size is not None else 2**31
        if min(ids) < 0 or max(ids) >= v:
            bad = next(t for t in ids if t < 0 or t >= v)
            raise RequestError(f"prompt token id {bad} is outside the vocabulary 0..{v - 1}", param="prompt")
        return ids

    def run(
        self,
        req: CompletionRequest,
        on_tokens: Callable[[list[int]], None] | None = None,
        stop_when: Callable[[], bool] | None = None,
        cancel: Cancellation | None = None,
    ) -> "Generation":
        """Decode a checked request on the runner; returns the Generation.

        ``on_tokens(ids)`` gets the tokens as they are committed; ``stop_when()``, asked after each
        round, ends decoding as ``"stop"``; ``cancel`` (a :class:`~adaptspec.serving.cancelling.Cancellation`)
        ends it when the client went away. The decision and its outcome are in the decision log
        when this returns. A failure counts in the metrics (a full queue's 429 does not).
        """
        try:
            return self.runner.run(req, on_tokens, stop_when, cancel)
        except Exception as e:
            self._failed(req, e)
            raise

    async def run_async(
        self,
        req: CompletionRequest,
        on_tokens: Callable[[list[int]], None] | None = None,
        stop_when: Callable[[], bool] | None = None,
        cancel: Cancellation | None = None,
    ) -> "Generation":
        """:meth:`run`, awaited on the server's event loop."""
        try:
            return await self.runner.run_async(req, on_tokens, stop_when, cancel)
        except Exception as e:
            self._failed(req, e)
            raise

    def _failed(self, req: CompletionRequest, e: Exception) -> None:
        """Count a failed request in the metrics (a full queue's 429 is not a failure)."""
        if self.metrics is not None and not (isinstance(e, RequestError) and e.status == 429):
            self.metrics.failed(req.variant)

    def observe(
        self,
        req: CompletionRequest,
        gen: "Generation",
        ttft_s: float | None,
        completion_tokens: int | None = None,
    ) -> None:
        """Record a completed request; ``completion_tokens``: what the client got (default: every token decoded)."""
        if self.metrics is not None:
            self.metrics.observe(
                req.variant,
                gen,
                len(req.prompt_ids),
                time.perf_counter() - req.received,
                ttft_s,
                completion_tokens,
            )

    # ------------------------------------------------------------------ answers (their bodies: serving.responses)
    def text(self, ids: list[int]) -> str:
        return "" if self.codec is None else self.codec.decode(ids)

    def output(self, gen: "Generation") -> Output:
        """The whole of a generation, as answered when the request had no stop sequence."""
        out = gen.outcome
        return Output(list(out.tokens), self.text(out.tokens), finish_reason(out.finish_reason))

    # ------------------------------------------------------------------ reports
    def health(self, digest: bool = False) -> dict[str, Any]:
        variants = {}
        for name, w in zip(self.router.variants, self.router.weights):
            c = self.controllers[name]
            s = c.stats()
            v = {
                "spec": self.router.specs.get(name),
                "weight": round(float(w), 6),
                "policy": s["policy"],
                "decisions": s["decisions"],
                "updates": s["updates"],
                "pending": s["pending"],
                "queued": s["queued"],
                "fallbacks": sum(s["fallbacks"].values()),
                "late_decisions": s["late_decisions"],
                "checkpoint_updates": s["checkpoint_updates"],
                "resumed": _hide_dirs(s["resumed"], c),
                "checkpoint_errors": s["checkpoint_errors"],
                "log_errors": s["log_errors"],
                "last_error": _hide_dirs(s["last_error"], c),
                "machine_speed": s["machine_speed"],
            }
            if "shared" in s:
                v["shared"] = s["shared"]
            if digest:
                c.sync()
                v["policy_digest"] = c.policy_digest()
            variants[name] = v
        failing = any(
            v["checkpoint_errors"] or v["log_errors"] or v.get("shared", {}).get("state", "ok") != "ok"
            for v in variants.values()
        )
        engine = (
            self.runner.health
        )  # the decoding thread's: the batched engine's, or a speculator of one's own
        if engine["state"] in ("failed", "stalled"):
            status = engine[
                "state"
            ]  # stopped for good, or stuck: every request gets a 503 (HTTP 503 here too)
        elif self._closed or not self._admitting:
            status = "closing"
        else:
            status = "degraded" if failing or engine["state"] != "ok" else "ok"
        report = {
            "status": status,
            "model": self.model_name,
            "uptime_s": round(time.time() - self.started, 3),
            "variants": variants,
            "engine": engine,
        }
        if self.host is not None:
            report["host"] = self.host
        return report

    def ab_report(self, ope: bool = True, n_boot: int = 200) -> dict[str, Any]:
        """The live A/B report over the decision log (see :mod:`adaptspec.analysis.ab`)."""
        from ..analysis.ab import analyze, rows_to_arrays

        if self.log_dir is None:
            raise RequestError("no decision log: start the server with --log-dir to get an A/B report", 503)
        try:
            rows = self._log_rows()
        except AdaptspecError as e:  # a part that is not a readable file: the report cannot be made now
            raise unavailable("the decision log cannot be read now, so there is no A/B report", e) from None
        policies = {}
        if ope:
            for name, c in self.controllers.items():
                try:
                    policies[name] = c.policy_snapshot()
                except Exception:  # a stuck policy: report without its off-policy estimates
                    pass
        report = analyze(rows_to_arrays(rows), policies=policies, n_boot=n_boot).to_json()
        report["router"] = self.router.to_dict()
        return report

    def _log_rows(self) -> list[dict[str, Any]]:
        from ..traces import DecisionLog
        from ..traces.decision_log import read_part
        from ..traces.log_writer import journal_rows

        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for part in DecisionLog(self.log_dir).parts():  # parts never change: read each once
            key = str(part)
            if key not in self._parts_cache:
                self._parts_cache[key] = read_part(
                    part
                ).to_pylist()  # any fault: one AdaptspecError (a 503 below)
            for r in self._parts_cache[key]:
                seen.add(r["decision_id"])
                rows.append(r)
        for r in journal_rows(self.log_dir):
            if r["decision_id"] not in seen:
                seen.add(r["decision_id"])
                rows.append(r)
        return rows

    def stop_admitting(self) -> None:
        """Refuse every new request from now on with 503 (``the server is shutting down``); the
        requests admitted go on."""
        self._admitting = False

    def drain(self, reason: str = SHUTTING_DOWN) -> None:
        """Stop admitting and answer every request waiting or decoding with a 503 giving ``reason``,
        now, whatever its decode is doing (:meth:`Runner.drain <adaptspec.serving.runner.Runner.drain>`).
        A request already answered keeps its answer; one cut here keeps its decision pending (logged
        without a reward at :meth:`close`, unless its decode returns before)."""
        self.stop_admitting()
        self._drained = True
        self.runner.drain(reason)

    def close(self) -> None:
        """Stop admitting; let the runner finish the requests it holds (at most :data:`CLOSE_WAIT_S`
        seconds and only while its thread progresses; after a :meth:`drain`, which answered them, at
        most :data:`DRAINED_WAIT_S`), answering what is left with 503; then close every controller
        without waiting for a decode still running: queued updates applied, final checkpoints, logs
        rolled (a pending decision logged without a reward)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self.stop_admitting()
        self.runner.close(DRAINED_WAIT_S if self._drained else CLOSE_WAIT_S)
        for c in self.controllers.values():
            c.close(
                timeout=0.0
            )  # the runner has ended, or what it still decodes was answered: not waited for


def _hide_dirs(value: Any, controller: "AdaptiveController") -> Any:
    """``value`` (a report's string, or a dict of them) with the controller's checkpoint and log
    directories shown by their folder names: /health tells no client where files live."""
    if isinstance(value, dict):
        return {k: _hide_dirs(v, controller) for k, v in value.items()}
    if not isinstance(value, str):
        return value
    for d in (controller.checkpoint_dir, controller.log_dir):
        if d is not None:
            for shown in sorted({str(d), str(d.absolute()), str(d.resolve())}, key=len, reverse=True):
                value = value.replace(shown, d.name)
    return value


def _check_runner_settings(
    speculator: Any, batched: bool, engine: Any, stall_s: float, controller_options: Mapping[str, Any]
) -> None:
    """What only one runner takes: redecide_every the sequential one, engine settings the batched one;
    and the stall time, a number of seconds > 0."""
    if batched and controller_options.get("redecide_every") is not None:
        raise AdaptspecError(
            "redecide_every is not available with the batched engine (each request decides "
            "once, at join); it applies to a speculator of your own, served one request at a time"
        )
    if not batched and engine is not None:
        raise AdaptspecError(
            f"engine settings apply to adaptspec's own target and drafter; a "
            f"{type(speculator).__name__} is served one request at a time"
        )
    if isinstance(stall_s, bool) or not isinstance(stall_s, (int, float)) or not 0 < stall_s < float("inf"):
        raise AdaptspecError(f"stall_s must be a number of seconds > 0, got {stall_s!r}")


def _controllers(
    speculator: Any,
    router: ABRouter,
    log_dir: str | Path | None,
    checkpoint_dir: str | Path | None,
    controller_options: dict[str, Any],
) -> dict[str, Any]:
    """One controller per variant, each logging under its name and checkpointing to
    checkpoint_dir/NAME; a ``shared`` option (variant -> SharedState) gives each its fleet
    statistics. Those built are closed if one fails."""
    from ..control.controller import AdaptiveController

    controllers: dict[str, AdaptiveController] = {}
    shared = controller_options.pop("shared", None)  # variant -> SharedState (fleet learning)
    try:
        for name, spec in router.specs.items():
            if shared is not None:
                controller_options["shared"] = shared(name)
            controllers[name] = AdaptiveController(
                speculator,
                spec,
                variant=name,
                log_dir=log_dir,
                checkpoint_dir=None if checkpoint_dir is None else Path(checkpoint_dir) / name,
                **controller_options,
            )
    except BaseException:
        for c in controllers.values():
            c.close()
        raise
    return controllers
