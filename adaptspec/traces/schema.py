"""The on-disk formats' columns and version: what every reader checks and every writer writes.

``name -> (type, required, nullable)`` for the three Parquet tables (docs/data.md):
``requests.parquet`` and ``outcomes.parquet`` of a trace set, and the parts of a decision log.
"""

from __future__ import annotations

import pyarrow as pa

#: Version of the on-disk formats this code writes; it reads this version and older.
SCHEMA_VERSION = 1

#: The most tokens a count in a trace may hold (a prompt's, a request's new tokens, its rounds):
#: far past any context window, so only a corrupted value is refused.
MAX_TOKENS = 10**8

_F32_LIST = pa.list_(pa.float32())
_F64_LIST = pa.list_(pa.float64())

# name -> (type, required, nullable)
REQUEST_COLUMNS: dict[str, tuple[pa.DataType, bool, bool]] = {
    "request_id": (pa.string(), True, False),
    "domain": (pa.string(), True, False),
    "prompt_tokens": (pa.int64(), True, True),
    "features": (_F32_LIST, False, False),
}
OUTCOME_COLUMNS: dict[str, tuple[pa.DataType, bool, bool]] = {
    "request_id": (pa.string(), True, False),
    "block_size": (pa.int64(), True, False),
    "new_tokens": (pa.int64(), True, True),
    "rounds": (pa.int64(), True, True),
    "mean_tau": (pa.float64(), True, False),
    "tau": (pa.list_(pa.int32()), False, False),
    "draft_ms": (_F32_LIST, False, False),
    "verify_ms": (_F32_LIST, False, False),
    "decode_ms": (pa.float64(), False, True),
}
DECISION_COLUMNS: dict[str, tuple[pa.DataType, bool, bool]] = {
    "decision_id": (pa.string(), True, False),
    "time": (pa.timestamp("us", tz="UTC"), True, False),
    "request_id": (pa.string(), False, True),
    "policy": (pa.string(), True, False),
    "version": (pa.int64(), False, True),
    "variant": (pa.string(), False, True),
    "features": (_F32_LIST, False, True),
    "block_size": (pa.int64(), True, False),
    "propensity": (pa.float64(), True, False),
    "probs": (_F64_LIST, True, False),
    "arms": (pa.list_(pa.int64()), True, False),
    "reward": (pa.float64(), False, True),
    "new_tokens": (pa.int64(), False, True),
    "decode_ms": (pa.float64(), False, True),
    "mean_tau": (pa.float64(), False, True),
    "rounds": (pa.int64(), False, True),
    "speed_ratio": (pa.float64(), False, True),
    # the load at the decision (batched serving; absent or null elsewhere)
    "rows_in_flight": (pa.int64(), False, True),
    "queue_length": (pa.int64(), False, True),
    "context_tokens": (pa.int64(), False, True),
    "temperature": (pa.float64(), False, True),
    "max_tokens": (pa.int64(), False, True),
    # how a batched request's decode time was attributed (decode_ms is attributed_ms there)
    "attributed_ms": (pa.float64(), False, True),
    "wall_decode_ms": (pa.float64(), False, True),
    "row_rounds": (pa.int64(), False, True),
    "mean_rows": (pa.float64(), False, True),
    # every arm's counterfactual outcome from the rounds that ran, over ``arms`` (null without rounds)
    "cf_rewards": (_F64_LIST, False, True),
    "cf_tokens": (_F64_LIST, False, True),
    "cf_censored": (pa.list_(pa.bool_()), False, True),
    "cf_approximate": (pa.list_(pa.bool_()), False, True),
}

#: Decision-log columns checked finite (null is the missing value) and non-negative integers.
DECISION_FLOATS = (
    "reward",
    "decode_ms",
    "mean_tau",
    "temperature",
    "attributed_ms",
    "wall_decode_ms",
    "mean_rows",
)
DECISION_COUNTS = (
    "new_tokens",
    "rounds",
    "rows_in_flight",
    "queue_length",
    "context_tokens",
    "max_tokens",
    "row_rounds",
)
#: Decision-log list columns with one value per arm of the row (null, or as long as ``arms``);
#: the numeric ones are checked finite.
DECISION_PER_ARM = ("cf_rewards", "cf_tokens", "cf_censored", "cf_approximate")
DECISION_PER_ARM_FLOATS = ("cf_rewards", "cf_tokens")
