"""What the engine runs on this host: the dtype, the profile every block size is priced by, and
the bundled head re-priced by it.

:func:`choose` takes a :class:`~adaptspec.host.costs.HostCosts`: the dtype is ``dtype`` when given
(``--dtype``), else the one whose best block size decodes a request fastest at the prior's
acceptance, at every load the engine runs as nearly as the other dtype (one row for a single
decoder, 1 to ``max_rows`` for a server: :func:`~adaptspec.host.pricing.cheaper_dtype`); the head (default: the bundled one)
is re-priced by that dtype's profile (:func:`~adaptspec.host.pricing.reprice_head`) and written
to the cache next to the profile, its featurizer with it. A controller given that head as its
policy and the profile as ``latency`` prices everything on this host's curve: the head's
predictions (its acceptance model, this host's costs), the machine-speed reference (the head's
``timings``) and every counterfactual round.

Where no block size beyond 1 pays at the prior's acceptance, by :data:`~adaptspec.host.pricing.PAYS_MARGIN`
over plain decoding (``speculation_pays`` false), the
product's default is plain decoding (:func:`~adaptspec.control.policy_build.default_on_host`):
every request at ``B = 1``, the drafter never run, and :meth:`HostChoice.summary` says so.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..costs.latency import LatencyProfile, get_profile
from ..errors import AdaptspecError
from .costs import HostCosts
from .identity import describe
from .pricing import PAYS_MARGIN, cheaper_dtype, expected_speeds, paying_block_size, prior_tokens_per_round


@dataclass(frozen=True)
class HostChoice:
    """The dtype run here and why, the profile it is priced by (and its file), the re-priced head
    (None when no head was re-priced), and the prior's tokens a second by block size at one row."""

    dtype: str
    chosen_by: str
    profile: LatencyProfile
    profile_path: Path
    head: Path | None
    speeds: dict[int, float]
    best_block_size: int  # the block size that pays most here (1 where none clears PAYS_MARGIN)
    costs: HostCosts
    fastest_dtype: str = ""  # the dtype that decodes fastest here (the one run unless a dtype was given)

    @property
    def speculation_pays(self) -> bool:
        return self.best_block_size > 1

    def policy_spec(self) -> str | None:
        """The default policy over the re-priced head (None without one)."""
        return None if self.head is None else f"neural-linear:head={self.head}"

    def summary(self) -> str:
        """One line: the host, what each dtype costs, what was chosen and whether speculating pays."""
        p = self.profile
        plain = 1e3 * float(p.round_s(1))
        per = ", ".join(f"{d} {1e3 * float(q.round_s(1)):.1f} ms" for d, q in self.costs.profiles.items())
        ratio = float(p.round_s(4)) / float(p.round_s(1))
        where = "measured now" if self.costs.fresh else f"cached {self.costs.measured_at}"
        took = sum(v for k, v in self.costs.timing_s.items() if not k.endswith(" cpu"))
        cpu = sum(v for k, v in self.costs.timing_s.items() if k.endswith(" cpu"))
        s1 = self.speeds.get(1, 1.0 / float(p.round_s(1)))
        sb = self.speeds.get(self.best_block_size, s1)
        top = max(self.speeds, key=self.speeds.get, default=1)
        verdict = (
            f"speculation pays here at the prior's acceptance (B = {self.best_block_size}: {sb / s1:.2f}x plain)"
            if self.speculation_pays
            else "speculation cannot pay here at the prior's acceptance "
            f"(best B = {top}: {self.speeds.get(top, s1) / s1:.2f}x plain, under the {1 + PAYS_MARGIN:.2f}x "
            "it must clear): the default decodes plainly (B = 1)"
        )
        faster = (
            f"; {self.fastest_dtype} decodes faster here"
            if self.fastest_dtype and self.fastest_dtype != self.dtype
            else ""
        )
        return (
            f"host: {describe(self.costs.key)}; plain round (CPU time, one thread) {per} ({where}, timing {took:.1f} s{f', {cpu:.1f} CPU s' if cpu else ''}); "
            f"running {self.dtype} ({self.chosen_by}{faster}): a 4-token verify {ratio:.2f}x a 1-token one "
            f"({plain:.1f} ms); {verdict}"
        )

    def to_dict(self) -> dict[str, Any]:
        """For ``/health``: what was measured and chosen (the profile's and head's file names, never
        the server's paths)."""
        return {
            "host": describe(self.costs.key),
            "dtype": self.dtype,
            "chosen_by": self.chosen_by,
            "fastest_dtype": self.fastest_dtype,
            "plain_round_ms": {
                d: round(1e3 * float(q.round_s(1)), 2) for d, q in self.costs.profiles.items()
            },
            "round_ms": {str(b): round(1e3 * float(self.profile.round_s(b)), 2) for b in sorted(self.speeds)},
            "prior_tok_s": {str(b): round(s, 2) for b, s in self.speeds.items()},
            "best_block_size": self.best_block_size,
            "speculation_pays": self.speculation_pays,
            "profile": self.profile_path.name,
            "head": None if self.head is None else self.head.name,
            "measured_at": self.costs.measured_at,
            "timing_s": self.costs.timing_s,
        }


