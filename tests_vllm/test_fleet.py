"""The fleet across vLLM replicas (``shared``): two plug-ins, as two data-parallel vLLM engines would
hold, learn through one real Redis (tests/_redis.py). The plug-ins are driven through their own
API with plain values, as the scheduler drives them; no engine is needed to show the sharing."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _redis import RedisServer  # noqa: E402


@pytest.fixture()
def redis_url(tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server.url
    finally:
        server.stop()


def _serve(plugin, request_id: str, tokens: int = 12) -> None:
    """One request through the plug-in's hooks: admitted, decided, cut, one round a step, finished."""
    plugin.admit(request_id, list(range(1, 30)), None)
    plugin.decide(request_id, 1, rows=1, queue=0, max_tokens=tokens, temperature=0.0)
    out = [7]
    while len(out) < tokens:
        cut = plugin.cut({request_id: [5] * 4}, rows=1, queue=0)
        drafted = len(cut[request_id])
        committed = min(1 + min(drafted, 2), tokens - len(out))  # two drafts accepted, then a rejection
        plugin.observe([(request_id, 1 + drafted, 30 + len(out), drafted, committed)], step_s=0.01)
        out += [7] * committed
    plugin.finish(request_id, out, "length")


def test_two_replicas_learn_from_each_others_requests(redis_url, tmp_path):
    from adaptspec.vllm.config import plugin_settings
    from adaptspec.vllm.plugin import AdaptspecPlugin

    def replica(name):
        entry = {
            "shared": f"{redis_url}/fleet",
            "replica_id": name,
            "sync_every": 1,
            "sync_interval": 0.05,
            "log_dir": str(tmp_path / name / "log"),
        }
        return AdaptspecPlugin(plugin_settings({"adaptspec": entry}), 4, "sim")

    one, two = replica("one"), replica("two")
    try:
        for i in range(4):
            _serve(one, f"a{i}")
        _serve(two, "b0")
        ctl_one, ctl_two = one.controllers["default"].sync(), two.controllers["default"].sync()
        deadline = time.monotonic() + 60  # the sync threads publish and merge in the background
        while time.monotonic() < deadline and ctl_two.stats()["shared"]["fleet_updates"] < 5:
            time.sleep(0.05)
        assert ctl_two.stats()["shared"]["local_updates"] == 1
        assert (
            ctl_two.stats()["shared"]["fleet_updates"] == 5
            and ctl_two.stats()["shared"]["other_replicas"] == 1
        )
        assert ctl_one.stats()["shared"]["local_updates"] == 4
    finally:
        one.close()
        two.close()
