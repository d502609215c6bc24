#!/usr/bin/env bash
# Background drafter run (issue 29, item 2): contexts of the committed corpus, then training
# from the shipped weights with 32 anchors at lr 1e-4. Start it in its own process group at low priority:
#   cp -r adaptspec/models/weights/smollm2-135m-drafter runs/drafter-init    # once
#   setsid nice -n 19 bash benchmarks/drafter_background.sh > runs/drafter.log 2>&1 &
# Resumable: run it again and each stage continues where it stopped (contexts: ~20 min on one core,
# 5.5 GB for the 182 shards, outside the repository; training resumes from WORK/checkpoints/state.pt).
# Pause for timed runs: kill -STOP -- -$(cat runs/drafter.pid); resume: kill -CONT -- -$(cat runs/drafter.pid)
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
ps -o pgid= $$ | tr -d ' ' > "${WORK:-runs/drafter}.pid"
export PYTHONUNBUFFERED=1
common=(--corpus datasets/smollm2-135m-distill --work ${WORK:-runs/drafter} --init-from ${INIT:-runs/drafter-init}
        --anchors 32 --lr 1e-4 --steps 12000 --threads 1)
echo "== $(date -u +%FT%TZ) data stage"
adaptspec train-drafter "${common[@]}" --stage data
echo "== $(date -u +%FT%TZ) train stage"
adaptspec train-drafter "${common[@]}" --stage train --minutes "${MINUTES:-2880}"
echo "== $(date -u +%FT%TZ) done"
