#!/usr/bin/env bash
# Session 3's second GPU batch: every generated test with the direct launch on by
# default; the launcher's graph-timed tuning; the example tables re-tuned with the
# graph timer. Usage (GPU machine): bash benchmarks/gpu_session3b.sh OUT
set -u
out=${1:-session3b}
mkdir -p "$out"
timeout 60 python3 benchmarks/autotune_check.py >"$out/autotune-check.txt" 2>&1
timeout 200 python3 -m pytest generated -q -p no:cacheprovider -rfE >"$out/generated-tests.log" 2>&1
echo "generated tests exit $?" >>"$out/generated-tests.log"
TUNE_BUDGET_S=240 bash benchmarks/tune_examples.sh "$out/tune"
cp generated/*.tuned.json "$out/tune/"
cat "$out/autotune-check.txt"; tail -3 "$out/generated-tests.log"; cat "$out/tune/times.txt" "$out/tune/tune.txt"
