#!/usr/bin/env bash
# Passkey retrieval (nas-eval RUN --passkey: the trained length, 2x and 4x, at five needle depths, 20 probes a
# cell) on every finished run of the fourth round that has none yet; the page reads eval/passkey.json beside each
# run. Safe to run again: a run already scored is skipped.
set -u
cd "$(dirname "$0")/.."
for run in benchmarks/study/subword_lm_rope/*/; do
  run=${run%/}
  [ -f "$run/summary.json" ] || continue
  [ -f "$run/eval/passkey.json" ] && continue
  echo "passkey: $run"
  nas-eval "$run" --passkey > /dev/null || echo "passkey: $run failed"
done
