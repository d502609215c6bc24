"""A target's passes on prepacked weights: each linear layer's weight reordered once for oneDNN.

On a CPU, a bfloat16 ``nn.Linear`` runs oneDNN's matrix product, which reorders the weight into
its blocked layout at every call, and a float32 one runs MKL's, which packs it at every call. At
the row counts of a decoding round (1 to a few dozen positions a pass) that work is a large share
of the layer's time. Measured on an AMD EPYC host with AVX-512 BF16 (2 threads, the bundled
target's 30 layers and head, BENCHMARKS.md "Prepacked linear weights"): the linear layers of one
pass at 8 rows take 16.0 ms on their own bfloat16 weights against 10.2 ms on reordered ones,
38.0 ms in float32 against 17.7 ms, and at one row 12.8 against 7.3 ms in bfloat16.

:class:`Prepacked` reorders the weight of every plain ``nn.Linear`` of a model once
(``torch.ops.mkldnn._reorder_linear_weight``) and, inside :meth:`Prepacked.on`, runs those
layers on the reordered weights (``torch.ops.mkldnn._linear_pointwise``). A
:class:`~adaptspec.decoding.TargetModel` holds one (``prepacked=True``, the default) and runs
its passes inside it, as does the batching engine; outside them the model is its own again
(saving it, another wrapper's forward). ``on`` nests and may be entered from several threads at
once: the layers are switched when the first enters and back when the last leaves. In bfloat16
the product is the one oneDNN runs on the layer's own weight: bit-identical (tested); in float32
it is oneDNN's product instead of MKL's, the same function to rounding. Layers that are not
plain ``nn.Linear`` (an exact target's row-padded ones), a weight of a dtype this host's oneDNN
cannot reorder (bfloat16 needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT), or on another device, are
left as they are. The reordered copy costs the linear weights' memory once more.

>>> import torch
>>> lin = torch.nn.Sequential(torch.nn.Linear(16, 8)).to(torch.bfloat16)
>>> packed = Prepacked(lin)
>>> x = torch.randn(3, 16).to(torch.bfloat16)
>>> with packed.on():
...     y = lin(x)
>>> len(packed.layers) == int(reorders(torch.bfloat16)), torch.equal(y, torch.nn.functional.linear(x, lin[0].weight, lin[0].bias))
(True, True)
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Iterator

import torch
from torch import nn

#: dtypes whose linear layers are packed (where this host's oneDNN can reorder them)
DTYPES = (torch.bfloat16, torch.float32)


@functools.cache
def reorders(dtype: torch.dtype) -> bool:
    """Whether this host's oneDNN reorders a linear weight of ``dtype`` (tried once on a small one:
    a torch build without oneDNN, or bfloat16 on a CPU without AVX-512 BW/VL/DQ, cannot)."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    try:
        w = torch.zeros(8, 8, dtype=dtype)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 8, dtype=dtype),
                                           torch.ops.mkldnn._reorder_linear_weight(w, 1), None, "none", [], "")
    except RuntimeError:
        return False
    return True


class PrepackedLinear(nn.Linear):
    """An ``nn.Linear`` whose product runs on its weight reordered for oneDNN (``self.packed``)."""

    packed: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], out.shape[-1])


class Prepacked:
    """The plain ``nn.Linear`` layers of ``model`` with their weights reordered once (module docstring);
    ``rows``: the row count oneDNN is told to expect."""

    def __init__(self, model: nn.Module, rows: int = 8) -> None:
        self.layers: list[tuple[nn.Linear, torch.Tensor]] = []
        for sub in model.modules():
            w = getattr(sub, "weight", None)
            if (type(sub) is nn.Linear and w is not None and w.device.type == "cpu" and w.dtype in DTYPES
                    and reorders(w.dtype)):
                self.layers.append((sub, torch.ops.mkldnn._reorder_linear_weight(w.detach(), rows)))
        self._lock = threading.Lock()
        self._inside = 0  # the on() blocks open now (nested or in other threads)
        self._switched: list[nn.Linear] = []

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        """Inside the block the packed layers run on their reordered weights; once the last open
        block ends they are plain again. A layer that is no longer a plain ``nn.Linear`` (patched
        since) is left as it is."""
        with self._lock:
            if self._inside == 0:
                self._switched = [layer for layer, _ in self.layers if type(layer) is nn.Linear]
                for layer, packed in self.layers:
                    if type(layer) is nn.Linear:
                        layer.packed = packed
                        layer.__class__ = PrepackedLinear
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0:
                    for layer in self._switched:
                        layer.__class__ = nn.Linear
                        del layer.packed
                    self._switched = []
