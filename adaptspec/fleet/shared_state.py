"""SharedState: one controller's link to the fleet (publish its own statistics, merge everyone's).

Three threads touch it, none of them the decision thread:

- the controller's **update thread** calls :meth:`SharedState.update` in place of
  ``policy.update``, and :meth:`SharedState.update_full` in place of ``policy.update_full`` (a
  policy with ``full_feedback`` whose family shares every arm it learns, ``fi-ucb``: the policy
  learns, and the update is added to this replica's own sums) and
  :meth:`SharedState.apply_pending` at every tick: when a fetch brought new statistics from the
  other replicas, the learning copy becomes *prior + others + own* and the controller publishes
  a fresh snapshot to decisions;
- a **sync thread** publishes this replica's cumulative sums every ``sync_every`` updates or
  ``sync_interval_s`` seconds, whichever comes first, and fetches every replica's; all network
  calls happen here, so a slow or dead Redis delays neither decisions nor updates;
- the constructor's thread calls :meth:`attach` once: this replica claims its id
  (:mod:`adaptspec.fleet.identity`: refused with one line while another live process holds it),
  its own sums are rebuilt from its decision log (the record of every acknowledged feedback),
  checked against what it published before, published, and merged with the others' before the
  first decision (a fresh replica starts from the fleet's statistics). :meth:`claim` takes the
  id earlier (``adaptspec serve`` does, before loading the model).

The sync thread renews the id's lease before every publish (a publish always follows a renewal
that worked, so a replica whose lease lapsed never writes under the id); a replica that finds its
id taken by another process (possible only after it could not renew for ``lease_ttl_s``) stops
publishing until the id is free again, and says so in :meth:`status` (``connected`` False,
``last_error``).

The sync thread is one guarded loop: whatever an iteration raises is logged (one line, again only
when the error changes), counted in ``sync_errors``, shown in :meth:`status` (``state``
``"failing"``), and the loop goes on at the next interval, renewing the lease. An entry of another
replica that cannot be read or merged (:func:`~adaptspec.fleet.wire.decode`,
:meth:`~adaptspec.fleet.stats.Family.check`: unreadable bytes, another policy, other shapes, a
NaN) is skipped: logged once and counted (``refused``) per distinct blob, listed in
``refused_entries`` while it is there (``state`` ``"degraded"``), never merged; the others are
merged as usual. :meth:`status`'s ``state`` is ``"ok"`` only when the last sync worked, no entry
is refused, the lease is held with time left and the sync thread runs.

Consistency window: a feedback applied on replica R reaches replica S after R's next publish
(at most ``sync_every`` updates or ``sync_interval_s`` seconds) and S's next fetch (at most
``sync_interval_s``) plus S's next update-thread tick (0.25 s). If R dies (SIGKILL) before
publishing, its unpublished updates are missing from the fleet until R restarts on the same
decision log and replica id; what it published keeps counting meanwhile. While Redis cannot be
reached, every replica keeps deciding and learning from its own state (``status()["connected"]``
is False, ``sync_errors`` counts) and catches up at the first sync that works: sums are
cumulative, so nothing published late is lost or counted twice.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ab.variants import check_variant_name
from ..errors import AdaptspecError
from .identity import ReplicaLease
from .stats import NOTHING, Family, family_for, merge_sums
from .wire import Published, decode, encode

if TYPE_CHECKING:
    from ..costs.machine_speed import LogCalibration

__all__ = ["SharedState"]

log = logging.getLogger("adaptspec.fleet")


class SharedState:
    """Share one variant's policy statistics with the other replicas through ``backend``.

    Parameters
    ----------
    backend
        A :class:`~adaptspec.fleet.backend.MemoryBackend`, a
        :class:`~adaptspec.fleet.redis_backend.RedisBackend`, or anything with
        ``publish(channel, replica, blob)``, ``fetch(channel)`` and ``fetch_one(channel, replica)``.
    replica
        This replica's id: stable across restarts (a restarted replica must overwrite its own
        key, not add a second one), unique in the fleet.
    sync_every, sync_interval_s
        Publish and fetch after this many own updates, or this many seconds, whichever first.
    lease_ttl_s
        Life of the replica id's lease without renewal (at least 3 sync intervals): how long a
        crashed replica's id stays taken.
    """

    def __init__(
        self,
        backend: Any,
        replica: str,
        *,
        sync_every: int = 32,
        sync_interval_s: float = 1.0,
        lease_ttl_s: float = 15.0,
    ) -> None:
        if not replica or not isinstance(replica, str):
            raise AdaptspecError(f"replica id must be a non-empty string, got {replica!r}")
        if int(sync_every) != sync_every or sync_every < 1:
            raise AdaptspecError(f"sync_every must be a positive integer, got {sync_every!r}")
        if not sync_interval_s > 0:
            raise AdaptspecError(f"sync_interval_s must be > 0, got {sync_interval_s!r}")
        if not lease_ttl_s >= 3 * sync_interval_s:
            raise AdaptspecError(
                f"the lease ttl ({lease_ttl_s!r} s, --lease-ttl) must be at least 3 sync intervals "
                f"({3 * sync_interval_s!r} s): a live replica would lose its id between renewals"
            )
        self.backend = backend
        self.replica = replica
        self.sync_every = int(sync_every)
        self.sync_interval_s = float(sync_interval_s)
        self.lease_ttl_s = float(lease_ttl_s)
        self.lease: ReplicaLease | None = None
        self._closed = False
        self.family: Family = NOTHING
        self.channel = "default"
        self.fingerprint = ""
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()  # one publish + fetch at a time (the sync thread, or sync_now)
        self._local: dict[str, np.ndarray] = {}
        self._local_updates = 0
        self._published_updates = 0
        self._others: dict[str, np.ndarray] | None = None
        self._others_updates: dict[str, int] = {}
        self._fetch_seq = 0
        self._applied_seq = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.connected = False
        self.syncs = 0
        self.sync_errors = 0
        self.refused = 0
        self.merges = 0
        self.last_sync: float | None = None
        self.last_error: str | None = None
        self.loop_error: str | None = None  # what the sync loop's last iteration raised (None: it did not)
        self.merge_error: str | None = None  # why the last merge into the policy failed (None: it worked)
        self.refused_entries: dict[str, str] = {}  # replica -> why its entry was skipped, at the last fetch
        self._refused_blobs: dict[
            str, str
        ] = {}  # replica -> digest of its refused blob (logged and counted once)
        self.rebuilt: dict[str, Any] = {}

    # ------------------------------------------------------------------ setup
    def claim(self, variant: str | None) -> None:
        """Claim this replica's id for ``variant`` now (one line when a live replica holds it); :meth:`attach` does it
        if nobody did before."""
        channel = check_variant_name(variant or "default")  # it becomes a Redis key
        if self.lease is not None:
            if self.lease.channel != channel:
                raise AdaptspecError(
                    f"replica {self.replica!r} claimed variant {self.lease.channel!r}, not {channel!r}"
                )
            return
        lease = ReplicaLease(self.backend, channel, self.replica, self.lease_ttl_s)
        lease.claim()
        self.lease, self.channel = lease, channel

    def attach(
        self,
        policy: Any,
        variant: str | None,
        log_dir: str | Path | None = None,
        contextual: bool | None = None,
        calibration: LogCalibration | None = None,
    ) -> None:
        """Bind to ``policy`` (the controller's learning copy) before the controller starts its threads.

        Rebuilds this replica's own sums from ``log_dir`` (its rows of ``variant`` with a reward;
        ``calibration``, a fresh :class:`~adaptspec.costs.machine_speed.LogCalibration` where the
        controller calibrates rewards for the machine's speed, turns each row's logged reward into
        the one the learner learnt),
        refuses to start (one line) when the backend holds more of this replica's updates than the
        log, publishes, merges the others' statistics into ``policy`` and starts the sync thread.
        A backend that cannot be reached now raises (one line). On any refusal the id is released.
        """
        self.family = family_for(policy)
        self.claim(variant)
        try:
            self._attach(policy, log_dir, contextual, calibration)
        except BaseException:
            self.close()
            raise

    def _attach(
        self,
        policy: Any,
        log_dir: str | Path | None,
        contextual: bool | None,
        calibration: LogCalibration | None,
    ) -> None:
        self.fingerprint = self.family.fingerprint(policy)
        self._contextual = bool(getattr(policy, "contextual", True) if contextual is None else contextual)
        try:
            own_blob = self.backend.fetch_one(self.channel, self.replica)
        except Exception as e:  # noqa: BLE001
            raise AdaptspecError(
                f"shared state {getattr(self.backend, 'describe', self.backend)}: cannot be reached "
                f"({type(e).__name__}: {e})"
            ) from None
        own = None
        if own_blob is not None:
            try:
                own = decode(own_blob, self._entry(self.replica))
            except AdaptspecError as e:  # nothing can be learnt from it: replaced by this replica's sums
                log.warning("%s: %s; replacing it with this replica's statistics", self.channel, e)
            if own is not None:
                try:
                    self._check(self.replica, own)
                except AdaptspecError as e:
                    raise AdaptspecError(
                        f"replica {self.replica!r} of variant {self.channel!r} published statistics "
                        f"of another policy before ({e}): use another replica id or fleet name"
                    ) from None
        if log_dir is not None:
            local, n = self._rebuild(policy, Path(log_dir), calibration)
            if own is not None and own.updates > n:
                raise AdaptspecError(
                    f"replica {self.replica!r} published {own.updates} updates of variant "
                    f"{self.channel!r}, but its decision log {log_dir} holds {n}: start it on its own "
                    "log directory, or give it another replica id"
                )
            if own is not None and own.updates == n:  # keep what the fleet has seen of the estimates
                for key in self.family.approximate:
                    local[key] = np.asarray(own.sums[key], dtype=np.float64).copy()
            self.rebuilt = {
                "from": "log",
                "updates": n,
                "published_before": None if own is None else own.updates,
            }
        elif own is not None:
            local, n = {k: np.array(v) for k, v in own.sums.items()}, own.updates
            self.rebuilt = {"from": "shared", "updates": n, "published_before": n}
        else:
            local, n = self.family.zero(), 0
            self.rebuilt = {"from": "none", "updates": 0, "published_before": None}
        self._local, self._local_updates = local, n
        if not self._sync_guarded():
            raise AdaptspecError(
                f"shared state {getattr(self.backend, 'describe', self.backend)}: the first sync "
                f"failed ({self.last_error})"
            )
        self.apply_pending(policy)
        self._thread = threading.Thread(target=self._run, name=f"adaptspec-fleet-{self.channel}", daemon=True)
        self._thread.start()

    def _rebuild(
        self, policy: Any, log_dir: Path, calibration: LogCalibration | None
    ) -> tuple[dict[str, np.ndarray], int]:
        """This replica's sums from its decision log: every logged reward of this variant, in log order,
        calibrated as the learner calibrated it and replayed into a fresh copy of the policy (the
        estimates are scored against that copy)."""
        from ..traces.log_writer import log_rows

        sums = self.family.zero()
        if not log_dir.is_dir():
            return sums, 0
        rows = [
            r
            for r in log_rows(
                log_dir,
                [
                    "variant",
                    "block_size",
                    "reward",
                    "features",
                    "arms",
                    "cf_rewards",
                    "cf_censored",
                    "speed_ratio",
                ],
            )
            if r.get("variant") == self.channel and r.get("reward") is not None
        ]
        if not rows or self.family is NOTHING:
            return sums, 0
        learnt = 0
        head = getattr(policy, "head", None)
        scratch = copy.deepcopy(policy, {} if head is None else {id(head): head})
        scratch.reset()
        for r in rows:
            # every row's ratio moves the factor, as every applied update did
            calibrated = (lambda x: x) if calibration is None else calibration.row(r.get("speed_ratio"))
            if int(r["block_size"]) not in self.family.arms:
                continue
            learnt += 1
            f = r.get("features")
            if self._contextual and f is None:
                raise AdaptspecError(
                    f"{log_dir}: logged decision {r['decision_id']} has no features: cannot rebuild "
                    "this replica's shared statistics (log_features was off)"
                )
            ctx = (
                None
                if (f is None or not self._contextual)
                else np.asarray(f, dtype=np.float32).astype(np.float64)
            )
            if (
                self.family.full_feedback
                and r.get("cf_rewards") is not None
                and r.get("cf_censored") is not None
                and tuple(int(a) for a in r["arms"]) == self.family.arms
            ):  # every arm's, as it was learnt
                self._learn_full(
                    scratch,
                    sums,
                    ctx,
                    calibrated(np.asarray(r["cf_rewards"], dtype=np.float64)),
                    ~np.asarray(r["cf_censored"], dtype=bool),
                )
            else:
                self._learn(scratch, sums, ctx, int(r["block_size"]), float(calibrated(float(r["reward"]))))
        return sums, learnt

    # ------------------------------------------------------------------ update thread
    def _learn(
        self, policy: Any, sums: dict[str, np.ndarray], context: Any, block_size: int, reward: float
    ) -> None:
        pre = self.family.before(policy)
        policy.update(context, block_size, reward)
        self.family.observe(sums, policy, context, policy.arm_index(block_size), float(reward), pre)

    def _learn_full(
        self,
        policy: Any,
        sums: dict[str, np.ndarray],
        context: Any,
        rewards: np.ndarray,
        observed: np.ndarray,
    ) -> None:
        pre = self.family.before(policy)
        policy.update_full(context, rewards, observed)
        self.family.observe_full(sums, policy, context, rewards, observed, pre)

    @property
    def full_feedback(self) -> bool:
        """Whether :meth:`update_full` shares every arm a request showed (the attached policy's family keeps them)."""
        return self.family.full_feedback

    def update(self, policy: Any, context: Any, block_size: int, reward: float) -> None:
        """``policy.update(context, block_size, reward)``, and the update counted in this replica's sums."""
        with self._lock:
            self._learn(policy, self._local, context, block_size, reward)
            due = self._counted()
        if due:
            self._wake.set()

    def update_full(self, policy: Any, context: Any, rewards: np.ndarray, observed: np.ndarray) -> None:
        """``policy.update_full(context, rewards, observed)``, and the update counted in this replica's sums
        (only when :attr:`full_feedback`; otherwise one line, nothing learnt)."""
        if not self.family.full_feedback:
            raise AdaptspecError(
                f"the shared statistics of variant {self.channel!r} are of the arm that ran only: "
                "use update(), not update_full()"
            )
        with self._lock:
            self._learn_full(policy, self._local, context, rewards, observed)
            due = self._counted()
        if due:
            self._wake.set()

    def _counted(self) -> bool:
        """One more own update (under the lock); True when ``sync_every`` are unpublished."""
        self._local_updates += 1
        return self._local_updates - self._published_updates >= self.sync_every

    def apply_pending(self, policy: Any) -> bool:
        """If a fetch brought news since the last call, make ``policy`` prior + others + own; True if it did."""
        if self._fetch_seq == self._applied_seq or self.family is NOTHING:
            return False
        with self._lock:
            seq, others = self._fetch_seq, self._others
            try:
                total = self.family.add(others, self._local) if others is not None else self._local
                self.family.apply(policy, total)
            except Exception as e:  # noqa: BLE001 - the policy keeps learning from its own updates meanwhile
                msg = f"merging the fleet's statistics failed ({type(e).__name__}: {e})"
                if msg != self.merge_error:
                    log.error(
                        "%s: %s; deciding on this replica's own updates until a merge works",
                        self.channel,
                        msg,
                    )
                self.merge_error = self.last_error = msg
                self._applied_seq = seq
                return False
        if self.merge_error is not None:
            log.warning("%s: merging the fleet's statistics works again", self.channel)
            self.merge_error = None
        self._applied_seq = seq
        self.merges += 1
        return True

    # ------------------------------------------------------------------ sync thread
    def _run(self) -> None:
        """The sync loop: one guarded iteration every interval (or when woken) until :meth:`close`."""
        while not self._stop.is_set():
            self._wake.wait(self.sync_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            self._sync_guarded()

    def _sync_guarded(self) -> bool:
        """:meth:`_sync_once`, with anything it raises logged (once per distinct error), counted and reported."""
        try:
            ok = self._sync_once()
        except Exception as e:  # noqa: BLE001 - the loop must outlive any one iteration
            msg = f"{type(e).__name__}: {e}"
            self.sync_errors += 1
            if msg != self.loop_error:
                log.error(
                    "%s: shared-state sync failed (%s); retrying every %g s",
                    self.channel,
                    msg,
                    self.sync_interval_s,
                )
            self.loop_error = self.last_error = msg
            return False
        if self.loop_error is not None:
            log.warning("%s: shared-state sync works again", self.channel)
            self.loop_error = None
        return ok

    def _entry(self, rid: str) -> str:
        return f"replica {rid!r} of variant {self.channel!r}"

    def _check(self, rid: str, p: Published) -> None:
        """Refuse a decoded entry that is not this variant's policy, or not under its own replica's field."""
        if p.replica != rid:
            raise AdaptspecError(
                f"shared statistics of {self._entry(rid)}: published as replica {p.replica!r}"
            )
        if p.fingerprint != self.fingerprint:
            raise AdaptspecError(
                f"shared statistics of {self._entry(rid)}: another policy (fingerprint "
                f"{p.fingerprint}, this one {self.fingerprint})"
            )
        try:
            self.family.check(p.sums)
        except AdaptspecError as e:
            raise AdaptspecError(f"shared statistics of {self._entry(rid)}: {e}") from None

    def _others_readable(self, blobs: dict[str, bytes]) -> tuple[list[Published], dict[str, str]]:
        """The other replicas' entries that can be merged, and why each other one was skipped."""
        parts, refused = [], {}
        for rid, blob in sorted(blobs.items()):
            if rid == self.replica:
                continue
            try:
                p = decode(blob, self._entry(rid))
                self._check(rid, p)
                parts.append(p)
            except AdaptspecError as e:
                refused[rid] = str(e)
                digest = hashlib.sha256(
                    bytes(blob) if isinstance(blob, (bytes, bytearray)) else repr(blob).encode()
                )
                if (
                    self._refused_blobs.get(rid) != digest.hexdigest()
                ):  # a new bad blob: logged and counted once
                    self._refused_blobs[rid] = digest.hexdigest()
                    self.refused += 1
                    log.warning(
                        "%s: skipping %s (not merged; /health degraded while it is there)", self.channel, e
                    )
        for rid in sorted(set(self._refused_blobs) - set(refused)):
            del self._refused_blobs[rid]
            log.warning(
                "%s: the entry of %s is %s",
                self.channel,
                self._entry(rid),
                "readable again" if rid in blobs else "gone",
            )
        return parts, refused

    def _sync_once(self) -> bool:
        """Publish own sums, fetch everyone's; False (and counted) when the backend failed."""
        with self._sync_lock:
            return self._sync_locked()

    def _sync_locked(self) -> bool:
        try:
            if self.lease is not None and not self.lease.renew():
                return self._identity_lost()
            with self._lock:
                mine = Published(
                    self.replica,
                    self.fingerprint,
                    self._local_updates,
                    {k: np.array(v) for k, v in self._local.items()},
                )
            if not self._publishable(mine):
                return False
            self.backend.publish(self.channel, self.replica, encode(mine))
            blobs = self.backend.fetch(self.channel)
        except Exception as e:  # noqa: BLE001 - any backend failure: keep serving from local state
            self.sync_errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            if self.connected or self.syncs == 0:
                log.warning(
                    "%s: shared state %s unreachable, serving from local state: %s",
                    self.channel,
                    getattr(self.backend, "describe", ""),
                    self.last_error,
                )
            self.connected = False
            return False
        parts, refused = self._others_readable(blobs)
        others = merge_sums(self.family, [p.sums for p in parts])
        counts = {p.replica: p.updates for p in parts}
        self.refused_entries = refused
        with self._lock:
            self._published_updates = mine.updates
            self._others, self._others_updates = others, counts
            self._fetch_seq += 1
        if not self.connected and self.syncs:
            log.warning(
                "%s: shared state %s reachable again", self.channel, getattr(self.backend, "describe", "")
            )
        self.connected = True
        self.syncs += 1
        self.last_sync = time.time()
        return True

    def _publishable(self, mine: Published) -> bool:
        """Whether this replica's own sums pass the check every other replica applies to them
        (finite, the family's shapes): sums that would be refused are never published, and the
        failure is counted and said (rewards and contexts are bounded where they enter, so this
        is a guard, not a path)."""
        try:
            self.family.check(mine.sums)
        except AdaptspecError as e:
            self.sync_errors += 1
            self.last_error = f"own statistics not published: {e}"
            log.error("%s: not publishing this replica's statistics: %s", self.channel, e)
            return False
        return True

    def _identity_lost(self) -> bool:
        """Another process holds this replica's id: publish nothing (it would overwrite that one's sums)."""
        self.sync_errors += 1
        self.last_error = (
            f"replica id {self.replica!r} of variant {self.channel!r} is held by another process (this "
            "one could not renew its lease in time): not publishing until the id is free; give one of "
            "them another --replica-id"
        )
        if self.connected or self.syncs == 0:
            log.warning("%s: %s", self.channel, self.last_error)
        self.connected = False
        return False

    def sync_now(self) -> bool:
        """Publish and fetch now, on the caller's thread (tests, shutdown); True if the backend answered."""
        return self._sync_once()

    # ------------------------------------------------------------------ reports
    def state(self) -> str:
        """``"ok"``; ``"degraded"`` (syncing, but an entry is skipped or the last merge failed); or ``"failing"``
        (the last sync did not work, the lease is lost or lapsed, or the sync thread is not running)."""
        lease_ok = self.lease is None or (self.lease.held and self.lease.seconds_left() > 0)
        thread_ok = self._thread is None or self._thread.is_alive() or self._closed
        if not (self.connected and lease_ok and thread_ok) or self.loop_error is not None:
            return "failing"
        return "degraded" if self.refused_entries or self.merge_error is not None else "ok"

    def status(self) -> dict[str, Any]:
        with self._lock:
            others = dict(self._others_updates)
            local, published = self._local_updates, self._published_updates
        return {
            "backend": getattr(self.backend, "describe", type(self.backend).__name__),
            "replica": self.replica,
            "state": self.state(),
            "connected": self.connected,
            "syncs": self.syncs,
            "sync_errors": self.sync_errors,
            "refused": self.refused,
            "refused_entries": dict(self.refused_entries),
            "merges": self.merges,
            "last_sync_age_s": None if self.last_sync is None else round(time.time() - self.last_sync, 3),
            "local_updates": local,
            "unpublished_updates": local - published,
            "other_replicas": len(others),
            "fleet_updates": local + sum(others.values()),
            "last_error": self.last_error,
            "rebuilt": self.rebuilt,
            "lease_held": bool(self.lease is not None and self.lease.held),
            "lease_seconds_left": 0.0 if self.lease is None else round(self.lease.seconds_left(), 3),
        }

    def close(self, timeout: float = 5.0) -> None:
        """Stop the sync thread, publish one last time (best effort: a dead backend is only counted) and
        release the replica id."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self.family is not NOTHING and self._fetch_seq:  # attached: its sums are worth publishing
            self._sync_guarded()
        if self.lease is not None:
            self.lease.release()


def claimed_states(url: str, replica: str, variants: list[str], **settings: Any) -> dict[str, SharedState]:
    """One :class:`SharedState` per variant over one Redis connection at ``url``, each holding its
    replica id ``replica`` (``settings``: ``sync_every``, ``sync_interval_s``, ``lease_ttl_s``).

    Redis is pinged and the replica id claimed now: unreachable, or an id a live replica holds, is
    one line (and the states claimed so far are released)."""
    from .redis_backend import RedisBackend

    backend = RedisBackend(url).connect()
    states = {v: SharedState(backend, replica, **settings) for v in variants}
    try:
        for v, s in states.items():
            s.claim(v)
    except BaseException:
        for s in states.values():
            s.close()
        raise
    return states
