"""A speculator of a user's own over the tiny model, for the servers' one-request-at-a-time runner.

adaptspec's own decoder (a ``SpeculativeDecoder``) is served by the batched engine; a speculator
that is not adaptspec's is served one request at a time through its controller
(``adaptspec.serving.engine.sequential``). :class:`OwnSpeculator` is such a speculator, written as a user
would (the protocol's ``prefill``/``decode``/``max_block_size``/``feature_dim``), over a real decoder.
"""

from __future__ import annotations

from typing import Any


class OwnSpeculator:
    """The speculator protocol over ``inner`` (a real decoder), in a class that is not adaptspec's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.max_block_size = inner.max_block_size
        self.feature_dim = inner.feature_dim

    def prefill(self, prompt_ids: Any, temperature: float = 0.0, seed: int | None = None) -> Any:
        return self.inner.prefill(prompt_ids, temperature=temperature, seed=seed)

    def decode(self, prefill: Any, block_size: Any, max_new_tokens: int, temperature: float = 0.0,
               seed: int | None = None, on_round: Any = None) -> Any:
        return self.inner.decode(prefill, block_size, max_new_tokens, temperature=temperature, seed=seed,
                                 on_round=on_round)
