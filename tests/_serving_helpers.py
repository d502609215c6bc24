"""A speculator of a user's own over the tiny model, for the servers' one-request-at-a-time runner.

adaptspec's own decoder (a ``SpeculativeDecoder``) is served by the batched engine; a speculator
that is not adaptspec's is served one request at a time through its controller
(``adaptspec.serving.engine.sequential``). :class:`OwnSpeculator` is such a speculator, written as a user
would (the protocol's ``prefill``/``decode``/``max_block_size``/``feature_dim``), over a real decoder.

Also the clients of the server tests: :func:`wait_up` (a server process answering), :func:`post_all`
(requests at once) and :func:`sse` (a stream's events).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx


class OwnSpeculator:
    """The speculator protocol over ``inner`` (a real decoder), in a class that is not adaptspec's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.max_block_size = inner.max_block_size
        self.feature_dim = inner.feature_dim

    def prefill(self, prompt_ids: Any, temperature: float = 0.0, seed: int | None = None) -> Any:
        return self.inner.prefill(prompt_ids, temperature=temperature, seed=seed)

    def decode(
        self,
        prefill: Any,
        block_size: Any,
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        on_round: Any = None,
    ) -> Any:
        return self.inner.decode(
            prefill, block_size, max_new_tokens, temperature=temperature, seed=seed, on_round=on_round
        )


class ThreadServer:
    """``app`` served by the server's own uvicorn configuration on a free loopback port, on a
    thread of this process (a context manager: started on enter, stopped and joined on exit)."""

    def __init__(self, app: Any, log_level: str = "warning") -> None:
        import threading

        import uvicorn

        from _redis import free_port
        from adaptspec.serving.connections import uvicorn_config

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn_config(
                app, host="127.0.0.1", port=self.port, log_config=None, log_level=log_level, lifespan="on"
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "ThreadServer":
        import time

        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        assert not self.thread.is_alive()


def sse(text: str) -> list[dict]:
    """The JSON events of a server-sent event stream's text."""
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def wait_up(proc, url: str, out: Path, timeout: float = 120) -> None:
    """Until the server process ``proc`` answers ``url``/health (its output ``out`` shown if it exits first)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {out.read_text()[-3000:]}")
        try:
            httpx.get(url + "/health", timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("server did not start")


def post_all(url: str, bodies: list[dict]) -> list[httpx.Response]:
    """The bodies posted at once, each on its own client (bounded: a request not answered in 120 s fails)."""

    def one(body):
        with httpx.Client(timeout=120) as c:
            return c.post(url + "/v1/completions", json=body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))
