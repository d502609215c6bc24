"""Import BlockPilot's per-prompt result folders as a (summary-level) trace set."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .._util.files import read_json
from .parquet import _err
from .schema import SCHEMA_VERSION
from .traceset import TraceSet

_BP_FOLDER = re.compile(r"^(?P<dataset>.+)_(?P<start>\d+)T(?P<temp>\d+(?:\.\d+)?)$")


def _load_json_map(path: Path) -> dict[str, Any]:
    d = read_json(path, "a BlockPilot result file")
    if not isinstance(d, dict) or not d:
        raise _err(str(path), "expected a non-empty JSON object {prompt index: value}")
    for k, v in d.items():
        if not re.fullmatch(r"\d+", str(k)):
            raise _err(str(path), f"key {k!r} is not a prompt index")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _err(str(path), f"prompt {k}: {v!r} is not a finite number")
    return d


def _read_blockpilot_folder(folder: Path) -> dict[str, Any]:
    sizes: dict[int, dict[str, Any]] = {}
    ignored = []
    for p in sorted(folder.glob("*.json")):
        if re.fullmatch(r"\d+", p.stem):
            sizes[int(p.stem)] = _load_json_map(p)
        elif p.name != "mapped_from_1.json":
            ignored.append(p.name)
    mapped_path = folder / "mapped_from_1.json"
    mapped = _load_json_map(mapped_path) if mapped_path.exists() else None
    choice = None
    if 1 in sizes:
        others = sorted(b for b in sizes if b != 1)
        vals = np.asarray(list(sizes[1].values()), dtype=np.float64)
        integral = bool(np.all(vals == np.round(vals)))
        in_range = bool(others) and integral and bool(np.all((vals >= others[0]) & (vals <= others[-1])))
        if in_range and (mapped is not None or not np.all(vals == 1)):
            choice = {k: int(v) for k, v in sizes.pop(1).items()}
        elif mapped is not None:
            raise _err(
                str(folder / "1.json"),
                "mapped_from_1.json is present, so 1.json should hold the selector's "
                f"block size per prompt (integers in {others[0]}..{others[-1]}), but it does not",
            )
        elif not np.all(vals == 1):
            raise _err(
                str(folder / "1.json"),
                f"values are neither tau at block size 1 (all 1.0) nor block sizes among {others}",
            )
    if not sizes:
        raise _err(str(folder), "no {block size}.json files")
    prompts = sorted(next(iter(sizes.values())), key=int)
    ref_name = f"{next(iter(sizes))}.json"
    files = {f"{b}.json": d for b, d in sizes.items()}
    if choice is not None:
        files["1.json"] = choice
    if mapped is not None:
        files["mapped_from_1.json"] = mapped
    for fname, d in files.items():
        if set(d) != set(prompts):
            extra = sorted(set(d) - set(prompts), key=int)
            miss = sorted(set(prompts) - set(d), key=int)
            what = f"prompt {miss[0]} missing" if miss else f"prompt {extra[0]} not in {ref_name}"
            raise _err(str(folder / fname), what)
    for b, d in sizes.items():
        for k, v in d.items():
            if not 1 - 1e-9 <= v <= b + 1e-9:
                raise _err(str(folder / f"{b}.json"), f"prompt {k}: tau {v} outside 1..{b}")
    arms = sorted(sizes)
    if choice is not None:
        for k, b in choice.items():
            if b not in sizes:
                raise _err(str(folder / "1.json"), f"prompt {k}: chosen block size {b} has no {b}.json")
        if mapped is not None:
            for k, v in mapped.items():
                at = sizes[choice[k]][k]
                if abs(v - at) > 1e-9 * max(1.0, abs(at)):
                    raise _err(
                        str(mapped_path),
                        f"prompt {k}: tau {v} but {choice[k]}.json has {at} "
                        f"at the chosen block size {choice[k]}",
                    )
    return {
        "sizes": sizes,
        "arms": arms,
        "prompts": prompts,
        "choice": choice,
        "mapped": mapped,
        "ignored": ignored,
    }


def import_blockpilot(
    path: str | os.PathLike,
    *,
    target: str | None = None,
    drafter: str | None = None,
    hardware: str | None = None,
) -> TraceSet:
    """Import a BlockPilot per-prompt result folder (or a folder of them) as a trace set.

    A result folder ``{dataset}_{N}T{temperature}`` holds ``{B}.json`` files mapping prompt
    index -> mean tau at block size B. In the BlockPilot release ``1.json`` is not block size
    1 but the selector's chosen block size per prompt (detected: integers within the other
    files' range, or ``mapped_from_1.json`` present); it becomes the request column
    ``blockpilot_choice``, and ``mapped_from_1.json`` (tau at that choice) is cross-checked.
    The result is summary-level: no features, no per-round lists, no timings.
    """
    root = Path(path)
    if not root.is_dir():
        raise _err(str(root), "no such directory")
    if any(root.glob("*.json")):
        folders = [root]
    else:
        folders = sorted(p for p in root.iterdir() if p.is_dir() and any(p.glob("*.json")))
        if not folders:
            raise _err(
                str(root),
                "no BlockPilot result folder here ({block size}.json files, or subfolders holding them)",
            )
    ids, domains, pidx, choice_col, temps = [], [], [], [], []
    tau_rows = []
    arms = None
    first_folder = None
    ignored = []
    for f in folders:
        data = _read_blockpilot_folder(f)
        if arms is None:
            arms, first_folder = data["arms"], f
        elif data["arms"] != arms:
            raise _err(str(f), f"block sizes {data['arms']} differ from {first_folder.name}'s {arms}")
        m = _BP_FOLDER.match(f.name)
        dataset = m.group("dataset") if m else f.name
        temp = float(m.group("temp")) if m else None
        ignored += [f"{f.name}/{n}" for n in data["ignored"]]
        for k in data["prompts"]:
            ids.append(f"{f.name}/{k}")
            domains.append(dataset)
            pidx.append(int(k))
            choice_col.append(None if data["choice"] is None else data["choice"][k])
            temps.append(temp)
            tau_rows.append([float(data["sizes"][b][k]) for b in arms])
    uniq_t = sorted({t for t in temps if t is not None})
    meta = {
        "schema_version": SCHEMA_VERSION,
        "source": {
            "kind": "blockpilot",
            "path": str(root.resolve()),
            "folders": [f.name for f in folders],
            **({"ignored": ignored} if ignored else {}),
        },
        "target": target,
        "drafter": drafter,
        "hardware": hardware,
        "temperature": uniq_t[0] if len(uniq_t) == 1 else None,
    }
    cols: dict[str, Any] = {
        "prompt_index": pa.array(pidx, pa.int64()),
        "blockpilot_choice": pa.array(choice_col, pa.int64()),
        "temperature": pa.array(temps, pa.float64()),
    }
    return TraceSet.from_arrays(ids, domains, arms, np.asarray(tau_rows), request_columns=cols, meta=meta)
