#!/usr/bin/env bash
# Issue 29 item 1, the levers left: sequences per step, response crop, soft targets. Each phase
# runs in one process group at nice 19 (pause it with kill -STOP -- -PGID; cost is CPU seconds,
# so a pause changes nothing measured):
#   setsid nice -n 19 bash -c 'echo $$ > /work/runs/lever.pid; exec bash benchmarks/drafter_levers.sh data'
# Phases: data (contexts of the first 120 k response tokens with the target's top 8, and the
# benchmark prompts'); cost [FLAGS] (benchmarks/bench_drafter_cost.py); arm NAME STEPS FLAGS... (a fresh
# drafter for STEPS steps, warm-up 5 % of them, evaluated in the loop at half way and by
# --stage eval on the first 60 benchmark prompts at the end); two phases joined by '+' run side by
# side (one core each).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export PYTHONUNBUFFERED=1
W=${W:-/work/runs/levers/work}
R=${R:-/work/runs/levers}
common=(--corpus datasets/smollm2-135m-distill --work "$W" --threads 1 --train-tokens 120000)

phase() {
  case "$1" in
    data)
      adaptspec train-drafter "${common[@]}" --stage data --soft-targets 8 > "$R/data.log" 2>&1 ;;
    cost)
      shift
      python benchmarks/bench_drafter_cost.py --work "$W" --out "$R/cost.json" "$@" > "$R/cost.log" 2>&1 ;;
    arm)
      local name=$2 steps=$3; shift 3
      local warm=$(( (steps + 10) / 20 )) every=$(( steps / 2 ))
      adaptspec train-drafter "${common[@]}" --stage train --checkpoints "$R/arms/$name" --anchors 32 --gamma 4 \
        --lr 6e-4 --steps "$steps" --warmup "$warm" --eval-every "$every" "$@" > "$R/arm-$name.log" 2>&1
      adaptspec train-drafter "${common[@]}" --stage eval --checkpoints "$R/arms/$name" --eval-prompts 60 \
        > "$R/arm-$name.eval.json" 2> "$R/arm-$name.eval.log" ;;
    *) echo "unknown phase $1" >&2; return 2 ;;
  esac
}

mkdir -p "$R/arms"
# "A + B": phase A and phase B side by side; words of a phase are separated by spaces
IFS='+' read -ra parts <<< "$*"
pids=()
for part in "${parts[@]}"; do
  read -ra words <<< "$part"
  echo "== $(date -u +%FT%TZ) start: ${words[*]}"
  phase "${words[@]}" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
echo "== $(date -u +%FT%TZ) done (rc $rc): $*"
exit $rc
