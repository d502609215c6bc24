"""Where the shipped files are that packages low in the import graph read.

:data:`BUNDLED_HEAD` is read by the policies (the neural-linear head and its featurizer) and by
the bundled models (:func:`adaptspec.models.bundled.paired_head`), so it lives below both.

>>> BUNDLED_HEAD.name
'smollm2-135m-head'
"""

from __future__ import annotations

from pathlib import Path

#: The offline head (and its featurizer) trained on the bundled default trace set, the public
#: benchmark prompts' (:data:`adaptspec.traces.DEFAULT_TRACES`, ``adaptspec/data/traces/benchmarks``).
BUNDLED_HEAD = Path(__file__).resolve().parent / "models" / "weights" / "smollm2-135m-head"
