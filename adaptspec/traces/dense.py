"""Dense traces, the format: at T = 0, how many drafts the target accepts at every position and block size.

At temperature 0 the target's output is fixed, so what any block-size schedule would do on a
prompt is known once three things are: the greedy output ``y``, the target's hidden states
along it (one teacher-forced pass: the drafter's context) and, for every position ``p`` and
block size ``b``, the drafts the drafter makes there. ``accept[p, b - 2]`` is the number of
drafts accepted by a round of block size ``b`` whose last committed token is ``y[p]``: the
longest prefix of its ``b - 1`` drafts equal to ``y[p + 1 :]``. One greedy generation and one
drafter pass per block size (batched over all positions, :mod:`adaptspec.collect.dense`)
replace a full decode per block size; :func:`replay` then walks any schedule through the table, round by round, as
:class:`~adaptspec.decoding.SpeculativeDecoder` does.

With exact verification the teacher-forced pass computes each row exactly as decoding does
(batch invariance), so replayed tokens, rounds and acceptance equal the real decoder's
(tested); with fast verification they can differ where a near-tie rounds differently. Drafts
past an EOS are never checked, so a round that commits the EOS may count fewer drafts than
the real decoder (which compares drafts after the EOS too); its tokens are the same.

>>> accept = np.array([[1, 2, 3], [0, 0, 0], [1, 1, 1], [0, 0, 0], [0, 0, 0]], dtype=np.uint8)
>>> replay(accept, n_tokens=6, max_new_tokens=6, schedule=4)   # tau of each round, B = 4
[4, 1]
>>> replay(accept, n_tokens=6, max_new_tokens=6, schedule=1)
[1, 1, 1, 1, 1]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._util.files import read_json_object
from ..errors import AdaptspecError
from .dense_checks import check_meta, check_part
from .parquet import read_parquet


@dataclass
class DenseRequest:
    """One prompt's dense trace (see the module docstring)."""

    tokens: np.ndarray  # int64 [L]: the greedy output, the token chosen at prefill first
    accept: np.ndarray  # uint8 [L - 1, max_block_size - 1]
    top1: np.ndarray  # float32 [L - 1, max_block_size - 1]: drafter's top-1 probability, block of max size
    entropy: np.ndarray  # float32 [L - 1, max_block_size - 1]: drafter's entropy (nats), same block
    features: np.ndarray  # float32 [d]: the prefill features
    prompt_tokens: int
    finish_reason: str


def replay(
    accept: np.ndarray,
    n_tokens: int,
    max_new_tokens: int,
    schedule,
    top1: np.ndarray | None = None,
) -> list[int]:
    """Tau of every round a schedule makes on a dense trace, as the decoder would run it.

    ``schedule`` is a block size, a :class:`~adaptspec.speculator.RoundSchedule` or a function
    ``(round index, rounds so far) -> block size`` (see :func:`replay_rounds`).
    """
    return [r.tau for r in _walk(accept, top1, n_tokens, max_new_tokens, schedule, None, 0, 1)]


def replay_rounds(request: DenseRequest, schedule, max_new_tokens: int, profile=None, batch: int = 1) -> list:
    """The rounds (:class:`~adaptspec.speculator.Round`) a schedule makes on one dense trace,
    exactly as :class:`~adaptspec.decoding.SpeculativeDecoder` runs them at T = 0: blocks are
    shortened near ``max_new_tokens`` as the decoder shortens them, and a schedule that
    ``uses_confidence`` sees the drafter's top-1 probabilities of the block it drafted (stored
    for the dense set's largest block size only, so such a schedule must draft that size or 1).
    With a latency ``profile`` each round's draft and verify seconds are the profile's at the
    round's block sizes, context length and ``batch``; without one they are 0.
    """
    return _walk(
        request.accept,
        request.top1,
        len(request.tokens),
        max_new_tokens,
        schedule,
        profile,
        request.prompt_tokens,
        batch,
    )


