"""Prometheus metric families of fleet sharing, per variant (only variants that share).

- ``adaptspec_shared_state_up`` (gauge): 1 when the last publish and fetch worked, 0 while the
  backend cannot be reached (the replica then decides and learns from its local state);
- ``adaptspec_shared_syncs_total`` / ``adaptspec_shared_sync_errors_total``: publish+fetch
  rounds that worked / failed;
- ``adaptspec_shared_refused_total``: other replicas' entries refused (another policy, a malformed
  blob), each distinct blob counted once;
- ``adaptspec_shared_refused_entries``: entries skipped at the last fetch (0 when all were merged);
- ``adaptspec_shared_unpublished_updates``: own updates the fleet has not seen yet;
- ``adaptspec_shared_fleet_updates``: updates in the merged statistics (own + published by the others);
- ``adaptspec_shared_other_replicas``: replicas whose statistics were merged;
- ``adaptspec_shared_last_sync_age_seconds``: since the last sync that worked;
- ``adaptspec_fleet_lease_held``: 1 while this replica holds its replica id's lease, 0 once it
  lost it (another process claimed the id: this one stops publishing);
- ``adaptspec_fleet_lease_seconds_left``: how long the lease lasts without another renewal (the
  sync thread renews it at every sync; it falls towards 0 while the backend cannot be reached).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

__all__ = ["shared_families"]


def shared_families(controllers: Mapping[str, Any]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    v = ["variant"]
    up = GaugeMetricFamily(
        "adaptspec_shared_state_up",
        "1 if the last sync with the shared state worked, else 0 (serving from local state)",
        labels=v,
    )
    syncs = CounterMetricFamily(
        "adaptspec_shared_syncs", "Publish+fetch rounds with the shared state that worked", labels=v
    )
    errs = CounterMetricFamily(
        "adaptspec_shared_sync_errors",
        "Publish+fetch rounds that failed (shared state unreachable)",
        labels=v,
    )
    refused = CounterMetricFamily(
        "adaptspec_shared_refused",
        "Other replicas' statistics refused (another policy, unreadable)",
        labels=v,
    )
    skipped = GaugeMetricFamily(
        "adaptspec_shared_refused_entries",
        "Other replicas' entries skipped at the last fetch (malformed, another policy)",
        labels=v,
    )
    unpub = GaugeMetricFamily(
        "adaptspec_shared_unpublished_updates", "Own updates not yet published", labels=v
    )
    fleet = GaugeMetricFamily("adaptspec_shared_fleet_updates", "Updates in the merged statistics", labels=v)
    others = GaugeMetricFamily(
        "adaptspec_shared_other_replicas", "Other replicas whose statistics are merged", labels=v
    )
    age = GaugeMetricFamily(
        "adaptspec_shared_last_sync_age_seconds", "Seconds since the last sync that worked", labels=v
    )
    held = GaugeMetricFamily(
        "adaptspec_fleet_lease_held",
        "1 while this replica holds its replica id's lease, else 0 "
        "(another process holds the id: not publishing)",
        labels=v,
    )
    left = GaugeMetricFamily(
        "adaptspec_fleet_lease_seconds_left",
        "Seconds the replica id's lease lasts without another renewal (0 when not held)",
        labels=v,
    )
    any_shared = False
    for name, c in controllers.items():
        s = c.stats().get("shared")
        if s is None:
            continue
        any_shared = True
        up.add_metric([name], 1.0 if s["connected"] else 0.0)
        syncs.add_metric([name], s["syncs"])
        errs.add_metric([name], s["sync_errors"])
        refused.add_metric([name], s["refused"])
        skipped.add_metric([name], len(s.get("refused_entries") or {}))
        unpub.add_metric([name], s["unpublished_updates"])
        fleet.add_metric([name], s["fleet_updates"])
        others.add_metric([name], s["other_replicas"])
        if s["last_sync_age_s"] is not None:
            age.add_metric([name], s["last_sync_age_s"])
        held.add_metric([name], 1.0 if s.get("lease_held") else 0.0)
        left.add_metric([name], float(s.get("lease_seconds_left") or 0.0))
    if any_shared:
        yield from (up, syncs, errs, refused, skipped, unpub, fleet, others, age, held, left)
