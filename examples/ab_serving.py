"""A/B test two block-size policies behind the HTTP server, then read the verdict.

What it shows:

1. ``adaptspec serve`` with two variants (each its own ``AdaptiveController``), here on the
   tiny random model (``--tiny``: built in a second, no download), every request a row of the
   server's batched engine (its default; each variant's controller decides a request's block
   size when it joins), listening on 127.0.0.1 at a free port and logging every decision into a
   temporary directory;
2. OpenAI-style ``/v1/completions`` requests sent with httpx; the ``user`` field is the A/B
   key, so the server routes each user to the same variant every time;
3. a clean shutdown (SIGINT: in-flight requests finish, queued updates are applied, the log
   journal is rolled into a Parquet part);
4. the A/B report over the decision log (what ``adaptspec ab-report LOG_DIR`` prints): per
   variant reward, tau and throughput with intervals, and an always-valid sequential test.

The tiny model's drafter is untrained (its drafts are nearly always rejected), so this
exercises the whole path, not the speed-up. No request is sent after ``--budget-s`` (30 s).
Run it (about 15 s; it needs the ``serve`` extra, ``pip install -e '.[serve]'``)::

    python examples/ab_serving.py
    python examples/ab_serving.py --requests 200 --variant A=ucb --variant B=fixed:8
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from adaptspec.analysis.ab import analyze, rows_to_arrays
from adaptspec.traces.log_writer import log_rows

PROMPTS = [
    "Write a haiku about the sea.",
    "What is 17 times 23?",
    "def fibonacci(n):",
    "Summarise the plot of Hamlet.",
    "List three uses of copper.",
]


def free_port() -> int:
    """A port nobody listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_ready(client: httpx.Client, server: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(
                f"ab_serving: the server exited with status {server.returncode} before it was ready"
            )
        try:
            if client.get("/health").status_code == 200:
                return
        except httpx.TransportError:  # not listening yet
            pass
        time.sleep(0.2)
    raise SystemExit(f"ab_serving: the server was not ready within the time budget ({timeout:.0f} s left)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variant",
        action="append",
        metavar="NAME=SPEC",
        help="a variant and its policy, repeatable (default: A=ucb and B=fixed:4)",
    )
    parser.add_argument(
        "--arms",
        default="1,2,4,8,16",
        help="block sizes the policies choose among (the tiny drafter's maximum is 16)",
    )
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--users", type=int, default=20, help="distinct user ids the requests come from")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--budget-s",
        type=float,
        default=30.0,
        help="stop sending requests this long after the start, served or not (default 30)",
    )
    args = parser.parse_args()
    if args.requests < 1 or args.users < 1 or args.max_tokens < 1 or not args.budget_s > 0:
        parser.error("--requests, --users and --max-tokens must be >= 1, --budget-s > 0")
    deadline = time.monotonic() + args.budget_s
    variants = args.variant or ["A=ucb", "B=fixed:4"]

    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "log"
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "adaptspec",
            "serve",
            "--tiny",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-dir",
            str(log_dir),
            "--arms",
            args.arms,
            "--log-level",
            "warning",
        ]
        for v in variants:
            cmd += ["--variant", v]
        server_output = open(Path(tmp) / "server.txt", "w+")
        server = subprocess.Popen(cmd, stdout=server_output, stderr=subprocess.STDOUT)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0) as client:
                wait_until_ready(client, server, timeout=deadline - time.monotonic())
                served: Counter = Counter()
                blocks: dict[str, Counter] = {}
                for i in range(args.requests):
                    if time.monotonic() > deadline:
                        print(f"time budget of {args.budget_s:.0f} s spent after {i} requests")
                        break
                    body = {
                        "prompt": PROMPTS[i % len(PROMPTS)],
                        "max_tokens": args.max_tokens,
                        "user": f"user-{i % args.users}",
                    }  # same user -> same variant
                    answer = client.post("/v1/completions", json=body)
                    answer.raise_for_status()
                    info = answer.json()["adaptspec"]  # variant, block size, reward, tau, ...
                    served[info["variant"]] += 1
                    blocks.setdefault(info["variant"], Counter())[info["block_size"]] += 1
            for name in sorted(served):
                chosen = ", ".join(f"B={b}: {n}" for b, n in sorted(blocks[name].items()))
                print(f"variant {name}: {served[name]} requests ({chosen})")
        except BaseException:
            server.kill()
            server.wait()
            server_output.seek(0)
            print(server_output.read(), file=sys.stderr)
            raise
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGINT)  # like Ctrl-C: a graceful shutdown
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
            server_output.close()
        print(f"server stopped (exit status {server.returncode}; 130 is the CLI's status after SIGINT)")

        # The report `adaptspec ab-report LOG_DIR` prints, from the library.
        report = analyze(rows_to_arrays(log_rows(log_dir)))
        print(report.to_text())
        if not report.tests:
            print("verdict: one variant, nothing to compare")
        for test in report.tests:
            a, b = test["n"]
            verdict = (
                f"{test['winner']} is better" if test["significant"] else "no significant difference yet"
            )
            print(f"verdict {a} vs {b}: {verdict} (always-valid p = {test['p_value']:.3g})")


if __name__ == "__main__":
    main()
