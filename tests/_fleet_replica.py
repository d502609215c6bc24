"""One fleet replica as a process, driven over stdin/stdout by tests/test_fleet_redis.py.

``python tests/_fleet_replica.py REDIS_URL REPLICA_ID LOG_DIR SPEC [SYNC_EVERY [LEASE_TTL]]`` builds an
AdaptiveController over a toy speculator, sharing its policy through Redis, and answers JSON
lines (a refusal at start, e.g. a replica id a live replica holds, is one line on stderr, exit 2):

- ``{"op": "step", "x": [...], "rewards": {"B": r, ...}}``: decide on context ``x``, feed back
  the chosen block size's reward, answer ``{"block_size", "reward"}`` once ``feedback`` has
  returned (the decision is acknowledged: in the decision log);
- ``{"op": "sync"}``: apply queued updates, publish and fetch, wait for the merge; answers
  ``{"shared": status}``;
- ``{"op": "state", "path": P}``: write the policy decisions use now to ``P`` (``save_state``);
- ``{"op": "close"}``: close the controller (final publish) and exit.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from adaptspec import AdaptiveController
from adaptspec.errors import AdaptspecError
from adaptspec.fleet import SharedState
from adaptspec.fleet.redis_backend import RedisBackend
from adaptspec.policies.spec import make_policy
from adaptspec.speculator import Outcome, Prefill, Round


class Toy:
    max_block_size = 16

    def prefill(self, prompt_ids, **kw):
        return Prefill(first_token=1, prompt_tokens=len(prompt_ids), features=np.ones(3, np.float32))

    def decode(self, prefill, block_size, max_new_tokens, temperature=0.0, seed=None, on_round=None):
        return Outcome([1] * 5, [Round(int(block_size), 1, 0.001, 0.004)], decode_s=0.005)


def main() -> None:
    url, replica, log_dir, spec = sys.argv[1:5]
    sync_every = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    lease_ttl = float(sys.argv[6]) if len(sys.argv) > 6 else 15.0
    backend = RedisBackend(url).connect()
    shared = SharedState(backend, replica, sync_every=sync_every, sync_interval_s=0.2, lease_ttl_s=lease_ttl)
    # a policy object, not a spec: a spec's head without a featurizer would pick up the bundled one
    try:
        ctl = AdaptiveController(
            Toy(),
            make_policy(spec, [1, 2, 4, 8], seed=0),
            variant="A",
            log_dir=log_dir,
            shared=shared,
            log_fsync=False,
            feedback_timeout_s=None,
        )
    except AdaptspecError as e:
        print(e, file=sys.stderr, flush=True)
        sys.exit(2)
    print(json.dumps({"ready": True, "rebuilt": shared.rebuilt}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "step":
            x = np.asarray(cmd["x"], dtype=np.float32)
            d = ctl.decide(x if ctl._contextual else None)
            r = float(cmd["rewards"][str(d.block_size)])
            status = ctl.feedback(d.decision_id, reward=r)
            out = {"block_size": d.block_size, "reward": r, "status": status}
        elif op == "sync":
            ctl.sync()
            shared.sync_now()
            deadline = time.monotonic() + 5
            while shared._applied_seq != shared._fetch_seq and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.05)  # the update thread publishes the merged copy right after applying it
            out = {"shared": ctl.stats()["shared"]}
        elif op == "state":
            ctl.policy_snapshot().save_state(cmd["path"])
            out = {"ok": True}
        elif op == "close":
            ctl.close()
            print(json.dumps({"closed": True}), flush=True)
            return
        else:
            out = {"error": f"unknown op {op}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
