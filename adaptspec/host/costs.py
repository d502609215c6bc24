"""This host's measured round costs, per dtype, cached under the user's cache directory.

:func:`host_costs` returns the record for a key (:func:`~adaptspec.host.identity.host_key`): read
from ``<cache>/host/<digest>.json`` when one is there for that key, else measured
(:mod:`adaptspec.host.timing`, every dtype of :data:`TIMED_DTYPES`) and written. ``remeasure``
measures again. A record that cannot be read, is not one, or belongs to another key is refused
in one line (:func:`read_record`), and :func:`host_costs` then measures again and replaces it.
Each dtype's profile is also written next to it as a latency profile file
(``<digest>-<dtype>.json``), which ``--latency`` and the machine-speed reference can name.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..costs.latency import LatencyProfile
from ..errors import AdaptspecError
from .identity import describe, key_digest

FORMAT = 2  # 2: passes timed on prepacked linear weights (batching.prepacked), as the engine runs them
KIND = "adaptspec-host-costs"
#: The dtypes timed (the engine runs the one that decodes fastest here); ``mixed``: float32 with a
#: bfloat16 weight copy for one- and two-row products (:data:`adaptspec.models.bundled.MIXED`)
TIMED_DTYPES = ("bfloat16", "float32", "mixed")

log = logging.getLogger("adaptspec.host")


def host_dir() -> Path:
    """``<cache>/host``: the cache directory of :func:`adaptspec.decoding.loading.cache_dir`."""
    from ..decoding.loading import cache_dir

    return cache_dir() / "host"


@dataclass(frozen=True)
class HostCosts:
    """One host's measured profiles by dtype, with the seconds each timing took (``timing_s``: wall
    seconds by dtype, and ``"<dtype> cpu"``: its CPU seconds, which a busy host does not inflate)."""

    key: dict[str, Any]
    profiles: dict[str, LatencyProfile]
    timing_s: dict[str, float]
    directory: Path
    measured_at: str = ""
    fresh: bool = field(default=False, compare=False)  # measured by this call (not read from the cache)

    @property
    def digest(self) -> str:
        return key_digest(self.key)

    @property
    def path(self) -> Path:
        return self.directory / f"{self.digest}.json"

    def profile_path(self, dtype: str) -> Path:
        return self.directory / f"{self.digest}-{dtype}.json"

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kind": KIND,
            "key": self.key,
            "measured_at": self.measured_at,
            "timing_s": self.timing_s,
            "profiles": {d: p.to_dict() for d, p in self.profiles.items()},
        }


def write_record(costs: HostCosts) -> None:
    """Write ``costs`` and each dtype's profile file (temporary files, then renames)."""
    costs.directory.mkdir(parents=True, exist_ok=True)
    for dtype, profile in costs.profiles.items():
        profile.save(costs.profile_path(dtype))
    tmp = costs.path.with_name(f".{costs.path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(costs.to_dict(), indent=2) + "\n")
    os.replace(tmp, costs.path)


def read_record(path: Path, key: Mapping[str, Any]) -> HostCosts:
    """The record at ``path`` for ``key``; an :class:`AdaptspecError` of one line naming the file
    when it cannot be read, is not a host cost record, or was measured for another key."""
    from .._util.files import read_json

    try:
        d = read_json(path, "a host cost record")
    except AdaptspecError as e:  # it names the file
        raise AdaptspecError(f"host cost record refused: {e}") from None
    try:
        if not isinstance(d, dict) or d.get("kind") != KIND or d.get("format") != FORMAT:
            raise ValueError(f"not a {KIND} record of format {FORMAT}")
        if d.get("key") != dict(key):
            raise ValueError("measured for another host, torch or model (its key differs)")
        profiles = {str(k): LatencyProfile.from_dict(v) for k, v in dict(d["profiles"]).items()}
        timing = {str(k): float(v) for k, v in dict(d["timing_s"]).items()}
        if not profiles:
            raise ValueError("no dtype was timed")
    except (AdaptspecError, KeyError, TypeError, ValueError) as e:
        raise AdaptspecError(f"host cost record refused: {path}: {e}") from None
    return HostCosts(dict(key), profiles, timing, path.parent, str(d.get("measured_at", "")))


def measure(
    load: Callable[[str], Any],
    key: Mapping[str, Any],
    dtypes: Sequence[str] = TIMED_DTYPES,
    directory: Path | None = None,
) -> HostCosts:
    """Time every dtype of ``dtypes`` on the speculator ``load(dtype)`` returns (loaded, timed, let go)."""
    from .timing import fit_host_profile, time_rounds

    profiles, timing = {}, {}
    for dtype in dtypes:
        speculator = load(dtype)
        t0, c0 = time.perf_counter(), time.process_time()
        records = time_rounds(speculator)
        timing[dtype] = round(time.perf_counter() - t0, 2)
        timing[f"{dtype} cpu"] = round(time.process_time() - c0, 2)  # the timing's own CPU seconds
        profiles[dtype] = fit_host_profile(
            records,
            f"host-{key_digest(dict(key))}-{dtype}",
            f"{len(records)} engine passes timed (CPU seconds, one thread) on {describe(dict(key))}, {dtype}",
        )
        del speculator
    return HostCosts(
        dict(key),
        profiles,
        timing,
        directory or host_dir(),
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        fresh=True,
    )


def host_costs(
    load: Callable[[str], Any],
    key: Mapping[str, Any],
    *,
    remeasure: bool = False,
    dtypes: Sequence[str] = TIMED_DTYPES,
    directory: Path | None = None,
) -> HostCosts:
    """The cached record for ``key``, or a fresh measurement (written to the cache); see the module docstring."""
    where = directory or host_dir()
    path = where / f"{key_digest(dict(key))}.json"
    if not remeasure and path.exists():
        try:
            costs = read_record(path, key)
            if set(dtypes) <= set(costs.profiles):
                return costs
        except AdaptspecError as e:
            log.warning("%s; measuring again", e)
    costs = measure(load, key, dtypes, where)
    try:
        write_record(costs)
    except OSError as e:  # a read-only cache: the measurement still holds for this process
        log.warning("host costs not cached (%s): measured again next time", e)
    return costs
