"""The load sweep, end to end: the real batched server on loopback under closed-loop clients.

For each configuration one ``adaptspec serve --batched`` server (bundled SmolLM2 pair, chat
template, greedy) is started on 127.0.0.1; closed-loop clients (each sends its next request as
soon as its last one ends) send public benchmark prompts (GSM8K, MT-Bench, HumanEval, in turn;
by default the odd-numbered half) at 1, 2, 4, 8 and 16 clients, then a run whose client count
changes (``--day``: phases of clients, each phase a number of requests). Every request is
streamed, so the time to its first token is measured at the client. Reported per configuration
and level: aggregate tokens/s (all completion tokens over the level's wall time), per-request
latency p50/p95 and TTFT p50, and from the server's /metrics the load rule's share of decode time
and the rounds run by rows x widest block (what the rule chose at each load).

Configurations (``--configs``): ``plain`` (every request at B = 1: batched plain decoding),
``fixed:B`` (every request at B), ``table`` (requests at B = 8 capped each round by a static
rows -> B table; ``--table tune`` first runs plain and the fixed sizes on the *other* half of
the prompts and takes each level's best, as an engine user tunes such a table from a trial
run), ``goodput`` and ``learned`` (requests at B = 8 capped each round by that load rule),
``controller`` (the server's default: the controller decides each request's block size at
join from its prefill, and the learned load rule caps it each round), ``controller-no-load``
(the controller alone, blind to the load), ``lints-load-features`` (no round rule: a cold LinTS
per request with the load in its context, ``--load-features``), ``cold`` (the cold default a
speculator with no fitting head gets: fi-ucb per request, the learned rule each round).

Repeats (``--repeats R``): every level, and the day, is run R times on every configuration,
each repeat on the next prompts (all configurations get the same prompts in a repeat, so a
repeat pairs them). Phases run level-major (level 1 repeat 1, level 1 repeat 2, ..., level 2
..., the day's R runs last), the configuration order rotated by one from phase to phase, so
with R at least the number of configurations each one sits at every position of a level. Per
configuration and level the results keep each repeat's run (``repeats``) and pool them:
tokens/s is all the repeats' tokens over their summed wall time, p50/p95/TTFT over all their
requests.

The oracle (``--oracle``, on by default when the day is run and plain or a fixed size is
measured): after the constant levels, the static table that is best knowing the outcome on
these very prompts (at each level the best of plain and the fixed sizes measured, by mean
tok/s over the repeats) is served like ``table``, and the day is run on it too, in the same
rotation: an upper bound for any rule choosing a fixed size from the load alone.

The summary (``summary`` in the JSON, printed after the tables): per configuration and level,
the ratio to plain and to the best of plain and the fixed sizes at that level (by mean tok/s),
each per repeat (paired: same prompts, adjacent in time), their geometric mean and a 95%
t-interval over the repeats' log ratios (none with one repeat); for the day, each adaptive
configuration's share of the oracle's gain over the best single fixed size, on mean tok/s.

Pooling runs (``--pool A.json B.json [--out C.json]``): no sweep is run; the repeats of several
results files are summarized together, for the configurations and levels all of them ran (each
repeat still paired within its own run), when one run's repeats are too few for the intervals.

Bounded: ``--requests-per-client`` requests per client per level (at least 4 a level),
``--max-tokens`` per request. By default (``--order interleaved``) every configuration's server
is up at once and each level runs on every configuration in turn, in an order rotated from level
to level: on the shared host this was written on, the machine's speed drifted by 10-20% over
the 25 minutes of a configuration-by-configuration sweep (``--order config``: each
configuration's levels, each R times in a row, then its day), more than the differences
measured. Timed figures need a quiet machine:

    python benchmarks/bench_load_sweep.py --requests-per-client 4 --max-tokens 64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"

CONFIGS = {
    "plain": ["--variant", "A=fixed:1", "--load-rule", "none"],
    "fixed:2": ["--variant", "A=fixed:2", "--load-rule", "none"],
    "fixed:3": ["--variant", "A=fixed:3", "--load-rule", "none"],
    "fixed:4": ["--variant", "A=fixed:4", "--load-rule", "none"],
    "fixed:6": ["--variant", "A=fixed:6", "--load-rule", "none"],
    "learned": ["--variant", "A=fixed:8", "--load-rule", "learned"],
    "goodput": ["--variant", "A=fixed:8", "--load-rule", "goodput"],
    "controller": [],  # the served default: the controller decides each request at join, the learned rule each round
    "controller-no-load": ["--load-rule", "none"],  # the controller alone, blind to the load
    # the cold default, what a speculator with no fitting head gets: fi-ucb (every block size a
    # request's rounds show) per request, the learned rule (full information) each round
    "cold": ["--variant", "A=fi-ucb"],
    # the load in the per-request policy's context instead of a round rule: LinTS over the prefill
    # features and the five load features, cold (the bundled head is sized for the features alone)
    "lints-load-features": ["--variant", "A=lints", "--load-features", "--load-rule", "none"],
}

#: The configuration the oracle's runs are stored under.
ORACLE = "oracle"


def table_extra(spec: str) -> list[str]:
    """The server flags of a static-table configuration: requests at B = 8, capped by ``spec``."""
    return ["--variant", "A=fixed:8", "--load-rule", spec]


def is_static(name: str) -> bool:
    """Plain or a fixed size: the baselines the best-static comparison and the oracle choose from."""
    return name == "plain" or name.startswith("fixed:")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, out: Path, timeout: float, name: str = "server") -> None:
    """Until ``url``/health answers 200: a server that exits first, or is not up in ``timeout``
    seconds, is one RuntimeError (with the end of its output ``out``)."""
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name}: server exited: {out.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{name}: server did not start in {timeout:.0f} s")


class Server:
    """One ``adaptspec serve --batched`` process on loopback."""

    def __init__(self, extra: list[str], root: Path, max_rows: int, threads: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = root / f"server-{self.port}.out"
        args = [
            sys.executable,
            "-m",
            "adaptspec",
            "serve",
            "--max-rows",
            str(max_rows),
            "--max-queue",
            "64",
            "--chat",
            "--threads",
            str(threads),
            "--port",
            str(self.port),
            "--log-dir",
            str(root / f"log-{self.port}"),
            "--log-level",
            "warning",
            "--max-tokens",
            "1024",
            "--arms",
            "1,2,3,4,6,8",
            *extra,
        ]
        self.proc = subprocess.Popen(args, stdout=self.out.open("wb"), stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 300) -> None:
        wait_healthy(self.proc, self.url, self.out, timeout)

    def warm_up(self, prompt: str) -> None:
        """Ready, then one short request (first-call costs), not measured."""
        self.wait_ready()
        one_request(self.url, prompt, 8)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def one_request(url: str, prompt: str, max_tokens: int) -> dict:
    """A streamed completion: its tokens, latency and time to first token, at the client."""
    import httpx

    t0 = time.perf_counter()
    first, tokens = None, 0
    with (
        httpx.Client(timeout=600) as c,
        c.stream(
            "POST",
            url + "/v1/completions",
            json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True},
        ) as r,
    ):
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if first is None and chunk["choices"][0]["token_ids"]:
                first = time.perf_counter() - t0
            if "usage" in chunk:
                tokens = chunk["usage"]["completion_tokens"]
    return {"tokens": tokens, "latency_s": time.perf_counter() - t0, "ttft_s": first}


def drive(
    url: str, prompts: list[str], phases: list[tuple[int, int]], max_tokens: int | Sequence[int], start: int
) -> tuple[list[dict], float]:
    """``phases``: ``(clients, requests)``, run one after another, the prompts taken in turn from
    index ``start``; ``max_tokens``: every request's, or one per prompt (the same prompt the same
    length in every configuration); returns every request's :func:`one_request` result and the wall time."""
    results: list[dict] = []
    nxt = [start]
    lock = threading.Lock()
    t0 = time.perf_counter()
    for clients, requests in phases:
        left = [requests]

        def client() -> None:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                    i = nxt[0]
                    nxt[0] += 1
                length = max_tokens if isinstance(max_tokens, int) else max_tokens[i % len(prompts)]
                res = one_request(url, prompts[i % len(prompts)], length)
                with lock:
                    results.append(res)

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    return results, time.perf_counter() - t0


