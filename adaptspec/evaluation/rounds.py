"""Section 7: per-round schedules against fixed block sizes and both oracles, on dense traces.

The trace set under evaluation names the dense set it was derived from (``meta.json``:
``dense``); every request of that dense set is replayed round by round
(:mod:`adaptspec.simulators.rounds`) under the measured CPU profile and the GPU profile at each
batch size of the settings. Nothing is trained here, so no split is needed: the schedules are
fixed rules (a learned per-round rule is measured on a held-out half in
``benchmarks/bench_rounds.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .core import Settings

#: the rules compared (spec -> label)
RULES = {
    "confidence:0.3": "confidence threshold 0.3",
    "confidence:0.4": "confidence threshold 0.4",
    "history": "acceptance history (from B = 4)",
}
CPU_PROFILE = "cpu-smollm2-fast"


def section_rounds(traces: Any, st: Settings) -> dict[str, Any]:
    from ..schedules import parse_schedule
    from ..simulators.rounds import evaluate_rounds
    from ..traces.dense import DenseTraceSet

    where = (getattr(traces, "meta", None) or {}).get("dense")
    if not where or not (Path(where) / "meta.json").is_file():
        return {
            "status": "absent",
            "reason": f"the trace set names no dense set on disk (meta.json dense: {where!r}); "
            "collect one with `adaptspec collect --dense`",
        }
    ds = DenseTraceSet.open(where)
    items = [(rid, dom.split("/")[0], r) for rid, dom, r in ds.requests()]
    out: dict[str, Any] = {"status": "ok", "dense": str(where), "requests": len(items), "profiles": []}
    for profile, batch in [(CPU_PROFILE, 1), *[(st.gpu_profile, b) for b in st.batch_sizes]]:
        schedules = {spec: parse_schedule(spec, ds.max_block_size) for spec in RULES}
        rep = evaluate_rounds(items, schedules, profile, batch=batch, max_new_tokens=ds.max_new_tokens)
        best = rep.best_fixed()
        rows = rep.table(["plain", best, *schedules, "per-request oracle", "per-round oracle"])
        for row in rows:
            row["headroom"] = None if row["schedule"] == "plain" else rep.headroom_captured(row["schedule"])
        out["profiles"].append(
            {
                "profile": profile,
                "batch": batch,
                "best_fixed": best,
                "domains": rep.domain_names(),
                "rows": rows,
            }
        )
    return out


def render_rounds(d: dict[str, Any] | None, figs: list[str]) -> str:
    from .._util.markdown import table

    if not d or d.get("status") != "ok":
        return f"Not run: {d.get('reason') if d else 'never run'}."
    out = [
        f"Every request of the dense set `{d['dense']}` ({d['requests']} requests) replayed round by round "
        "(`adaptspec traces rounds`); aggregate tok/s over plain decoding on each profile; the last column is the "
        "share of the per-round oracle's gain over the best fixed block size a row gets.",
        "",
    ]
    for p in d["profiles"]:
        doms = p["domains"]
        rows = [
            [
                RULES.get(r["schedule"], r["schedule"]),
                *[f"{r[k]:.3f}" for k in ["all", *doms]],
                "" if r["headroom"] is None else f"{100 * r['headroom']:+.0f}%",
            ]
            for r in p["rows"]
        ]
        out += [
            f"**{p['profile']}, batch {p['batch']}** (best fixed block size {p['best_fixed'].split(':')[1]}):",
            "",
            table(["schedule", "all", *doms, "of the headroom"], rows, "l" + "r" * (len(doms) + 2)),
            "",
        ]
    out += [
        "The per-round oracle is clairvoyant (it knows where drafts will be accepted); a per-round rule can only "
        "use what is known before drafting (the rounds so far) and the drafter's confidences after. "
        "Why no rule gets near it with this drafter: [controller.md](controller.md#per-round-rules)."
    ]
    return "\n".join(out)