def _walk(accept, top1, n_tokens, max_new_tokens, schedule, profile, prompt_tokens, batch) -> list:
    from ..schedules import as_schedule
    from ..speculator import Round

    schedule = as_schedule(schedule)
    largest = accept.shape[1] + 1
    rounds: list = []
    m = 1  # committed tokens (the prefill's token included)
    while m < n_tokens:
        room = max_new_tokens - m
        b = int(schedule.draft_size(rounds))
        if not 1 <= b <= largest:
            raise AdaptspecError(f"block size {b} outside 1..{largest} (this dense set's largest)")
        if schedule.uses_confidence and b > 1:
            if b != largest or top1 is None:
                raise AdaptspecError(
                    f"{schedule!r} drafts {b}, but drafter confidences are stored "
                    f"for block size {largest} only"
                )
            v = min(int(schedule.verify_size(top1[m - 1], rounds)), room)
        else:
            b = v = min(b, room)
        j = min(int(accept[m - 1, b - 2]), v - 1) if v > 1 else 0
        j = min(j, n_tokens - 1 - m)  # nothing past the end of the greedy output is checked
        ctx = prompt_tokens + m  # as profile-latency counts context
        draft_s = float(profile.draft_s(b, ctx, batch)) if profile is not None and b > 1 else 0.0
        verify_s = float(profile.verify_s(v, ctx, batch)) if profile is not None else 0.0
        rounds.append(
            Round(block_size=v, tau=j + 1, draft_s=draft_s, verify_s=verify_s, drafted=b if b != v else 0)
        )
        m += j + 1
    return rounds


# ---------------------------------------------------------------------- storage
FORMAT = "adaptspec-dense-traces/1"
_PART = "part-{:05d}.parquet"


