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
(the controller alone, blind to the load).

Bounded: ``--requests-per-client`` requests per client per level (at least 4 a level),
``--max-tokens`` per request. By default (``--order interleaved``) every configuration's server
is up at once and each level runs on every configuration in turn, in an order rotated from level
to level: on the shared host this was written on, the machine's speed drifted by 10-20% over
the 25 minutes of a configuration-by-configuration sweep (``--order config``), more than the
differences measured. Timed figures need a quiet machine:

    python benchmarks/bench_load_sweep.py --requests-per-client 4 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

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
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``adaptspec serve --batched`` process on loopback."""

    def __init__(self, extra: list[str], root: Path, max_rows: int, threads: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = root / f"server-{self.port}.out"
        args = [sys.executable, "-m", "adaptspec", "serve", "--batched", "--max-rows", str(max_rows), "--max-queue", "64",
                "--chat", "--threads", str(threads), "--port", str(self.port), "--log-dir", str(root / f"log-{self.port}"),
                "--log-level", "warning", "--max-tokens", "1024", "--arms", "1,2,3,4,6,8", *extra]
        self.proc = subprocess.Popen(args, stdout=self.out.open("wb"), stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 300) -> None:
        import httpx

        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.out.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("server did not start in time")

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
    with httpx.Client(timeout=600) as c, c.stream("POST", url + "/v1/completions", json={
            "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}) as r:
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


def closed_loop(url: str, prompts: list[str], phases: list[tuple[int, int]], max_tokens: int, start: int) -> dict:
    """``phases``: ``(clients, requests)``, run one after another; returns the run's figures."""
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
                res = one_request(url, prompts[i % len(prompts)], max_tokens)
                with lock:
                    results.append(res)

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    wall = time.perf_counter() - t0
    lat = np.array([r["latency_s"] for r in results])
    ttft = np.array([r["ttft_s"] for r in results if r["ttft_s"] is not None])
    tokens = sum(r["tokens"] for r in results)
    return {"requests": len(results), "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "p50_s": float(np.percentile(lat, 50)), "p95_s": float(np.percentile(lat, 95)),
            "ttft_p50_s": float(np.percentile(ttft, 50)) if len(ttft) else None}


def scrape(url: str) -> dict:
    """The engine's counters from the server's /metrics: the load rule's CPU and wall seconds, the
    rounds' decode seconds and count, and rounds by (rows, widest block)."""
    import httpx

    values: dict = {"widths": {}}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        for name in ("adaptspec_load_rule_seconds_total", "adaptspec_load_rule_wall_seconds_total",
                     "adaptspec_batch_decode_seconds_total", "adaptspec_batch_rounds_total"):
            if line.startswith(name + " "):
                values[name] = float(line.split()[1])
        if line.startswith("adaptspec_batch_rounds_by_width_total{"):
            labels, count = line[line.index("{") + 1:].split("} ")
            kv = dict(part.split("=") for part in labels.split(","))
            values["widths"][f'{kv["rows"].strip(chr(34))}x{kv["block_size"].strip(chr(34))}'] = float(count)
    return values


