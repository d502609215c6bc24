"""Prometheus metrics of the server, per A/B variant (``/metrics``).

Per request (observed by the HTTP layer): requests by outcome, prompt and generated tokens (the
completion tokens the client received, its ``usage.completion_tokens``),
mean tau, decode tokens/s, latency, time to first token, block size chosen. Read from each
controller at scrape time: fallbacks by reason, feedback by status (applied, duplicate,
late, expired, ..., log_error), policy updates, pending decisions, queued updates,
checkpoints, and the failures of background work: checkpoints that could not be written
(``adaptspec_checkpoint_errors``) and decision-log writes or rolls that failed
(``adaptspec_log_errors``). Anything but 0 there needs an operator; ``/health`` then says
``"degraded"`` and gives the newest error.

With the batched engine (``serve --batched``), read from the engine loop at scrape time: rows
in flight (``adaptspec_rows_in_flight``), requests waiting (``adaptspec_queue_length``), rounds
run, and the last round's committed tokens (``adaptspec_tokens_per_round``) and time
(``adaptspec_batch_seconds``, with its moving average).

Each server has its own registry, so several apps can live in one process (tests).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

__all__ = ["ServingMetrics"]

_TAU_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0)
_TPS_BUCKETS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000, 5000, 10000)
_SEC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServingMetrics:
    """The server's metrics; ``controllers`` maps variant -> AdaptiveController."""

    def __init__(self, controllers: Mapping[str, Any]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        r = self.registry = CollectorRegistry()
        v = ["variant"]
        self.requests = Counter(
            "adaptspec_requests",
            "Completion requests by variant and outcome (ok, error)",
            ["variant", "status"],
            registry=r,
        )
        self.rejected = Counter(
            "adaptspec_rejected_requests",
            "Requests rejected before decoding, by HTTP status",
            ["code"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "adaptspec_prompt_tokens", "Prompt tokens of completed requests", v, registry=r
        )
        self.tokens = Counter(
            "adaptspec_generated_tokens",
            "Completion tokens sent to clients (usage.completion_tokens; "
            "tokens decoded past a stop sequence are not counted)",
            v,
            registry=r,
        )
        self.tau = Histogram(
            "adaptspec_mean_tau",
            "Mean tokens committed per round, per request",
            v,
            buckets=_TAU_BUCKETS,
            registry=r,
        )
        self.tps = Histogram(
            "adaptspec_decode_tokens_per_second",
            "Decode throughput per request (prefill excluded)",
            v,
            buckets=_TPS_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "adaptspec_request_seconds",
            "Request latency, prefill and queueing included",
            v,
            buckets=_SEC_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "adaptspec_time_to_first_token_seconds",
            "Time to the first token",
            v,
            buckets=_SEC_BUCKETS,
            registry=r,
        )
        self.block = Counter(
            "adaptspec_block_size_chosen",
            "Block sizes chosen (the first decision of each request)",
            ["variant", "block_size"],
            registry=r,
        )
        r.register(_ControllerCollector(controllers))

    def observe(
        self,
        variant: str,
        generation: Any,
        prompt_tokens: int,
        latency_s: float,
        ttft_s: float | None,
        completion_tokens: int | None = None,
    ) -> None:
        """Record one completed request; ``completion_tokens`` is what its client got (its
        ``usage.completion_tokens``: a stop sequence ends it before the last tokens decoded),
        by default every token decoded."""
        out = generation.outcome
        self.requests.labels(variant, "ok").inc()
        self.prompt_tokens.labels(variant).inc(prompt_tokens)
        self.tokens.labels(variant).inc(out.new_tokens if completion_tokens is None else completion_tokens)
        if out.rounds:
            self.tau.labels(variant).observe(out.mean_tau)
        if out.decode_s > 0:
            self.tps.labels(variant).observe(out.new_tokens / out.decode_s)
        self.latency.labels(variant).observe(latency_s)
        if ttft_s is not None:
            self.ttft.labels(variant).observe(ttft_s)
        self.block.labels(variant, str(generation.decision.block_size)).inc()

    def attach_engine(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        """Export the engine loop's ``stats()`` (see the module docstring)."""
        self.registry.register(_EngineCollector(stats))

    def failed(self, variant: str) -> None:
        self.requests.labels(variant, "error").inc()

    def rejected_request(self, code: int) -> None:
        self.rejected.labels(str(code)).inc()

    def render(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _ControllerCollector:
    """Counters the controllers keep themselves, read at scrape time."""

    def __init__(self, controllers: Mapping[str, Any]) -> None:
        self.controllers = controllers

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        fb = CounterMetricFamily(
            "adaptspec_fallbacks",
            "Decisions that fell back to the fallback block size, by reason",
            labels=["variant", "reason"],
        )
        feed = CounterMetricFamily(
            "adaptspec_feedback",
            "Feedback by status (applied, no_reward, duplicate, late, "
            "unknown, expired, dropped, decode_error, log_error)",
            labels=["variant", "status"],
        )
        dec = CounterMetricFamily(
            "adaptspec_decisions", "Decisions made (re-decisions included)", labels=["variant"]
        )
        upd = CounterMetricFamily(
            "adaptspec_policy_updates",
            "Updates the policy has learnt from (restarts included)",
            labels=["variant"],
        )
        uerr = CounterMetricFamily(
            "adaptspec_policy_update_errors", "Updates the policy raised on", labels=["variant"]
        )
        ck = CounterMetricFamily(
            "adaptspec_checkpoints", "Checkpoints written by this process", labels=["variant"]
        )
        ckerr = CounterMetricFamily(
            "adaptspec_checkpoint_errors", "Checkpoints that failed to be written", labels=["variant"]
        )
        logerr = CounterMetricFamily(
            "adaptspec_log_errors", "Decision-log writes and rolls that failed", labels=["variant"]
        )
        pend = GaugeMetricFamily(
            "adaptspec_pending_decisions", "Decisions waiting for feedback", labels=["variant"]
        )
        queued = GaugeMetricFamily(
            "adaptspec_queued_updates",
            "Feedback logged but not yet applied to the policy",
            labels=["variant"],
        )
        speed = GaugeMetricFamily(
            "adaptspec_machine_speed",
            "Measured decode time over the speed reference "
            "profile's (above 1: slower than the machine the head was timed on)",
            labels=["variant"],
        )
        for name, c in self.controllers.items():
            s = c.stats()
            for reason, n in s["fallbacks"].items():
                fb.add_metric([name, reason], n)
            for status, n in s["feedback"].items():
                feed.add_metric([name, status], n)
            dec.add_metric([name], s["decisions"])
            upd.add_metric([name], s["updates"])
            uerr.add_metric([name], s["update_errors"])
            ck.add_metric([name], s["checkpoints"])
            ckerr.add_metric([name], s["checkpoint_errors"])
            logerr.add_metric([name], s["log_errors"])
            pend.add_metric([name], s["pending"])
            queued.add_metric([name], s["queued"])
            if s["machine_speed"] is not None:
                speed.add_metric([name], s["machine_speed"])
        yield from (fb, feed, dec, upd, uerr, ck, ckerr, logerr, pend, queued, speed)
        from ..fleet.metrics import shared_families

        yield from shared_families(self.controllers)


class _EngineCollector:
    """The batched engine's state, read at scrape time."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.stats()
        yield GaugeMetricFamily(
            "adaptspec_rows_in_flight", "Requests decoding in the batch now", value=s["rows_in_flight"]
        )
        yield GaugeMetricFamily(
            "adaptspec_queue_length", "Requests waiting for a row", value=s["queue_length"]
        )
        yield CounterMetricFamily("adaptspec_batch_rounds", "Batched rounds run", value=s["rounds"])
        yield GaugeMetricFamily(
            "adaptspec_tokens_per_round",
            "Tokens committed by all rows in the last round",
            value=s["tokens_per_round"],
        )
        yield GaugeMetricFamily(
            "adaptspec_batch_seconds", "Time of the last batched round", value=s["batch_time_s"]
        )
        yield GaugeMetricFamily(
            "adaptspec_batch_seconds_ewma",
            "Moving average of the batched round time",
            value=s["round_s_ewma"],
        )
        yield CounterMetricFamily(
            "adaptspec_batch_decode_seconds",
            "Decode time of all batched rounds (prefills excluded)",
            value=s["decode_s"],
        )
        yield CounterMetricFamily(
            "adaptspec_load_rule_seconds",
            "CPU seconds of the engine thread spent in the "
            "per-round load rule (choose and feedback): its overhead over "
            "adaptspec_batch_decode_seconds",
            value=s["rule_s"],
        )
        yield CounterMetricFamily(
            "adaptspec_load_rule_wall_seconds",
            "Wall seconds in the per-round load rule, "
            "including waits for the interpreter lock held by other threads",
            value=s["rule_wall_s"],
        )
        yield CounterMetricFamily(
            "adaptspec_engine_failures",
            "Failures of the engine's thread (each failed the "
            "requests in flight with a 503 and restarted it, or stopped it) and its stalls",
            value=s["engine_failures"],
        )
        yield GaugeMetricFamily(
            "adaptspec_engine_up",
            "1 while the engine's thread serves (ok or restarted), 0 "
            "while it is stalled and once it stopped for good",
            value=s["engine_up"],
        )
        by_width = CounterMetricFamily(
            "adaptspec_batch_rounds_by_width",
            "Batched rounds by rows in the round "
            "and the block every row was padded to (what a load rule chose, per load)",
            labels=["rows", "block_size"],
        )
        for (rows, width), n in sorted(s["rounds_by_width"].items()):
            by_width.add_metric([str(rows), str(width)], n)
        yield by_width
