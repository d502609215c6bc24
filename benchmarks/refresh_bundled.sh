#!/usr/bin/env bash
# Re-derive everything the bundled drafter feeds, after a new drafter was exported to
# adaptspec/models/weights/smollm2-135m-drafter (adaptspec train-drafter ... --stage export):
#
#   1. the dense traces of the public benchmark prompts, reusing the old set's greedy outputs
#      (the target's output does not depend on the drafter): prefill, teacher-forced pass and
#      drafter passes only;
#   2. the bundled default trace set, derived from them with the measured CPU profile;
#   3. the bundled head, trained on that set minus the end-to-end benchmark's prompts;
#   4. docs/evaluation.md (python benchmarks/evaluate.py) and the per-round replay
#      (benchmarks/bench_rounds.py).
#
# The end-to-end benchmark (benchmarks/bench_real_prompts.py) and the demo are run after it,
# on a quiet machine.  Usage: bash benchmarks/refresh_bundled.sh [THREADS]
set -euo pipefail
threads=${1:-2}
dense=datasets/dense/benchmarks-fast
work=runs/refresh-bundled
mkdir -p "$work"

echo "== 1/4 dense traces with the new drafter ($dense's greedy outputs)"
# the set holds the first N benchmark prompts taking the benchmarks' domains in turn (--limit N)
n=$(python -c "from adaptspec.collect.dense import DenseTraceSet; print(len(DenseTraceSet.open('$dense').request_ids()))")
adaptspec collect --dense --prompts benchmarks --limit "$n" --arms 1,16 --max-new-tokens 128 --threads "$threads" \
  --greedy-from "$dense" --out "$work/dense"
python - "$dense" "$work/dense" <<'PY'
import sys
from adaptspec.collect.dense import DenseTraceSet
old, new = (DenseTraceSet.open(p).request_ids() for p in sys.argv[1:])
if old != new:
    sys.exit(f"{sys.argv[2]} holds other requests than {sys.argv[1]} ({len(new)} against {len(old)})")
PY
rm -rf "$dense" && mv "$work/dense" "$dense"

echo "== 2/4 the bundled trace set"
adaptspec traces derive "$dense" --out adaptspec/data/traces/benchmarks --arms 1,2,3,4,6,8,12,16 \
  --latency cpu-smollm2-fast --force

echo "== 3/4 the bundled head (trained without the end-to-end benchmark's prompts)"
rm -rf "$work/head-train"
python - "$work/head-train" <<'PY'
import sys
from adaptspec.models.prompts import benchmark_prompts
from adaptspec.traces import TraceSet
ts = TraceSet.read("adaptspec/data/traces/benchmarks")
held = {p.prompt for p in benchmark_prompts(per_benchmark=8)}
text = {f"{p.domain}-{i:04d}": p.prompt for i, p in enumerate(benchmark_prompts())}
ts.subset([i for i, r in enumerate(ts.request_ids) if text[r] not in held]).write(sys.argv[1])
PY
adaptspec train-head "$work/head-train" --out adaptspec/models/weights/smollm2-135m-head --overwrite

echo "== 4/4 evaluation report and per-round replay"
python benchmarks/evaluate.py --force
python benchmarks/bench_rounds.py --dense "$dense"
