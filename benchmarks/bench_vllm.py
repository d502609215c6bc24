"""vLLM's CPU OpenAI server with the bundled target and its DFlash drafter, under closed-loop clients.

Configurations (``--configs``), each one vLLM server on 127.0.0.1 (``python -m
vllm.entrypoints.openai.api_server`` from ``--vllm-python``), float32, greedy:

- ``plain``: no speculation;
- ``kK``: vLLM's own ``dflash`` method at ``num_speculative_tokens`` K (block size K + 1);
- ``table``: ``dflash`` with vLLM's per-batch-size table (``num_speculative_tokens_per_batch_size``,
  given by ``--table``, e.g. ``1-2:3,3-8:2,9-256:1``: batch sizes 1-2 at K = 3, ...);
- ``adaptive``: ``dflash`` at K = ``--adaptive-max-k`` with adaptspec's plug-in
  (``--scheduler-cls adaptspec.vllm.AdaptiveScheduler``, cold, its default policy), and its worker
  extension that skips the drafter's pass on steps that verify no draft next
  (``--worker-extension-cls adaptspec.vllm.IdleDrafterSkip``; ``--no-idle-drafter-skip``: without
  it); ``adaptive-NAME``: the same with the settings ``--plugin-entries`` gives ``adaptive-NAME``;
- ``warm``: the same with one variant, ``--warm-spec`` (e.g. a head trained on vLLM traces);
- ``floor``: the same with one variant ``fixed:1``: every request at B = 1, so no draft is ever
  verified: what speculation being on costs when the plug-in turns it off, the floor under which no
  choice of block sizes can go; ``floor-noskip``: the same without the worker extension, so vLLM's
  drafter still runs after every step (over the step's context, at ``num_spec_tokens_to_schedule`` 0);
- ``plugin-kK``: the plug-in at K with one variant ``fixed:K+1``: vLLM's ``kK`` through the plug-in
  (the same drafts verified), whose tokens/s against ``kK``'s is the plug-in's whole cost;
- ``adaptspec-plain``: not vLLM but ``adaptspec serve --variant P=fixed:1`` (plain decoding with
  adaptspec's defaults), the peer of ``plain`` for issue 47.

Every client sends its next request as soon as its last one ends: a non-streaming
``/v1/chat/completions`` (the public benchmark prompts, GSM8K, MT-Bench, HumanEval in turn, by
default the odd-numbered half; the chat template applied by each server), ``--max-tokens`` new
tokens. Levels (``--levels``) are client counts. A vLLM CPU server holds ~4 GB, so the
configurations run in groups of ``--group-size`` servers up at once, ``plain`` in every group; in a
group each repeat runs every level on every configuration in turn, the configuration order rotated
from one (level, repeat) to the next, the repeat on its own prompts (the same prompts for every
configuration of the group in a repeat, so a repeat pairs them). Per configuration and level: tokens/s (completion tokens over the run's wall
time), latency p50/p95, and for ``dflash`` servers vLLM's own counters over the run
(``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``, ``_num_accepted_tokens``): tau = 1 +
accepted / drafts, the mean tokens a verify step commits. The summary gives each configuration's
tok/s ratio to its group's ``plain`` and to the best fixed K at that level (both sides divided by
their own group's plain first; the plug-in's also to ``table``'s, ``plugin-kK``'s to ``kK``'s), per
repeat, their geometric mean and a 95% t-interval over the repeats (``bench_load_sweep.paired_ratio``), and how many responses equal plain's.

Besides tokens/s: each run's CPU seconds of the server's processes (``cpu_s``, psutil; tokens per
CPU second, ``vs_plain_cpu``, is less sensitive to other jobs on the host than wall time); for
the plug-in's servers, from its metrics on vLLM's ``/metrics`` (``PROMETHEUS_MULTIPROC_DIR`` set
for every server), the run's engine steps, their seconds, the plug-in's own seconds in vLLM's hooks
and their ratio (``plugin``: its cost per step), and the block sizes it decided.

Bounded: ``--requests-per-client`` requests per client per level, ``--max-tokens`` per request,
``--deadline-min`` for the whole run (levels not reached are left out, and said so). The machine is
named in the results (CPU model, the flags that decide a verify's cost, torch's capability).

    python benchmarks/bench_vllm.py --drafter DIR --target DIR --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_load_sweep import free_port, paired_ratio, run_figures, wait_healthy  # noqa: E402  (the load sweep's figures)

RESULTS = Path(__file__).resolve().parent / "results"
CHECKOUT = Path(__file__).resolve().parents[1]
DEFAULT_VLLM_PYTHON = str(CHECKOUT / ".venv-vllm" / "bin" / "python")
#: the flags that decide what a wide verify costs on a CPU
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
#: the plug-in's counters (adaptspec.vllm.metrics) a run reads
PLUGIN_COUNTERS = (
    "adaptspec_vllm_plugin_seconds",
    "adaptspec_vllm_step_seconds",
    "adaptspec_vllm_steps",
    "adaptspec_vllm_draft_fetch_seconds",
    "adaptspec_vllm_drafter_skipped_steps",
)
PLUGIN_CONFIGS = ("adaptive", "warm", "floor", "floor-noskip")


def host() -> dict:
    """The machine: CPU model, the flags that matter here, cores, torch's CPU capability."""
    model, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    import torch

    return {
        "cpu": model,
        "flags": [f for f in CPU_FLAGS if f in flags],
        "cores": os.cpu_count(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "load_average_at_start": list(os.getloadavg()),
    }


def parse_table(spec: str) -> list[list[int]]:
    """``1-2:3,3-8:2`` -> vLLM's ``[[1, 2, 3], [3, 8, 2]]`` (batch sizes start..end at K)."""
    out = []
    for part in spec.split(","):
        sizes, _, k = part.partition(":")
        lo, _, hi = sizes.partition("-")
        out.append([int(lo), int(hi or lo), int(k)])
    if not out or out[0][0] != 1:
        raise ValueError(f"--table {spec!r}: the first range must start at batch size 1")
    return out


def server_command(config: str, args, port: int, root: Path) -> tuple[list[str], dict]:
    """The command line and extra environment of configuration ``config``'s server (``KIND@TAG``: configuration
    KIND with the vLLM flags ``--server-args`` gives ``KIND@TAG``)."""
    name = config.split("@")[0]
    if name == "adaptspec-plain":
        return [
            sys.executable,
            "-m",
            "adaptspec",
            "serve",
            "--variant",
            "P=fixed:1",
            "--port",
            str(port),
            "--log-dir",
            str(root / f"log-{port}"),
            "--log-level",
            "warning",
            "--max-tokens",
            "1024",
        ], {}
    cmd = [
        args.vllm_python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(args.target),
        "--served-model-name",
        "target",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        str(max(args.levels)),
        "--enforce-eager",
        "--disable-uvicorn-access-log",
        "--seed",
        "0",
    ]
    spec = None
    if name.startswith("k"):
        spec = {"method": "dflash", "model": str(args.drafter), "num_speculative_tokens": int(name[1:])}
    elif name == "table":
        table = parse_table(args.table)
        spec = {
            "method": "dflash",
            "model": str(args.drafter),
            "num_speculative_tokens": max(k for *_, k in table),
            "num_speculative_tokens_per_batch_size": table,
        }
    elif name in PLUGIN_CONFIGS or name.startswith(("plugin-k", "adaptive-")):
        k = int(name.removeprefix("plugin-k")) if name.startswith("plugin-k") else args.adaptive_max_k
        spec = {"method": "dflash", "model": str(args.drafter), "num_speculative_tokens": k}
        entries = json.loads(args.plugin_entries)  # a tagged configuration's own settings, else its kind's
        entry = (
            {"log_dir": str(root / f"log-{port}")}
            | json.loads(args.plugin_entry)
            | entries.get(config, entries.get(name, {}))
        )
        if name == "warm":
            if args.warm_spec is None:
                raise ValueError("configuration 'warm' needs --warm-spec")
            entry["variants"] = {"W": args.warm_spec}
        elif name.startswith("floor"):
            entry["variants"] = {"F": "fixed:1"}
        elif name.startswith(
            "plugin-k"
        ):  # vLLM's kK through the plug-in: no load rule, so every step verifies K
            entry["variants"] = {"P": f"fixed:{k + 1}"}
            entry["load_rule"] = "none"
        cmd += [
            "--scheduler-cls",
            "adaptspec.vllm.AdaptiveScheduler",
            "--additional-config",
            json.dumps({"adaptspec": entry}),
        ]
        if args.idle_drafter_skip and name != "floor-noskip":
            cmd += ["--worker-extension-cls", "adaptspec.vllm.IdleDrafterSkip"]
    elif name != "plain":
        raise ValueError(f"unknown configuration {name!r}")
    cmd += json.loads(args.server_args).get(config, [])
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    metrics = root / f"prometheus-{port}"  # the engine process's counters (the plug-in's) on /metrics
    metrics.mkdir()
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
        "LD_PRELOAD": args.ld_preload,
        "PYTHONPATH": str(CHECKOUT),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics),
    }  # the plug-in, from this checkout
    return cmd, env


