"""The served default on the host it runs on (issue 47): ``adaptspec serve`` with its defaults
(cold: no ``--variant``, no ``--arms``, no checkpoint; the host measured or read from its cache,
the dtype and the bundled head's prior priced by this host's curve, the learned load rule) against
plain decoding (``--variant P=fixed:1``) and fixed block sizes (``--load-rule none``), under
closed-loop streaming clients on 127.0.0.1.

Every server is up at once; each level (1, 2, 4, 8 clients by default) runs on every
configuration in turn, the order rotated from phase to phase, ``--repeats`` times, each repeat on
the next prompts (every configuration the same ones): :func:`bench_load_sweep.schedule`, and the
ratios are paired by repeat (:func:`bench_load_sweep.summarize`: geometric mean and a 95%
t-interval over the repeats). Prompts: the public benchmark prompts from ``--offset`` on (past the
336 the bundled head was trained on: unseen by it). Each server's ``/health`` ``host`` field (what
the host measurement measured and chose) and the rounds it ran by rows x widest block are kept.

    flock /work/bench.lock nice -n -20 python benchmarks/bench_host_served.py --out benchmarks/results/host-served-avx512.json
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 flock ... --fixed 2,3,4 --out benchmarks/results/host-served-avx2.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_load_sweep import (
    Measured,
    Server as SweepServer,  # noqa: E402
    free_port,
    one_request,
    schedule,
    summarize,
    summary_table,
    wait_healthy,
)  # noqa: E402

#: The arms every fixed configuration's server is given (so that 3 is one); the default gets none.
FIXED_ARMS = "1,2,3,4,6,8"


class Server(SweepServer):
    """One ``adaptspec serve`` on loopback with ``extra`` flags only (none: its defaults, no ``--arms`` or
    ``--max-rows`` as the sweep's servers get); stopped as they are."""

    def __init__(self, extra: list[str], root: Path, threads: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = root / f"server-{self.port}.out"
        args = [
            sys.executable,
            "-m",
            "adaptspec",
            "serve",
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
            *extra,
        ]
        self.proc = subprocess.Popen(args, stdout=self.out.open("wb"), stderr=subprocess.STDOUT)

    def start(self, warm_prompt: str, timeout: float = 600) -> dict:
        """Healthy, then one short unmeasured request (first-call costs); returns /health."""
        wait_healthy(self.proc, self.url, self.out, timeout)
        health = httpx.get(self.url + "/health", timeout=30).json()
        one_request(self.url, warm_prompt, 8)
        return health


def configs(fixed: list[int]) -> dict[str, list[str]]:
    out = {"default": [], "plain": ["--variant", "P=fixed:1", "--load-rule", "none", "--arms", FIXED_ARMS]}
    for b in fixed:
        out[f"fixed:{b}"] = ["--variant", f"P=fixed:{b}", "--load-rule", "none", "--arms", FIXED_ARMS]
    return out


def host_description() -> dict:
    """The CPU, its flags of note, torch and its kernels, and the restricting variables."""
    import torch

    from adaptspec.host.identity import KERNEL_ENV, cpu_description

    model, flags = cpu_description()
    wanted = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
    return {
        "cpu": model,
        "flags": [f for f in wanted if f in flags.split()],
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "capability": str(torch.backends.cpu.get_cpu_capability()),
        "load_average_at_start": list(os.getloadavg()),
        **{k: os.environ.get(k, "") for k in KERNEL_ENV},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument(
        "--fixed", default="2,3,4,6,8", help="fixed block sizes served beside plain and the default"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--requests-per-client",
        type=int,
        default=2,
        help="requests per client per level (at least 4 a level)",
    )
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--offset", type=int, default=346, help="first benchmark prompt (past the head's 336)")
    ap.add_argument(
        "--lengths",
        default=None,
        metavar="LO,HI",
        help="each prompt's max_tokens drawn once, uniformly from LO..HI (seeded, the same prompt the same "
        "length in every configuration), instead of --max-tokens for all: requests that all run to one "
        "length decode in lockstep at B = 1, which no other block size keeps (BENCHMARKS.md)",
    )
    ap.add_argument("--threads", type=int, default=2, help="each server's torch threads")
    ap.add_argument(
        "--extra-configs",
        default="{}",
        metavar="JSON",
        help="more configurations, NAME -> the serve flags it adds to the defaults, e.g. "
        '\'{"margin": ["--load-margin", "0.1"]}\'',
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from adaptspec.models.prompts import benchmark_prompts

    prompts = [p.prompt for p in benchmark_prompts()[args.offset :]]
    lengths: int | list[int] = args.max_tokens
    if args.lengths:
        lo, hi = (int(x) for x in args.lengths.split(","))
        if not 1 <= lo <= hi:
            ap.error(f"--lengths {args.lengths}: give LO,HI with 1 <= LO <= HI")
        lengths = [int(x) for x in np.random.default_rng(0).integers(lo, hi + 1, size=len(prompts))]
    levels = [int(x) for x in args.levels.split(",") if x]
    confs = configs([int(b) for b in args.fixed.split(",") if b.strip()]) | json.loads(args.extra_configs)
    names = list(confs)
    results: dict = {
        "settings": {k: str(v) for k, v in vars(args).items()},
        "host": host_description(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "health": {},
        "runs": {},
    }
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        # The default server first, alone: where this host has no cached measurement it times the host
        # with the cores to itself; the others then read the cached record (each server checks its key).
        servers = {"default": Server(confs["default"], Path(tmp), args.threads)}
        try:
            results["health"]["default"] = servers["default"].start(prompts[-1]).get("host")
            servers.update(
                {n: Server(extra, Path(tmp), args.threads) for n, extra in confs.items() if n != "default"}
            )
            for n, s in servers.items():  # the warm-up prompt is the pool's last: measured by none
                if n != "default":
                    results["health"][n] = s.start(prompts[-1]).get("host")
            measured = {n: Measured(n, s) for n, s in servers.items()}
            for step in schedule(names, levels, [], args.repeats, args.requests_per_client):
                for n in step["order"]:
                    measured[n].measure(step, prompts, lengths)
            for n, m in measured.items():
                d = m.done()
                results["runs"][n] = {label: {k: v for k, v in e.items()} for label, e in d["runs"].items()}
                results.setdefault("engine", {})[n] = d["overhead"]
        finally:
            for s in servers.values():
                s.stop()
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    results["host"]["load_average_at_end"] = list(os.getloadavg())
    results["summary"] = summarize(results["runs"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results["host"]))
    print(json.dumps(results["health"].get("default")))
    print(summary_table(results["summary"]))


if __name__ == "__main__":
    main()
