"""The evaluation report (``adaptspec evaluate``, ``python benchmarks/evaluate.py``).

Sections: (1) replay on the bundled trace set, (2) the same acceptance re-timed for a GPU at
several batch sizes, (3) BlockPilot's published per-prompt acceptance, (4) drift, (5) cold
start, (6) end to end on the real decoder, (7) what the numbers say. One module per concern:
``core`` (splits, contexts, heads, contenders, scores), ``replay_sections`` (1-3), ``drift``,
``coldstart``, ``e2e``, ``plots``, ``findings`` (the text), ``report`` (markdown) and
``runner`` (which sections run, results.json, writing the files).
"""

from .core import Settings
from .runner import E2EOptions, Outputs, Request, run_evaluation

__all__ = ["E2EOptions", "Outputs", "Request", "Settings", "run_evaluation"]