def overhead(before: dict, after: dict) -> dict:
    """The load rule's time over the rounds' decode time between two scrapes, and the rounds run
    then by rows x widest block."""
    def d(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    decode, rule, wall = (d("adaptspec_batch_decode_seconds_total"), d("adaptspec_load_rule_seconds_total"),
                          d("adaptspec_load_rule_wall_seconds_total"))
    widths = {k: int(v - before["widths"].get(k, 0.0)) for k, v in after["widths"].items()
              if v > before["widths"].get(k, 0.0)}
    return {"rule_s": rule, "rule_wall_s": wall, "decode_s": decode, "rounds": d("adaptspec_batch_rounds_total"),
            "rule_share": rule / decode if decode > 0 else None, "rule_wall_share": wall / decode if decode > 0 else None,
            "rounds_by_rows_x_width": dict(sorted(widths.items(), key=lambda kv: tuple(map(int, kv[0].split("x")))))}


def run_config(name: str, extra: list[str], prompts: list[str], levels: list[int], day: list, args, tmp: Path) -> dict:
    """One server with ``extra`` flags: every level, then the day; returns the runs and the rule's overhead."""
    server = Server(extra, tmp, args.max_rows, args.threads)
    try:
        server.wait_ready()
        one_request(server.url, prompts[-1], 8)  # one short warm-up request (first-call costs), not measured
        runs = {}
        start = 0  # every configuration sends the same prompts in the same order
        first = last = scrape(server.url)
        for c in levels:
            n = max(4, c * args.requests_per_client)
            runs[str(c)] = closed_loop(server.url, prompts, [(c, n)], args.max_tokens, start)
            now = scrape(server.url)
            runs[str(c)]["engine"], last = overhead(last, now), now
            start += n
            print(f"{name:18s} clients={c}: {runs[str(c)]['tokens_per_s']:.1f} tok/s", flush=True)
        if day:
            runs["day"] = closed_loop(server.url, prompts, day, args.max_tokens, start)
            now = scrape(server.url)
            runs["day"]["engine"], last = overhead(last, now), now
            print(f"{name:18s} day: {runs['day']['tokens_per_s']:.1f} tok/s", flush=True)
        return {"runs": runs, "overhead": overhead(first, last)}
    finally:
        server.stop()


def run_interleaved(configs: dict[str, list[str]], prompts: list[str], levels: list[int], day: list, args,
                    tmp: Path, tag: str = "") -> dict[str, dict]:
    """Every configuration's server up at once (idle ones take no CPU), then level by level each
    configuration in turn, the order rotated from level to level: a machine whose speed drifts
    over minutes (a shared host's does, by 10-20% here) then moves every configuration of a level
    alike instead of favouring those measured in its fast minutes. Returns, per configuration,
    what :func:`run_config` returns."""
    names = list(configs)
    servers = {n: Server(extra, tmp, args.max_rows, args.threads) for n, extra in configs.items()}
    try:
        for n, server in servers.items():
            server.wait_ready()
            one_request(server.url, prompts[-1], 8)  # one short warm-up request (first-call costs), not measured
        runs: dict[str, dict] = {n: {} for n in names}
        first = {n: scrape(s.url) for n, s in servers.items()}
        last = dict(first)
        phases = [(str(c), [(c, max(4, c * args.requests_per_client))]) for c in levels]
        if day:
            phases.append(("day", day))
        start = 0  # every configuration sends the same prompts in the same order
        for i, (label, phase) in enumerate(phases):
            for n in names[i % len(names):] + names[:i % len(names)]:
                url = servers[n].url
                runs[n][label] = closed_loop(url, prompts, phase, args.max_tokens, start)
                now = scrape(url)
                runs[n][label]["engine"], last[n] = overhead(last[n], now), now
                print(f"{tag}{n:18s} {label}: {runs[n][label]['tokens_per_s']:.1f} tok/s", flush=True)
            start += sum(k for _, k in phase)
        return {n: {"runs": runs[n], "overhead": overhead(first[n], last[n])} for n in names}
    finally:
        for server in servers.values():
            server.stop()


def tuned_table(tuning: dict[str, dict], levels: list[int]) -> str:
    """``table:R=B,...``: at each level the fixed size (plain = 1) with the most tok/s in ``tuning``."""
    parts = []
    for c in levels:
        best = max(tuning, key=lambda n: tuning[n]["runs"][str(c)]["tokens_per_s"])
        parts.append(f"{c}={1 if best == 'plain' else int(best.split(':')[1])}")
    return "table:" + ",".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="plain,fixed:2,fixed:3,fixed:4,table,goodput,learned,controller")
    ap.add_argument("--levels", default="1,2,4,8,16", help="client counts, one closed-loop run each")
    ap.add_argument("--day", default="1:4,8:16,2:6", metavar="C:N,...",
                    help="the run whose load changes: phases of C clients sending N requests ('' skips it)")
    ap.add_argument("--split", choices=("odd", "even", "all"), default="odd",
                    help="the benchmark prompts measured (the static table is tuned on the other half)")
    ap.add_argument("--table", default="tune", metavar="SPEC",
                    help="the static table: 'tune' runs plain and every fixed size of --configs on the other half "
                         "first and takes each level's best; or give one, like table:1=3,2=4,4=1")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-rows", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    ap.add_argument("--order", choices=("interleaved", "config"), default="interleaved",
                    help="interleaved: all servers up, each level run on every configuration in turn (robust to a "
                         "machine whose speed drifts); config: one configuration after another")
    ap.add_argument("--out", type=Path, default=RESULTS / "load-sweep.json")
    args = ap.parse_args()
    from adaptspec.models.prompts import benchmark_prompts

    every = [p.prompt for p in benchmark_prompts()]
    halves = {"even": every[0::2], "odd": every[1::2], "all": every}
    prompts = halves[args.split]
    other = halves[{"odd": "even", "even": "odd", "all": "all"}[args.split]]
    levels = [int(x) for x in args.levels.split(",") if x]
    day = [tuple(int(v) for v in ph.split(":")) for ph in args.day.split(",") if ph]
    names = args.configs.split(",")
    results: dict = {"settings": vars(args) | {"out": str(args.out)}, "runs": {}, "overhead": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        table_spec = args.table
        if "table" in names and table_spec == "tune":
            fixed = [n for n in names if n == "plain" or n.startswith("fixed:")]
            if args.order == "interleaved":
                tuning = run_interleaved({n: CONFIGS[n] for n in fixed}, other, levels, [], args, Path(tmp), "tune ")
            else:
                tuning = {n: run_config(f"tune {n}", CONFIGS[n], other, levels, [], args, Path(tmp)) for n in fixed}
            table_spec = tuned_table(tuning, levels)
            results["tuning"] = {n: t["runs"] for n, t in tuning.items()} | {"table": table_spec}
            print(f"tuned on the other half: {table_spec}", flush=True)
        extras = {n: ["--variant", "A=fixed:8", "--load-rule", table_spec] if n == "table" else CONFIGS[n] for n in names}
        if args.order == "interleaved":
            for name, done in run_interleaved(extras, prompts, levels, day, args, Path(tmp)).items():
                results["runs"][name], results["overhead"][name] = done["runs"], done["overhead"]
        for name in names if args.order == "config" else []:
            done = run_config(name, extras[name], prompts, levels, day, args, Path(tmp))
            results["runs"][name], results["overhead"][name] = done["runs"], done["overhead"]
            args.out.write_text(json.dumps(results, indent=1))  # after each configuration: a failure keeps the rest
    args.out.write_text(json.dumps(results, indent=1))
    print(table(results))


def table(results: dict) -> str:
    """Markdown: tok/s (and ratio to plain) per configuration and level; p50/p95/TTFT underneath."""
    runs = results["runs"]
    names = list(runs)
    cols = list(next(iter(runs.values())))
    lines = ["| config | " + " | ".join(f"{c} clients" if c != "day" else "changing" for c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for n in names:
        cells = []
        for c in cols:
            r = runs[n][c]
            ratio = f" ({r['tokens_per_s'] / runs['plain'][c]['tokens_per_s']:.2f}x)" if "plain" in runs else ""
            cells.append(f"{r['tokens_per_s']:.1f}{ratio}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "| config | level | p50 s | p95 s | TTFT p50 s |", "|---|---|---:|---:|---:|"]
    for n in names:
        for c in cols:
            r = runs[n][c]
            lines.append(f"| {n} | {c} | {r['p50_s']:.2f} | {r['p95_s']:.2f} | {r['ttft_p50_s'] or float('nan'):.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
