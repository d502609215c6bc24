"""What this host's kernels can do, read from the CPU's flags and the variables that restrict them.

The tests whose subject depends on the host (prepacked weights, bfloat16 products) take their
expectation from here: an independent reading of the host, not the library's own probe
(``adaptspec.decoding.prepacked.reorders`` tries a reorder and catches the failure).

oneDNN reorders a bfloat16 linear weight where it may use AVX-512 with BW/VL/DQ, or
AVX-NE-CONVERT (the AVX2 kind of CPU has neither); ``ONEDNN_MAX_CPU_ISA`` caps what it may use,
and ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` runs a test as an AVX2-only host does
(README, "Testing").
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

#: ``ONEDNN_MAX_CPU_ISA`` values that leave oneDNN no AVX-512 (oneDNN's names, upper case)
BELOW_AVX512 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2"}
#: the AVX2-kind caps that still allow AVX-NE-CONVERT
WITH_NE_CONVERT = {"AVX2_VNNI_2"}


def cpu_flags() -> set[str]:
    """The flags of the first processor in /proc/cpuinfo (empty where there is none)."""
    path = Path("/proc/cpuinfo")
    if not path.exists():
        return set()
    for line in path.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def onednn_reorders(dtype: torch.dtype) -> bool:
    """Whether oneDNN on this host, under this process's ``ONEDNN_MAX_CPU_ISA``, reorders a linear
    weight of ``dtype`` (float32: wherever oneDNN runs; bfloat16: see the module docstring)."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    if dtype != torch.bfloat16:
        return False
    flags = cpu_flags()
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").strip().upper()
    avx512 = {"avx512bw", "avx512vl", "avx512dq"} <= flags and cap not in BELOW_AVX512
    ne_convert = "avx_ne_convert" in flags and (cap not in BELOW_AVX512 or cap in WITH_NE_CONVERT)
    return avx512 or ne_convert
