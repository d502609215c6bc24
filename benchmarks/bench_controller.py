"""Controller overhead per request, and server throughput and latency under a loopback load.

1. **Overhead.** Requests run through ``AdaptiveController.generate`` with a decision log
   (fsync'd rows) and checkpoints on. The controller's own time per request -- featurize +
   decide + reward + log + update -- is compared with the decode time of the same request.
   ``Generation.overhead_s`` holds everything but the update, which runs on the update thread
   (its mean time is read from ``stats()``); both are counted. A second loop times each part
   alone (featurize, decide, feedback = reward + log + enqueue, update).
2. **Server.** ``adaptspec serve`` in a subprocess on loopback; ``--clients`` concurrent clients
   send ``--requests`` completions (half streamed), bounded by ``--seconds``. Reported:
   requests/s, generated tokens/s, latency and time-to-first-token percentiles, and the ratio
   of the server's token throughput to the same prompts run in-process, one after another,
   through a controller (the decoder serves one sequence at a time, so that is the ceiling).
   Both use ``fixed:4``, so that the ratio measures the server, not what a policy chose.

Tiny models by default (random weights: the figures are about the controller and the server,
not the speed-up); ``--bundled`` uses the bundled SmolLM2 target and drafter;
``--bundled-target`` the bundled target with a fresh, untrained drafter (real decode costs,
before the trained drafter exists; its drafts are mostly rejected). ``--no-fsync`` logs
without fsync (rows then survive a process crash, not a machine crash).

    python benchmarks/bench_controller.py                       # ~1 minute on 2 cores
    python benchmarks/bench_controller.py --bundled --requests 24 --max-tokens 64
    python benchmarks/bench_controller.py --json benchmarks/results/controller.json
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is 17 * 23? Explain step by step.",
    "Describe the sea at night in three sentences.",
    "List five uses of a paperclip.",
    "Translate 'good morning' into French and Spanish.",
    "def quicksort(xs):",
    "Summarise the plot of Hamlet.",
    "A train leaves at 9:40 and arrives at 13:05. How long is the journey?",
]


def _speculator(bundled: bool, threads: int, bundled_target: bool = False, workdir: Path | None = None):
    import torch

    torch.set_num_threads(threads)
    if bundled_target:
        from adaptspec.decoding import BlockDiffusionDrafter, SpeculativeDecoder, TargetModel
        from adaptspec.models import load_target

        model, tok = load_target(dtype="bfloat16")
        drafter = BlockDiffusionDrafter.for_target(model, num_layers=2, seed=0, max_block_size=32)
        drafter.to(dtype=torch.bfloat16)
        drafter.save_pretrained(workdir / "drafter")  # for the server
        spec = SpeculativeDecoder(TargetModel(model, tok), drafter)
        return spec, (lambda text: spec.target.encode_chat(text)), tok
    if bundled:
        from adaptspec.errors import AdaptspecError
        from adaptspec.models import load_speculator

        try:
            spec = load_speculator(threads=threads)
        except AdaptspecError as e:
            sys.exit(f"bench_controller: --bundled needs the bundled drafter: {e}")
        tok = spec.target.tokenizer
        return spec, (lambda text: spec.target.encode_chat(text)), tok
    from adaptspec.serving.tiny import tiny_speculator

    spec, codec = tiny_speculator(0)
    return spec, codec.encode, None


def _policy(spec, encode, workdir: Path, arms: tuple[int, ...]):
    """NeuralLinear (the default policy) over a featurizer and a head fitted on this speculator's features.

    The head is trained on made-up rewards: its decisions do not matter here, its cost does.
    """
    import torch

    from adaptspec.policies import train_head
    from adaptspec.policies.featurizer import Featurizer

    X = np.stack([spec.prefill(encode(p + f" {i}")).features for i, p in enumerate(PROMPTS * 4)])
    f = Featurizer.fit(X, dim=min(32, len(X) - 1), keep=[-1])
    Z = f.transform(X)
    rng = np.random.default_rng(0)
    R = Z[:, :1] * rng.normal(size=(1, len(arms))) + rng.normal(size=(len(X), len(arms)))
    torch_threads = torch.get_num_threads()
    head = train_head(Z, R, arms, hidden=(64, 32), max_epochs=40, seed=0)
    torch.set_num_threads(torch_threads)
    head.save(workdir / "head")
    f.save(workdir / "head")
    return f"neural-linear:head={workdir / 'head'}"


def bench_overhead(
    spec, encode, policy: str, workdir: Path, n: int, max_tokens: int, fsync: bool = True
) -> dict:
    from adaptspec import AdaptiveController

    out: dict = {"policy": policy.split(":")[0], "requests": n, "max_tokens": max_tokens, "fsync": fsync}
    with AdaptiveController(
        spec,
        policy,
        log_dir=workdir / "log",
        checkpoint_dir=workdir / "ck",
        checkpoint_every=50,
        decide_timeout_s=1.0,
        log_fsync=fsync,
    ) as c:
        c.generate(encode("warm up"), max_new_tokens=4)
        over, dec, pre, new = [], [], [], []
        for i in range(n):
            g = c.generate(encode(PROMPTS[i % len(PROMPTS)]), max_new_tokens=max_tokens)
            over.append(g.overhead_s)
            dec.append(g.outcome.decode_s)
            pre.append(g.prefill_s)
            new.append(g.outcome.new_tokens)
        c.sync()
        s = c.stats()
        upd = s["update_mean_s"]
        # each part alone
        feats = [spec.prefill(encode(p)).features for p in PROMPTS]
        t_feat, t_dec, t_fb = [], [], []
        from adaptspec.speculator import Outcome, Round

        for i in range(100):
            x = feats[i % len(feats)]
            t0 = time.perf_counter()
            if c.featurizer is not None:
                c.featurizer(x)
            t1 = time.perf_counter()
            d = c.decide(x)
            t2 = time.perf_counter()
            b = d.block_size  # an outcome as the decoder would report it: 4 rounds of this block size
            c.feedback(d.decision_id, Outcome([1] * (1 + 4 * b), [Round(b, b, 0.001, 0.002)] * 4, 0.012))
            t3 = time.perf_counter()
            t_feat.append(t1 - t0)
            t_dec.append(t2 - t1)
            t_fb.append(t3 - t2)
        c.sync()
    per_request = float(np.mean(over)) + upd
    ratio = (np.asarray(over) + upd) / np.asarray(dec)
    out.update(
        decode_ms=1000 * float(np.mean(dec)),
        prefill_ms=1000 * float(np.mean(pre)),
        overhead_ms=1000 * per_request,
        overhead_pct_of_decode=100 * per_request / float(np.mean(dec)),
        overhead_pct_median=100 * float(np.median(ratio)),
        parts_ms={
            "featurize": 1000 * float(np.median(t_feat)),
            "decide": 1000 * float(np.median(t_dec)),
            "feedback (reward + fsync'd log + enqueue)": 1000 * float(np.median(t_fb)),
            "update (update thread)": 1000 * upd,
        },
        tokens_per_s_in_process=float(
            np.sum(new) / np.sum(np.asarray(dec) + np.asarray(pre) + np.asarray(over))
        ),
    )
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_server(
    models: str,
    threads: int,
    policy: str,
    workdir: Path,
    clients: int,
    n: int,
    max_tokens: int,
    seconds: float,
    fsync: bool = True,
) -> dict:
    import httpx

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "adaptspec",
        "serve",
        "--threads",
        str(threads),
        "--port",
        str(port),
        "--variant",
        f"A={policy}",
        "--log-dir",
        str(workdir / "slog"),
        "--checkpoint-dir",
        str(workdir / "sck"),
        "--log-level",
        "warning",
        "--max-tokens",
        str(max(max_tokens, 16)),
    ]
    if models == "tiny":
        cmd.append("--tiny")
    elif models == "bundled-target":
        from adaptspec.decoding.loading import bundled_target_path

        cmd += ["--target", str(bundled_target_path()), "--drafter", str(workdir / "drafter"), "--chat"]
    else:
        cmd.append("--chat")
    if not fsync:
        cmd.append("--no-fsync")
    log = open(workdir / "server.out", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited:\n{(workdir / 'server.out').read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise SystemExit("server did not start")
            time.sleep(0.3)
        lat, ttft, toks = [], [], []
        stop_at = time.time() + seconds
        lock = threading.Lock()
        counter = iter(range(n))

        def client(k: int) -> None:
            with httpx.Client(timeout=600) as c:
                while time.time() < stop_at:
                    with lock:
                        i = next(counter, None)
                    if i is None:
                        return
                    body = {
                        "prompt": PROMPTS[i % len(PROMPTS)],
                        "max_tokens": max_tokens,
                        "user": f"u{i}",
                        "stream": i % 2 == 0,
                    }
                    t0 = time.perf_counter()
                    first = None
                    if body["stream"]:
                        ntok = 0
                        with c.stream("POST", url + "/v1/completions", json=body) as r:
                            for line in r.iter_lines():
                                if line.startswith("data: {"):
                                    first = first or time.perf_counter()
                                    ntok += len(json.loads(line[6:])["choices"][0]["token_ids"])
                    else:
                        r = c.post(url + "/v1/completions", json=body)
                        ntok = r.json()["usage"]["completion_tokens"]
                    t1 = time.perf_counter()
                    with lock:
                        lat.append(t1 - t0)
                        toks.append(ntok)
                        if first is not None:
                            ttft.append(first - t0)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(client, range(clients)))
        wall = time.perf_counter() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)

    def q(xs, p):
        return 1000 * float(np.percentile(xs, p)) if xs else None

    return {
        "clients": clients,
        "requests": len(lat),
        "seconds": wall,
        "requests_per_s": len(lat) / wall,
        "tokens_per_s": sum(toks) / wall,
        "latency_ms": {"p50": q(lat, 50), "p90": q(lat, 90), "p99": q(lat, 99)},
        "ttft_ms": {"p50": q(ttft, 50), "p90": q(ttft, 90), "p99": q(ttft, 99)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--bundled", action="store_true", help="the bundled SmolLM2 target and drafter (needs the drafter)"
    )
    ap.add_argument(
        "--bundled-target", action="store_true", help="the bundled target with an untrained drafter"
    )
    ap.add_argument("--no-fsync", action="store_true", help="log without fsync")
    ap.add_argument("--no-server", action="store_true", help="overhead figures only")
    ap.add_argument("--requests", type=int, default=40, help="in-process requests for the overhead figures")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent HTTP clients")
    ap.add_argument("--server-requests", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60.0, help="time bound of the load")
    ap.add_argument("--json", metavar="FILE", default=None)
    args = ap.parse_args()
    models = "bundled" if args.bundled else "bundled-target" if args.bundled_target else "tiny"
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        spec, encode, _ = _speculator(args.bundled, args.threads, args.bundled_target, work)
        from adaptspec.control.controller import DEFAULT_ARMS

        arms = tuple(a for a in DEFAULT_ARMS if a <= spec.max_block_size)
        policy = _policy(spec, encode, work, arms)
        results: dict = {
            "models": models,
            "machine": f"{platform.machine()}, {platform.processor() or platform.platform()}",
            "torch_threads": args.threads,
        }
        print("overhead ...", file=sys.stderr, flush=True)
        results["overhead"] = [
            bench_overhead(
                spec, encode, pol, work / pol.split(":")[0], args.requests, args.max_tokens, not args.no_fsync
            )
            for pol in ("fixed:4", "ucb", policy)
        ]
        if not args.no_server:
            print("server ...", file=sys.stderr, flush=True)
            results["server"] = bench_server(
                models,
                args.threads,
                "fixed:4",
                work,
                args.clients,
                args.server_requests,
                args.max_tokens,
                args.seconds,
                not args.no_fsync,
            )
            ref = results["overhead"][0]["tokens_per_s_in_process"]  # fixed:4 too
            results["server"]["ratio_to_in_process"] = results["server"]["tokens_per_s"] / ref
    print(
        f"models: {models}, torch threads {args.threads}, {args.requests} requests of {args.max_tokens} tokens, "
        f"log {'without' if args.no_fsync else 'with'} fsync"
    )
    print(
        f"{'policy':<14}{'decode ms':>10}{'overhead ms':>12}{'% of decode':>12}{'median %':>9}  parts (median ms)"
    )
    for o in results["overhead"]:
        parts = ", ".join(f"{k.split(' ')[0]} {v:.3f}" for k, v in o["parts_ms"].items())
        print(
            f"{o['policy']:<14}{o['decode_ms']:>10.1f}{o['overhead_ms']:>12.3f}{o['overhead_pct_of_decode']:>11.2f}%"
            f"{o['overhead_pct_median']:>8.2f}%  {parts}"
        )
    if args.no_server:
        return _save(results, args.json)
    s = results["server"]
    print(
        f"server (fixed:4): {s['clients']} clients, {s['requests']} requests in {s['seconds']:.1f} s: {s['requests_per_s']:.2f} req/s, "
        f"{s['tokens_per_s']:.1f} tok/s ({s['ratio_to_in_process']:.2f}x the in-process sequential rate); "
        f"latency p50/p90/p99 {s['latency_ms']['p50']:.0f}/{s['latency_ms']['p90']:.0f}/{s['latency_ms']['p99']:.0f} ms; "
        f"TTFT p50/p90/p99 {s['ttft_ms']['p50']:.0f}/{s['ttft_ms']['p90']:.0f}/{s['ttft_ms']['p99']:.0f} ms"
    )
    return _save(results, args.json)


def _save(results: dict, path: str | None) -> int:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
