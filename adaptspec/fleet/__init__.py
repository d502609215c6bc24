"""Fleet learning: replicas of a server share one policy's statistics (see docs/serving.md#fleet).

- :mod:`~adaptspec.fleet.stats`: each policy family's additive statistics, and how a policy is
  rebuilt from prior + the sum over replicas (and which policies cannot be shared, and why);
- :mod:`~adaptspec.fleet.wire`: one replica's statistics as bytes;
- :mod:`~adaptspec.fleet.backend`: the backend protocol and the in-process backend;
- :mod:`~adaptspec.fleet.redis_backend`: Redis (``redis://HOST:PORT/NAME``, the ``fleet`` extra);
- :mod:`~adaptspec.fleet.shared_state`: :class:`SharedState`, one controller's link to the fleet;
- :mod:`~adaptspec.fleet.logs`: the decision logs of every replica, read as one;
- :mod:`~adaptspec.fleet.replay`: the fleet replay simulator (learning curves per replica).
"""

from .backend import MemoryBackend
from .shared_state import SharedState, claimed_states
from .stats import family_for

__all__ = ["MemoryBackend", "SharedState", "claimed_states", "family_for"]
