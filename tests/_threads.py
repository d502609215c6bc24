"""The torch thread count while a test (or a module's tests) runs, restored after."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the body on ``n`` torch threads; the count before is restored after, whatever happens."""
    import torch  # here: test modules that import this need not import torch at collection

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
