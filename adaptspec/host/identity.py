"""Which host a cost measurement belongs to: the CPU, its flags, torch and the kernels torch may use.

A round's cost depends on the instructions torch's kernels run (AVX2 or AVX-512, native bf16 or
not), which hosts of one machine kind differ in, and which ``ATEN_CPU_CAPABILITY`` and
``ONEDNN_MAX_CPU_ISA`` restrict. The key names all of it, and the models and threads timed, so
that a measurement is reused only where it holds.

>>> key = host_key(models="bundled", threads=2)
>>> sorted(key) == sorted(KEY_FIELDS)
True
>>> key_digest(key) == key_digest(dict(key)), len(key_digest(key))
(True, 16)
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from typing import Any

#: The environment variables that restrict torch's CPU kernels (part of the key).
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
KEY_FIELDS = ("cpu_model", "cpu_flags", "machine", "torch", "capability", *KERNEL_ENV, "threads", "models")


def cpu_description() -> tuple[str, str]:
    """``(model name, space-separated flags)`` from ``/proc/cpuinfo``; the platform's processor
    name and no flags where there is no such file."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return platform.processor() or platform.machine(), ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() not in fields:
            fields[name.strip()] = value.strip()
    return fields.get("model name", platform.processor() or platform.machine()), fields.get("flags", "")


def host_key(models: str, threads: int) -> dict[str, Any]:
    """The key of a measurement of ``models`` (which target, drafter and verification) at
    ``threads`` torch threads on this host."""
    import torch

    model, flags = cpu_description()
    return {
        "cpu_model": model,
        "cpu_flags": " ".join(sorted(flags.split())),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "capability": str(torch.backends.cpu.get_cpu_capability()),
        **{name: os.environ.get(name, "") for name in KERNEL_ENV},
        "threads": int(threads),
        "models": str(models),
    }


def key_digest(key: dict[str, Any]) -> str:
    """A short digest of ``key`` (the cache file's name)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def describe(key: dict[str, Any]) -> str:
    """One line: the CPU, torch's kernels and the restricting variables set.

    >>> describe({"cpu_model": "AMD EPYC", "capability": "AVX2", "cpu_flags": "avx2 avx512_bf16",
    ...           "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "", "threads": 2})
    'AMD EPYC, torch kernels AVX2 (ATEN_CPU_CAPABILITY=avx2), bf16 in the CPU flags, 2 threads'
    """
    env = ", ".join(f"{k}={key[k]}" for k in KERNEL_ENV if key.get(k))
    flags = set(str(key.get("cpu_flags", "")).split())
    bf16 = "bf16 in the CPU flags" if flags & {"avx512_bf16", "amx_bf16"} else "no bf16 in the CPU flags"
    return (
        f"{key['cpu_model']}, torch kernels {key['capability']}{f' ({env})' if env else ''}, {bf16}, "
        f"{key['threads']} threads"
    )
