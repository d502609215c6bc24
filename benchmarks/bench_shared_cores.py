"""The bundled target's plain decoding when processes share the cores (issue 38, item 19).

N processes (1, 2, 3) each decode the bundled target (SmolLM2-135M, bf16, batch 1, fast
kernels: the project's ``TargetModel.verify`` one token at a time, a few hundred OpenMP
parallel regions a token) during the same wall-clock window, with T torch threads each
(1, 2) under an OpenMP setting: libgomp's default (spin 300,000 times before sleeping),
``OMP_WAIT_POLICY=PASSIVE`` (sleep at once), ``GOMP_SPINCOUNT`` 10000 and 1000 (``--settings``
takes any of ``default``, ``passive``, ``spinN``). One thread
forms no team, so the settings cannot matter there and it is run under the default only.

The environment is read by libgomp when the process starts, so each setting has its own pool
of 3 worker processes, loaded once and kept for the whole run (idle workers block on a pipe);
every window tells N of one pool to decode for ``--window`` seconds from a common start.
Rounds repeat every configuration once in a shuffled order (seeded), so drift in the machine's
other work spreads over all of them; a configuration's interval is a t interval over rounds,
and its ratio to the default at the same N and T a t interval over the rounds' log ratios
(paired by round). Each window records the 1-minute load average at its start and the CPU the
rest of the machine used during it (``/proc/stat`` busy time less the workers' own).

Workers run at the parent's niceness (run the script with the same ``nice`` as the machine's
other work, so that the measured processes compete with it on equal terms): the measurement
is of how N processes share the cores among themselves and with that other work.

    nice -n 5 python benchmarks/bench_shared_cores.py     # ~10 min here; benchmarks/results/shared-cores.json, run "grid"
    nice -n 5 python benchmarks/bench_shared_cores.py --label alone --processes 1 --threads 1,2 \
        --settings default,passive,spin1000,spin10000,spin30000 --rounds 12 --window 2 --wait-quiet 0.15
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The settings run by default: libgomp's own, PASSIVE, and two spin counts ("spinN": GOMP_SPINCOUNT=N)
SETTINGS = ["default", "passive", "spin10000", "spin1000"]


def setting_env(name: str) -> dict[str, str | None]:
    """The OpenMP variables of a setting (None: removed from the worker's environment)."""
    if name == "default":
        return {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}
    if name == "passive":
        return {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}
    if name.startswith("spin") and name[4:].isdigit():
        return {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": name[4:]}
    raise SystemExit(f"unknown setting {name!r}: default, passive or spinN")


PROMPT = "Explain in a few sentences why the sky is blue, and what changes at sunset."
RESTART_EVERY = 64  # decoded tokens; then the cache is cropped back to the prompt: every token costs the same


# ---------------------------------------------------------------------------------------- worker
def worker() -> None:
    """Load the target, then serve commands from stdin until EOF: ``prep THREADS`` (answer
    ``armed`` once this thread count's team exists), then ``go START WINDOW STOPFILE`` (decode
    from START, answer the window's tokens/s, keep decoding until STOPFILE exists)."""
    import torch

    from adaptspec.decoding import TargetModel
    from adaptspec.decoding.loading import load_target

    model, tok = load_target()
    target = TargetModel(model, tok)
    prompt = target.encode_chat(PROMPT)
    maps = Path("/proc/self/maps").read_text()
    omp = sorted(
        {
            Path(line.split()[-1]).name
            for line in maps.splitlines()
            if any(k in line for k in ("libgomp", "libiomp", "libomp"))
        }
    )
    print(
        json.dumps(
            {"ready": True, "openmp_libraries": omp, "parallel_info": torch.__config__.parallel_info()}
        ),
        flush=True,
    )
    lines = iter(sys.stdin)
    for line in lines:  # "prep THREADS", then "go START WINDOW STOPFILE"
        torch.set_num_threads(int(line.split()[1]))
        pre = target.prefill(prompt)
        nxt = pre.logits.argmax().reshape(1)
        target.verify(nxt, pre.cache, context=False)  # this thread count's team is made before the start
        target.crop(pre.cache, len(prompt))
        print(json.dumps({"armed": True}), flush=True)
        _, start, window, stop = next(lines).split()
        start, window = float(start), float(window)
        while time.monotonic() < start:
            time.sleep(0.001)
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        end, tokens, done, last = start + window, 0.0, 0, start
        while True:
            logits, _ = target.verify(nxt, pre.cache, context=False)
            now = time.monotonic()
            if now > end:  # the token that straddles the end counts for its share inside the window
                tokens += (end - last) / (now - last)
                break
            tokens, done, last = tokens + 1, done + 1, now
            nxt = logits[-1].argmax().reshape(1)
            if done == RESTART_EVERY:
                target.crop(pre.cache, len(prompt))
                nxt, done = pre.logits.argmax().reshape(1), 0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        print(json.dumps({"tok_s": tokens / window, "cpu_s": cpu * window / (now - start)}), flush=True)
        while not os.path.exists(stop):  # keep the cores as busy as before until every worker is past the end
            target.verify(nxt, pre.cache, context=False)
            target.crop(pre.cache, len(prompt))
        print(json.dumps({"stopped": True}), flush=True)


# ---------------------------------------------------------------------------------------- parent
def busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def wait_quiet(cores: float, limit_s: float = 10.0) -> float:
    """Wait until the machine (our workers idle) used fewer than ``cores`` over 0.3 s; the seconds waited."""
    t0 = time.monotonic()
    hz = os.sysconf("SC_CLK_TCK")
    while time.monotonic() - t0 < limit_s:
        b0, _ = busy_jiffies()
        time.sleep(0.3)
        b1, _ = busy_jiffies()
        if (b1 - b0) / hz / 0.3 < cores:
            break
    return time.monotonic() - t0


def read(p: subprocess.Popen) -> dict:
    line = p.stdout.readline()
    if not line:
        raise SystemExit(f"a worker exited (status {p.wait()}); its stderr is above")
    return json.loads(line)


def start_pool(setting: str, size: int) -> list[subprocess.Popen]:
    env = dict(os.environ)
    for k, val in setting_env(setting).items():
        env.pop(k, None)
        if val is not None:
            env[k] = val
    env.pop("OMP_NUM_THREADS", None)
    env["PYTHONPATH"] = str(ROOT)
    env["TRANSFORMERS_VERBOSITY"] = "error"
    return [
        subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(size)
    ]


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    from scipy import stats

    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    lo, hi = stats.t.interval(0.95, len(xs) - 1, loc=m, scale=stats.sem(xs)) if stats.sem(xs) > 0 else (m, m)
    return m, float(lo), float(hi)


def summarize(windows: list[dict], configs) -> list[dict]:
    """Per configuration: tokens/s per process and in all (mean, 95% t interval over its windows),
    CPU seconds a token, the other load; for a setting other than the default, its aggregate
    over the default's at the same N and T (geometric mean and interval of the ratios of the
    rounds that have both)."""
    by: dict = {}
    for w in windows:
        by.setdefault((w["setting"], w["threads"], w["processes"]), {})[w["round"]] = w
    summary = []
    for c in configs:
        ws = by.get(tuple(c))
        if not ws:
            continue
        per = [sum(w["tok_s"]) / len(w["tok_s"]) for w in ws.values()]
        agg = [w["aggregate_tok_s"] for w in ws.values()]
        row = {
            "setting": c[0],
            "threads": c[1],
            "processes": c[2],
            "windows": len(ws),
            "per_process_tok_s": [round(x, 2) for x in t_interval(per)],
            "aggregate_tok_s": [round(x, 2) for x in t_interval(agg)],
            "cpu_s_per_token": round(sum(w["cpu_s_per_token"] for w in ws.values()) / len(ws), 4),
            "other_cpu_cores": round(sum(w["other_cpu_cores"] for w in ws.values()) / len(ws), 2),
            "load_average_1m": round(sum(w["load_average_1m"] for w in ws.values()) / len(ws), 2),
        }
        ref = by.get(("default", c[1], c[2]))
        if c[0] != "default" and ref:
            logs = [math.log(ws[r]["aggregate_tok_s"] / ref[r]["aggregate_tok_s"]) for r in ws if r in ref]
            if logs:
                row["aggregate_vs_default"] = [round(math.exp(x), 3) for x in t_interval(logs)] + [len(logs)]
        summary.append(row)
        print(row, flush=True)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--processes", default="1,2,3")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument(
        "--threads", default="1,2", help="torch threads per process (1 runs under the default setting only)"
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=float, default=3.0, help="seconds each window decodes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--wait-quiet",
        type=float,
        default=None,
        metavar="CORES",
        help="before each window, wait (up to 10 s) until the rest of the machine uses fewer cores than this",
    )
    ap.add_argument(
        "--max-minutes", type=float, default=10.0, help="start no round after this (whole rounds only)"
    )
    ap.add_argument("--json", default=str(ROOT / "benchmarks/results/shared-cores.json"))
    ap.add_argument(
        "--label", default="grid", help="the run's key under 'runs' in --json (other runs there are kept)"
    )
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    procs = [int(x) for x in args.processes.split(",")]
    settings = args.settings.split(",")
    threads = [int(x) for x in args.threads.split(",")]
    configs = [(s, t, n) for t in threads if t > 1 for s in settings for n in procs]
    configs += [("default", 1, n) for n in procs] if 1 in threads else []
    t_start = time.time()
    load_at_start = os.getloadavg()
    pools = {s: start_pool(s, max(procs)) for s in dict.fromkeys(c[0] for c in configs)}
    info = {}
    for s, pool in pools.items():
        for p in pool:
            info = read(p)
            if not info.get("ready"):
                raise SystemExit(f"worker of {s} failed")
    print(
        f"workers ready after {time.time() - t_start:.0f} s; OpenMP: {info['openmp_libraries']}", flush=True
    )
    rng = random.Random(args.seed)
    windows = []
    for r in range(args.rounds):
        if r > 0 and time.time() - t_start > 60 * args.max_minutes:
            print(f"stopped after {r} rounds: --max-minutes {args.max_minutes} spent", flush=True)
            break
        order = configs[:]
        rng.shuffle(order)
        for setting, t, n in order:
            waited = wait_quiet(args.wait_quiet) if args.wait_quiet is not None else 0.0
            la = os.getloadavg()[0]
            pool = pools[setting][:n]
            for p in pool:
                p.stdin.write(f"prep {t}\n")
                p.stdin.flush()
            for p in pool:
                read(p)
            stop = Path(tempfile.gettempdir()) / f"shared-cores-stop-{os.getpid()}-{len(windows)}"
            start = time.monotonic() + 0.2
            for p in pool:
                p.stdin.write(f"go {start} {args.window} {stop}\n")
                p.stdin.flush()
            while time.monotonic() < start:
                time.sleep(0.001)
            b0, _ = busy_jiffies()
            time.sleep(args.window)
            b1, _ = busy_jiffies()
            res = [read(p) for p in pool]
            stop.touch()
            hz = os.sysconf("SC_CLK_TCK")
            ours = sum(x["cpu_s"] for x in res)
            other = max(0.0, (b1 - b0) / hz - ours) / args.window
            for p in pool:
                read(p)
            stop.unlink()
            w = {
                "round": r,
                "setting": setting,
                "threads": t,
                "processes": n,
                "tok_s": [round(x["tok_s"], 2) for x in res],
                "aggregate_tok_s": round(sum(x["tok_s"] for x in res), 2),
                "cpu_s_per_token": round(ours / sum(x["tok_s"] * args.window for x in res), 4),
                "load_average_1m": round(la, 2),
                "other_cpu_cores": round(other, 2),
                "waited_quiet_s": round(waited, 1),
            }
            windows.append(w)
            print(json.dumps(w), flush=True)
    for pool in pools.values():
        for p in pool:
            p.stdin.close()
            p.wait()

    summary = summarize(windows, configs)
    quiet = (
        summarize([w for w in windows if w["other_cpu_cores"] < args.wait_quiet], configs)
        if args.wait_quiet is not None
        else None
    )
    out = {
        "what": "bundled target (SmolLM2-135M, bf16, fast kernels) plain decoding, batch 1; N processes "
        "decoding in the same window, T torch threads each, under an OpenMP setting",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "cpus": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "niceness": os.nice(0),
        "platform": platform.platform(),
        "openmp_libraries": info["openmp_libraries"],
        "parallel_info": info["parallel_info"].splitlines()[:8],
        "settings": {k: {kk: vv for kk, vv in setting_env(k).items() if vv is not None} for k in settings},
        "window_s": args.window,
        "rounds": args.rounds,
        "seed": args.seed,
        "load_average_at_start": [round(x, 2) for x in load_at_start],
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.time() - t_start, 1),
        "summary": summary,
        **({"summary_quiet_windows": quiet} if quiet is not None else {}),
        "windows": windows,
    }
    path = Path(args.json)
    runs = json.loads(path.read_text()).get("runs", {}) if path.is_file() else {}
    runs[args.label] = out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    print(f"wrote {args.json} ({out['wall_s']} s)")


if __name__ == "__main__":
    main()
