"""Every Python process of the vLLM tests, as an AVX2-only host runs it (README, "Testing").

``tests_vllm/run`` puts this folder on ``PYTHONPATH`` when ``ONEDNN_MAX_CPU_ISA=AVX2`` is set. The two
variables cap torch's and oneDNN's kernels; vLLM's CPU build picks its own kernels (``vllm._C`` for
AVX-512 with bfloat16, ``vllm._C_AVX512``, ``vllm._C_AVX2``) and attention paths by asking torch whether
the CPU has AVX-512, which the variables do not change. Here torch answers as such a host's would, so
vLLM loads and runs its AVX2 build, in the test process and in every process it starts.
"""

import importlib.util
import os

# (a Python without torch, such as pip's in a venv still being made, has no kernels to choose)
if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() == "AVX2" and importlib.util.find_spec("torch"):
    import torch.cpu

    torch.cpu._is_avx512_supported = lambda: False
    torch.cpu._is_avx512_bf16_supported = lambda: False
