"""Test markers: the inner loop is ``pytest -m "not slow and not integration"`` (under 2 minutes
on 2 cores); ``.ci/run`` runs everything.

- ``integration``: starts something real beside the test process: an HTTP server on loopback,
  Redis, a local Ray cluster, or the ``adaptspec`` CLI in a subprocess. Whole files that do are
  listed in :data:`INTEGRATION_FILES`; a test elsewhere carries the marker itself.
- ``slow``: takes more than a few seconds on 2 cores (loads the bundled target, trains, or
  decodes many tokens); marked on the test.
"""

from __future__ import annotations

import pytest

#: Files whose every test starts a server, Redis, Ray or a CLI subprocess.
INTEGRATION_FILES = {
    "test_examples.py",
    "test_fleet_ab.py",
    "test_fleet_identity.py",
    "test_fleet_redis.py",
    "test_fleet_serve.py",
    "test_openai_client.py",
    "test_ray.py",
    "test_serving.py",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a few seconds on 2 cores")
    config.addinivalue_line("markers", "integration: starts a server, Redis, Ray or a CLI subprocess")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in INTEGRATION_FILES:
            item.add_marker(pytest.mark.integration)