def latency_figures(requests: list[dict]) -> dict:
    """Per-request latency p50/p95 and TTFT p50 over ``requests`` (:func:`one_request` results)."""
    lat = np.array([r["latency_s"] for r in requests])
    ttft = np.array([r["ttft_s"] for r in requests if r["ttft_s"] is not None])
    return {
        "p50_s": float(np.percentile(lat, 50)),
        "p95_s": float(np.percentile(lat, 95)),
        "ttft_p50_s": float(np.percentile(ttft, 50)) if len(ttft) else None,
    }


def run_figures(requests: list[dict], wall: float) -> dict:
    """One run's figures: requests, tokens, wall time, tokens/s and :func:`latency_figures`."""
    tokens = sum(r["tokens"] for r in requests)
    return {
        "requests": len(requests),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        **latency_figures(requests),
    }


def closed_loop(
    url: str, prompts: list[str], phases: list[tuple[int, int]], max_tokens: int, start: int
) -> dict:
    """``phases``: ``(clients, requests)``, run one after another; returns the run's figures."""
    return run_figures(*drive(url, prompts, phases, max_tokens, start))


def scrape(url: str) -> dict:
    """The engine's counters from the server's /metrics: the load rule's CPU and wall seconds, the
    rounds' decode seconds and count, and rounds by (rows, widest block)."""
    import httpx

    values: dict = {"widths": {}}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        for name in (
            "adaptspec_load_rule_seconds_total",
            "adaptspec_load_rule_wall_seconds_total",
            "adaptspec_batch_decode_seconds_total",
            "adaptspec_batch_rounds_total",
        ):
            if line.startswith(name + " "):
                values[name] = float(line.split()[1])
        if line.startswith("adaptspec_batch_rounds_by_width_total{"):
            labels, count = line[line.index("{") + 1 :].split("} ")
            kv = dict(part.split("=") for part in labels.split(","))
            values["widths"][f"{kv['rows'].strip(chr(34))}x{kv['block_size'].strip(chr(34))}"] = float(count)
    return values


