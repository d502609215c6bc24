"""Block sizes and dtypes priced by this host's curve; the bundled head's prior re-priced by it.

With ``a(B)`` the tokens a round commits at block size ``B`` (its acceptance length) and
``c(B)`` what a round costs on this host, a request decodes ``a(B) / c(B)`` tokens a second:
:func:`expected_speeds`, :func:`best_block_size`. Plain decoding (``B = 1``) commits one token a
round, so speculating pays only where some ``a(B) / c(B) > 1 / c(1)``.

A head (:class:`~adaptspec.policies.offline_head.HeadModel`) predicts each block size's reward
``-1000 c0(B) / a(B)`` (minus ms per token) with the costs ``c0`` of the profile its training rewards
were timed with. :func:`reprice_head` keeps its acceptance model and swaps the costs: every arm's
prediction times ``k(B) = c(B) / c0(B)``, an exact rewrite of the output layer (and of its
validation errors, which NeuralLinear's prior is made of), the hidden layers untouched.

>>> from adaptspec.costs.latency import CostCurve, LatencyProfile
>>> flat = LatencyProfile("flat", CostCurve((1,), (0.0,)), CostCurve((1.0, 4.0), (0.040, 0.048)))
>>> steep = LatencyProfile("steep", CostCurve((1,), (0.0,)), CostCurve((1.0, 4.0), (0.040, 0.102)))
>>> tau = {1: 1.0, 2: 1.4, 4: 1.67}
>>> best_block_size(flat, tau), best_block_size(steep, tau)   # 1.67/1.2 = 1.39x plain; 1.67/2.55 < 1
(4, 1)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from ..costs.latency import LatencyProfile
from ..errors import AdaptspecError


def expected_speeds(
    profile: LatencyProfile, tokens_per_round: Mapping[int, float], rows: int = 1
) -> dict[int, float]:
    """Tokens a second of one request at each block size of ``tokens_per_round`` (``a(B)``), with
    ``rows`` rows in every round, at the profile's reference context."""
    out = {}
    for b, a in sorted(tokens_per_round.items()):
        if not (a >= 1 and np.isfinite(a)):
            raise AdaptspecError(f"block size {b}: a round commits at least one token, got {a}")
        out[int(b)] = float(a) / float(profile.round_s(int(b), None, rows))
    return out


def best_block_size(profile: LatencyProfile, tokens_per_round: Mapping[int, float], rows: int = 1) -> int:
    """The block size of the most tokens a second (the smallest of equals)."""
    speeds = expected_speeds(profile, tokens_per_round, rows)
    top = max(speeds.values())
    return min(b for b, s in speeds.items() if s >= top * (1 - 1e-12))


#: how much faster than plain decoding a block size must be on the host's curve, at the prior's
#: acceptance, for speculating to count as paying there (:func:`paying_block_size`): the curve and
#: the prior are estimates, and a predicted gain below this was measured as a loss (BENCHMARKS.md,
#: "The default on an AVX2 host")
PAYS_MARGIN = 0.10


def paying_block_size(
    profile: LatencyProfile, tokens_per_round: Mapping[int, float], rows: int = 1, margin: float = PAYS_MARGIN
) -> int:
    """:func:`best_block_size`, or 1 where it decodes less than ``1 + margin`` times as fast as
    plain decoding (``B = 1``).

    >>> from adaptspec.costs.latency import CostCurve
    >>> zero = CostCurve((1,), (0.0,))
    >>> curve = LatencyProfile("c", draft=zero, verify=CostCurve((1, 2), (0.040, 0.052)))
    >>> tau = {1: 1.0, 2: 1.4}   # B = 2: 1.4 / 1.3 = 1.08x plain
    >>> best_block_size(curve, tau), paying_block_size(curve, tau), paying_block_size(curve, tau, margin=0.05)
    (2, 1, 2)
    """
    speeds = expected_speeds(profile, tokens_per_round, rows)
    best = best_block_size(profile, tokens_per_round, rows)
    plain = speeds.get(1, 1.0 / float(profile.round_s(1, None, rows)))
    return best if speeds[best] >= (1 + margin) * plain else 1


