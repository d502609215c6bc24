"""The bundled speculator (SmolLM2-135M-Instruct + its trained drafter), loaded once per test run.

test_bundled and test_dense each decode it with exact verification; neither changes it (decoding
copies the prefill's cache), so they share one load (~2 s of CPU each time it is loaded again).
"""

from __future__ import annotations

import functools


@functools.cache
def bundled_exact():
    """The bundled pair with exact verification."""
    from adaptspec.models import load_speculator

    return load_speculator(verification="exact")
