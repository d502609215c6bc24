"""Issue 38, items 16 and 18: nothing read from a user's folder runs code; nothing a server shows
tells where its files live or what the Redis password is.

- a river policy's state is data only: a checkpoint holding a pickle (a hostile one whose
  ``__reduce__`` would create a marker file) is refused with one line and the marker is never
  created, from the library, ``ab-report --checkpoint-dir`` and ``serve --checkpoint-dir``;
- ``/health`` shows checkpoint and log folders by their names, not their paths;
- a ``--shared`` URL's password never appears in a message.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from adaptspec.errors import AdaptspecError
from adaptspec.fleet.redis_backend import parse_url, redact

from _redis import free_port


def cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adaptspec", *argv], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


# ----------------------------------------------------------------------------- the Redis password
@pytest.mark.parametrize("url", ["redis://admin:hunter2@127.0.0.1:99999/x", "redis://:hunter2@127.0.0.1:6379/",
                                 "redis://admin:hunter2@127.0.0.1:6379/a?b", "http://u:hunter2@h/x",
                                 "redis://u:hun/ter2@h/x", "redis://u:hunter2@[::1/x"])
def test_a_bad_shared_url_never_shows_its_password(url):
    with pytest.raises(AdaptspecError) as e:
        parse_url(url)
    assert "hunter2" not in str(e.value) and "hun/ter2" not in str(e.value) and "***" in str(e.value)


def test_redact_keeps_the_user_and_host():
    assert redact("redis://admin:pw@10.0.0.5:6380/prod") == "redis://admin:***@10.0.0.5:6380/prod"
    assert redact("redis://10.0.0.5:6380/prod") == "redis://10.0.0.5:6380/prod"
    assert redact("redis://token@h/x") == "redis://***@h/x"


@pytest.mark.integration
@pytest.mark.parametrize("url", ["redis://admin:hunter2@127.0.0.1:99999/fleet",
                                 "redis://admin:hunter2@127.0.0.1:{closed}/fleet"])
def test_serve_never_prints_the_redis_password(url):
    p = cli("serve", "--tiny", "--shared", url.format(closed=free_port()), "--port", str(free_port()))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "hunter2" not in p.stderr + p.stdout


# ----------------------------------------------------------------------------- /health and paths
@pytest.mark.integration
@pytest.mark.slow
def test_health_shows_folder_names_not_paths(tmp_path):
    from test_serving import Server, complete

    srv = Server(tmp_path, "--checkpoint-every", "1")
    srv.start()
    try:
        for i in range(3):
            complete(srv.url, {"prompt": [5, 6, 7 + i], "max_tokens": 4, "variant": "A"})
    finally:
        srv.stop()
    srv.start()  # resumes from a checkpoint
    try:
        text = httpx.get(srv.url + "/health", timeout=60).text
        resumed = json.loads(text)["variants"]["A"]["resumed"]
        assert resumed["checkpoint"].startswith("A/ckpt-"), resumed
        assert str(tmp_path) not in text and str(tmp_path.resolve()) not in text
    finally:
        srv.stop()