def choose(
    costs: HostCosts,
    dtype: str | None = None,
    head: Path | None = None,
    chosen_by: str = "--dtype",
    rows: Sequence[int] = (1,),
) -> HostChoice:
    """The choice on ``costs`` (see the module docstring); ``head`` default: the bundled head;
    ``chosen_by``: who gave ``dtype`` when one is given (``--dtype``, or ``as loaded``); ``rows``:
    the row counts the engine will run (a server's loads, :func:`server_rows`; one request: 1),
    at every one of which the dtype chosen decodes as nearly as fast as the faster one
    (:func:`~adaptspec.host.pricing.cheaper_dtype`)."""
    from ..paths import BUNDLED_HEAD
    from ..policies.offline_head import HeadModel

    source = Path(head) if head is not None else BUNDLED_HEAD
    model = HeadModel.load(source) if (source / "config.json").is_file() else None
    arms = model.arms if model is not None else (1, 2, 3, 4, 6, 8)
    tokens = prior_tokens_per_round(arms)
    if dtype is not None and dtype not in costs.profiles:
        raise AdaptspecError(
            f"dtype {dtype!r} was not timed on this host (timed: {', '.join(costs.profiles)})"
        )
    rows = tuple(int(r) for r in rows)
    fastest = cheaper_dtype(costs.profiles, tokens, rows)
    chosen = dtype or fastest
    profile = costs.profiles[chosen]
    path = costs.profile_path(chosen)
    if not path.is_file():
        costs.directory.mkdir(parents=True, exist_ok=True)
        profile.save(path)
    repriced = None if model is None else write_repriced_head(model, source, profile, path)
    here = "measured: the faster here" + ("" if rows == (1,) else f" at {min(rows)}-{max(rows)} rows")
    return HostChoice(
        chosen,
        chosen_by if dtype else here,
        profile,
        path,
        repriced,
        expected_speeds(profile, tokens),
        paying_block_size(profile, tokens),
        costs,
        fastest,
    )


def server_rows(max_rows: int) -> tuple[int, ...]:
    """The loads a server of ``max_rows`` rows is priced at: 1, 2, 4, ... up to ``max_rows``.

    >>> server_rows(8), server_rows(6), server_rows(1)
    ((1, 2, 4, 8), (1, 2, 4, 6), (1,))
    """
    out = [1]
    while out[-1] * 2 < max_rows:
        out.append(out[-1] * 2)
    return tuple(out + ([max_rows] if max_rows > 1 else []))


def write_repriced_head(model: Any, source: Path, profile: LatencyProfile, profile_path: Path) -> Path:
    """The head ``model`` (read from ``source``) re-priced by ``profile``, saved with its featurizer
    in a directory named by its weights (written once; a directory already there is that head)."""
    from ..policies.offline_head import head_fingerprint
    from .pricing import reprice_head

    timed_on = model.info.get("timings")
    if not timed_on:
        raise AdaptspecError(f"head {source}: no 'timings' profile in its info, so it cannot be re-priced")
    repriced = reprice_head(model, get_profile(timed_on), profile, str(profile_path))
    out = profile_path.with_name(f"{profile_path.stem}-head-{head_fingerprint(repriced)}")
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    repriced.save(tmp)
    for f in ("featurizer.json", "featurizer.safetensors"):
        if (source / f).is_file():
            shutil.copyfile(source / f, tmp / f)
    try:
        os.rename(tmp, out)
    except OSError:  # another process wrote the same head first
        shutil.rmtree(tmp, ignore_errors=True)
    return out
