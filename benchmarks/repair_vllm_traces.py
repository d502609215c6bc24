"""Cut each request's last round to the tokens vLLM kept, in trace sets collected before 2fefc98.

Before commit 2fefc98 the plug-in's recorder gave a request's last round the tokens its step
*sampled*; vLLM keeps them only up to the stop (``max_tokens``, a stop token), so such a set's
rounds can commit more than the request's ``new_tokens`` and ``adaptspec simulate`` refuses it.
Since 2fefc98 the recorder gives that round the tokens kept (``adaptspec.vllm.record.kept_last_tau``: the
round's tau less ``1 + sum(tau) - new_tokens``, the 1 being the prefill's token). This script
applies that same function to a stored set's outcomes: only the last round's tau (and the row's
``mean_tau``) change; ``new_tokens``, ``rounds`` and every time stay as measured, since vLLM ran
that step whatever it kept.

    python benchmarks/repair_vllm_traces.py benchmarks/results/vllm-traces-c1 --out runs/c1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from adaptspec.traces.traceset import TraceSet
from adaptspec.vllm.record import kept_last_tau


def repair(src: Path, out: Path) -> dict:
    outcomes = pq.read_table(src / "outcomes.parquet")
    rows = outcomes.to_pylist()
    cut = 0
    for row in rows:
        taus = row["tau"][:-1] + [kept_last_tau(row["tau"], row["new_tokens"])]
        if taus != row["tau"]:
            cut += 1
            row["tau"] = taus
            row["mean_tau"] = sum(taus) / len(taus)
    fixed = pa.Table.from_pylist(rows, schema=outcomes.schema)
    meta = json.loads((src / "meta.json").read_text())
    meta["repaired"] = (
        f"{src.name}: each request's last round cut to the tokens vLLM kept "
        "(benchmarks/repair_vllm_traces.py, the recorder's rule since 2fefc98); times unchanged"
    )
    ts = TraceSet(pq.read_table(src / "requests.parquet"), fixed, meta)  # validates
    ts.write(out, overwrite=True)
    return {"set": str(src), "out": str(out), "rows": len(rows), "last_rounds_cut": cut}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    print(json.dumps(repair(a.src, a.out)))


if __name__ == "__main__":
    main()