class Server:
    """One server process on loopback (vLLM's or adaptspec's)."""

    def __init__(self, name: str, args, root: Path) -> None:
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = root / f"{name}-{self.port}.out"
        cmd, env = server_command(name, args, self.port, root)
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.out.open("wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )

    def wait_ready(self, timeout: float) -> None:
        wait_healthy(self.proc, self.url, self.out, timeout, self.name)

    def counters(self) -> dict[str, float]:
        """vLLM's speculative-decoding counters and the plug-in's from /metrics (summed over their
        labels; the plug-in's decisions by block size as ``decisions:B``), and the CPU seconds of the
        server's processes so far (``cpu_s``)."""
        import httpx

        out: dict[str, float] = {"cpu_s": self.cpu_seconds()}
        if self.name == "adaptspec-plain":
            return out
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            if line.startswith("#"):
                continue
            for name in (*SPEC_COUNTERS, *PLUGIN_COUNTERS):
                if line.startswith(name + "_total"):
                    out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            for name, key in (
                ("adaptspec_vllm_decisions_total{", "decisions"),
                ("adaptspec_vllm_decode_steps_total{", "blocks"),
            ):
                if line.startswith(name):
                    b = line.split('block_size="', 1)[1].split('"', 1)[0]
                    out[f"{key}:{b}"] = out.get(f"{key}:{b}", 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def cpu_seconds(self) -> float:
        """User and system CPU seconds of the server's process and its children (vLLM's engine core)."""
        import psutil

        total = 0.0
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.NoSuchProcess:
                    pass
        except psutil.NoSuchProcess:
            pass
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def one_request(url: str, prompt: str, max_tokens: int) -> dict:
    """A non-streaming chat completion: its completion tokens and latency, at the client."""
    import httpx

    t0 = time.perf_counter()
    r = httpx.post(
        url + "/v1/chat/completions",
        timeout=900,
        json={"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0},
    )
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
    body = r.json()
    return {
        "tokens": body["usage"]["completion_tokens"],
        "latency_s": time.perf_counter() - t0,
        "ttft_s": None,
        "text": body["choices"][0]["message"]["content"],
    }


def closed_loop(
    url: str, prompts: list[str], clients: int, requests: int, max_tokens: int
) -> tuple[list[dict], float]:
    """``clients`` closed-loop clients sending ``requests`` requests in all, ``prompts`` in turn."""
    results: list[dict] = []
    nxt, lock = [0], threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if nxt[0] >= requests:
                    return
                i = nxt[0]
                nxt[0] += 1
            res = one_request(url, prompts[i % len(prompts)], max_tokens) | {"prompt_index": i}
            with lock:
                results.append(res)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sorted(results, key=lambda r: r["prompt_index"]), time.perf_counter() - t0


def measure(server: Server, prompts: list[str], clients: int, args) -> dict:
    before = server.counters()
    done, wall = closed_loop(
        server.url, prompts, clients, clients * args.requests_per_client, args.max_tokens
    )
    after = server.counters()
    fig = run_figures(done, wall)
    fig.pop("ttft_p50_s", None)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    fig["cpu_s"] = delta.pop("cpu_s")
    spec = {k.removeprefix("vllm:spec_decode_"): v for k, v in delta.items() if k.startswith("vllm:")}
    if spec.get("num_drafts"):
        fig["spec"] = spec | {"tau": 1 + spec["num_accepted_tokens"] / spec["num_drafts"]}
    if delta.get("adaptspec_vllm_step_seconds"):
        fig["plugin"] = {
            "steps": delta.get("adaptspec_vllm_steps", 0.0),
            "step_s": delta["adaptspec_vllm_step_seconds"],
            "plugin_s": delta.get("adaptspec_vllm_plugin_seconds", 0.0),
            "share": delta.get("adaptspec_vllm_plugin_seconds", 0.0) / delta["adaptspec_vllm_step_seconds"],
            "fetch_s": delta.get("adaptspec_vllm_draft_fetch_seconds", 0.0),
            "drafter_skipped": delta.get("adaptspec_vllm_drafter_skipped_steps", 0.0),
            "decisions": {
                k.split(":")[1]: v for k, v in sorted(delta.items()) if k.startswith("decisions:") and v
            },
            "decode_steps_by_block": {
                k.split(":")[1]: v
                for k, v in sorted(delta.items(), key=lambda kv: kv[0])
                if k.startswith("blocks:") and v
            },
        }
    fig["texts"] = [r["text"] for r in done]
    return fig


def plain_of(runs: dict, run: dict, lv: str) -> dict | None:
    """``plain``'s run paired with ``run``: same level, group and repeat (same prompts, adjacent in time)."""
    return next(
        (
            r
            for r in runs.get("plain", {}).get(lv, [])
            if (r["group"], r["repeat"]) == (run["group"], run["repeat"])
        ),
        None,
    )


def summarize(runs: dict[str, dict[str, list[dict]]]) -> dict:
    """Per configuration and level: tok/s ratio to ``plain`` (paired with plain's run of the same
    group and repeat) and to the best fixed K (each side first divided by its own group's plain)."""
    out: dict = {}
    levels = sorted({lv for per in runs.values() for lv in per}, key=int)
    for lv in levels:
        rel: dict[str, list[float]] = {}
        for name, per in runs.items():
            if name == "plain" or lv not in per:
                continue
            pairs = [(r, plain_of(runs, r, lv)) for r in per[lv]]
            pairs = [(r, p) for r, p in pairs if p is not None]
            if pairs:
                entry = {
                    "tokens_per_s": [r["tokens_per_s"] for r, _ in pairs],
                    "vs_plain": paired_ratio(
                        [r["tokens_per_s"] for r, _ in pairs], [p["tokens_per_s"] for _, p in pairs]
                    ),
                }
                if all(r.get("cpu_s") and p.get("cpu_s") for r, p in pairs):  # tokens per CPU second
                    entry["vs_plain_cpu"] = paired_ratio(
                        [r["tokens"] / r["cpu_s"] for r, _ in pairs],
                        [p["tokens"] / p["cpu_s"] for _, p in pairs],
                    )
                shares = [r["plugin"]["share"] for r, _ in pairs if "plugin" in r]
                if shares:
                    entry["plugin_share"] = shares
                rel[name] = [r["tokens_per_s"] / p["tokens_per_s"] for r, p in pairs]
                taus = [r["spec"]["tau"] for r, _ in pairs if "spec" in r]
                if taus:
                    entry["tau"] = taus
                out.setdefault(name, {})[lv] = entry
        if "plain" in runs and lv in runs["plain"]:
            out.setdefault("plain", {})[lv] = {"tokens_per_s": [r["tokens_per_s"] for r in runs["plain"][lv]]}
        fixed = [k for k in rel if k.startswith("k")]
        if not fixed:
            continue
        n = min(len(rel[k]) for k in rel)
        best = max(fixed, key=lambda k: sum(rel[k][:n]))
        for name in rel:
            if name != best:
                out[name][lv]["vs_best_fixed"] = paired_ratio(rel[name][:n], rel[best][:n]) | {
                    "best_fixed": best
                }
            if (name in ("adaptive", "warm") or name.startswith("adaptive-")) and "table" in rel:
                out[name][lv]["vs_table"] = paired_ratio(rel[name][:n], rel["table"][:n])
            if name.startswith("plugin-k") and name.removeprefix("plugin-") in rel:
                out[name][lv]["vs_vllm_same_k"] = paired_ratio(
                    rel[name][:n], rel[name.removeprefix("plugin-")][:n]
                )
    return out


def identical_texts(runs: dict[str, dict[str, list[dict]]]) -> dict:
    """For each configuration, how many of its responses equal ``plain``'s for the same prompt."""
    out = {}
    for name, per in runs.items():
        if name == "plain":
            continue
        same = total = 0
        for lv, reps in per.items():
            for mine in reps:
                base = plain_of(runs, mine, lv)
                for a, b in zip(mine["texts"], base["texts"] if base else []):
                    same, total = same + (a == b), total + 1
        out[name] = {"identical": same, "of": total}
    return out


def groups_of(names: list[str], size: int) -> list[list[str]]:
    """The configurations in groups of at most ``size`` servers up at once, ``plain`` in every group
    (the anchor each group's ratios are paired with)."""
    others = [n for n in names if n != "plain"]
    if size >= len(names) or "plain" not in names:
        return [names]
    step = max(1, size - 1)
    return [["plain", *others[i : i + step]] for i in range(0, len(others), step)]


def run_group(
    group: list[str], gi: int, prompts: list[str], args, results: dict, t_start: float, root: Path
) -> None:
    """Start ``group``'s servers, run every level's repeats on each in a rotated order, stop them; with
    ``--restart-every-repeat`` the servers start afresh for each repeat, which then runs every level
    (on this host a server's instance moves its speed by up to 6.6% for its whole life: BENCHMARKS.md)."""
    offsets, offset = {}, 0
    for lv in args.levels:  # each (level, repeat) its own prompts, the same with or without restarts
        for rep in range(args.repeats):
            offsets[lv, rep], offset = offset, (offset + lv * args.requests_per_client) % len(prompts)
    if args.restart_every_repeat:  # one server life a repeat, every level in it
        batches = [[(lv, rep) for lv in args.levels] for rep in range(args.repeats)]
    else:  # one server life, level-major
        batches = [list(offsets)]
    phase = 0
    for batch in batches:
        servers: dict[str, Server] = {}
        try:
            for n in group:
                servers[n] = Server(n, args, root)
            for s in servers.values():
                s.wait_ready(args.start_timeout)
                one_request(s.url, prompts[0], 8)  # first-call costs, not measured
            for lv, rep in batch:
                chunk = prompts[offsets[lv, rep] :] + prompts[: offsets[lv, rep]]
                order = group[phase % len(group) :] + group[: phase % len(group)]
                phase += 1
                if time.time() - t_start > args.deadline_min * 60:
                    results["not_run"].append({"group": group, "level": lv, "repeat": rep})
                    continue
                for name in order:
                    fig = measure(servers[name], chunk, lv, args)
                    results["runs"][name].setdefault(str(lv), []).append(fig | {"repeat": rep, "group": gi})
                    spec = f" tau {fig['spec']['tau']:.3f}" if "spec" in fig else ""
                    print(
                        f"group {gi} level {lv} repeat {rep} {name}: {fig['tokens_per_s']:.1f} tok/s{spec}",
                        flush=True,
                    )
                args.out.write_text(json.dumps(compact(results), indent=1))
        finally:
            for s in servers.values():
                s.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--target",
        type=Path,
        required=True,
        help="the target's Hugging Face directory (adaptspec export-vllm)",
    )
    ap.add_argument(
        "--drafter", type=Path, required=True, help="the DFlash drafter directory (adaptspec export-vllm)"
    )
    ap.add_argument("--configs", default="plain,k1,k2,k3,k4,k6,k8")
    ap.add_argument(
        "--group-size",
        type=int,
        default=3,
        help="servers up at once (a vLLM CPU server holds ~4 GB): plain and the others in groups, "
        "plain measured again in every group",
    )
    ap.add_argument(
        "--table", default="1-2:3,3-4:2,5-256:1", help="the per-batch-size table of configuration 'table'"
    )
    ap.add_argument("--adaptive-max-k", type=int, default=8)
    ap.add_argument(
        "--plugin-entry",
        default="{}",
        help="more settings of the plug-in's servers' adaptspec entry (JSON), e.g. '{\"load_rule\": \"learned\"}'",
    )
    ap.add_argument(
        "--plugin-entries",
        default="{}",
        help="settings of single plug-in configurations (JSON: configuration -> settings; a tagged "
        'KIND@TAG\'s own, else KIND\'s), e.g. \'{"adaptive-none": {"load_rule": "none"}}\'',
    )
    ap.add_argument(
        "--no-idle-drafter-skip",
        dest="idle_drafter_skip",
        action="store_false",
        help="the plug-in's servers without its worker extension (vLLM's drafter runs after every step)",
    )
    ap.add_argument(
        "--server-args",
        default="{}",
        metavar="JSON",
        help="more vLLM flags by configuration, for configurations named KIND@TAG (KIND any above), "
        'e.g. \'{"plain@nostats": ["--disable-log-stats"]}\'',
    )
    ap.add_argument(
        "--warm-spec",
        default=None,
        help="configuration 'warm': the plug-in with this one variant (a policy spec, docs/vllm.md), "
        "e.g. a head trained on vLLM traces",
    )
    ap.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--split", choices=("odd", "even", "all"), default="odd")
    ap.add_argument("--deadline-min", type=float, default=60.0, help="stop starting new runs after this long")
    ap.add_argument(
        "--restart-every-repeat",
        action="store_true",
        help="start each group's servers afresh for every repeat (which then runs every level), so the "
        "intervals over repeats hold what a server's instance adds",
    )
    ap.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON)
    ap.add_argument(
        "--ld-preload",
        default=str(CHECKOUT / ".venv-vllm" / "lib" / "libiomp5.so"),
        help="Intel OpenMP for vLLM's CPU backend (it warns that speculation loses speed without it)",
    )
    ap.add_argument("--kv-cache-gib", type=int, default=1)
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm-bench.json")
    args = ap.parse_args()
    from adaptspec.models.prompts import benchmark_prompts

    every = [p.prompt for p in benchmark_prompts()]
    prompts = {"odd": every[1::2], "even": every[0::2], "all": every}[args.split]
    names = args.configs.split(",")
    t_start = time.time()
    results: dict = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "host": host(),
        "runs": {n: {} for n in names},
        "not_run": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for gi, group in enumerate(groups_of(names, args.group_size)):
            try:
                run_group(group, gi, prompts, args, results, t_start, Path(tmp))
            except (
                RuntimeError
            ) as e:  # a server that does not start, or a request refused: said, the rest still run
                results.setdefault("failed", []).append({"group": group, "error": str(e)[-2000:]})
                print(f"group {gi} {group}: {str(e)[-300:]}", flush=True)
    results["summary"] = summarize(results["runs"])
    results["identical_to_plain"] = identical_texts(results["runs"])
    results["wall_s"] = time.time() - t_start
    results["host"]["load_average_at_end"] = list(os.getloadavg())
    args.out.write_text(json.dumps(compact(results), indent=1))
    print(
        json.dumps(
            {"summary": results["summary"], "identical_to_plain": results["identical_to_plain"]}, indent=1
        )
    )


def compact(results: dict) -> dict:
    """The results without the response texts (kept only to compare configurations)."""
    runs = {
        n: {lv: [{k: v for k, v in r.items() if k != "texts"} for r in reps] for lv, reps in per.items()}
        for n, per in results["runs"].items()
    }
    return results | {"runs": runs}


if __name__ == "__main__":
    main()
