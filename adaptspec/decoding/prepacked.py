"""A target's passes on prepacked weights: each linear layer's weight reordered once for oneDNN.

On a CPU, a bfloat16 ``nn.Linear`` runs oneDNN's matrix product, which reorders the weight into
its blocked layout at every call, and a float32 one runs MKL's, which packs it at every call. At
the row counts of a decoding round (1 to a few dozen positions a pass) that work is a large share
of the layer's time, which a weight reordered once saves (what the engine gains with it:
BENCHMARKS.md, "Decoding and the bundled pair", adaptspec's own B = 1).

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
left as they are. A weight changed since it was reordered (loaded in place, moved, cast) is
reordered again when the next block opens. The reordered copy costs the linear weights' memory once
more.

**Small products on a second copy** (``small_dtype``, the dtype ``mixed`` of
:func:`~adaptspec.models.load_speculator`): a float32 model whose layers also hold their weights
in ``small_dtype`` (bfloat16) runs every product of at most ``small_rows`` rows on that copy (the
input cast to it, the output cast back) and larger ones on the reordered float32 weight. On a CPU
without native bf16 kernels bfloat16 products are cheaper than float32 ones at one or two rows
(half the weight bytes to read) and dearer at several (every element converted): a one-token
decoding step then costs about a bfloat16 model's step and a batch's pass about a float32 model's
(BENCHMARKS.md, "Two weight copies"). The copy costs half the linear weights' float32 memory.

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
import torch.nn.functional as F
from torch import nn

#: dtypes whose linear layers are packed (where this host's oneDNN can reorder them)
DTYPES = (torch.bfloat16, torch.float32)
#: the most rows a product runs on the small copy (``small_dtype``): at 1-2 rows a bfloat16 product
#: beats a float32 one on CPUs without native bf16, at 4 they are even (BENCHMARKS.md, "Two weight copies")
SMALL_ROWS = 2


@functools.cache
def reorders(dtype: torch.dtype) -> bool:
    """Whether this host's oneDNN reorders a linear weight of ``dtype`` (tried once on a small one:
    a torch build without oneDNN, or bfloat16 on a CPU without AVX-512 BW/VL/DQ, cannot)."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    try:
        w = torch.zeros(8, 8, dtype=dtype)
        torch.ops.mkldnn._linear_pointwise(
            torch.zeros(1, 8, dtype=dtype),
            torch.ops.mkldnn._reorder_linear_weight(w, 1),
            None,
            "none",
            [],
            "",
        )
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


class SmallCopyLinear(PrepackedLinear):
    """A :class:`PrepackedLinear` whose products of at most ``small_rows`` rows run on its weight's
    copy in another dtype (``self.small``, ``self.small_bias``; the module docstring)."""

    small: torch.Tensor
    small_bias: torch.Tensor | None
    small_rows: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[0] > self.small_rows:
            return super().forward(x)
        out = F.linear(flat.to(self.small.dtype), self.small, self.small_bias).to(x.dtype)
        return out.reshape(*x.shape[:-1], out.shape[-1])


class Prepacked:
    """The plain ``nn.Linear`` layers of ``model`` with their weights reordered once (module docstring);
    ``rows``: the row count oneDNN is told to expect; ``small_dtype``: where given, each layer also
    holds its weight in that dtype for the products of at most ``small_rows`` rows (float32 layers
    only: :class:`SmallCopyLinear`).

    Opening a block costs what switching the layers' classes costs (~0.1 ms for the bundled
    target's 211 layers) plus a look at each weight's storage and version (~0.04 ms): the
    reordered weights stay on the layers (``layer.packed``, a plain attribute, not a buffer)."""

    def __init__(
        self,
        model: nn.Module,
        rows: int = 8,
        small_dtype: torch.dtype | None = None,
        small_rows: int = SMALL_ROWS,
    ) -> None:
        self.rows = rows
        self.small_dtype, self.small_rows = small_dtype, int(small_rows)
        self.layers: list[nn.Linear] = [
            sub
            for sub in model.modules()
            if type(sub) is nn.Linear
            and sub.weight.device.type == "cpu"
            and sub.weight.dtype in DTYPES
            and reorders(sub.weight.dtype)
        ]
        self._versioned = not any(
            layer.weight.is_inference() for layer in self.layers
        )  # no version counter there
        self._packed_from = self._identities()
        for layer in self.layers:
            self._pack(layer)
        self._lock = threading.Lock()
        self._inside = 0  # the on() blocks open now (nested or in other threads)
        self._switched: list[nn.Linear] = []

    def _identities(self) -> list[tuple[int, int]]:
        """What changes when a weight does: its storage (moved, cast, replaced) and its version
        (written in place, as ``load_state_dict`` does; not tracked on inference tensors)."""
        ws = [layer._parameters["weight"] for layer in self.layers]
        return [(w.data_ptr(), w._version if self._versioned else 0) for w in ws]

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        """Inside the block the packed layers run on their reordered weights (a weight changed since
        it was reordered is reordered again first); once the last open block ends they are plain
        again. A layer that is no longer a plain ``nn.Linear`` (patched since) is left as it is."""
        with self._lock:
            if self._inside == 0:
                now = self._identities()
                if now != self._packed_from:
                    for layer, a, b in zip(self.layers, now, self._packed_from):
                        if a != b and layer.weight.device.type == "cpu" and reorders(layer.weight.dtype):
                            self._pack(layer)
                    self._packed_from = self._identities()
                self._switched = [
                    layer
                    for layer in self.layers
                    if type(layer) is nn.Linear and layer.packed.dtype == layer.weight.dtype
                ]
                for layer in self._switched:
                    object.__setattr__(layer, "__class__", self._kind(layer))
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0:
                    for layer in self._switched:
                        object.__setattr__(layer, "__class__", nn.Linear)
                    self._switched = []

    def _pack(self, layer: nn.Linear) -> None:
        """Reorder ``layer``'s weight for oneDNN into ``layer.packed``, and copy a float32 one into
        ``layer.small`` when the layers hold a small copy (plain attributes: not saved, not moved)."""
        weight = layer.weight.detach()
        object.__setattr__(layer, "packed", torch.ops.mkldnn._reorder_linear_weight(weight, self.rows))
        if self.small_dtype is not None and weight.dtype == torch.float32:
            object.__setattr__(layer, "small", weight.to(self.small_dtype))
            object.__setattr__(
                layer, "small_bias", None if layer.bias is None else layer.bias.detach().to(self.small_dtype)
            )
            object.__setattr__(layer, "small_rows", self.small_rows)

    def _kind(self, layer: nn.Linear) -> type[PrepackedLinear]:
        """The class ``layer`` runs as inside a block: with its small copy where the layers hold one
        (a float32 weight's, made by :meth:`_pack` whenever the weight changes)."""
        small = self.small_dtype is not None and layer.weight.dtype == torch.float32
        return SmallCopyLinear if small else PrepackedLinear