class DenseTraceSet:
    """Dense traces on disk: ``meta.json`` and Parquet parts of ``rows_per_part`` requests, one row
    per request (``request_id``, ``domain``, ``prompt_tokens``, ``finish_reason``, ``features``,
    ``tokens``, and ``accept``/``top1``/``entropy`` flattened row-major over
    ``[len(tokens) - 1, max_block_size - 1]``). Parts are written atomically as collection goes,
    so an interrupted collection resumes where it stopped (docs/data.md)."""

    def __init__(self, path, meta: dict) -> None:
        self.path = Path(path)
        self.meta = meta
        self.max_block_size, self.max_new_tokens = check_meta(meta, str(self.path / "meta.json"))

    @classmethod
    def open(cls, path) -> "DenseTraceSet":
        path = Path(path)
        meta_file = path / "meta.json"
        if not meta_file.exists() and not meta_file.is_symlink():
            raise AdaptspecError(f"{path}: not a dense trace set (no meta.json)")
        meta = read_json_object(
            meta_file, "a dense trace set's meta.json"
        )  # a regular file only: a FIFO would block
        if meta.get("format") != FORMAT:
            raise AdaptspecError(f"{path}/meta.json: format {meta.get('format')!r}, expected {FORMAT!r}")
        return cls(path, meta)

    @classmethod
    def create(cls, path, meta: dict) -> "DenseTraceSet":
        """A new dense set at ``path``, or the existing one when it was made with the same ``meta``."""
        path = Path(path)
        meta = {"format": FORMAT, **meta}
        if (path / "meta.json").exists():
            old = cls.open(path)
            if old.meta != meta:
                raise AdaptspecError(
                    f"{path}: a dense trace set made with other settings; use another directory"
                )
            return old
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise AdaptspecError(f"{path}: exists and is not a dense trace set; refusing to write into it")
        path.mkdir(parents=True, exist_ok=True)
        (path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        return cls(path, meta)

    def parts(self) -> list:
        return sorted(self.path.glob("part-*.parquet"))

    def read_part(self, path, columns: list[str] | None = None):
        """One part as a table, checked (:mod:`adaptspec.traces.dense_checks`): a truncated file, a
        missing or mistyped column or an impossible value is one line naming the file, the column
        and the row. ``columns``: read (and check the types of) only these."""
        t = read_parquet(path, "a dense trace set's Parquet part", columns)
        if columns is None:
            check_part(t, str(path), self.max_block_size, self.max_new_tokens)
        elif "request_id" in columns and not pa.types.is_string(t.schema.field("request_id").type):
            raise AdaptspecError(
                f"{path}: column 'request_id' has type {t.schema.field('request_id').type}, expected string"
            )
        return t

    def table(self):
        parts = self.parts()
        return pa.concat_tables([self.read_part(p) for p in parts]) if parts else None

    def request_ids(self) -> set[str]:
        return {r for p in self.parts() for r in self.read_part(p, ["request_id"])["request_id"].to_pylist()}

    def requests(self):
        """``(request_id, domain, DenseRequest)`` in stored order."""
        k = self.max_block_size - 1
        for row in (r for p in self.parts() for r in self.read_part(p).to_pylist()):
            n = len(row["tokens"]) - 1
            mat = lambda key, dt: np.asarray(row[key], dtype=dt).reshape(n, k)  # noqa: E731
            yield (
                row["request_id"],
                row["domain"],
                DenseRequest(
                    np.asarray(row["tokens"], dtype=np.int64),
                    mat("accept", np.uint8),
                    mat("top1", np.float32),
                    mat("entropy", np.float32),
                    np.asarray(row["features"], dtype=np.float32),
                    row["prompt_tokens"],
                    row["finish_reason"],
                ),
            )

    def write_part(self, rows: list[tuple[str, str, DenseRequest]]) -> None:
        f32 = pa.list_(pa.float32())
        table = pa.table(
            {
                "request_id": pa.array([r for r, _, _ in rows], pa.string()),
                "domain": pa.array([d for _, d, _ in rows], pa.string()),
                "prompt_tokens": pa.array([x.prompt_tokens for _, _, x in rows], pa.int64()),
                "finish_reason": pa.array([x.finish_reason for _, _, x in rows], pa.string()),
                "features": pa.array([x.features.tolist() for _, _, x in rows], f32),
                "tokens": pa.array([x.tokens.tolist() for _, _, x in rows], pa.list_(pa.int32())),
                "accept": pa.array([x.accept.ravel().tolist() for _, _, x in rows], pa.list_(pa.uint8())),
                "top1": pa.array([x.top1.ravel().tolist() for _, _, x in rows], f32),
                "entropy": pa.array([x.entropy.ravel().tolist() for _, _, x in rows], f32),
            }
        )
        path = self.path / _PART.format(len(self.parts()))
        tmp = path.with_name(path.name + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)


#: Meta keys that do not change the greedy output: a dense set that differs only in these can lend
#: its greedy outputs (the prefill features are computed again).
_NOT_GREEDY_KEYS = ("format", "drafter", "max_block_size", "features", "greedy_from")


def to_traceset(ds: DenseTraceSet, arms, profile, meta: dict | None = None):
    """The per-request trace set a dense one implies for fixed block sizes ``arms``: tau of every
    round replayed exactly (:func:`replay_rounds`), each round's draft and verify time from ``profile``
    (a :class:`~adaptspec.costs.latency.LatencyProfile`) at its context length."""
    from ..traces import TraceSet

    arms = sorted(int(a) for a in arms)
    if not arms or arms[0] < 1 or arms[-1] > ds.max_block_size:
        raise AdaptspecError(
            f"arms must be block sizes in 1..{ds.max_block_size} (the dense set's largest), got {arms}"
        )
    ids, doms, prompt_tokens, feats, taus, draft_ms, verify_ms, new_tokens = [], [], [], [], [], [], [], []
    for rid, dom, r in ds.requests():
        ids.append(rid)
        doms.append(dom)
        prompt_tokens.append(r.prompt_tokens)
        feats.append(r.features)
        new_tokens.append(len(r.tokens))
        for b in arms:
            rounds = replay_rounds(r, b, ds.max_new_tokens, profile)
            taus.append([x.tau for x in rounds])
            draft_ms.append([1e3 * x.draft_s for x in rounds])
            verify_ms.append([1e3 * x.verify_s for x in rounds])
    n, k = len(ids), len(arms)
    if n == 0:
        raise AdaptspecError(f"{ds.path}: no requests yet")
    per = [np.mean(t) if t else 1.0 for t in taus]
    decode_ms = [sum(d) + sum(v) for d, v in zip(draft_ms, verify_ms)]
    return TraceSet.from_arrays(
        ids,
        doms,
        arms,
        np.asarray(per).reshape(n, k),
        prompt_tokens=prompt_tokens,
        features=np.asarray(feats, dtype=np.float32),
        new_tokens=np.asarray(new_tokens),
        rounds=np.asarray([len(t) for t in taus]).reshape(n, k),
        decode_ms=np.asarray(decode_ms).reshape(n, k),
        tau=taus,
        draft_ms=draft_ms,
        verify_ms=verify_ms,
        meta={
            "arms": arms,
            "source": "adaptspec dense traces",
            "dense": str(ds.path),
            "latency_profile": getattr(profile, "name", ""),
            "max_new_tokens": ds.max_new_tokens,
            **{k_: v for k_, v in ds.meta.items() if k_ not in ("format",)},
            **(meta or {}),
        },
    )