def cheaper_dtype(
    profiles: Mapping[str, LatencyProfile], tokens_per_round: Mapping[int, float], rows: Sequence[int] = (1,)
) -> str:
    """The dtype that decodes fastest at every load of ``rows`` (rows in every round) as nearly as
    any timed dtype can: at each row count, each dtype's best block size's tokens a second over the
    best dtype's there; the dtype whose worst such ratio is the largest (ties: the larger mean, then
    the first). ``rows=(1,)``, one request: the dtype whose best block size decodes it fastest. A
    server's rows matter because the dtypes' curves cross: bfloat16 kernels without native bf16
    are cheap at one row and steep in the positions a pass carries, float32 the other way round.

    >>> from adaptspec.costs.latency import CostCurve
    >>> zero = CostCurve((1,), (0.0,))
    >>> steep = LatencyProfile("steep", draft=zero, verify=CostCurve((1, 8), (0.030, 0.200)))
    >>> flat = LatencyProfile("flat", draft=zero, verify=CostCurve((1, 8), (0.060, 0.080)))
    >>> cheaper_dtype({"bfloat16": steep, "float32": flat}, {1: 1.0}), cheaper_dtype({"bfloat16": steep, "float32": flat}, {1: 1.0}, rows=(1, 8))
    ('bfloat16', 'float32')
    """
    if not profiles:
        raise AdaptspecError("no dtype was timed")
    best = {
        d: np.array([max(expected_speeds(p, tokens_per_round, r).values()) for r in rows])
        for d, p in profiles.items()
    }
    top = np.max(np.stack(list(best.values())), axis=0)
    ratios = {d: b / top for d, b in best.items()}
    return max(ratios, key=lambda d: (float(ratios[d].min()), float(ratios[d].mean())))


def prior_tokens_per_round(arms: tuple[int, ...]) -> dict[int, float]:
    """The bundled drafter's mean acceptance length at each of ``arms`` that the bundled trace set
    (the public benchmark prompts, which its head was trained on) recorded."""
    from ..traces import DEFAULT_TRACES, load_traces

    traces = load_traces(DEFAULT_TRACES)
    tau = np.nanmean(traces.tau_matrix(), axis=0)
    recorded = {int(b): float(t) for b, t in zip(traces.arm_array, tau)}
    return {b: recorded[b] for b in arms if b in recorded}


def cost_ratios(timed_on: LatencyProfile, host: LatencyProfile, arms: tuple[int, ...]) -> np.ndarray:
    """``k(B) = c(B) / c0(B)``: a round at each arm on ``host`` over one on ``timed_on`` (one row,
    each at its reference context)."""
    b = np.asarray(arms, dtype=np.float64)
    return np.asarray(host.round_s(b), dtype=np.float64) / np.asarray(timed_on.round_s(b), dtype=np.float64)


def reprice_head(head: Any, timed_on: LatencyProfile, host: LatencyProfile, timings: str) -> Any:
    """``head`` (a regression head of minus-ms-per-token rewards timed on ``timed_on``) with every
    arm's prediction multiplied by :func:`cost_ratios` (see the module docstring); ``timings``
    names the host's profile in its info (the controller's machine-speed reference and the profile
    its counterfactuals are priced with). In standardised units ``s = (r - m) / v`` the rewrite is
    ``s' = k s + (k - 1) m / v``; the validation errors scale by ``k``."""
    if head.mode != "regression" or head.info.get("reward") not in (None, "token_latency"):
        raise AdaptspecError("only a regression head of token_latency rewards can be re-priced")
    k = cost_ratios(timed_on, host, head.arms)
    W, b = head.layers[-1]
    shift = (k - 1.0) * head.reward_mean / head.reward_scale
    layers = [*head.layers[:-1], (W * k[:, None], b * k + shift)]
    mse = None if head.val_mse is None else np.asarray(head.val_mse) * k**2
    cov = None if head.val_cov is None else np.asarray(head.val_cov) * np.outer(k, k)
    info = {
        **head.info,
        "timings": timings,
        "repriced_from": head.info.get("timings"),
        "cost_ratios": [round(float(x), 6) for x in k],
    }
    return dataclasses.replace(head, layers=layers, val_mse=mse, val_cov=cov, info=info)