def _engine(rule: float, wall: float, decode: float, rounds: float, widths: dict[str, int]) -> dict:
    return {
        "rule_s": rule,
        "rule_wall_s": wall,
        "decode_s": decode,
        "rounds": rounds,
        "rule_share": rule / decode if decode > 0 else None,
        "rule_wall_share": wall / decode if decode > 0 else None,
        "rounds_by_rows_x_width": dict(
            sorted(widths.items(), key=lambda kv: tuple(map(int, kv[0].split("x"))))
        ),
    }


def overhead(before: dict, after: dict) -> dict:
    """The load rule's time over the rounds' decode time between two scrapes, and the rounds run
    then by rows x widest block."""

    def d(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    widths = {
        k: int(v - before["widths"].get(k, 0.0))
        for k, v in after["widths"].items()
        if v > before["widths"].get(k, 0.0)
    }
    return _engine(
        d("adaptspec_load_rule_seconds_total"),
        d("adaptspec_load_rule_wall_seconds_total"),
        d("adaptspec_batch_decode_seconds_total"),
        d("adaptspec_batch_rounds_total"),
        widths,
    )


def sum_engine(parts: list[dict]) -> dict:
    """:func:`overhead` figures of consecutive intervals (a level's repeats) added up."""
    widths: dict[str, int] = {}
    for p in parts:
        for k, v in p["rounds_by_rows_x_width"].items():
            widths[k] = widths.get(k, 0) + v
    return _engine(
        *(sum(p[k] for p in parts) for k in ("rule_s", "rule_wall_s", "decode_s", "rounds")), widths
    )


# -- the sweep's plan and its figures: pure, tested without servers --------------------------------


def schedule(
    names: list[str],
    levels: list[int],
    day: list[tuple[int, int]],
    repeats: int,
    requests_per_client: int,
    day_extra: list[str] | tuple = (),
) -> list[dict]:
    """The sweep's phases in order: every level ``repeats`` times (level-major), then the day
    ``repeats`` times. Each phase: ``label`` (the level, or ``"day"``), ``repeat`` (from 0),
    ``phase`` (``(clients, requests)`` for :func:`drive`), ``start`` (its first prompt: each phase
    sends the next prompts, every configuration the same ones) and ``order`` (``names``, with
    ``day_extra`` joining them in the day's phases, rotated by one from phase to phase)."""
    plan = [(str(c), r, [(c, max(4, c * requests_per_client))]) for c in levels for r in range(repeats)]
    plan += [("day", r, [tuple(p) for p in day]) for r in range(repeats)] if day else []
    out, start = [], 0
    for k, (label, r, phase) in enumerate(plan):
        ns = list(names) + (list(day_extra) if label == "day" else [])
        s = k % len(ns)
        out.append({"label": label, "repeat": r, "phase": phase, "start": start, "order": ns[s:] + ns[:s]})
        start += sum(n for _, n in phase)
    return out


def totals(runs: list[dict]) -> dict:
    """Runs' requests, tokens and wall time summed, tokens/s as their ratio; ``repeats``: the runs."""
    tokens, wall = sum(r["tokens"] for r in runs), sum(r["wall_s"] for r in runs)
    return {
        "requests": sum(r["requests"] for r in runs),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "repeats": runs,
    }


def pool(runs: list[dict], requests: list[list[dict]]) -> dict:
    """A level's repeats pooled: :func:`totals`, p50/p95/TTFT over every request of every repeat
    (``requests``: each repeat's :func:`one_request` results), the engine's figures summed."""
    out = totals(runs) | latency_figures([q for rs in requests for q in rs])
    if all("engine" in r for r in runs):
        out["engine"] = sum_engine([r["engine"] for r in runs])
    return out


def repeat_tps(entry: dict) -> list[float]:
    """Each repeat's tokens/s of a level's entry (one, for an entry without ``repeats``)."""
    return [r["tokens_per_s"] for r in entry.get("repeats", [entry])]


def mean_tps(entry: dict) -> float:
    """The mean over the repeats of tokens/s: what the best static choice is made by."""
    return float(np.mean(repeat_tps(entry)))


def tuned_table(tuning: dict[str, dict], levels: list[int]) -> str:
    """``table:R=B,...``: at each level the fixed size (plain = 1) with the most tok/s in
    ``tuning`` (mean over the repeats)."""
    parts = []
    for c in levels:
        best = max(tuning, key=lambda n: mean_tps(tuning[n]["runs"][str(c)]))
        parts.append(f"{c}={1 if best == 'plain' else int(best.split(':')[1])}")
    return "table:" + ",".join(parts)


def paired_ratio(xs: list[float], ys: list[float], level: float = 0.95) -> dict:
    """``xs[r] / ys[r]`` per repeat (paired: same prompts, adjacent in time), their geometric mean
    and a ``level`` t-interval on the mean of the log ratios, exponentiated (None with one repeat)."""
    from scipy.stats import t

    if len(xs) != len(ys) or not xs:
        raise ValueError(f"paired_ratio: {len(xs)} against {len(ys)} repeats")
    ratios = [x / y for x, y in zip(xs, ys)]
    logs = np.log(ratios)
    mean = float(logs.mean())
    ci = None
    if len(logs) > 1:
        half = float(t.ppf((1 + level) / 2, len(logs) - 1)) * float(logs.std(ddof=1)) / math.sqrt(len(logs))
        ci = [math.exp(mean - half), math.exp(mean + half)]
    return {"per_repeat": ratios, "geomean": math.exp(mean), "ci95": ci}


def oracle_share(x: float, best: float, oracle: float) -> float | None:
    """The share of the oracle's gain over the best static choice that ``x`` captures:
    ``(x - best) / (oracle - best)``; None when the oracle gains nothing."""
    return (x - best) / (oracle - best) if oracle - best > 0 else None


def best_static(runs: dict[str, dict], label: str) -> str | None:
    """The best of plain and the fixed sizes at ``label`` by mean tok/s (None if none ran it)."""
    static = [n for n in runs if is_static(n) and label in runs[n]]
    return max(static, key=lambda n: mean_tps(runs[n][label])) if static else None


def labels_of(runs: dict[str, dict]) -> list[str]:
    """Every level any configuration ran, in order of first appearance."""
    return list(dict.fromkeys(label for r in runs.values() for label in r))


def summarize(runs: dict[str, dict]) -> dict:
    """Per level: ``best`` (:func:`best_static`) and per configuration the mean tok/s over the
    repeats, :func:`paired_ratio` to plain (``vs_plain``) and to the best (``vs_best``), and for
    the day, for every adaptive configuration when the oracle ran, its :func:`oracle_share`."""
    summary = {}
    for label in labels_of(runs):
        best = best_static(runs, label)
        configs = {}
        for n in (n for n in runs if label in runs[n]):
            mine = repeat_tps(runs[n][label])
            e = {
                "tokens_per_s_mean": mean_tps(runs[n][label]),
                "vs_plain": paired_ratio(mine, repeat_tps(runs["plain"][label]))
                if label in runs.get("plain", {})
                else None,
                "vs_best": paired_ratio(mine, repeat_tps(runs[best][label])) if best else None,
            }
            if label == "day" and best and label in runs.get(ORACLE, {}) and not is_static(n) and n != ORACLE:
                e["oracle_share"] = oracle_share(
                    e["tokens_per_s_mean"], mean_tps(runs[best][label]), mean_tps(runs[ORACLE][label])
                )
            configs[n] = e
        summary[label] = {"best": best, "configs": configs}
    return summary


def pool_files(results: list[dict]) -> dict[str, dict]:
    """Several results files' runs as one (``--pool``): for every configuration and level that
    every file ran, the repeats of each file in turn, their :func:`totals` (no percentiles: the
    requests are not kept). Repeats stay paired: the i-th repeat of every configuration at a
    level comes from the same file and repeat, because a configuration or level missing from any
    file is left out of all of them."""
    names = [n for n in results[0]["runs"] if all(n in r["runs"] for r in results)]
    out: dict[str, dict] = {}
    for n in names:
        out[n] = {}
        for label in (lb for lb in results[0]["runs"][n] if all(lb in r["runs"][n] for r in results)):
            entries = [r["runs"][n][label] for r in results]
            out[n][label] = totals([rep for e in entries for rep in e.get("repeats", [e])])
    return out


def _stat(s: dict | None) -> str:
    if s is None:
        return "—"
    ci = s["ci95"]
    return f"{s['geomean']:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def _col(label: str) -> str:
    return "changing" if label == "day" else f"{label} clients"


def summary_table(summary: dict) -> str:
    """Markdown: the ratio to plain, then to the best static choice, per configuration and level
    (geometric mean over the repeats [95% interval]); then the day's shares of the oracle's gain."""
    labels = list(summary)
    names = list(dict.fromkeys(n for s in summary.values() for n in s["configs"]))
    head = ["| config | " + " | ".join(_col(c) for c in labels) + " |", "|---|" + "---:|" * len(labels)]

    def rows(key: str) -> list[str]:
        return [
            f"| {n} | "
            + " | ".join(
                _stat(summary[c]["configs"][n][key]) if n in summary[c]["configs"] else "—" for c in labels
            )
            + " |"
            for n in names
        ]

    lines = [
        "Ratio to plain (paired by repeat: geometric mean [95% t-interval]):",
        "",
        *head,
        *rows("vs_plain"),
        "",
        "Ratio to the best of plain and the fixed sizes at each level (by mean tok/s):",
        "",
        *head,
        "| (best) | " + " | ".join(summary[c]["best"] or "—" for c in labels) + " |",
        *rows("vs_best"),
    ]
    day = summary.get("day", {}).get("configs", {})
    shares = {n: e["oracle_share"] for n, e in day.items() if "oracle_share" in e}
    if shares:
        lines += [
            "",
            f"The day: share of the oracle's gain over the best single fixed size ({summary['day']['best']}):",
            "",
            "| config | mean tok/s | share |",
            "|---|---:|---:|",
        ]
        lines += [
            f"| {n} | {day[n]['tokens_per_s_mean']:.1f} | " + ("—" if s is None else f"{s:.2f}") + " |"
            for n, s in shares.items()
        ]
        lines.append(f"| {ORACLE} | {day[ORACLE]['tokens_per_s_mean']:.1f} | 1.00 |")
    return "\n".join(lines)


def table(results: dict) -> str:
    """Markdown: tok/s (and ratio to plain) per configuration and level; p50/p95/TTFT underneath.
    Pooled over the repeats; a level a configuration did not run (the oracle's constant levels) is —."""
    runs = results["runs"]
    names = list(runs)
    cols = labels_of(runs)
    lines = ["| config | " + " | ".join(_col(c) for c in cols) + " |", "|---|" + "---:|" * len(cols)]
    for n in names:
        cells = []
        for c in cols:
            if c not in runs[n]:
                cells.append("—")
                continue
            r = runs[n][c]
            plain = runs.get("plain", {}).get(c)
            ratio = f" ({r['tokens_per_s'] / plain['tokens_per_s']:.2f}x)" if plain else ""
            cells.append(f"{r['tokens_per_s']:.1f}{ratio}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "| config | level | p50 s | p95 s | TTFT p50 s |", "|---|---|---:|---:|---:|"]
    for n in names:
        for c in (c for c in cols if c in runs[n]):
            r = runs[n][c]
            lines.append(
                f"| {n} | {c} | {r['p50_s']:.2f} | {r['p95_s']:.2f} | {r['ttft_p50_s'] or float('nan'):.3f} |"
            )
    return "\n".join(lines)


# -- running it ------------------------------------------------------------------------------------


class Measured:
    """One configuration's server and what it measured so far: per level each repeat's run and requests."""

    def __init__(self, name: str, server: Server, tag: str = "") -> None:
        self.name, self.server, self.tag = name, server, tag
        self.reps: dict[str, list[tuple[dict, list[dict]]]] = {}
        self.first = self.last = scrape(server.url)

    def measure(self, step: dict, prompts: list[str], max_tokens: int | Sequence[int]) -> None:
        """Run ``step`` (a :func:`schedule` phase) on this server; the engine's figures from /metrics."""
        requests, wall = drive(self.server.url, prompts, step["phase"], max_tokens, step["start"])
        run = run_figures(requests, wall)
        now = scrape(self.server.url)
        run["engine"], self.last = overhead(self.last, now), now
        self.reps.setdefault(step["label"], []).append((run, requests))
        print(
            f"{self.tag}{self.name:18s} {step['label']} #{step['repeat'] + 1}: {run['tokens_per_s']:.1f} tok/s",
            flush=True,
        )

    def runs(self) -> dict[str, dict]:
        """Per level, the repeats :func:`pool`-ed."""
        return {label: pool([r for r, _ in reps], [q for _, q in reps]) for label, reps in self.reps.items()}

    def done(self) -> dict:
        return {"runs": self.runs(), "overhead": overhead(self.first, self.last)}


def run_config(
    name: str, extra: list[str], prompts: list[str], steps: list[dict], args, tmp: Path, tag: str = ""
) -> dict:
    """One server with ``extra`` flags running ``steps`` (:func:`schedule` phases) in turn; returns
    the runs per level (pooled over repeats) and the rule's overhead."""
    server = Server(extra, tmp, args.max_rows, args.threads)
    try:
        server.warm_up(prompts[-1])
        m = Measured(name, server, tag)
        for step in steps:
            m.measure(step, prompts, args.max_tokens)
        return m.done()
    finally:
        server.stop()


def run_interleaved(
    configs: dict[str, list[str]],
    prompts: list[str],
    levels: list[int],
    day: list,
    args,
    tmp: Path,
    tag: str = "",
    repeats: int = 1,
    oracle: bool = False,
) -> dict[str, dict]:
    """Every configuration's server up at once (idle ones take no CPU), then phase by phase
    (:func:`schedule`) each configuration in turn, the order rotated from phase to phase: a
    machine whose speed drifts over minutes (a shared host's does, by 10-20% here) then moves
    every configuration of a level alike instead of favouring those measured in its fast minutes.
    With ``oracle``, before the day one more server is started on the best static table of the
    levels just measured (:func:`tuned_table` over plain and the fixed sizes) and joins the day's
    rotation as :data:`ORACLE`. Returns, per configuration, what :func:`run_config` returns
    (the oracle's with its ``table``)."""
    names = list(configs)
    servers = {n: Server(extra, tmp, args.max_rows, args.threads) for n, extra in configs.items()}
    try:
        for server in servers.values():
            server.warm_up(prompts[-1])
        measured = {n: Measured(n, s, tag) for n, s in servers.items()}
        spec = None
        for step in schedule(
            names, levels, day, repeats, args.requests_per_client, [ORACLE] if oracle else []
        ):
            if ORACLE in step["order"] and ORACLE not in measured:
                spec = tuned_table(
                    {n: {"runs": m.runs()} for n, m in measured.items() if is_static(n)}, levels
                )
                print(f"{tag}oracle table (best static at each level of these prompts): {spec}", flush=True)
                servers[ORACLE] = Server(table_extra(spec), tmp, args.max_rows, args.threads)
                servers[ORACLE].warm_up(prompts[-1])
                measured[ORACLE] = Measured(ORACLE, servers[ORACLE], tag)
            for n in step["order"]:
                measured[n].measure(step, prompts, args.max_tokens)
        out = {n: m.done() for n, m in measured.items()}
        if spec:
            out[ORACLE]["table"] = spec
        return out
    finally:
        for server in servers.values():
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="plain,fixed:2,fixed:3,fixed:4,table,goodput,learned,controller")
    ap.add_argument(
        "--levels", default="1,2,4,8,16", help="client counts, one closed-loop run each (per repeat)"
    )
    ap.add_argument(
        "--day",
        default="1:4,8:16,2:6",
        metavar="C:N,...",
        help="the run whose load changes: phases of C clients sending N requests ('' skips it)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="R",
        help="run every level and the day R times on every configuration, each repeat on the next "
        "prompts (level-major, the configuration order rotated every phase); pooled per level, "
        "and the summary's intervals are over the repeats (none with R = 1)",
    )
    ap.add_argument(
        "--oracle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the levels, serve the best static table of these very prompts (best of plain and "
        "the fixed sizes measured at each level) and run the day on it too, in the rotation: the "
        "bound the day's rules are scored against (needs the day and plain or a fixed size)",
    )
    ap.add_argument(
        "--split",
        choices=("odd", "even", "all"),
        default="odd",
        help="the benchmark prompts measured (the static table is tuned on the other half)",
    )
    ap.add_argument(
        "--table",
        default="tune",
        metavar="SPEC",
        help="the static table: 'tune' runs plain and every fixed size of --configs on the other half "
        "first and takes each level's best; or give one, like table:1=3,2=4,4=1",
    )
    ap.add_argument(
        "--tune-repeats",
        type=int,
        default=1,
        metavar="R",
        help="repeats of the tuning run of --table tune (its table by mean tok/s over them)",
    )
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-rows", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    ap.add_argument(
        "--order",
        choices=("interleaved", "config"),
        default="interleaved",
        help="interleaved: all servers up, each level run on every configuration in turn, the order "
        "rotated every phase (robust to a machine whose speed drifts); config: one configuration "
        "after another, each level's repeats in a row (the oracle last)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the results file (default benchmarks/results/load-sweep.json; with --pool, none)",
    )
    ap.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="run nothing: summarize these results files' repeats together (the configurations and "
        "levels all of them ran; runs under different settings are the reader's responsibility)",
    )
    args = ap.parse_args()
    if args.pool:
        files = [json.loads(f.read_text()) for f in args.pool]
        runs = pool_files(files)
        pooled = {
            "pooled_from": [str(f) for f in args.pool],
            "settings": [f["settings"] for f in files],
            "runs": runs,
            "summary": summarize(runs),
        }
        if args.out:
            args.out.write_text(json.dumps(pooled, indent=1))
        print(summary_table(pooled["summary"]))
        return
    args.out = args.out or RESULTS / "load-sweep.json"
    if args.repeats < 1 or args.tune_repeats < 1:
        ap.error("--repeats and --tune-repeats must be >= 1")
    from adaptspec.models.prompts import benchmark_prompts

    every = [p.prompt for p in benchmark_prompts()]
    halves = {"even": every[0::2], "odd": every[1::2], "all": every}
    prompts = halves[args.split]
    other = halves[{"odd": "even", "even": "odd", "all": "all"}[args.split]]
    levels = [int(x) for x in args.levels.split(",") if x]
    day = [tuple(int(v) for v in ph.split(":")) for ph in args.day.split(",") if ph]
    names = args.configs.split(",")
    statics = [n for n in names if is_static(n)]
    oracle = args.oracle and bool(day) and bool(statics) and bool(levels)
    results: dict = {
        "settings": vars(args) | {"out": str(args.out), "oracle": oracle},
        "runs": {},
        "overhead": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        table_spec = args.table
        if "table" in names and table_spec == "tune":
            if args.order == "interleaved":
                tuning = run_interleaved(
                    {n: CONFIGS[n] for n in statics},
                    other,
                    levels,
                    [],
                    args,
                    Path(tmp),
                    "tune ",
                    repeats=args.tune_repeats,
                )
            else:
                steps = schedule(statics, levels, [], args.tune_repeats, args.requests_per_client)
                tuning = {
                    n: run_config(n, CONFIGS[n], other, steps, args, Path(tmp), "tune ") for n in statics
                }
            table_spec = tuned_table(tuning, levels)
            results["tuning"] = {n: t["runs"] for n, t in tuning.items()} | {"table": table_spec}
            print(f"tuned on the other half: {table_spec}", flush=True)
        extras = {n: table_extra(table_spec) if n == "table" else CONFIGS[n] for n in names}
        if args.order == "interleaved":
            done = run_interleaved(
                extras, prompts, levels, day, args, Path(tmp), repeats=args.repeats, oracle=oracle
            )
        else:
            steps, done = schedule(names, levels, day, args.repeats, args.requests_per_client), {}
            for name in names:
                done[name] = run_config(name, extras[name], prompts, steps, args, Path(tmp))
                results["runs"][name], results["overhead"][name] = done[name]["runs"], done[name]["overhead"]
                args.out.write_text(
                    json.dumps(results, indent=1)
                )  # after each configuration: a failure keeps the rest
            if oracle:
                spec = tuned_table({n: done[n] for n in statics}, levels)
                print(f"oracle table (best static at each level of these prompts): {spec}", flush=True)
                done[ORACLE] = run_config(
                    ORACLE,
                    table_extra(spec),
                    prompts,
                    [s for s in steps if s["label"] == "day"],
                    args,
                    Path(tmp),
                ) | {"table": spec}
        for name, d in done.items():
            results["runs"][name], results["overhead"][name] = d["runs"], d["overhead"]
        if ORACLE in done:
            results["oracle_table"] = done[ORACLE]["table"]
    results["summary"] = summarize(results["runs"])
    args.out.write_text(json.dumps(results, indent=1))
    print(table(results))
    print()
    print(summary_table(results["summary"]))


if __name__ == "__main__":
    main()
